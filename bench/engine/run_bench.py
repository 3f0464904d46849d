"""Benchmark: the 24 fixed orders of a query on TPC-DS side by side, with the cost model's
prediction per order, prefilter on/off, per-batch vs pipelined execution, and Spark's own
chained stream-stream joins.

    python bench/engine/run_bench.py                 # SF=1, seed query and two-class query
    python bench/engine/run_bench.py --quick         # SF=0.01 smoke test
    python bench/engine/run_bench.py --queries tpcds_returns_by_address --rounds 1

Per query it writes ``bench/engine/results/orders_<mode>[_<query>].json`` (machine, load
average before and after, versions, git commit, date, parameters, per-order measurements,
spreads, calibration, predicted vs measured rank correlations) and a ``.png``.

Per order it measures: the wall time of the interval's batches (what a user waits for),
the tasks' CPU time (the operator's whole work: input split, state maintenance, probing,
materialising, writing), the chains' CPU time (probe + materialise) and the probing CPU
time, and the lookups and matches made. CPU time is the thread's own (``time.thread_time``
in the tasks), so on a shared machine it is not inflated by other processes as wall time is.

The prediction: the statistics job (``mjoin.stats.job.compute_statistics``, the one
statistics format, measured from the data and not from the probes) gives per cycle
``lambda, kappa, gamma, mu``; the cost model (``mjoin.optimizer.cost.plan_cost``) with coefficients
calibrated from this run's own engine metrics (``mjoin.optimizer.calibrate``, the one calibration
path; NNLS of per-step CPU time on lookups, lookups*log2(kappa), matches and calls) gives
each order's expected probing seconds per second of input; times the cycle length, summed
over the cycles. Spearman's rho between prediction and each measurement says whether the
engine's cost follows the plan. (The calibration is in-sample: fitted on the same runs'
steps, which does not decide the ranking, since every order shares the coefficients.)

Rounds run the orders in a fresh random order each, and the median over rounds is reported,
so a load change on a shared machine does not favour the orders that ran first.
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
import subprocess
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
QUERIES = ("tpcds_returns_by_address", "tpcds_returns_by_customer_and_address")
MEASURES = ("batch_seconds", "task_cpu_seconds", "chain_cpu_seconds", "probe_cpu_seconds")


def versions() -> dict:
    import duckdb
    import numpy
    import pyarrow
    import pyspark
    import scipy

    return {"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__, "numpy": numpy.__version__,
            "scipy": scipy.__version__, "duckdb": duckdb.__version__, "python": platform.python_version()}


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(PROJECT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return None


def summarise(name: str, summary, records: list) -> dict:
    steps = [st for r in records for c in r["chains"] for st in c["steps"]]
    pre = [r["prefilter"] for r in records if r.get("prefilter")]
    out = {
        "order": name, "result_rows": summary.result_rows, "batches": summary.batches,
        "batch_seconds": summary.batch_seconds,
        "task_seconds": sum(r["task_seconds"] for r in records),
        "task_cpu_seconds": sum(r.get("task_cpu_seconds", 0.0) for r in records),
        "chain_seconds": sum(c["seconds"] for r in records for c in r["chains"]),
        "chain_cpu_seconds": sum(c.get("cpu_seconds", 0.0) for r in records for c in r["chains"]),
        "probe_seconds": sum(st["seconds"] for st in steps),
        "probe_cpu_seconds": sum(st.get("cpu_seconds", 0.0) for st in steps),
        "lookups": sum(st["lookups"] for st in steps), "matches": sum(st["matches"] for st in steps),
        "calls": sum(st.get("calls", 0) for st in steps),
        "stages": max(r.get("stages", 1) for r in records),
        "shuffle_bytes": records[0].get("execution", {}).get("shuffle_bytes", {}).get("read")
        if records and records[0].get("execution", {}).get("mode") == "pipelined"
        else sum(r["shuffle_bytes"]["read"] for r in records),
        "execution": summary.extra.get("execution"),
        "prefilter": None if not pre else {k: sum(p[k] for p in pre) for k in pre[0]},
    }
    # the prefilter's own checks are part of the chains' cost
    out["chain_seconds"] += (out["prefilter"] or {}).get("seconds", 0.0)
    return out


def predicted_costs(query, stats_by_cycle: list, plans: dict, model, cycle_s: float) -> dict:
    """Expected probing seconds of each plan over the interval: sum over cycles of
    ``plan_cost`` (seconds per second of input, Eq. 1-8 with the calibrated model) x cycle length."""
    from mjoin.optimizer.cost import plan_cost

    return {name: sum(plan_cost(query, st, plan, model) for st in stats_by_cycle) * cycle_s
            for name, plan in plans.items()}


def rank_correlations(orders: list, predicted: dict, keys) -> dict:
    from scipy.stats import spearmanr

    out = {}
    for k in keys:
        x = [predicted[o["order"]] for o in orders]
        y = [o[k] for o in orders]
        rho, p = spearmanr(x, y) if len(set(x)) > 1 and len(set(y)) > 1 else (float("nan"), float("nan"))
        out[k] = {"rho": float(rho), "p_value": float(p)}
    return out


def median_over_rounds(runs: list) -> dict:
    """One plan's ``summarise`` records of several rounds: the last, with each time replaced by its median
    over the rounds (and the rounds' values kept as ``<time>_runs``)."""
    out = dict(runs[-1])
    for k in ("batch_seconds", "task_seconds", "task_cpu_seconds", "chain_seconds", "chain_cpu_seconds",
              "probe_seconds", "probe_cpu_seconds"):
        out[k] = statistics.median(r[k] for r in runs)
        out[k + "_runs"] = [r[k] for r in runs]
    return out


def spread(rows: list, keys) -> dict:
    out = {}
    for k in keys:
        vals = sorted(o[k] for o in rows)
        best = min(rows, key=lambda o: o[k])["order"]
        worst = max(rows, key=lambda o: o[k])["order"]
        out[k] = {"best": vals[0], "worst": vals[-1], "ratio": vals[-1] / vals[0] if vals[0] else None,
                  "best_order": best, "worst_order": worst}
    return out


def run_query(spark, args, lake, qname: str, start: int, end: int, work: Path) -> dict:
    from mjoin.optimizer.calibrate import CalibrationError, calibrate, engine_observations
    from mjoin.optimizer.cost import CostModel
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.runs import run_interval
    from mjoin.engine.interval import run_interval_plans
    from mjoin.engine.metrics import machine
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.model.query import load_query
    from mjoin.stats.job import compute_statistics

    query = load_query(qname)
    load_before = os.getloadavg()
    config = EngineConfig(buckets=args.buckets)
    perms = list(permutations(query.stream_names))[: args.orders]
    plans = {"".join(p): make_plan(query, orders_from_permutation(query, p), "fixedOrder") for p in perms}
    use_prefilter = args.prefilter and query.single_class  # the SMJ filter needs one attribute class
    pre_plans = {f"{k}+pre": make_plan(query, orders_from_permutation(query, p), "fixedOrder",
                                       options={"prefilter": True}) for k, p in zip(plans, perms)} \
        if use_prefilter else {}
    all_plans = {**plans, **pre_plans}

    # statistics of every cycle (plan-independent, from the data)
    t = time.perf_counter()
    stats_run = compute_statistics(spark, query, lake, start, end, args.cycle)
    stats_by_cycle = [stats_run.snapshot(c) for c in sorted(stats_run.cycle_meta)]
    stats_seconds = time.perf_counter() - t

    # unmeasured warm-up: Python workers started, imports and allocator warm, before any order is timed
    first = next(iter(plans))
    run_interval_plans(spark, query, {first: plans[first]}, lake, start, end, args.cycle, str(work / "warmup"),
                       config=config, pipelined=True)
    rounds: dict = {}
    calib_records = []
    rng = random.Random(args.seed)
    for rnd in range(args.rounds):
        names = list(all_plans)
        rng.shuffle(names)
        log.info("%s round %d: %d plans (pipelined)", qname, rnd + 1, len(names))
        summaries = run_interval_plans(spark, query, {n: all_plans[n] for n in names}, lake, start, end, args.cycle,
                                       str(work / "out"), config=config, pipelined=True)
        for n, s in summaries.items():
            recs = read_metrics(s.metrics_path)
            rounds.setdefault(n, []).append(summarise(n, s, recs))
            if not n.endswith("+pre"):
                calib_records += recs
    # the same plans one Spark job per batch (as streaming runs them), side by side
    per_batch = {}
    if args.per_batch_orders:
        pick = list(plans)[:: max(1, len(plans) // args.per_batch_orders)][: args.per_batch_orders]
        log.info("%s: %d plans per batch", qname, len(pick))
        summaries = run_interval_plans(spark, query, {n: plans[n] for n in pick}, lake, start, end, args.cycle,
                                       str(work / "out-per-batch"), config=config, pipelined=False)
        for n, s in summaries.items():
            per_batch[n] = summarise(n, s, read_metrics(s.metrics_path))
    native = None
    if not args.no_native:
        t = time.perf_counter()
        ns = run_interval(spark, query, None, lake, start, end, args.cycle, str(work / "native"), engine="spark-native")
        native = {"result_rows": ns.result_rows, "batch_seconds": ns.batch_seconds,
                  "wall_seconds": time.perf_counter() - t, "max_state_tuples": ns.extra["max_state_tuples"],
                  "join_strategies": ns.extra["join_strategies"], "join_order": ns.extra["join_order"],
                  "micro_batches": ns.extra["micro_batches"]}

    orders = sorted((median_over_rounds(rounds[n]) for n in plans), key=lambda r: r["batch_seconds"])
    prefilter = [median_over_rounds(rounds[n]) for n in pre_plans]

    # one calibration path: mjoin.optimizer.calibrate on the engine's per-step metrics (CPU time)
    calibration = {}
    model = None
    obs = engine_observations(calib_records)
    for field in ("cpu_seconds", "seconds"):
        try:
            m, rep = calibrate(obs, "auto", time_field=field, source=f"bench {qname}")
        except CalibrationError as exc:
            calibration[field] = {"error": str(exc)}
            continue
        calibration[field] = {"model": m.to_json(), "r2": rep["r2"], "correlation": rep["correlation"],
                              "coefficients": rep["coefficients"], "used": rep["used"], "notes": rep["notes"],
                              "overhead_seconds_per_call": rep["overhead_seconds_per_call"]}
        if field == "cpu_seconds":
            model = m
    predicted = predicted_costs(query, stats_by_cycle, plans, model or CostModel(), args.cycle)
    predicted_default = predicted_costs(query, stats_by_cycle, plans, CostModel(), args.cycle)
    for o in orders:
        o["predicted_seconds"] = predicted[o["order"]]
        o["predicted_default_model"] = predicted_default[o["order"]]
    keys = MEASURES + ("lookups", "matches")
    correlation = {"calibrated": rank_correlations(orders, predicted, keys),
                   "default_model": rank_correlations(orders, predicted_default, keys)}

    pre_summary = None
    if prefilter:
        pre_by = {p["order"].removesuffix("+pre"): p for p in prefilter}
        per = [{"order": o["order"], "chain_cpu_seconds_off": o["chain_cpu_seconds"],
                "chain_cpu_seconds_on": pre_by[o["order"]]["chain_cpu_seconds"]
                + pre_by[o["order"]]["prefilter"]["seconds"],
                "batch_seconds_off": o["batch_seconds"], "batch_seconds_on": pre_by[o["order"]]["batch_seconds"],
                "lookups_off": o["lookups"], "lookups_on": pre_by[o["order"]]["lookups"],
                **pre_by[o["order"]]["prefilter"]} for o in orders]
        pre_summary = {
            "per_order": per,
            "median_chain_cpu_ratio_on_off": statistics.median(p["chain_cpu_seconds_on"] / p["chain_cpu_seconds_off"]
                                                               for p in per if p["chain_cpu_seconds_off"]),
            "median_batch_seconds_ratio_on_off": statistics.median(p["batch_seconds_on"] / p["batch_seconds_off"]
                                                                   for p in per if p["batch_seconds_off"]),
            "median_lookups_ratio_on_off": statistics.median(p["lookups_on"] / p["lookups_off"]
                                                             for p in per if p["lookups_off"]),
            "dropped_fraction": per[0]["dropped"] / per[0]["checked"] if per[0]["checked"] else None,
        }
    overhead = None
    if per_batch:
        overhead = {"per_order": [{"order": n, "per_batch_seconds": pb["batch_seconds"],
                                   "pipelined_seconds": next(o["batch_seconds"] for o in orders if o["order"] == n),
                                   "per_batch_task_cpu_seconds": pb["task_cpu_seconds"]}
                                  for n, pb in per_batch.items()]}
        overhead["median_ratio_per_batch_over_pipelined"] = statistics.median(
            p["per_batch_seconds"] / p["pipelined_seconds"] for p in overhead["per_order"])
    rows = {o["result_rows"] for o in orders} | {p["result_rows"] for p in prefilter} \
        | {p["result_rows"] for p in per_batch.values()} | ({native["result_rows"]} if native else set())
    return {
        "benchmark": "engine-24-orders", "mode": "quick" if args.quick else "full",
        "date": datetime.now(timezone.utc).isoformat(), "machine": machine(),
        "load_average_before": list(load_before), "load_average_after": list(os.getloadavg()),
        "versions": versions(), "git_commit": git_commit(), "command": " ".join([sys.executable] + sys.argv),
        "parameters": {"sf": args.sf, "rate_rows_per_s": args.rate, "arrival_cycle_s": args.arrival_cycle,
                       "cycle_s": args.cycle, "interval": [start, end], "batches": (end - start) // args.cycle,
                       "buckets": args.buckets, "master": args.master, "shuffle_partitions": args.partitions,
                       "rounds": args.rounds, "seed": args.seed, "query": qname, "execution": "pipelined"},
        "statistics_seconds": stats_seconds,
        "results_agree": len(rows) == 1, "result_rows": sorted(rows),
        "orders": orders, "spread": spread(orders, keys + ("predicted_seconds",)),
        "rank_correlation_predicted_vs_measured": correlation,
        "calibration": calibration,
        "prefilter": prefilter, "prefilter_summary": pre_summary,
        "per_batch": list(per_batch.values()), "per_batch_vs_pipelined": overhead,
        "native": native,
        "note": "timings on a shared machine are noisy (see load averages); CPU times much less so",
    }


def run(args) -> list:
    from engine_helpers import T0, replay_tpcds

    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    work = Path(args.work or tempfile.mkdtemp(prefix="mjoin-bench-engine-"))
    lake = Lake(str(work / "lake"))
    if not lake.arrivals("customer"):
        info = replay_tpcds(lake, args.sf, rate=args.rate, arrival_cycle=args.arrival_cycle, seed=args.seed)
        end = info["end"]
    else:
        end = max(a for t in ("customer", "store_returns", "web_returns", "catalog_returns")
                  for a in lake.arrivals(t)) + args.arrival_cycle
    spark = get_spark("mjoin-bench-engine", Resources(spark_master=args.master, shuffle_partitions=args.partitions))
    results = []
    try:
        for qname in args.queries:
            query = load_query(qname)
            start = T0 + int(query.max_window)  # full windows from the first batch on
            q_end = start + ((end - start) // args.cycle) * args.cycle
            if args.batches:
                q_end = min(q_end, start + args.batches * args.cycle)
            results.append(run_query(spark, args, lake, qname, start, q_end, work))
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return results


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    orders = result["orders"]
    rc = result["rank_correlation_predicted_vs_measured"]["calibrated"]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.2))
    pred = [o["predicted_seconds"] for o in orders]
    for ax, key, label in ((axes[0], "batch_seconds", "measured wall time of the interval (s)"),
                           (axes[1], "task_cpu_seconds", "measured CPU time of the tasks (s)")):
        ax.scatter(pred, [o[key] for o in orders], color="#4c72b0")
        for o in orders:
            ax.annotate(o["order"], (o["predicted_seconds"], o[key]), fontsize=6, alpha=0.7)
        ax.set_xlabel("predicted probing seconds (calibrated cost model x statistics per cycle)")
        ax.set_ylabel(label)
        ax.set_title(f"{key}: Spearman rho = {rc[key]['rho']:.2f}")
    ax = axes[1]
    ax.scatter(pred, [o["probe_cpu_seconds"] for o in orders], color="#dd8452", marker="x",
               label=f"probing CPU only (rho = {rc['probe_cpu_seconds']['rho']:.2f})")
    ax.legend(fontsize=8)
    by = sorted(orders, key=lambda o: o["predicted_seconds"])
    x = range(len(by))
    axes[2].bar(x, [o["batch_seconds"] for o in by], color="#4c72b0", label="wall time, pipelined (mjoin)")
    axes[2].plot(list(x), [o["task_cpu_seconds"] for o in by], "k.", label="tasks' CPU time")
    pb = {p["order"]: p for p in result.get("per_batch", [])}
    if pb:
        axes[2].plot([i for i, o in enumerate(by) if o["order"] in pb], [pb[o["order"]]["batch_seconds"] for o in by
                                                                          if o["order"] in pb],
                     "rs", label="wall time, one Spark job per batch")
    if result.get("native"):
        axes[2].axhline(result["native"]["batch_seconds"], color="#c44e52", ls="--",
                        label=f"spark-native chained joins ({result['native']['batch_seconds']:.1f}s)")
    axes[2].set_xticks(list(x), [o["order"] for o in by], rotation=90, fontsize=7)
    axes[2].set_ylabel("seconds (median over rounds)")
    axes[2].set_yscale("log")
    axes[2].set_title("orders by predicted cost")
    axes[2].legend(fontsize=7)
    p = result["parameters"]
    fig.suptitle(f"{p['query']}, TPC-DS SF={p['sf']}, {p['batches']} batches of {p['cycle_s']}s, "
                 f"load average {result['load_average_before'][0]:.1f}-{result['load_average_after'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="SF=0.01 smoke test")
    p.add_argument("--sf", type=float, default=None)
    p.add_argument("--rate", type=float, default=None, help="replay rate, rows per second")
    p.add_argument("--arrival-cycle", type=int, default=60)
    p.add_argument("--cycle", type=int, default=60, help="batch length, seconds of event time")
    p.add_argument("--batches", type=int, default=None, help="at most this many batches (default: the whole replay)")
    p.add_argument("--buckets", type=int, default=4)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--orders", type=int, default=24, help="first N of the 24 orders")
    p.add_argument("--per-batch-orders", type=int, default=4,
                   help="also run N orders with one Spark job per batch (0: skip)")
    p.add_argument("--queries", nargs="+", default=list(QUERIES), choices=QUERIES)
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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("mjoin.engine.interval").setLevel(logging.WARNING)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for result in run(args):
        q = result["parameters"]["query"]
        stem = f"orders_{result['mode']}" + ("" if q == QUERIES[0] else f"_{q}")
        (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
        plot(result, out / f"{stem}.png")
        s = result["spread"]
        rc = result["rank_correlation_predicted_vs_measured"]["calibrated"]
        print(f"{q}: {len(result['orders'])} orders, results agree: {result['results_agree']} {result['result_rows']}")
        for k in MEASURES + ("lookups", "matches", "predicted_seconds"):
            line = f"  {k:>18}: best {s[k]['best']:.4g} worst {s[k]['worst']:.4g} (x{s[k]['ratio'] or 0:.2f})"
            if k in rc:
                line += f"; Spearman rho with predicted {rc[k]['rho']:.2f}"
            print(line)
        c = result["calibration"].get("cpu_seconds", {})
        if "model" in c:
            print(f"  calibration (CPU): alpha_q {c['model']['alpha_q']:.3g}s, alpha_m {c['model']['alpha_m']:.3g}s, "
                  f"c {c['model']['c']:.3g}, per call {c['overhead_seconds_per_call']:.3g}s, R^2 {c['r2']:.2f}")
        if result["per_batch_vs_pipelined"]:
            print(f"  one job per batch / pipelined: x{result['per_batch_vs_pipelined']['median_ratio_per_batch_over_pipelined']:.2f}")
        if result["prefilter_summary"]:
            ps = result["prefilter_summary"]
            print(f"  prefilter: drops {ps['dropped_fraction']:.0%} of the new tuples; lookups "
                  f"x{ps['median_lookups_ratio_on_off']:.2f}, chain CPU x{ps['median_chain_cpu_ratio_on_off']:.2f}, "
                  f"wall x{ps['median_batch_seconds_ratio_on_off']:.2f}")
        if result["native"]:
            print(f"  spark-native: {result['native']['batch_seconds']:.2f}s in batches")
        print(f"  wrote {out / stem}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
