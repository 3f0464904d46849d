"""Benchmark: punctuations (PJoin) on a workload whose keys end: state size and engine time without
punctuations, eager and lazy, side by side in one run; results identical (count and fingerprint).

    python bench/punctuation/bench_punctuation.py            # 3 streams, 20 min, 3 rounds (~10 min)
    python bench/punctuation/bench_punctuation.py --quick    # 8 min, 1 round (~2 min)

Workload: the project's synthetic generator, preset ``match-drift`` (the last stream's keys move by
one key domain over the middle half: its old keys end), 3 streams at --rate tuples/s each, and
``python -m mjoin generate punctuations --source s2:key``: each cycle's folder of s2 promises the keys
whose last tuple it holds. The query: the generated spec with s2's window short (20 s) and the other
streams' long (5 min): once s2 promised a key and its own tuples of it expired, s0's and s1's tuples
of that key can join nothing for minutes. Every mode runs the streaming job (availableNow, 8 files
per micro-batch) on a fresh copy of the same landed lake, rounds in shuffled order, medians reported.

Writes ``bench/punctuation/results/punctuation[-quick].json`` (machine, load, versions, git commit,
parameters, per mode: wall time, batches, state tuples per batch (mean, max, final), purged and skipped
tuples, result fingerprint) and a ``.png`` of the state per batch.
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

MODES = ("off", "eager", "lazy")


def build(work: Path, minutes: int, rate: float) -> tuple:
    import yaml

    from mjoin.model.query import parse_query
    from mjoin.workloads.synthetic import generate_synthetic
    from mjoin.workloads.lander import land
    from mjoin.workloads.punctuations import write_punctuations

    wl = work / "workload"
    generate_synthetic(str(wl), streams=3, duration=f"{minutes}m", rate=rate, schedule="match-drift", window="5m")
    promised = write_punctuations(str(wl), {"s2": "key"})
    doc = yaml.safe_load((wl / "query.yaml").read_text())
    for s in doc["streams"]:
        s["window"] = "20s" if s["name"] == "s2" else "5m"
    doc["name"] = "punctuation_bench"
    query = parse_query(doc, source="bench")
    lake = work / "landed"
    land(str(wl), str(lake), None)
    return query, lake, promised


def run_mode(spark, query, landed: Path, mode: str, work: Path) -> dict:
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.results import result_fingerprint
    from mjoin.engine.runs import run_stream
    from mjoin.lake.layout import Lake
    from mjoin.model.plan import make_plan, orders_from_permutation

    root = work / f"run-{mode}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(landed / "streams", root / "streams")
    lake = Lake(str(root))
    plan = make_plan(query, orders_from_permutation(query, query.stream_names), "fixedOrder",
                     options={"punctuation": mode, "punctuation_threshold": 2000})
    t0 = time.perf_counter()
    s = run_stream(spark, query, lake, plan=plan, config=EngineConfig(buckets=4, max_files_per_trigger=8))
    wall = time.perf_counter() - t0
    recs = read_metrics(lake, query.name)
    state = [sum(r["state_tuples"].values()) for r in recs]
    punct = {k: sum((r["punctuation"] or {}).get(k, 0) for r in recs) for k in ("promised", "purged", "skipped")}
    return {"mode": mode, "wall_seconds": wall, "batches": len(s.batches),
            "batch_seconds": sum(r["wall_seconds"] for r in recs),
            "task_cpu_seconds": sum(r["task_cpu_seconds"] for r in recs),
            "state_mean": statistics.fmean(state), "state_max": max(state), "state_final": state[-1],
            "state_per_batch": state, **punct, "fingerprint": result_fingerprint(lake, query.name)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--minutes", type=int)
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--rounds", type=int)
    args = ap.parse_args(argv)
    minutes = args.minutes or (8 if args.quick else 20)
    rounds = args.rounds or (1 if args.quick else 3)
    from mjoin.engine.metrics import git_commit, machine
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    load_before = os.getloadavg()
    spark = get_spark("bench-punctuation", Resources(spark_master="local[2]", shuffle_partitions=4))
    work = Path(tempfile.mkdtemp(prefix="bench-punct-"))
    query, landed, promised = build(work, minutes, args.rate)
    run_mode(spark, query, landed, "eager", work)  # warm-up, not measured
    runs = {m: [] for m in MODES}
    for r in range(rounds):
        order = list(MODES)
        random.Random(r).shuffle(order)
        for m in order:
            runs[m].append(run_mode(spark, query, landed, m, work))
            print(f"round {r} {m}: {runs[m][-1]['wall_seconds']:.1f}s, mean state {runs[m][-1]['state_mean']:.0f}",
                  flush=True)
    fps = {json.dumps(x["fingerprint"], sort_keys=True) for v in runs.values() for x in v}
    summary = {}
    for m, xs in runs.items():
        summary[m] = {k: statistics.median(x[k] for x in xs) for k in
                      ("wall_seconds", "batch_seconds", "task_cpu_seconds", "state_mean", "state_max", "state_final",
                       "purged", "skipped")}
        summary[m]["wall_spread"] = [min(x["wall_seconds"] for x in xs), max(x["wall_seconds"] for x in xs)]
    off = summary["off"]
    for m in ("eager", "lazy"):
        summary[m]["state_mean_vs_off"] = summary[m]["state_mean"] / off["state_mean"]
        summary[m]["wall_vs_off"] = summary[m]["wall_seconds"] / off["wall_seconds"]
    doc = {"benchmark": "punctuation", "machine": machine(), "load_before": load_before, "load_after": os.getloadavg(),
           "git_commit": git_commit(PROJECT), "parameters": {"minutes": minutes, "rate_per_stream": args.rate,
                                                      "rounds": rounds, "schedule": "match-drift",
                                                      "windows": {"s0": "5m", "s1": "5m", "s2": "20s"},
                                                      "max_files_per_trigger": 8, "buckets": 4,
                                                      "lazy_threshold": 2000, "keys_promised": promised},
           "identical_results": len(fps) == 1, "fingerprint": json.loads(next(iter(fps))),
           "summary": summary, "runs": runs}
    out = HERE / "results" / ("punctuation-quick.json" if args.quick else "punctuation.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    plot(doc, out.with_suffix(".png"))
    print(json.dumps({m: {k: round(v, 3) if isinstance(v, float) else v for k, v in s.items()}
                      for m, s in summary.items()}, indent=1))
    print(f"identical results: {doc['identical_results']}; wrote {out}")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0 if doc["identical_results"] else 1


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for m in MODES:
        ax.plot(doc["runs"][m][0]["state_per_batch"], label=f"{m} (median wall {doc['summary'][m]['wall_seconds']:.1f} s)")
    ax.set_xlabel("micro-batch")
    ax.set_ylabel("state tuples (all streams)")
    ax.set_title("punctuations on a workload whose keys end (match-drift, s2 window 20 s, others 5 min)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
