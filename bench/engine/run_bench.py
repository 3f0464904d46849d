"""Benchmark: the seed query on TPC-DS, all 24 fixed orders side by side, prefilter on/off,
and Spark's own chained stream-stream joins once.

    python bench/engine/run_bench.py            # SF=1 (the lead runs this on a quiet machine)
    python bench/engine/run_bench.py --quick    # SF=0.01 smoke test

Writes ``bench/engine/results/orders_<mode>.json`` (machine, versions, date,
parameters, per-order measurements, best/worst spread, a fit of the cost model's
alpha_q and alpha_m to the per-step measurements) and ``orders_<mode>.png``.

Measures, per order: the wall time of the interval's batches (what a user waits
for; includes Spark's per-batch overhead), the operator's own time in the chains
(probe + materialise, summed over buckets: the part that depends on the order),
and the lookups and matches it made. Rounds run the orders in a fresh random order
each, and the median over rounds is reported, so a load change on a shared machine
does not favour the orders that ran first.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from itertools import permutations
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))
# the paper's TPC-DS replay; until `python -m mjoin generate tpcds` lands, the test fixture's
sys.path.insert(0, str(PROJECT / "tests"))

log = logging.getLogger("bench.engine")


def versions() -> dict:
    import duckdb
    import numpy
    import pyarrow
    import pyspark

    return {"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__, "numpy": numpy.__version__,
            "duckdb": duckdb.__version__, "python": platform.python_version()}


def fit_cost_model(records: list) -> dict:
    """Least squares of per-step seconds = c * calls + alpha_q * lookups * log2(kappa + 2) + alpha_m * matches
    (ALGORITHMS.md Eq. 1 and 6, sorted-array state; ``calls``: one vectorised lookup per bucket, the
    engine's fixed cost per step), over every step of every batch, non-negative coefficients."""
    import numpy as np
    from scipy.optimize import nnls

    rows, y = [], []
    for rec in records:
        for chain in rec["chains"]:
            for st in chain["steps"]:
                if st["lookups"]:
                    rows.append([st.get("calls", 0), st["lookups"] * np.log2(st["kappa"] + 2), st["matches"]])
                    y.append(st["seconds"])
    if len(rows) < 4:
        return {"steps": len(rows)}
    a, y = np.asarray(rows, dtype=float), np.asarray(y)
    coef, _ = nnls(a, y)
    pred = a @ coef
    ss = float(((y - y.mean()) ** 2).sum())
    return {"per_call": float(coef[0]), "alpha_q": float(coef[1]), "alpha_m": float(coef[2]), "steps": len(rows),
            "r2": 1 - float(((y - pred) ** 2).sum()) / ss if ss else None,
            "model": "seconds = per_call * calls + alpha_q * lookups * log2(kappa + 2) + alpha_m * matches",
            "unit": "seconds"}


def summarise(name: str, summary, records: list) -> dict:
    steps = [st for r in records for c in r["chains"] for st in c["steps"]]
    pre = [r["prefilter"] for r in records if r.get("prefilter")]
    out = {
        "order": name, "result_rows": summary.result_rows, "batches": summary.batches,
        "batch_seconds": summary.batch_seconds,
        "chain_seconds": sum(c["seconds"] for r in records for c in r["chains"]),
        "probe_seconds": sum(st["seconds"] for st in steps),
        "task_seconds": sum(r["task_seconds"] for r in records),
        "lookups": sum(st["lookups"] for st in steps), "matches": sum(st["matches"] for st in steps),
        "shuffle_bytes": sum(r["shuffle_bytes"]["read"] for r in records),
        "prefilter": None if not pre else {k: sum(p[k] for p in pre) for k in pre[0]},
    }
    # the prefilter's own checks are part of the chains' cost
    out["chain_seconds"] += (out["prefilter"] or {}).get("seconds", 0.0)
    return out


def run(args) -> dict:
    from engine_helpers import T0, replay_tpcds

    from mjoin.engine import EngineConfig, read_metrics, run_interval
    from mjoin.engine.interval import run_interval_plans
    from mjoin.lake import Lake
    from mjoin.plan import make_plan, orders_from_permutation
    from mjoin.query import load_query
    from mjoin.resources import Resources
    from mjoin.sparkutil import get_spark

    work = Path(args.work or tempfile.mkdtemp(prefix="mjoin-bench-engine-"))
    lake = Lake(str(work / "lake"))
    t0 = time.perf_counter()
    if not lake.arrivals("customer"):
        info = replay_tpcds(lake, args.sf, rate=args.rate, arrival_cycle=args.arrival_cycle, seed=args.seed)
        end = info["end"]
    else:
        end = max(a for t in ("customer", "store_returns", "web_returns", "catalog_returns")
                  for a in lake.arrivals(t)) + args.arrival_cycle
    replay_seconds = time.perf_counter() - t0
    query = load_query("tpcds_returns_by_address")
    start = T0 + int(query.max_window)  # full windows from the first batch on
    end = start + ((end - start + args.cycle - 1) // args.cycle) * args.cycle
    spark = get_spark("mjoin-bench-engine", Resources(spark_master=args.master, shuffle_partitions=args.partitions))
    config = EngineConfig(buckets=args.buckets)
    perms = list(permutations(query.stream_names))[: args.orders]
    plans = {"".join(p): make_plan(query, orders_from_permutation(query, p), "fixedOrder") for p in perms}
    pre_plans = {f"{k}+pre": make_plan(query, orders_from_permutation(query, p), "fixedOrder",
                                       options={"prefilter": True}) for k, p in zip(plans, perms)}
    rounds: dict = {}
    calib_records = []
    rng = random.Random(args.seed)
    for rnd in range(args.rounds):
        names = list(plans) + (list(pre_plans) if args.prefilter else [])
        rng.shuffle(names)
        all_plans = {**plans, **pre_plans}
        log.info("round %d: %d plans", rnd + 1, len(names))
        summaries = run_interval_plans(spark, query, {n: all_plans[n] for n in names}, lake, start, end, args.cycle,
                                       str(work / "out"), config=config)
        for n, s in summaries.items():
            recs = read_metrics(s.metrics_path)
            rounds.setdefault(n, []).append(summarise(n, s, recs))
            if rnd == args.rounds - 1 and not n.endswith("+pre"):
                calib_records += recs
    native = None
    if not args.no_native:
        t = time.perf_counter()
        ns = run_interval(spark, query, None, lake, start, end, args.cycle, str(work / "native"), engine="spark-native")
        recs = read_metrics(ns.metrics_path)
        native = {"result_rows": ns.result_rows, "batch_seconds": ns.batch_seconds,
                  "wall_seconds": time.perf_counter() - t, "max_state_tuples": ns.extra["max_state_tuples"],
                  "join_strategies": ns.extra["join_strategies"], "join_order": ns.extra["join_order"],
                  "micro_batches": ns.extra["micro_batches"]}
    spark.stop()

    def median_of(n):
        runs = rounds[n]
        out = dict(runs[-1])
        for k in ("batch_seconds", "chain_seconds", "probe_seconds", "task_seconds"):
            out[k] = statistics.median(r[k] for r in runs)
            out[k + "_runs"] = [r[k] for r in runs]
        return out

    orders = sorted((median_of(n) for n in plans), key=lambda r: r["batch_seconds"])
    prefilter = [median_of(n) for n in pre_plans] if args.prefilter else []
    spread = {}
    for k in ("batch_seconds", "chain_seconds", "lookups", "matches"):
        vals = sorted(o[k] for o in orders)
        spread[k] = {"best": vals[0], "worst": vals[-1], "ratio": vals[-1] / vals[0] if vals[0] else None}
    pre_by = {p["order"].removesuffix("+pre"): p for p in prefilter}
    pre_summary = None
    if pre_by:
        per = [{"order": o["order"], "chain_seconds_off": o["chain_seconds"],
                "chain_seconds_on": pre_by[o["order"]]["chain_seconds"], "lookups_off": o["lookups"],
                "lookups_on": pre_by[o["order"]]["lookups"], **pre_by[o["order"]]["prefilter"]} for o in orders]
        pre_summary = {
            "per_order": per,
            "median_chain_seconds_ratio_on_off": statistics.median(p["chain_seconds_on"] / p["chain_seconds_off"]
                                                                   for p in per if p["chain_seconds_off"]),
            "median_lookups_ratio_on_off": statistics.median(p["lookups_on"] / p["lookups_off"]
                                                             for p in per if p["lookups_off"]),
            "dropped_fraction": per[0]["dropped"] / per[0]["checked"] if per[0]["checked"] else None,
        }
        rows_pre = {p["result_rows"] for p in prefilter}
    else:
        rows_pre = set()
    rows = {o["result_rows"] for o in orders} | ({native["result_rows"]} if native else set()) | rows_pre
    result = {
        "benchmark": "engine-24-orders", "mode": "quick" if args.quick else "full",
        "date": datetime.now(timezone.utc).isoformat(), "machine": {
            "host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "load_average_at_end": os.getloadavg()},
        "versions": versions(),
        "parameters": {"sf": args.sf, "rate_rows_per_s": args.rate, "arrival_cycle_s": args.arrival_cycle,
                       "cycle_s": args.cycle, "interval": [start, end], "buckets": args.buckets,
                       "master": args.master, "shuffle_partitions": args.partitions, "rounds": args.rounds,
                       "seed": args.seed, "query": query.name},
        "replay_seconds": replay_seconds,
        "results_agree": len(rows) == 1, "result_rows": sorted(rows),
        "orders": orders, "spread": spread, "prefilter": prefilter, "prefilter_summary": pre_summary,
        "native": native,
        "calibration": fit_cost_model(calib_records),
        "note": "timings on a shared machine are noisy; the lead re-runs the full mode on a quiet one",
    }
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    orders = result["orders"]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    names = [o["order"] for o in orders]
    x = range(len(orders))
    axes[0].bar(x, [o["batch_seconds"] for o in orders], color="#4c72b0", label="batch wall time (mjoin)")
    if result.get("native"):
        axes[0].axhline(result["native"]["batch_seconds"], color="#c44e52", ls="--",
                        label=f"spark-native chained joins ({result['native']['batch_seconds']:.1f}s)")
    axes[0].set_xticks(list(x), names, rotation=90, fontsize=7)
    axes[0].set_ylabel("seconds (median over rounds)")
    axes[0].set_title(f"seed query, TPC-DS SF={result['parameters']['sf']}: 24 fixed orders")
    axes[0].legend(fontsize=8)
    by_chain = sorted(orders, key=lambda o: o["chain_seconds"])
    axes[1].bar(x, [o["chain_seconds"] for o in by_chain], color="#55a868", label="operator time in chains")
    pre = {p["order"].removesuffix("+pre"): p for p in result.get("prefilter", [])}
    if pre:
        axes[1].plot(list(x), [pre[o["order"]]["chain_seconds"] for o in by_chain], "k.", label="with SMJ prefilter")
    ax2 = axes[1].twinx()
    ax2.plot(list(x), [o["lookups"] for o in by_chain], color="#dd8452", marker="x", lw=0, label="lookups")
    ax2.set_ylabel("lookups")
    axes[1].set_xticks(list(x), [o["order"] for o in by_chain], rotation=90, fontsize=7)
    axes[1].set_ylabel("seconds (sum over buckets)")
    axes[1].set_title("plan-dependent work: probe + materialise")
    axes[1].legend(loc="upper left", fontsize=8)
    ax2.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="SF=0.01 smoke test")
    p.add_argument("--sf", type=float, default=None)
    p.add_argument("--rate", type=float, default=None, help="replay rate, rows per second")
    p.add_argument("--arrival-cycle", type=int, default=60)
    p.add_argument("--cycle", type=int, default=60, help="batch length, seconds of event time")
    p.add_argument("--buckets", type=int, default=16)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--orders", type=int, default=24, help="first N of the 24 orders")
    p.add_argument("--no-prefilter", dest="prefilter", action="store_false")
    p.add_argument("--no-native", action="store_true")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--work", help="working folder (default: a temporary one); a replay there is reused")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    args.sf = args.sf or (0.01 if args.quick else 1.0)
    args.rate = args.rate or (10.0 if args.quick else 500.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.quick:
        args.buckets = min(args.buckets, 4)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("mjoin.engine.interval").setLevel(logging.WARNING)
    result = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"orders_{result['mode']}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    plot(result, out / f"{stem}.png")
    s = result["spread"]
    print(f"{len(result['orders'])} orders, results agree: {result['results_agree']} {result['result_rows']}")
    print(f"batch wall: best {s['batch_seconds']['best']:.2f}s worst {s['batch_seconds']['worst']:.2f}s "
          f"(x{s['batch_seconds']['ratio']:.2f}); chain time x{s['chain_seconds']['ratio']:.2f}; "
          f"lookups x{s['lookups']['ratio']:.2f}")
    if result["prefilter_summary"]:
        ps = result["prefilter_summary"]
        print(f"prefilter: drops {ps['dropped_fraction']:.0%} of the new tuples; lookups x{ps['median_lookups_ratio_on_off']:.2f}, "
              f"chain time (incl. its checks) x{ps['median_chain_seconds_ratio_on_off']:.2f} (median over orders)")
    if result["native"]:
        print(f"spark-native: {result['native']['batch_seconds']:.2f}s in batches")
    c = result["calibration"]
    if "alpha_q" in c:
        print(f"calibration: per call {c['per_call']:.3g}s, alpha_q {c['alpha_q']:.3g}s, alpha_m {c['alpha_m']:.3g}s, "
              f"r2 {c['r2']:.2f}")
    print(f"wrote {out / stem}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
