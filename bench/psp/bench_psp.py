"""Benchmark: a pair joined by a band alone (PSP time-sliced state): latency and throughput against the number
of time slices N, and the slice count the latency model (docs/algorithms.md Eq. 58-61, ``mjoin.optimizer.psp.choose_slices``) picks
against the measured best.

    python bench/psp/bench_psp.py            # TPC-DS sf 1 web/catalog returns, N = 1..8, 3 rounds
    python bench/psp/bench_psp.py --quick    # sf 0.1, N = 1, 2, 4, 1 round

The query joins web returns and catalog returns whose amounts lie within 1.00 of each other inside
2-minute windows (no key: a band class). The streaming job runs on the executors (``driver_rows=0``: the
slices are Spark tasks working in parallel) over the landed replay in micro-batches of 8 files, once per
N on a fresh copy; per run: the wall time, input tuples per second, each micro-batch's wall time (its
latency: the time from its start to its results), the operator's task seconds, the result fingerprint
(identical for every N). The model's inputs: ``L_C`` the operator's task seconds per input tuple with
one slice, ``lambda`` and ``W`` from the data (``T_j = L_C / (lambda W)``), ``T_s`` the extra task seconds
per tuple of a second slice (its copy routed and probed), ``T_n = T_s`` (a hop is that copy here);
``max_slices`` = the cores.
Results: ``bench/psp/results/psp[-quick].json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))

SPEC = {
    "spec_version": 1, "name": "psp_bench", "lateness": "0s",
    "streams": [
        {"name": "wr", "source": "web_returns", "event_time": "ts", "window": "2m",
         "columns": {"ts": "timestamp", "wr_order_number": "long", "wr_return_amt": "decimal(7,2)"}, "keys": []},
        {"name": "cr", "source": "catalog_returns", "event_time": "ts", "window": "2m",
         "columns": {"ts": "timestamp", "cr_order_number": "long", "cr_return_amount": "decimal(7,2)"}, "keys": []},
    ],
    "predicates": ["abs(wr.wr_return_amt - cr.cr_return_amount) <= 1"],
    "output": ["wr.wr_order_number", "cr.cr_order_number"],
}


def run_n(spark, query, landed: Path, work: Path, n: int, tag: str) -> dict:
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.results import result_fingerprint
    from mjoin.engine.runs import run_stream

    root = work / f"n{n}-{tag}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(landed / "streams", root / "streams")
    t0 = time.perf_counter()
    s = run_stream(spark, query, str(root), config=EngineConfig(buckets=4, psp_slices=n, max_files_per_trigger=8,
                                                                driver_rows=0))
    wall = time.perf_counter() - t0
    recs = read_metrics(str(root), query.name)
    rows = sum(sum(r["rows_in"].values()) for r in recs)
    steps = [st for r in recs for c in r["chains"] for st in c["steps"]]
    out = {"slices": n, "wall_seconds": wall, "batches": len(s.batches), "rows": rows,
           "rows_per_second": rows / wall, "batch_latency_median": statistics.median(r["wall_seconds"] for r in recs),
           "batch_latency_p90": sorted(r["wall_seconds"] for r in recs)[int(0.9 * (len(recs) - 1))],
           "task_seconds": sum(r["task_seconds"] for r in recs),
           "probe_cpu_seconds": sum(st["cpu_seconds"] for st in steps), "matches": sum(st["matches"] for st in steps),
           "results": s.result_rows, "fingerprint": result_fingerprint(str(root), query.name)}
    shutil.rmtree(root, ignore_errors=True)
    return out


def slope_per_slice(ns, task_seconds) -> float:
    """Least-squares slope of task seconds over the slice count (what one more slice costs in all)."""
    import numpy as np

    return float(np.polyfit(np.asarray(ns, dtype=float), np.asarray(task_seconds, dtype=float), 1)[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    sf, slices, rounds = (0.1, [1, 2, 4], 1) if args.quick else (1.0, [1, 2, 3, 4, 6, 8], 3)
    from mjoin.engine.metrics import git_commit, machine
    from mjoin.optimizer.psp import choose_slices, latency
    from mjoin.model.query import parse_query
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark
    from mjoin.workloads.tpcds_replay import generate_tpcds
    from mjoin.workloads.lander import land
    from mjoin.workloads.manifest import load_manifest

    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-psp-"))
    wl = work / "workload"
    generate_tpcds(str(wl), sf=sf, rate=200.0 * sf / 0.1, cycle="10s")
    man = load_manifest(str(wl))
    landed = work / "landed"
    land(str(wl), str(landed), None)
    query = parse_query(SPEC, source="bench")
    spark = get_spark("bench-psp", Resources(spark_master="local[2]", shuffle_partitions=4))
    run_n(spark, query, landed, work, 2, "warm")  # warm-up, not measured
    runs = {n: [] for n in slices}
    for r in range(rounds):
        order = list(slices)
        random.Random(r).shuffle(order)
        for n in order:
            runs[n].append(run_n(spark, query, landed, work, n, str(r)))
            print(f"round {r} N={n}: {runs[n][-1]['wall_seconds']:.1f}s, batch latency "
                  f"{runs[n][-1]['batch_latency_median']:.2f}s", flush=True)
    fps = {json.dumps(x["fingerprint"], sort_keys=True) for v in runs.values() for x in v}
    med = {n: {k: statistics.median(x[k] for x in v) for k in
               ("wall_seconds", "rows_per_second", "batch_latency_median", "batch_latency_p90", "task_seconds")}
           for n, v in runs.items()}
    best = min(slices, key=lambda n: med[n]["batch_latency_median"])
    # the model's inputs (Eq. 58), measured: L_C the operator's probing CPU per input tuple with one slice (the work
    # of a tuple against its whole window), T_j = L_C / (lambda W) (so lambda W T_j = L_C, as in the paper), and
    # T_s the task seconds one more slice adds per input tuple (its copy routed to that slice's task and probed
    # there): the least-squares slope of the median task seconds over every N measured, not the difference of two
    # noisy runs (at sf 0.1 under load that difference was negative); a hop (T_n) is that same copy here
    rows = runs[1][0]["rows"]
    duration = man.end_epoch - man.start_epoch
    lam = rows / duration / 2  # per stream
    window = 120.0
    l_c = statistics.median(x["probe_cpu_seconds"] for x in runs[1]) / max(rows, 1)
    t_j = l_c / max(lam * window, 1e-9)
    slope = slope_per_slice(slices, [med[n]["task_seconds"] for n in slices])
    t_s = max(slope, 1e-9) / max(rows, 1)
    t_n = t_s
    cores = os.cpu_count() or 2
    chosen = choose_slices(lam, window, t_j, t_s, t_n, max_slices=cores)
    unbounded = choose_slices(lam, window, t_j, t_s, t_n, max_slices=64)
    lwt = lam * window * t_j
    model = {"lambda_per_stream": lam, "window_seconds": window, "l_c": l_c, "t_j": t_j, "t_s": t_s, "t_n": t_n,
             "task_seconds_per_slice": slope, "max_slices": cores, "chosen": chosen,
             "chosen_without_core_cap": unbounded,
             "predicted_latency": {str(n): latency(n, lwt, t_n, t_s, lwt) for n in slices}}
    doc = {"benchmark": "psp", "machine": machine(), "load_before": load_before, "load_after": os.getloadavg(),
           "git_commit": git_commit(PROJECT), "parameters": {"sf": sf, "slices": slices, "rounds": rounds,
                                                             "band": SPEC["predicates"][0], "windows": "2m",
                                                             "max_files_per_trigger": 8, "where": "executors"},
           "identical_results": len(fps) == 1, "medians": {str(n): v for n, v in med.items()},
           "measured_best": best, "model": model, "runs": {str(n): v for n, v in runs.items()}}
    out = HERE / "results" / ("psp-quick.json" if args.quick else "psp.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    plot(doc, out.with_suffix(".png"))
    print(json.dumps({"medians": doc["medians"], "measured_best": best, "model_chose": chosen,
                      "identical_results": doc["identical_results"]}, indent=1))
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0 if doc["identical_results"] else 1


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [int(n) for n in doc["medians"]]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    a1.plot(ns, [doc["medians"][str(n)]["batch_latency_median"] for n in ns], "o-", label="measured (median)")
    a1.axvline(doc["model"]["chosen"], color="k", ls="--", label=f"Eq. 61 chose N = {doc['model']['chosen']}")
    a1.set_xlabel("time slices N")
    a1.set_ylabel("micro-batch latency, s")
    a1.legend(loc="upper left")
    pred = doc["model"]["predicted_latency"]
    ax = a1.twinx()
    ax.plot(ns, [pred[str(n)] * 1e6 for n in ns], "s:", color="tab:orange", label="Eq. 58 latency per tuple")
    ax.set_ylabel("Eq. 58 latency per tuple, us")
    ax.legend(loc="upper right")
    a2.plot(ns, [doc["medians"][str(n)]["rows_per_second"] for n in ns], "o-")
    a2.set_xlabel("time slices N")
    a2.set_ylabel("input tuples / s")
    fig.suptitle(f"band alone (PSP), TPC-DS sf {doc['parameters']['sf']}, {doc['machine']['cpus']} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
