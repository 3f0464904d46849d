"""Benchmark: PMJoin key groups chosen by the loop against one group, on a skewed drifting workload and TPC-DS.

    flock /tmp/mjoin-bench.lock .venv/bin/python bench/partition/bench_partition.py          # ~30-60 min on 2 cores
    flock /tmp/mjoin-bench.lock .venv/bin/python bench/partition/bench_partition.py --quick  # smoke run

Per workload, for each interval ``[t_k, t_k + P)`` after a warm-up, the plans the loop could deploy at ``t_k``
(statistics known before ``t_k`` only), side by side in ONE run of the engine's interval evaluation
(``run_interval_plans``: the input read once, the same warm state):

- ``D1``: one group, ``exact`` on the Holt forecast (the loop without partitioning);
- ``D1_oracle``: one group, ``exact`` on the interval's own statistics (the best single-group plan in hindsight);
- ``<method><D>``: the rule of ``method`` (hash, range, rate, cost) with ``D`` = 2, 4, 8, 16 groups made from the
  per-cell statistics of the period before ``t_k`` (``mjoin.optimizer.partitioning.optimize_partitioned``, D forced), every
  group's orders by ``exact`` on the forecast of its groups (re-aggregated history);
- ``chosen``: the loop's own choice (method and D auto: the cheapest by the cost model with the per-group
  overhead, priced out of sample; one group unless partitioning pays).

The cost model is calibrated on this machine from unmeasured warm-up runs of the first interval (NNLS of the
probe steps' CPU time, ``mjoin.optimizer.calibrate``), and a probe chain's fixed cost is measured from the same metrics
(``chain_overhead_from_metrics``): what the loop refits from the live job. Rounds run the plans in a fresh
random order each; medians over rounds. Per plan: engine time (the batches' wall time), task CPU (the
operator tasks' thread CPU: the whole join work), chain and probe CPU, lookups and matches (probe work), key
groups; every plan's results must have the same count and fingerprint (``result_fingerprint``).

Workloads:

- ``stripes``: the generator's ``stripes`` preset (``python -m mjoin generate synthetic --schedule stripes``): key
  residues mod 32 are stripes, s1 hot on 14 of them and s2 on 14 others (10^9 x), s0 uniform and dense, s3
  uniform and sparse; the hot stripes drift by 2 over the run. s0's tuples must probe s2 first on s1's stripes
  and s1 first on s2's: one order fetches the hot stream's key list for a part of them. A key hot in one striped
  stream is cold in the other, so there are next to no results (their equality is checked all the same; the
  TPC-DS part and tests/test_partition_engine.py compare non-empty results).
- ``stripes@<domain>``: the same on ``<domain>`` distinct keys (``--domain``, default 512, for ``stripes``): fewer keys
  put more tuples of the hot stream on each hot key, so the wrong order's probe work is a larger share of the
  engine's work (``stripes@256``: 8 keys per stripe instead of 16).
- ``tpcds``: the seed query ``tpcds_returns_by_address`` on the paper's TPC-DS replay (uniform surrogate keys):
  no key group favours another order, so the loop should keep one group.

Writes ``bench/partition/results/partition[-quick].json`` (machine, load before/after, versions, git commit,
date, parameters, every measurement, the summary) and a ``.png``.
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
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))
sys.path.insert(0, str(PROJECT / "tests"))  # the paper's TPC-DS replay (engine_helpers)

log = logging.getLogger("bench.partition")
METHODS = ("hash", "range", "rate", "cost")
COUNTS = (2, 4, 8, 16)


def versions() -> dict:
    import numpy
    import pyarrow
    import pyspark
    import scipy
    import statsmodels

    return {"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__, "numpy": numpy.__version__,
            "scipy": scipy.__version__, "statsmodels": statsmodels.__version__, "python": platform.python_version()}


# ---- workloads ----------------------------------------------------------------------------------------

def stripes_workload(work: Path, args, domain: int):
    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query
    from mjoin.workloads.synthetic import generate_synthetic
    from mjoin.workloads.lander import land

    window, period = args.window, args.period
    duration = window + period + args.intervals * period
    gen = work / f"stripes-{domain}"
    generate_synthetic(gen, streams=4, duration=f"{duration}s", schedule="stripes", rate=args.rate,
                       domain=domain, window=f"{window}s", cycle="10s", seed=args.seed)
    lake = Lake(str(work / f"stripes-{domain}-lake"))
    land(gen, lake, None)
    t0 = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp())
    first = t0 + window + period  # a full window of state and one period of statistics before the first interval
    params = {"schedule": "stripes", "rate": args.rate, "domain": domain, "window_s": window, "duration_s": duration,
              "seed": args.seed}
    return load_query(str(gen / "query.yaml")), lake, t0, first, params


def tpcds_workload(work: Path, args):
    from engine_helpers import T0, replay_tpcds
    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query

    lake = Lake(str(work / "tpcds-lake"))
    info = replay_tpcds(lake, args.sf, rate=args.tpcds_rate, arrival_cycle=10)
    q = load_query("tpcds_returns_by_address")
    window = max(s.window for s in q.streams)
    first = T0 + int(min(window, info["end"] - T0 - args.intervals * args.period))
    params = {"sf": args.sf, "replay_rate": args.tpcds_rate, "rows": info["rows"], "end": info["end"]}
    return q, lake, T0, first, params


# ---- plans of one interval ------------------------------------------------------------------------------

def cells_of(root, q, a, b) -> dict:
    from mjoin.optimizer.partitioning import Cells
    from mjoin.stats.history import CELL_KINDS, read_cells
    from mjoin.model.timeutil import iso

    out = {}
    for kind in CELL_KINDS:
        rows = read_cells(root, q.name, kind, start=a, end=b)
        rules = rows.attrs.get("rules") or {}
        if len(rows) and rules:
            newest = rules[max(rules)]
            keep = rows["cycle_start"].map(iso).isin({c for c, r in rules.items() if r == newest})
            out[kind] = Cells.from_rows(kind, newest, rows[keep])
    return out


def interval_plans(q, root, t, t_end, args, model, overhead) -> tuple[dict, dict]:
    """``({name: Plan}, {name: info})`` the loop could deploy at ``t`` (see the module doc)."""
    from mjoin.forecast.holt import forecast
    from mjoin.optimizer.partitioning import optimize_partitioned
    from mjoin.optimizer.strategies import optimize
    from mjoin.model.statistics import aggregate_rows
    from mjoin.stats.cells import history_for_rule
    from mjoin.stats.history import read_history

    memo = {}

    def stats_for(rule):
        key = json.dumps(rule, sort_keys=True)
        if key not in memo:
            hist, _ = history_for_rule(root, q.name, rule, start=t - timedelta(seconds=args.length * 10), end=t)
            memo[key] = forecast(hist, t, length=args.length).statistics
        return memo[key]

    cells = cells_of(root, q, t - timedelta(seconds=args.period), t)
    plans, info = {}, {}
    plans["D1"] = optimize(q, stats_for(None), "exact", cost_model=model, partitioning={})
    inside = read_history(root, q.name, start=t, end=t_end)
    plans["D1_oracle"] = optimize(q, aggregate_rows(inside.to_dict("records")), "exact", cost_model=model,
                                  partitioning={})
    for method in METHODS:
        for D in COUNTS:
            plan, ch = optimize_partitioned(q, cells, "exact", methods=(method,), counts=(1, D), forced=True,
                                            cost_model=model, overhead=overhead, stats_for=stats_for)
            if ch.groups > 1:
                plans[f"{method}{D}"] = plan
                info[f"{method}{D}"] = {"groups": ch.groups, "price": ch.price, "method": method, "D": D}
    t_c = time.perf_counter()
    plans["chosen"], ch = optimize_partitioned(q, cells, "exact", cost_model=model, overhead=overhead,
                                               stats_for=stats_for)
    info["chosen"] = {"method": ch.method, "groups": ch.groups, "price": ch.price, "baseline": ch.baseline,
                      "gain": ch.gain, "rule": ch.rule, "choose_seconds": time.perf_counter() - t_c,
                      "candidates": [c.to_json() for c in ch.candidates]}
    info["D1"] = {"groups": 1}
    info["D1_oracle"] = {"groups": 1}
    return plans, info


# ---- measuring ----------------------------------------------------------------------------------------

def summarise(summary, records) -> dict:
    steps = [st for r in records for c in r["chains"] for st in c["steps"]]
    return {"batch_seconds": summary.batch_seconds,
            "task_cpu_seconds": sum(r.get("task_cpu_seconds", 0.0) for r in records),
            "chain_cpu_seconds": sum(c.get("cpu_seconds", 0.0) for r in records for c in r["chains"]),
            "probe_cpu_seconds": sum(st.get("cpu_seconds", 0.0) for st in steps),
            "lookups": sum(st["lookups"] for st in steps), "matches": sum(st["matches"] for st in steps),
            "probe_work": sum(st["lookups"] + st["matches"] for st in steps),
            "chains": sum(st.get("calls", 0) for r in records for c in r["chains"] for st in c["steps"][:1]),
            "result_rows": summary.result_rows}


def calibrate_here(spark, q, lake, t, t_end, plans, work, config):
    """Unmeasured warm-up runs of the first interval; the cost model and the chain cost from their metrics."""
    from mjoin.optimizer.calibrate import CalibrationError, calibrate, engine_observations
    from mjoin.optimizer.cost import CostModel, GroupOverhead
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.interval import run_interval_plans
    from mjoin.optimizer.partitioning import chain_overhead_from_metrics

    res = run_interval_plans(spark, q, plans, lake, t, t_end, 10, str(work / "calibration"), config=config)
    records = [r for s in res.values() for r in read_metrics(s.metrics_path)]
    try:
        model, rep = calibrate(engine_observations(records), "sorted", time_field="cpu_seconds",
                               source="bench partition warm-up")
        calib = {"model": model.to_json(), "r2": rep["r2"], "overhead_seconds_per_call": rep["overhead_seconds_per_call"]}
    except CalibrationError as exc:
        model, calib = CostModel(), {"error": str(exc)}
    per_chain = chain_overhead_from_metrics(records)
    overhead = GroupOverhead.for_model(model, batch_seconds=10.0, buckets=config.buckets,
                                       **({"per_chain": per_chain} if per_chain is not None else {}))
    calib["group_overhead"] = overhead.to_json()
    calib["chain_seconds"] = overhead.chain_seconds(len(q.stream_names))  # what the choice prices a chain at
    return model, overhead, calib


def run_workload(spark, name, args, work: Path) -> dict:
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.interval import run_interval_plans
    from mjoin.engine.results import result_fingerprint
    from mjoin.evaluation.evaluate import plan_signature
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.stats.history import history_root
    from mjoin.stats.job import StatsConfig, run_statistics
    from mjoin.model.timeutil import iso

    if name.startswith("stripes"):  # stripes or stripes@<domain>
        q, lake, t0, first, params = stripes_workload(work, args, int(name.partition("@")[2] or args.domain))
    elif name == "tpcds":
        q, lake, t0, first, params = tpcds_workload(work, args)
    else:
        raise SystemExit(f"unknown workload {name!r} (stripes, stripes@<domain>, tpcds)")
    config = EngineConfig()
    start = datetime.fromtimestamp(first, timezone.utc)
    spans = [(start + timedelta(seconds=k * args.period), start + timedelta(seconds=(k + 1) * args.period))
             for k in range(args.intervals)]
    root = history_root(lake)
    t = time.perf_counter()
    run_statistics(spark, q, lake, datetime.fromtimestamp(t0, timezone.utc), spans[-1][1], 10, config=StatsConfig())
    stats_seconds = time.perf_counter() - t
    # calibration on the period before the first interval (never measured)
    warm = {"".join(p): make_plan(q, orders_from_permutation(q, p), "fixed")
            for p in (q.stream_names, q.stream_names[::-1], q.stream_names[1:] + q.stream_names[:1])}
    model, overhead, calib = calibrate_here(spark, q, lake, spans[0][0] - timedelta(seconds=args.period),
                                            spans[0][0], warm, work / name.replace("@", "-"), config)
    log.info("%s: calibrated %s; group overhead %s", name, calib.get("model"), calib["group_overhead"])
    intervals = []
    rng = random.Random(args.seed)
    for k, (a, b) in enumerate(spans):
        t = time.perf_counter()
        plans, info = interval_plans(q, root, a, b, args, model, overhead)
        plan_seconds = time.perf_counter() - t
        unique, alias = {}, {}
        for n, p in plans.items():
            sig = plan_signature(p)
            alias[n] = unique.setdefault(sig, (n, p))[0]
        runs = {n: [] for n, _ in unique.values()}
        prints = {}
        for rnd in range(args.rounds):
            names = [n for n, _ in unique.values()]
            rng.shuffle(names)
            res = run_interval_plans(spark, q, {n: plans[n] for n in names}, lake, a, b, 10,
                                     str(work / f"{name.replace('@', '-')}-out"), config=config)
            for n, s in res.items():
                runs[n].append(summarise(s, read_metrics(s.metrics_path)))
                prints.setdefault(n, result_fingerprint(s.results_path))
        if len({json.dumps(v, sort_keys=True) for v in prints.values()}) != 1:
            raise RuntimeError(f"{name} interval {k}: plans returned different results {prints}")
        rows = {}
        for n in plans:
            r = runs[alias[n]]
            med = {key: statistics.median(x[key] for x in r) for key in r[0]}
            med.update({f"{key}_runs": [x[key] for x in r] for key in ("batch_seconds", "task_cpu_seconds")})
            rows[n] = {**med, **info.get(n, {}), "same_plan_as": alias[n] if alias[n] != n else None,
                       "groups": len(plans[n].group_ids)}
        intervals.append({"interval": k, "start": iso(a), "end": iso(b), "plans": rows,
                          "result_fingerprint": next(iter(prints.values())), "plan_seconds": plan_seconds})
        log.info("%s interval %d: chosen %s D=%s; task CPU chosen %.2f s, D1 %.2f s, D1_oracle %.2f s", name, k,
                 info["chosen"]["method"], info["chosen"]["groups"], rows["chosen"]["task_cpu_seconds"],
                 rows["D1"]["task_cpu_seconds"], rows["D1_oracle"]["task_cpu_seconds"])
    return {"workload": name, "query": q.name, "params": params, "intervals_s": args.period,
            "stats_seconds": stats_seconds, "calibration": calib, "intervals": intervals,
            "summary": summarise_workload(intervals)}


def summarise_workload(intervals) -> dict:
    names = list(intervals[0]["plans"])
    tot = {n: {k: sum(iv["plans"][n][k] for iv in intervals if n in iv["plans"])
               for k in ("batch_seconds", "task_cpu_seconds", "chain_cpu_seconds", "probe_cpu_seconds", "probe_work",
                         "chains")} for n in names}
    # spread: each round's total (rounds are aligned by index)
    for n in names:
        runs = [iv["plans"][n]["task_cpu_seconds_runs"] for iv in intervals if n in iv["plans"]]
        tot[n]["task_cpu_seconds_rounds"] = [sum(r[i] for r in runs) for i in range(min(len(r) for r in runs))]
    best_single = min(("D1", "D1_oracle"), key=lambda n: tot[n]["task_cpu_seconds"])
    # what a chain more costs the tasks, its lookups' fixed cost included: task CPU = a_interval + b chains + c probe
    # work (least squares over every interval and distinct plan), to compare with the priced chain cost
    import numpy as np

    X, y = [], []
    for k, iv in enumerate(intervals):
        for n, p in iv["plans"].items():
            if p.get("same_plan_as"):
                continue
            X.append([float(j == k) for j in range(len(intervals))] + [p["chains"], p["probe_work"]])
            y.append(p["task_cpu_seconds"])
    coef = np.linalg.lstsq(np.asarray(X), np.asarray(y), rcond=None)[0] if len(y) > len(intervals) + 2 else None
    chosen = tot["chosen"]["task_cpu_seconds"]
    return {"totals": tot, "best_single_group": best_single,
            "chosen_vs_best_single_task_cpu": chosen / tot[best_single]["task_cpu_seconds"] - 1,
            "chosen_vs_D1_task_cpu": chosen / tot["D1"]["task_cpu_seconds"] - 1,
            "chosen_vs_D1_batch_seconds": tot["chosen"]["batch_seconds"] / tot["D1"]["batch_seconds"] - 1,
            "chosen_groups": [iv["plans"]["chosen"]["groups"] for iv in intervals],
            "chosen_methods": [iv["plans"]["chosen"]["method"] for iv in intervals],
            "chain_task_cpu_marginal_seconds": None if coef is None else float(coef[-2]),
            "probe_work_task_cpu_marginal_seconds": None if coef is None else float(coef[-1])}


def plot(doc, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(doc["workloads"]), figsize=(6.5 * len(doc["workloads"]), 4.5), squeeze=False)
    for ax, w in zip(axes[0], doc["workloads"]):
        tot = w["summary"]["totals"]
        xs = [1] + list(COUNTS)
        for m in METHODS:
            ax.plot(xs, [tot["D1"]["task_cpu_seconds"]] + [tot.get(f"{m}{d}", {}).get("task_cpu_seconds", float("nan"))
                                                            for d in COUNTS], marker="o", label=m)
        ax.axhline(tot["chosen"]["task_cpu_seconds"], color="k", ls="--", label="loop's choice")
        ax.axhline(tot["D1_oracle"]["task_cpu_seconds"], color="grey", ls=":", label="one group, hindsight")
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("key groups D")
        ax.set_ylabel("task CPU over the intervals (s, median of rounds)")
        s = w["summary"]
        ax.set_title(f"{w['workload']}: choice {s['chosen_vs_best_single_task_cpu']:+.0%} vs best one-group")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small smoke run")
    p.add_argument("--workloads", default="stripes,tpcds")
    p.add_argument("--intervals", type=int, default=None)
    p.add_argument("--period", type=int, default=60, help="interval length, seconds (default 60)")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--rate", type=float, default=None, help="stripes: base rate (s1, s2 tuples/s)")
    p.add_argument("--window", type=int, default=120, help="stripes: every stream's window, seconds (default 120)")
    p.add_argument("--domain", type=int, default=512, help="stripes: distinct keys (default 512)")
    p.add_argument("--sf", type=float, default=None, help="tpcds: scale factor")
    p.add_argument("--tpcds-rate", type=float, default=None, help="tpcds: replay rate, tuples/s")
    p.add_argument("--length", type=int, default=30, help="L: cycles the forecasts read")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--tag", default="", help="suffix of the result files (partition-<tag>.json)")
    p.add_argument("--work", default=None, help="work folder (default: a temporary one, removed)")
    args = p.parse_args(argv)
    q = args.quick
    args.intervals = args.intervals or (2 if q else 4)
    args.rounds = args.rounds or (1 if q else 3)
    args.rate = args.rate or (480.0 if q else 640.0)
    args.sf = args.sf or (0.1 if q else 1.0)
    args.tpcds_rate = args.tpcds_rate or (200.0 if q else 1000.0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    from mjoin.engine.metrics import git_commit, machine
    from mjoin.runtime.spark import get_spark

    load_before = os.getloadavg()
    started = datetime.now(timezone.utc)
    work = Path(args.work or tempfile.mkdtemp(prefix="mjoin-bench-partition-"))
    spark = get_spark("bench-partition")
    workloads = []
    try:
        for name in [w.strip() for w in args.workloads.split(",") if w.strip()]:
            workloads.append(run_workload(spark, name, args, work))
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    doc = {"benchmark": "partition", "date": started.isoformat(), "machine": machine(), "load_before": load_before,
           "load_after": os.getloadavg(), "git_commit": git_commit(PROJECT), "versions": versions(),
           "parameters": {k: v for k, v in vars(args).items() if k != "work"},
           "seconds": (datetime.now(timezone.utc) - started).total_seconds(), "workloads": workloads}
    out = HERE / "results" / (("partition-quick" if q else "partition") + (f"-{args.tag}" if args.tag else "") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    plot(doc, out.with_suffix(".png"))
    for w in workloads:
        s = w["summary"]
        print(f"{w['workload']}: loop's choice {s['chosen_methods']} D={s['chosen_groups']}; task CPU "
              f"{s['chosen_vs_best_single_task_cpu']:+.1%} vs the best one-group plan ({s['best_single_group']}), "
              f"{s['chosen_vs_D1_task_cpu']:+.1%} vs D1; engine time {s['chosen_vs_D1_batch_seconds']:+.1%} vs D1; "
              f"a chain costs {s['chain_task_cpu_marginal_seconds'] or float('nan'):.3g} s of task CPU "
              f"(priced {w['calibration']['chain_seconds']:.3g} s)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
