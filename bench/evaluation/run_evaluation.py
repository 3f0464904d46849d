"""The evaluation: the seed experiment, drift, sensitivity, the peers and the loop's overhead, in one script.

    python bench/evaluation/run_evaluation.py --quick          # minutes: sf 0.1, a 7-minute replay, few orders
    flock /tmp/mjoin-bench.lock nice -n 5 python bench/evaluation/run_evaluation.py            # the full run
    python bench/evaluation/run_evaluation.py --sections paper drift --sf 1        # a part of it
    python bench/evaluation/run_evaluation.py --plot-only results/evaluation.json     # redraw the plots

Writes ``bench/evaluation/results/evaluation[_quick][_<tag>].json`` (machine, load before/after per section, versions,
git commit, date, parameters, every measurement with its repetitions) and ``.png`` plots beside it.

**What runs per cycle** (``mjoin.evaluation.cycle_loop``, the steps of one ``mjoin_reoptimize`` run, every statistics
cycle tau instead of every period): after cycle k has landed, the statistics job for cycle k
(``run_statistics``, appended to an append-only history) -> statistics gate (great-expectations) -> Holt
forecast of cycle k+1 over the last L cycles -> forecast gate -> per strategy: optimize (on the forecast;
``dppick_nosmooth`` on the last value; ``oracle`` = exact on batch k+1's own measured statistics) -> plan gate
against that strategy's active plan (5% improvement threshold: the hysteresis) -> the plan that passed runs
batch k+1 (the engine switches at batch boundaries; batch = cycle). The cost model is the one calibrated on this
machine by bench/engine (``results/orders_full.json``, per-step CPU time), the same for every strategy.

**What the engine measures**: every workload's interval is run by the engine (pipelined interval runs, one per
plan, after an unmeasured warm-up run) for a set of fixed orders whose chains cover every probe order of every
stream (all 24 for the paper's table; the 6 of ``cycle_loop.covering_orders`` elsewhere), R repetitions in a
fresh random order. Per batch, a plan's work is a plan-independent base (input, state, writing) plus one chain
per stream that depends only on that stream's order, so the cost of any schedule of plans switching at batch
boundaries is composed from those runs (``cycle_loop.compose``): lookups and matches exactly, CPU and time as
measured. A real switching run (one Spark job per batch, the loop's plan per batch, as the streaming job runs
after hot switches) checks the composition: its lookups and matches must equal the composed ones, its results
the fixed orders' (count + fingerprint over all output columns).

Sections (``--sections``): ``paper`` (seed query sf 1 [and --sf 10], the two-class query, the selective
workload of bench/engine/selective.py), ``sensitivity`` (cycle length tau and history length L on the seed
query), ``drift`` (the drifting presets), ``peers`` (Spark's chained joins, Flink 2.3 MultiJoin / binary joins /
interval joins, DuckDB; identical results), ``overhead`` (from the paper section's loop; and the DAG's period).
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
sys.path.insert(0, str(PROJECT / "tests"))  # engine_helpers.reference_sql: DuckDB's reference query
sys.path.insert(0, str(PROJECT / "bench" / "engine"))  # selective.schedule
sys.path.insert(0, str(HERE))

log = logging.getLogger("bench.evaluation")
FLINK_PY = HERE / ".flink-venv" / "bin" / "python"
PRIOR_MODEL = PROJECT / "bench" / "engine" / "results" / "orders_full.json"
STRATEGIES = ("fixed", "selectivity_first", "greedy", "dppick", "exact", "dppick_query", "dppick_match",
              "dppick_nosmooth", "oracle", "ajosc")  # ajosc: the peer of mjoin.optimizer.ajosc, on the same forecasts
BASELINES = ("fixed", "selectivity_first", "greedy", "dppick_query", "dppick_match", "dppick_nosmooth")
SEED, TWO_CLASS = "tpcds_returns_by_address", "tpcds_returns_by_customer_and_address"
DRIFT_PRESETS = ("stationary", "rate-swap", "match-drift", "skew-drift", "burst", "mixed", "hot-rotate", "hot-ramp",
                 "hot-burst", "twoclass-step", "twoclass-burst")
#: The presets where the order decides the work (a hot stream, sparse filters) run at this multiple of the base rate
#: (their rates' mean): the fan-out into the hot stream, not the per-call overhead, must dominate the chains.
DRIFT_RATE_FACTOR = {"hot-rotate": 10.0, "hot-ramp": 10.0, "hot-burst": 10.0, "twoclass-step": 10.0,
                     "twoclass-burst": 10.0}
MEASURES = ("cpu", "chain_cpu", "wall", "work")  # composed task CPU, its chains' part, engine time, lookups + matches


# ---- provenance -----------------------------------------------------------------------------------

def versions() -> dict:
    import duckdb
    import great_expectations
    import numpy
    import pyarrow
    import pyspark
    import statsmodels

    out = {"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__, "numpy": numpy.__version__,
           "duckdb": duckdb.__version__, "statsmodels": statsmodels.__version__,
           "great_expectations": great_expectations.__version__, "python": platform.python_version()}
    if FLINK_PY.exists():
        r = subprocess.run([str(FLINK_PY), "-c", "from importlib.metadata import version; print(version('apache-flink'))"],
                           capture_output=True, text=True)
        out["apache-flink"] = r.stdout.strip() or None
    java = subprocess.run(["java", "-version"], capture_output=True, text=True)
    out["java"] = (java.stderr or java.stdout).splitlines()[0] if (java.stderr or java.stdout) else None
    return out


def provenance() -> dict:
    from mjoin.engine.metrics import git_commit, machine

    return {"date": datetime.now(timezone.utc).isoformat(), "machine": machine(), "versions": versions(),
            "git_commit": git_commit(str(PROJECT)), "command": " ".join([sys.executable] + sys.argv)}


class Section:
    """Load average before and after, and the duration, of one part of the run."""

    def __init__(self, name: str, doc: dict):
        self.name, self.doc = name, doc

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.doc["load_average_before"] = list(os.getloadavg())
        log.info("== %s (load %.1f)", self.name, os.getloadavg()[0])
        return self.doc

    def __exit__(self, *exc):
        self.doc["load_average_after"] = list(os.getloadavg())
        self.doc["seconds"] = time.perf_counter() - self.t0
        log.info("== %s done in %.0f s", self.name, self.doc["seconds"])


def spread(values: list) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "runs": values}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "runs": values}


# ---- workloads ------------------------------------------------------------------------------------

def tpcds_workload(work: Path, sf: float, duration: str | None, rate: float | None = None) -> Path:
    """The paper's replay of TPC-DS at ``sf``, generated once into ``work``: lasting ``duration`` (default 1 h) or
    at ``rate`` total tuples/s (then it lasts the rows / rate; the folder name says the rate)."""
    from mjoin.workloads.tpcds_replay import generate_tpcds
    from mjoin.workloads.manifest import load_manifest

    out = work / (f"tpcds-sf{sf:g}" + (f"-{duration}" if duration else "") + (f"-r{rate:g}" if rate else ""))
    if not (out / "manifest.json").exists():
        t = time.perf_counter()
        generate_tpcds(out, sf=sf, duration=duration, rate=rate, overwrite=True)
        log.info("generated TPC-DS sf %g in %.0f s", sf, time.perf_counter() - t)
    load_manifest(out)
    return out


def synthetic_workload(work: Path, preset: str, duration: str, rate: float, domain: int, window: str) -> Path:
    from mjoin.workloads.synthetic import generate_synthetic

    out = work / f"syn-{preset}-{duration}"
    if not (out / "manifest.json").exists():
        generate_synthetic(out, streams=4, duration=duration, rate=rate, domain=domain, schedule=preset,
                           window=window, seed=5, overwrite=True)
    return out


def selective_workload(work: Path, quick: bool) -> Path:
    from selective import schedule

    from mjoin.workloads.synthetic import generate_synthetic

    domain, duration = (240, "3m") if quick else (2400, "6m")
    out = work / f"selective-{domain}-{duration}"
    if not (out / "manifest.json").exists():
        generate_synthetic(out, streams=4, duration=duration, window="60s", cycle="10s", seed=11, name="selective_4",
                           schedule=schedule(domain, 60, 50.0, 0.3, 0.01, 0.01), overwrite=True)
    return out


def spec_of(workload: Path, name: str | None):
    from mjoin.model.query import load_query

    return load_query(name) if name else load_query(str(workload / "query.yaml"))


def span_of(workload: Path, tau: int, limit: float | None = None) -> tuple[int, int]:
    from mjoin.workloads.manifest import load_manifest

    m = load_manifest(workload)
    start, end = int(m.start_epoch), int(m.end_epoch)
    if limit:
        end = min(end, start + int(limit))
    return start, start + ((end - start) // tau) * tau


# ---- the engine -------------------------------------------------------------------------------------

def measure_orders(spark, query, lake, start: int, end: int, tau: int, orders: list, reps: int, work: Path,
                   seed: int, warmup: bool = True) -> dict:
    """The fixed plans of ``orders`` over ``[start, end)``, ``reps`` rounds in a fresh random order each (after an
    unmeasured warm-up run): per round the merged chain and base costs, per plan its measured totals."""
    from mjoin.evaluation.cycle_loop import chain_costs, merge_runs
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.interval import run_interval_plans
    from mjoin.engine.results import result_fingerprint
    from mjoin.model.plan import make_plan, orders_from_permutation

    config = EngineConfig(buckets=4)
    plans = {"".join(o): make_plan(query, orders_from_permutation(query, list(o)), "fixed") for o in orders}
    first = next(iter(plans))
    t = time.perf_counter()
    if warmup:
        run_interval_plans(spark, query, {first: plans[first]}, lake, start, end, tau, str(work / "warmup"),
                           config=config)
    warmup = time.perf_counter() - t
    rng = random.Random(seed)
    rounds, per_plan, rows, fps = [], {n: [] for n in plans}, set(), {}
    for r in range(reps):
        names = list(plans)
        rng.shuffle(names)
        t = time.perf_counter()
        summ = run_interval_plans(spark, query, {n: plans[n] for n in names}, lake, start, end, tau,
                                  str(work / "orders"), config=config)
        log.info("%s: round %d/%d of %d plans in %.0f s", query.name, r + 1, reps, len(plans), time.perf_counter() - t)
        runs = []
        for n, s in summ.items():
            recs = read_metrics(s.metrics_path)
            runs.append(chain_costs(recs, query.stream_names))
            rows.add(s.result_rows)
            if r == 0:
                fps[n] = result_fingerprint(s.results_path)
            per_plan[n].append({"result_rows": s.result_rows, "batch_seconds": s.batch_seconds,
                                "wall_seconds": s.wall_seconds, "prepare_seconds": s.prepare_seconds,
                                "task_cpu_seconds": sum(x.get("task_cpu_seconds", 0.0) for x in recs),
                                "chain_cpu_seconds": sum(c.get("cpu_seconds", 0.0) for x in recs for c in x["chains"]),
                                "lookups": sum(st["lookups"] for x in recs for c in x["chains"] for st in c["steps"]),
                                "matches": sum(st["matches"] for x in recs for c in x["chains"] for st in c["steps"]),
                                "max_state_tuples": max((sum(x["state_tuples"].values()) for x in recs), default=0)})
        rounds.append(merge_runs(runs))
    distinct_fp = {json.dumps(v, sort_keys=True) for v in fps.values()}
    return {"plans": plans, "rounds": rounds, "per_plan": per_plan, "result_rows": sorted(rows),
            "fingerprints": fps, "results_agree": len(rows) == 1 and len(distinct_fp) == 1,
            "warmup_seconds": warmup, "batch_ids": list(range(1, (end - start) // tau + 1))}


def switching_run(spark, query, lake, start: int, end: int, tau: int, schedule: list, plans: dict, out: Path) -> dict:
    """The engine running ``schedule`` (a plan key per batch) for real: one Spark job per batch with the loop's
    plan of that batch, as the streaming job runs batches after hot switches (``BatchRunner.run``)."""
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.batch import BatchRunner
    from mjoin.engine.sparkplan import apply_engine_conf, restore_conf
    from mjoin.engine.inputs import as_lake, compile_plan
    from mjoin.engine.interval import _cycles, clear_outputs, prepare_interval, warm_up
    from mjoin.engine.results import result_fingerprint

    config = EngineConfig(buckets=4)
    compiled = {k: compile_plan(query, plans[k], config) for k in set(schedule)}
    before = apply_engine_conf(spark)
    prepared = None
    t0 = time.perf_counter()
    try:
        out_lake = as_lake(str(out))
        clear_outputs(out_lake, query.name)
        runner = BatchRunner(spark, query, out_lake, config, mode="interval")
        prepared = prepare_interval(spark, query, runner, as_lake(lake), start, end, tau)
        warm_up(runner, compiled[schedule[0]], prepared)
        bounds, extras = _cycles(prepared)
        recs = [runner.run(b, prepared.batch_input(b), compiled[schedule[b - 1]], purge_bound=bounds[b],
                           extra=extras[b]) for b in range(1, prepared.n_batches + 1)]
    finally:
        if prepared is not None:
            prepared.release()
        restore_conf(spark, before)
    steps = [st for r in recs for c in r["chains"] for st in c["steps"]]
    switches = sum(1 for a, b in zip(schedule, schedule[1:]) if a != b)
    return {"batches": len(recs), "plan_switches": switches, "seconds": time.perf_counter() - t0,
            "lookups": sum(st["lookups"] for st in steps), "matches": sum(st["matches"] for st in steps),
            "task_cpu_seconds": sum(r.get("task_cpu_seconds", 0.0) for r in recs),
            "batch_seconds": sum(r.get("wall_seconds", 0.0) for r in recs),
            "result_rows": sum(r["result_rows"] for r in recs), "fingerprint": result_fingerprint(runner.results_root)}


# ---- the loop and the composed costs ------------------------------------------------------------------

def cost_model():
    from mjoin.optimizer.cost import CostModel

    doc = json.loads(PRIOR_MODEL.read_text())
    return CostModel.from_json(doc["calibration"]["cpu_seconds"]["model"])


def run_loop(spark, query, lake, start, end, tau, length, orders, strategies, work: Path, gates=None,
             history: Path | None = None):
    from mjoin.evaluation.cycle_loop import LoopSettings, replay

    settings = LoopSettings(strategies=tuple(strategies), length=length, cycle=float(tau), gates=gates or {},
                            cost_model=cost_model())
    t = time.perf_counter()
    sched = replay(spark, query, lake, start, end, settings, orders, history_root=str(history or work / "history"),
                   reuse_history=history is not None)
    log.info("%s: loop over %d cycles in %.0f s", query.name, len(sched.batches), time.perf_counter() - t)
    return sched


def compose_all(sched, measured: dict) -> dict:
    """Per (initial order, strategy), gated and ungated: composed cost per round, then median and spread."""
    from mjoin.evaluation.cycle_loop import compose

    out = {}
    for kind in ("gated", "ungated"):
        table = getattr(sched, kind)
        for (order, strat), keys in table.items():
            per_round = [compose(keys, sched.plans, ch, base, measured["batch_ids"]) for ch, base in measured["rounds"]]
            out[(kind, order, strat)] = {
                "cpu": spread([c["cpu"] for c in per_round]), "wall": spread([c["wall"] for c in per_round]),
                "chain_cpu": spread([c["chain_cpu"] for c in per_round]),
                "work": per_round[0]["lookups"] + per_round[0]["matches"],
                "lookups": per_round[0]["lookups"], "matches": per_round[0]["matches"],
                "chains_not_measured": per_round[0]["chains_not_measured"],
                "per_batch_cpu": [statistics.median(v) for v in zip(*[c["per_batch_cpu"] for c in per_round])],
                "per_batch_chain_cpu": [statistics.median(v) for v in zip(*[c["per_batch_chain_cpu"]
                                                                            for c in per_round])],
                "plan_changes": sum(1 for a, b in zip(keys, keys[1:]) if a != b),
                "distinct_plans": len(set(keys))}
    return out


def paper_measures(costs: dict, orders: list, measure: str) -> dict:
    """The paper's way: per initial order, which strategy is fastest; dppick's reduction against each baseline."""
    val = lambda c: _val(c, measure)  # noqa: E731
    contenders = ("fixed", "selectivity_first", "greedy", "dppick", "dppick_query", "dppick_match", "dppick_nosmooth")
    fastest, reductions = 0, {b: [] for b in BASELINES + ("exact", "oracle")}
    strictly = 0
    for o in orders:
        v = {s: val(costs[("gated", o, s)]) for s in STRATEGIES if ("gated", o, s) in costs}
        best = min(v[s] for s in contenders if s in v)
        if v["dppick"] <= best * (1 + 1e-12):
            fastest += 1
            if all(v[s] > v["dppick"] for s in contenders if s != "dppick" and s in v):
                strictly += 1
        for b in reductions:
            if b in v and v[b]:
                reductions[b].append(1 - v["dppick"] / v[b])
    out = {"orders": len(orders), "dppick_fastest": fastest, "dppick_strictly_fastest": strictly,
           "contenders": list(contenders), "reduction_vs": {}}
    for b, rs in reductions.items():
        if rs:
            out["reduction_vs"][b] = {"mean": statistics.mean(rs), "min": min(rs), "max": max(rs)}
    sm = [(val(costs[("gated", o, "dppick_nosmooth")]) - val(costs[("gated", o, "dppick")]))
          / val(costs[("gated", o, "dppick_nosmooth")]) for o in orders if val(costs[("gated", o, "dppick_nosmooth")])]
    if sm:
        out["smoothing_beats_nosmooth"] = {"orders": sum(1 for x in sm if x > 0), "ties": sum(1 for x in sm if x == 0),
                                           "gain_min": min(sm), "gain_max": max(sm), "gain_mean": statistics.mean(sm)}
    return out


def order_share(measured: dict) -> dict:
    """What the order decides: over the fixed plans, the chains' share of task CPU, and the spread of the totals."""
    pp = measured["per_plan"]
    med = {n: {k: statistics.median(r[k] for r in runs) for k in ("task_cpu_seconds", "chain_cpu_seconds",
                                                                   "batch_seconds", "lookups", "matches")}
           for n, runs in pp.items()}
    cpu = [m["task_cpu_seconds"] for m in med.values()]
    wall = [m["batch_seconds"] for m in med.values()]
    work = [m["lookups"] + m["matches"] for m in med.values()]
    return {"chain_share_of_task_cpu": statistics.median(m["chain_cpu_seconds"] / m["task_cpu_seconds"]
                                                         for m in med.values() if m["task_cpu_seconds"]),
            "task_cpu": {"min": min(cpu), "max": max(cpu), "range_share": (max(cpu) - min(cpu)) / max(cpu)},
            "engine_seconds": {"min": min(wall), "max": max(wall), "range_share": (max(wall) - min(wall)) / max(wall)},
            "probe_work": {"min": min(work), "max": max(work), "ratio": max(work) / max(min(work), 1)},
            "per_plan": med}


def composition_check(measured: dict, sched, costs: dict) -> dict:
    """The fixed plans' composed cost against their own measured totals (the composition's consistency)."""
    by_name = {"".join(o): o for o in sched_orders(sched)}
    out = []
    for n, runs in measured["per_plan"].items():
        o = by_name.get(n)
        if o is None:
            continue
        c = costs[("gated", o, "fixed")]
        out.append({"plan": n, "composed_cpu": c["cpu"]["median"],
                    "measured_cpu": statistics.median(r["task_cpu_seconds"] for r in runs),
                    "composed_work": c["work"], "measured_work": runs[0]["lookups"] + runs[0]["matches"]})
    return {"plans": out, "work_equal": all(o["composed_work"] == o["measured_work"] for o in out),
            "cpu_ratio_median": statistics.median(o["composed_cpu"] / o["measured_cpu"] for o in out
                                                  if o["measured_cpu"]) if out else None}


def changes_report(sched, measured: dict, strategies) -> dict:
    """Plan changes with and without the gate's hysteresis, and whether each paid (measured task CPU, median
    round), for the first initial order."""
    from mjoin.evaluation.cycle_loop import compose, plan_changes

    ch, base = measured["rounds"][len(measured["rounds"]) // 2]
    ids = measured["batch_ids"]

    def cost_on(key, batches):
        return compose([key] * len(batches), sched.plans, ch, base, [ids[i] for i in batches])["cpu"]

    order = sched_orders(sched)[0]
    out = {}
    for s in strategies:
        if s in ("fixed",):
            continue
        out[s] = {}
        for kind in ("gated", "ungated"):
            r = plan_changes(getattr(sched, kind)[(order, s)], cost_on)
            r.pop("detail")
            out[s][kind] = r
    return out


def sched_orders(sched) -> list:
    return list(dict.fromkeys(o for o, _ in sched.gated))


def loop_overhead(sched, costs: dict, order, strategy: str = "dppick") -> dict:
    """Per re-optimization: the loop's steps (statistics job, history read, gates, forecast, optimize and plan
    gate of ``strategy``) against the join's own engine time for the same cycle (composed, the strategy's plan)."""
    per_cycle = []
    join = costs[("gated", order, strategy)]
    for rec in sched.cycles:
        s = rec["seconds"]
        st = rec["strategies"].get(strategy, {})
        per_cycle.append(sum(s.get(k, 0.0) for k in ("statistics", "history", "stats_gate", "forecast",
                                                    "forecast_gate")) + st.get("optimize_seconds", 0.0)
                         + st.get("plan_gate_seconds", 0.0))
    steps = {k: statistics.median(r["seconds"].get(k, 0.0) for r in sched.cycles) for k in
             ("statistics", "history", "stats_gate", "forecast", "forecast_gate")}
    steps["optimize"] = statistics.median(r["strategies"].get(strategy, {}).get("optimize_seconds", 0.0)
                                          for r in sched.cycles)
    steps["plan_gate"] = statistics.median(r["strategies"].get(strategy, {}).get("plan_gate_seconds", 0.0)
                                           for r in sched.cycles)
    total = sum(per_cycle)
    join_wall, join_cpu = join["wall"]["median"], join["cpu"]["median"]
    return {"cycles": len(per_cycle), "loop_seconds_total": total, "loop_seconds_per_cycle": spread(per_cycle),
            "median_step_seconds": steps, "join_engine_seconds": join_wall, "join_task_cpu_seconds": join_cpu,
            "fraction_of_join_engine_time": total / join_wall if join_wall else None,
            "fraction_of_join_cpu": total / join_cpu if join_cpu else None}


def period_overhead(spark, query, lake, loop_from: int, start: int, end: int, tau: int, length: int, period: int,
                    n_periods: int, work: Path) -> dict:
    """The loop at the DAG's period: one statistics job over the period's cycles, the gates, one forecast, dppick
    and its plan gate, timed per period; the join's engine time for the same period is the caller's."""
    from mjoin.optimizer.cost import plan_cost
    from mjoin.forecast.holt import forecast
    from mjoin.gates.forecast import check_forecast
    from mjoin.gates.plan import check_plan
    from mjoin.gates.stats import check_statistics
    from mjoin.optimizer.strategies import optimize
    from mjoin.stats.history import read_history
    from mjoin.stats.job import run_statistics

    root = str(work / "period-history")
    shutil.rmtree(root, ignore_errors=True)
    model = cost_model()
    first = start  # the measured interval's start: the history before it is the loop's
    period = min(period, (end - first) // tau * tau)
    n_periods = max(1, min(n_periods, (end - first) // period))
    lake = _lake(Path(lake)) if isinstance(lake, (str, Path)) else lake
    run_statistics(spark, query, lake, max(loop_from, first - length * tau), first, tau, out=root)  # not timed
    out, active = [], None
    for p in range(n_periods):
        a, b = first + p * period, first + (p + 1) * period
        t = {}
        t0 = time.perf_counter()
        run_statistics(spark, query, lake, a, b, tau, out=root)
        t["statistics"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        hist = read_history(root, query.name, start=b - length * tau, end=b)
        t["history"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        check_statistics(query, hist, a, b, tau)
        t["stats_gate"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        fc = forecast(hist, b, length=length).statistics
        t["forecast"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        check_forecast(query, fc, hist)
        t["forecast_gate"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan = optimize(query, fc, "dppick", cost_model=model)
        t["optimize"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        check_plan(query, plan, active=active, cost_fn=lambda pl: plan_cost(query, fc, pl, model))
        t["plan_gate"] = time.perf_counter() - t0
        active = plan
        out.append({"period": [a, b], "seconds": t, "total": sum(t.values())})
    return {"period_seconds": period, "periods": out, "first": first}


# ---- sections -------------------------------------------------------------------------------------------

def paper_workload(spark, args, label: str, workload: Path, qname: str | None, work: Path, all_orders: bool) -> dict:
    from mjoin.evaluation.cycle_loop import covering_orders

    query = spec_of(workload, qname)
    tau = args.cycle
    start, end = span_of(workload, tau, args.limit)
    lake = str(workload)
    # the loop runs from the workload's start; the engine is measured once every window is full and the
    # statistics gate has its minimum history (before that every strategy runs its initial order)
    offset = warm_offset(query, tau)
    measured_start = start + offset * tau
    orders = list(permutations(query.stream_names)) if all_orders else covering_orders(query.stream_names)
    loop_orders = list(permutations(query.stream_names))[: args.orders] if args.orders else \
        list(permutations(query.stream_names))
    doc = {"workload": label, "query": query.name, "lake": lake, "interval": [measured_start, end],
           "loop_from": start, "cycle_s": tau, "batches": (end - measured_start) // tau, "length_L": args.length, "engine_orders": ["".join(o) for o in orders],
           "initial_orders": ["".join(o) for o in loop_orders], "reps": args.reps}
    with Section(f"{label}: engine, {len(orders)} fixed orders x {args.reps}", doc.setdefault("engine", {})):
        measured = measure_orders(spark, query, lake, measured_start, end, tau, orders, args.reps,
                                  work / label / "engine", args.seed)
        doc["engine"].update({"result_rows": measured["result_rows"], "results_agree": measured["results_agree"],
                              "fingerprint": next(iter(measured["fingerprints"].values())),
                              "warmup_seconds": measured["warmup_seconds"], "order_share": order_share(measured)})
    with Section(f"{label}: loop over {doc['batches']} cycles", doc.setdefault("loop", {})):
        sched = run_loop(spark, query, lake, start, end, tau, args.length, loop_orders, STRATEGIES, work / label)
        doc["loop"]["gate_outcomes"] = {
            "stats_gate": _count(r.get("stats_gate") for r in sched.cycles),
            "forecast_gate": _count(r.get("forecast_gate") for r in sched.cycles),
            # Holt forecasts outside the gate's range replaced by the last value (mjoin.forecast.holt's bound)
            "forecast_out_of_range": {"series": sum(r.get("forecast_out_of_range", 0) for r in sched.cycles),
                                      "cycles": sum(1 for r in sched.cycles if r.get("forecast_out_of_range"))},
            # Holt forecasts lagging a shift replaced by the last value (mjoin.forecast.bound.LagBound, Eq. 71)
            "forecast_lagging": {"series": sum(r.get("forecast_lagging", 0) for r in sched.cycles),
                                 "cycles": sum(1 for r in sched.cycles if r.get("forecast_lagging"))},
            "cycles": len(sched.cycles), "measured_from_cycle": offset}
        sched = from_batch(sched, offset)
        doc["loop"]["settings"] = sched.settings
    costs = compose_all(sched, measured)
    doc["strategies"] = _costs_table(costs, loop_orders)
    doc["paper"] = {m: paper_measures(costs, loop_orders, m) for m in MEASURES}
    doc["composition_check"] = composition_check(measured, sched, costs)
    doc["plan_changes"] = changes_report(sched, measured, STRATEGIES)
    doc["overhead"] = loop_overhead(sched, costs, loop_orders[0])
    if args.validate:
        with Section(f"{label}: switching run", doc.setdefault("switching_run", {})):
            key = ("gated", loop_orders[0], "dppick")
            sw = switching_run(spark, query, lake, measured_start, end, tau, sched.gated[key[1:]], sched.plans,
                               work / label / "switching")
            doc["switching_run"].update(sw)
            doc["switching_run"].update({
                "strategy": "dppick", "initial_order": "".join(loop_orders[0]),
                "composed_lookups": costs[key]["lookups"], "composed_matches": costs[key]["matches"],
                "composed_task_cpu": costs[key]["cpu"]["median"],
                "work_equal": sw["lookups"] == costs[key]["lookups"] and sw["matches"] == costs[key]["matches"],
                "results_equal": sw["fingerprint"] == doc["engine"]["fingerprint"]})
    doc["_sched"], doc["_costs"], doc["_measured"] = sched, costs, measured
    return doc


def from_batch(sched, offset: int):
    """The schedules and cycle records from batch ``offset`` on (the measured part of the loop's run)."""
    from dataclasses import replace

    return replace(sched, batches=sched.batches[offset:], gated={k: v[offset:] for k, v in sched.gated.items()},
                   ungated={k: v[offset:] for k, v in sched.ungated.items()}, cycles=sched.cycles[offset:])


def _count(values) -> dict:
    out: dict = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def _costs_table(costs: dict, orders: list) -> dict:
    """Per strategy: gated and ungated totals, the mean over initial orders and per order."""
    out = {}
    for s in STRATEGIES:
        row = {}
        for kind in ("gated", "ungated"):
            cs = [costs[(kind, o, s)] for o in orders if (kind, o, s) in costs]
            if not cs:
                continue
            row[kind] = {"cpu_mean": statistics.mean(c["cpu"]["median"] for c in cs),
                         "chain_cpu_mean": statistics.mean(c["chain_cpu"]["median"] for c in cs),
                         "wall_mean": statistics.mean(c["wall"]["median"] for c in cs),
                         "work_mean": statistics.mean(c["work"] for c in cs),
                         "plan_changes_mean": statistics.mean(c["plan_changes"] for c in cs),
                         "per_order": {"".join(o): {k: costs[(kind, o, s)][k] for k in
                                                    ("cpu", "chain_cpu", "wall", "work", "plan_changes",
                                                     "distinct_plans")}
                                       for o in orders if (kind, o, s) in costs}}
        out[s] = row
    return out


def drift_workload(work: Path, args, preset: str) -> Path:
    """The drift preset's workload at the run's ``--drift-*`` settings (its base rate scaled by
    :data:`DRIFT_RATE_FACTOR`), generated once per work folder."""
    return synthetic_workload(work, preset, args.drift_duration, args.drift_rate * DRIFT_RATE_FACTOR.get(preset, 1.0),
                              args.drift_domain, args.drift_window)


def drift_section(spark, args, work: Path) -> dict:
    out = {"presets": {}, "parameters": {"duration": args.drift_duration, "rate": args.drift_rate,
                                         "domain": args.drift_domain, "window": args.drift_window}}
    for preset in args.presets:
        rate = args.drift_rate * DRIFT_RATE_FACTOR.get(preset, 1.0)
        wl = drift_workload(work, args, preset)
        doc = paper_workload(spark, args, f"drift-{preset}", wl, None, work, all_orders=False)
        costs, orders = doc["_costs"], sched_orders(doc["_sched"])
        spec_order = orders[0]
        tot = {s: {m: _val(costs[("gated", spec_order, s)], m) for m in MEASURES} for s in STRATEGIES}
        fixed_mean = {m: statistics.mean(_val(costs[("gated", o, "fixed")], m) for o in orders) for m in MEASURES}
        goals = {}
        for s in ("dppick", "exact"):
            goals[s] = {m: {"vs_oracle": tot[s][m] / tot["oracle"][m] - 1 if tot["oracle"][m] else None,
                            "below_fixed_mean": 1 - tot[s][m] / fixed_mean[m] if fixed_mean[m] else None,
                            "below_fixed_spec_order": 1 - tot[s][m] / tot["fixed"][m] if tot["fixed"][m] else None,
                            "below_selectivity_first": 1 - tot[s][m] / tot["selectivity_first"][m]
                            if tot["selectivity_first"][m] else None} for m in MEASURES}
            for m in MEASURES:
                g = goals[s][m]
                g["goal_met"] = (g["vs_oracle"] is not None and g["vs_oracle"] <= 0.05 and g["below_fixed_mean"] >= 0.25
                                 and g["below_selectivity_first"] >= 0.25)
        doc["drift"] = {"base_rate": rate, "totals_spec_order": tot, "fixed_mean_over_orders": fixed_mean, "goals": goals,
                        "per_cycle_cpu": {s: costs[("gated", spec_order, s)]["per_batch_cpu"] for s in STRATEGIES},
                        "per_cycle_chain_cpu": {s: costs[("gated", spec_order, s)]["per_batch_chain_cpu"]
                                                for s in STRATEGIES}}
        out["presets"][preset] = doc
    return out


def _val(c: dict, m: str):
    return c["work"] if m == "work" else c[m]["median"]


def warm_offset(query, tau: int) -> int:
    """Batches before the engine's measured interval: every window full and the statistics gate's minimum history
    present (before that every strategy runs its initial order)."""
    from mjoin.gates.config import GateConfig

    return -(-int(max(query.max_window, GateConfig().min_history * tau)) // tau)


def sensitivity_section(spark, args, work: Path, workload: Path, query_name: str | None = SEED) -> dict:
    """tau and L on the seed query (or a drift preset's workload, ``query_name`` None: its own query.yaml):
    dppick's composed cost per cycle length (engine runs of the covering orders at each tau) and per history
    length (the engine runs at the default tau, the loop re-run with another L)."""
    from mjoin.evaluation.cycle_loop import covering_orders

    query = spec_of(workload, query_name)
    out = {"cycle": [], "length": [], "workload": str(workload), "query": query.name, "limit_s": args.sens_limit}
    orders = covering_orders(query.stream_names)
    spec = [tuple(query.stream_names)]
    strategies = ("fixed", "dppick", "oracle")
    lake = str(workload)
    measured_at = {}
    for tau in sorted(set(args.taus) | {args.cycle}):
        start, end = span_of(workload, tau, args.sens_limit)
        off = warm_offset(query, tau)
        sub = work / f"sens-tau{tau}"
        doc = {"tau": tau, "batches": (end - start) // tau - off, "measured_from": start + off * tau}
        with Section(f"sensitivity tau={tau}", doc):
            measured = measure_orders(spark, query, lake, start + off * tau, end, tau, orders, args.sens_reps,
                                      sub / "engine", args.seed)
            measured_at[tau] = (measured, start, end, off)
            if tau in args.taus or tau == args.cycle:
                sched = from_batch(run_loop(spark, query, lake, start, end, tau, args.length, spec, strategies, sub), off)
                costs = compose_all(sched, measured)
                doc.update({s: {m: _val(costs[("gated", spec[0], s)], m) for m in MEASURES} for s in strategies})
                doc["overhead"] = loop_overhead(sched, costs, spec[0])
                doc["plan_changes"] = costs[("gated", spec[0], "dppick")]["plan_changes"]
        if tau in args.taus:
            out["cycle"].append(doc)
    measured, start, end, off = measured_at[args.cycle]
    for length in args.lengths:
        sub = work / f"sens-L{length}"
        with Section(f"sensitivity L={length}", doc := {"L": length}):
            # the statistics of these cycles are those of the tau run: read back, not recomputed
            sched = from_batch(run_loop(spark, query, lake, start, end, args.cycle, length, spec, strategies, sub,
                                        history=work / f"sens-tau{args.cycle}" / "history"), off)
            costs = compose_all(sched, measured)
            doc.update({s: {m: _val(costs[("gated", spec[0], s)], m) for m in MEASURES} for s in strategies})
            doc["plan_changes"] = costs[("gated", spec[0], "dppick")]["plan_changes"]
        out["length"].append(doc)
    return out


def peers_section(spark, args, work: Path, cases: list) -> dict:
    """Per case (label, workload, query, plan): every system on the same files, the same windows; R repetitions;
    results compared by count and fingerprint; throughput = landed input tuples / end-to-end seconds."""
    out = {}
    for label, workload, qname, plan in cases:
        query = spec_of(workload, qname)
        out[label] = peer_case(args, label, workload, query, plan, work / f"peers-{label}")
    return out


def peer_case(args, label, workload: Path, query, plan, work: Path) -> dict:
    import peers

    work.mkdir(parents=True, exist_ok=True)
    doc = {"query": query.name, "workload": str(workload), "systems": {}}
    start, end = span_of(workload, args.cycle)
    schema = peers.result_schema(query)
    t = time.perf_counter()
    copies = peers.csv_copies(query, _lake(workload), work / "csv")
    doc["csv_conversion_seconds"] = time.perf_counter() - t
    doc["input_tuples"] = sum(c["rows"] for c in copies.values())
    plan_path = work / "plan.json"
    plan.save(str(plan_path))
    # mjoin: the default (an interval this small runs on the driver, no Spark job: EngineConfig.driver_rows);
    # mjoin-spark: the same run forced onto Spark jobs (driver_rows=0), to show both paths side by side
    systems = [("mjoin", {"engine": "mjoin", "cycle": args.cycle}),
               ("mjoin-spark", {"engine": "mjoin", "cycle": args.cycle, "driver_rows": 0}),
               ("mjoin-60s", {"engine": "mjoin", "cycle": 60}),
               ("spark-native", {"engine": "spark-native", "cycle": 60})]
    for name, opts in systems:
        if name == "spark-native" and args.no_native:
            continue
        reps = args.peer_reps if name != "spark-native" else max(1, args.native_reps)
        job = {"query": qname_or_path(query), "lake": str(workload), "start": start, "end": end, "reps": reps,
               "plan": str(plan_path), "out": str(work / name), **opts}
        doc["systems"][name] = _peer_summary(_subprocess_peer(job, work / f"{name}.json", args.peer_timeout),
                                             doc["input_tuples"])
    job = {"engine": "duckdb", "query": qname_or_path(query), "lake": str(workload), "out": str(work / "duckdb"),
           "reps": args.peer_reps}
    doc["systems"]["duckdb"] = _peer_summary(_subprocess_peer(job, work / "duckdb.json", args.peer_timeout),
                                             doc["input_tuples"])
    if FLINK_PY.exists() and not args.no_flink:
        for variant in args.flink_variants:
            verify = work / f"flink-{variant}-out"
            shutil.rmtree(verify, ignore_errors=True)
            shutil.rmtree(str(verify) + "-checkpoints", ignore_errors=True)
            job = peers.flink_job(query, copies, variant, verify_to=str(verify), repeats=args.peer_reps)
            res = _flink(job, work / f"flink-{variant}.json", args.peer_timeout)
            if "error" not in res:
                rows = peers.read_csv_results(str(verify), schema)
                res["fingerprint"] = peers.fingerprint_table(rows, schema, work / f"flink-{variant}-fp")
                res["result_rows"] = rows.num_rows
                res["seconds"] = spread(res["blackhole_seconds"])
                res["throughput_tuples_per_s"] = doc["input_tuples"] / res["seconds"]["median"]
                res["state_tuples"] = (doc["input_tuples"] if variant in ("multijoin", "binary") else None)
                res["state_note"] = ("regular joins keep every input row (the windows are join conditions, nothing is "
                                     "purged)" if variant != "interval" else "purged by watermark; not measured")
            doc["systems"][f"flink-{variant}"] = res
    else:
        doc["flink_skipped"] = "no Flink venv (bench/evaluation/.flink-venv)" if not FLINK_PY.exists() else "--no-flink"
    ref = doc["systems"]["duckdb"].get("fingerprint")
    for name, s in doc["systems"].items():
        s["results_equal_duckdb"] = s.get("fingerprint") == ref if ref else None
    mj = doc["systems"]["mjoin"]["seconds"]["median"]
    for name, s in doc["systems"].items():
        if s.get("seconds", {}).get("median"):
            s["mjoin_speedup"] = s["seconds"]["median"] / mj
    return doc


def qname_or_path(query) -> str:
    return query.source_path or query.name


def _lake(workload: Path):
    from mjoin.lake.layout import Lake

    return Lake(str(workload))


def _peer_summary(res: dict, tuples: int) -> dict:
    """One system's repetitions (run in one process after an unmeasured warm-up)."""
    if "error" in res:
        return res
    ok = res["runs"]
    s = spread([r["seconds"] for r in ok])
    return {"seconds": s, "throughput_tuples_per_s": tuples / s["median"], "result_rows": ok[0]["result_rows"],
            "fingerprint": ok[0]["fingerprint"], "fingerprints_agree": len({json.dumps(r["fingerprint"]) for r in ok}) == 1,
            "peak_rss_bytes": res.get("peak_rss_bytes"), "warmup_seconds": res.get("warmup_seconds"),
            "state_tuples": ok[0].get("state_tuples"), "execution": ok[0].get("execution"), "runs": ok}


def _run_peer(cmd: list, marker: str, timeout: float | None, env: dict | None = None) -> dict:
    """The result a peer's process prints after ``marker`` (JSON), ``cmd`` run in a session of its own; after
    ``timeout`` seconds (``--peer-timeout``; None: no limit) the whole process group, the JVMs it started too, is
    killed and the peer recorded as not finished; ``{"error": ...}`` when it printed no result."""
    import signal

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return {"error": f"did not finish within {timeout:g} s (stopped)", "timeout_seconds": timeout}
    line = [x for x in out.splitlines() if x.startswith(marker + " ")]
    if not line:
        return {"error": (err or out)[-3000:]}
    return json.loads(line[-1].split(" ", 1)[1])


def _subprocess_peer(job: dict, path: Path, timeout: float | None = None) -> dict:
    path.write_text(json.dumps(job))
    return _run_peer([sys.executable, __file__, "--peer-job", str(path)], "PEER_RESULT", timeout,
                     env={**os.environ, "PYTHONPATH": str(PROJECT / "include")})


def _flink(job: dict, path: Path, timeout: float | None = None) -> dict:
    path.write_text(json.dumps(job))
    t = time.perf_counter()
    res = _run_peer([str(FLINK_PY), str(HERE / "flink_job.py"), str(path)], "FLINK_JOB_RESULT", timeout)
    if "error" not in res:
        res["process_seconds"] = time.perf_counter() - t
    return res


def peer_job(path: str) -> int:
    """One system in a fresh process: an unmeasured warm-up (Spark: a run over the interval's first two batches,
    starting the JVM's JIT and the Python workers; Flink's counterpart is its no-op job), then ``reps`` measured
    runs; peak resident memory of this process tree over them. Prints PEER_RESULT."""
    import peers

    from mjoin.model.query import load_query

    job = json.loads(Path(path).read_text())
    query = load_query(job["query"])
    reps = int(job.get("reps", 1))
    res = {"engine": job["engine"], "runs": []}
    if job["engine"] == "duckdb":
        peers.duckdb_reference(query, _lake(Path(job["lake"])))
        with peers.PeakRss() as rss:
            for r in range(reps):
                table, secs = peers.duckdb_reference(query, _lake(Path(job["lake"])))
                res["runs"].append({"seconds": secs, "result_rows": table.num_rows,
                                    "fingerprint": peers.fingerprint_table(table, peers.result_schema(query),
                                                                           Path(job["out"]) / f"r{r}")})
    else:
        from mjoin.engine.config import EngineConfig
        from mjoin.engine.metrics import read_metrics
        from mjoin.engine.runs import run_interval
        from mjoin.engine.results import result_fingerprint
        from mjoin.model.plan import load_plan
        from mjoin.runtime.resources import Resources
        from mjoin.runtime.spark import get_spark

        spark = get_spark("mjoin-eval-peer", Resources(spark_master="local[2]", shuffle_partitions=4))
        plan = load_plan(job["plan"], query) if job["engine"] == "mjoin" else None
        cfg = EngineConfig(buckets=4, **({"driver_rows": int(job["driver_rows"])} if "driver_rows" in job else {}))
        t = time.perf_counter()
        run_interval(spark, query, plan, job["lake"], job["start"], job["start"] + 2 * job["cycle"], job["cycle"],
                     job["out"] + "-warmup", engine=job["engine"], config=cfg)
        res["warmup_seconds"] = time.perf_counter() - t
        with peers.PeakRss() as rss:
            for r in range(reps):
                t = time.perf_counter()
                s = run_interval(spark, query, plan, job["lake"], job["start"], job["end"], job["cycle"],
                                 job["out"], engine=job["engine"], config=cfg)
                secs = time.perf_counter() - t
                more = {}
                if job["engine"] == "mjoin":
                    recs = read_metrics(s.metrics_path)
                    state = max((sum(x["state_tuples"].values()) for x in recs), default=0)
                    # where it ran ("fused-driver": no Spark job; "fused": one Spark job per stage) and its phases
                    more = {"execution": s.extra.get("execution"), "where": s.extra.get("where"),
                            "phases": {k: v for k, v in s.extra.get("phases", {}).items() if k != "spark_stages"}}
                else:
                    state = s.extra.get("max_state_tuples")
                res["runs"].append({"seconds": secs, "batch_seconds": s.batch_seconds, "prepare_seconds":
                                    s.prepare_seconds, "result_rows": s.result_rows, "state_tuples": state,
                                    "cycle_s": job["cycle"], "fingerprint": result_fingerprint(s.results_path),
                                    **more})
        spark.stop()
    res["peak_rss_bytes"] = rss.peak
    print("PEER_RESULT " + json.dumps(res, default=str))
    return 0


# ---- driver ------------------------------------------------------------------------------------------

def strip(doc):
    """The JSON-able part of a section (drops the in-memory schedules and tables)."""
    if isinstance(doc, dict):
        return {k: strip(v) for k, v in doc.items() if not str(k).startswith("_")}
    if isinstance(doc, list):
        return [strip(v) for v in doc]
    return doc


def run(args) -> dict:
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    work = Path(args.work or tempfile.mkdtemp(prefix="mjoin-bench-eval-"))
    work.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "evaluation", "mode": "quick" if args.quick else "full", **provenance(),
                "parameters": {k: v for k, v in vars(args).items() if k not in ("plot_only", "peer_job")}}
    t_all = time.perf_counter()
    spark = get_spark("mjoin-bench-evaluation", Resources(spark_master="local[2]", shuffle_partitions=4))
    out_path = Path(args.out) / f"{stem_name(args)}.json"

    def save():
        result["seconds_total"] = time.perf_counter() - t_all
        result["load_average_after"] = list(os.getloadavg())
        out_path.write_text(json.dumps(strip(result), indent=1, default=str))

    try:
        seed_docs = {}
        if "paper" in args.sections or "overhead" in args.sections or "peers" in args.sections:
            result["paper"] = {}
            for sf in args.sf:
                wl = tpcds_workload(work, sf, args.duration, args.tpcds_rate)
                label = f"seed-sf{sf:g}"
                seed_docs[label] = paper_workload(spark, args, label, wl, SEED, work,
                                                  all_orders=not args.quick and sf == args.sf[0])
                result["paper"][label] = seed_docs[label]
                save()
            if "paper" in args.sections and not args.no_two_class:
                wl = tpcds_workload(work, args.sf[0], args.duration, args.tpcds_rate)
                label = f"two-class-sf{args.sf[0]:g}"
                result["paper"][label] = paper_workload(spark, args, label, wl, TWO_CLASS, work, all_orders=False)
                save()
            if "paper" in args.sections or "peers" in args.sections:
                wl = selective_workload(work, args.quick)
                result["paper"]["selective"] = paper_workload(spark, args, "selective", wl, None, work, all_orders=False)
                save()
        if "overhead" in args.sections:
            with Section("overhead at the DAG period", result.setdefault("overhead", {})):
                result["overhead"].update(overhead_section(spark, args, seed_docs[f"seed-sf{args.sf[0]:g}"], work))
            save()
        if "sensitivity" in args.sections:
            if args.sens_preset:  # a drifting workload, where reacting sooner can pay
                wl, qname = drift_workload(work, args, args.sens_preset), None
            else:
                wl, qname = tpcds_workload(work, args.sf[0], args.duration, args.tpcds_rate), SEED
            with Section("sensitivity", result.setdefault("sensitivity", {})):
                result["sensitivity"].update(sensitivity_section(spark, args, work, wl, qname))
            save()
        if "drift" in args.sections:
            with Section("drift", result.setdefault("drift", {})):
                result["drift"].update(drift_section(spark, args, work))
            save()
        if "peers" in args.sections:
            cases = []
            for label in (f"seed-sf{args.sf[0]:g}", "selective"):
                doc = result["paper"][label]
                sched = doc["_sched"]
                key = (sched_orders(sched)[0], "dppick")
                cases.append((label, Path(doc["lake"]), SEED if label.startswith("seed") else None,
                              sched.plans[sched.gated[key][-1]]))
            spark.stop()
            spark = None
            with Section("peers", result.setdefault("peers", {})):
                result["peers"].update(peers_section(None, args, work, cases))
            save()
    finally:
        if spark is not None:
            spark.stop()
        save()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return strip(result)


def overhead_section(spark, args, doc: dict, work: Path) -> dict:
    """The loop's overhead on the seed query's paper-section ``doc``: per cycle (its loop, ``doc["overhead"]``) and
    at the DAG's period (``period_overhead``), each period against dppick's composed engine time for its batches."""
    wl = Path(doc["lake"])
    query = spec_of(wl, SEED)
    po = period_overhead(spark, query, str(wl), doc["loop_from"], doc["interval"][0], doc["interval"][1],
                         args.cycle, args.length, args.period, args.periods, work)
    sched, costs = doc["_sched"], doc["_costs"]
    per = costs[("gated", sched_orders(sched)[0], "dppick")]
    batch_wall = _per_batch_wall(doc)
    for p in po["periods"]:
        ks = [int((t - doc["interval"][0]) // args.cycle) for t in range(p["period"][0], p["period"][1],
                                                                          args.cycle)]
        p["join_engine_seconds"] = sum(batch_wall[k] for k in ks if k < len(batch_wall))
        p["join_task_cpu_seconds"] = sum(per["per_batch_cpu"][k] for k in ks if k < len(per["per_batch_cpu"]))
        p["fraction_of_join_engine_time"] = p["total"] / p["join_engine_seconds"] if p["join_engine_seconds"] else None
    return {"per_cycle": doc["overhead"], "per_period": po}


def _per_batch_wall(doc: dict) -> list:
    """dppick's composed engine time per batch for the first initial order: per batch the median over the engine's
    rounds (before, the middle round in run order, which one slow round could be)."""
    from mjoin.evaluation.cycle_loop import compose

    sched, measured = doc["_sched"], doc["_measured"]
    key = (sched_orders(sched)[0], "dppick")
    per_round = [[compose([plan_key], sched.plans, ch, base, [measured["batch_ids"][k]])["wall"]
                  for k, plan_key in enumerate(sched.gated[key])] for ch, base in measured["rounds"]]
    return [statistics.median(walls) for walls in zip(*per_round)]


def stem_name(args) -> str:
    return "evaluation" + ("_quick" if args.quick else "") + (f"_{args.tag}" if args.tag else "")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="minutes: sf 0.1, a 7-minute replay, covering orders, 2 reps")
    p.add_argument("--sections", nargs="+", default=["paper", "overhead", "sensitivity", "drift", "peers"],
                   choices=["paper", "overhead", "sensitivity", "drift", "peers"])
    p.add_argument("--sf", nargs="+", type=float, default=None, help="TPC-DS scale factors of the seed query (1 10)")
    p.add_argument("--duration", default=None, help="TPC-DS replay length (default: the generator's 1 h)")
    p.add_argument("--tpcds-rate", type=float, default=None,
                   help="replay TPC-DS at this total rate, tuples/s (it then lasts rows / rate; not with --duration)")
    p.add_argument("--limit", type=float, default=None, help="at most this many seconds of each workload")
    p.add_argument("--cycle", type=int, default=10, help="statistics cycle tau = engine batch, seconds")
    p.add_argument("--length", type=int, default=60, help="history length L, cycles")
    p.add_argument("--orders", type=int, default=0, help="first N of the 24 initial orders (0: all)")
    p.add_argument("--reps", type=int, default=None, help="engine repetitions (default 3, quick 2)")
    p.add_argument("--no-validate", dest="validate", action="store_false", help="skip the real switching run")
    p.add_argument("--no-two-class", action="store_true")
    p.add_argument("--period", type=int, default=300, help="the DAG's re-optimization period, seconds")
    p.add_argument("--periods", type=int, default=3, help="periods timed for the per-period overhead")
    p.add_argument("--taus", nargs="+", type=int, default=None)
    p.add_argument("--lengths", nargs="+", type=int, default=None)
    p.add_argument("--sens-limit", type=float, default=None, help="seconds of the replay for the sensitivity runs")
    p.add_argument("--sens-reps", type=int, default=None)
    p.add_argument("--sens-preset", default=None, choices=DRIFT_PRESETS,
                   help="run the sensitivity on this drift preset's workload (--drift-*) instead of the seed query")
    p.add_argument("--presets", nargs="+", default=None, choices=DRIFT_PRESETS)
    p.add_argument("--drift-duration", default=None)
    p.add_argument("--drift-rate", type=float, default=None, help="base rate per stream, tuples/s")
    p.add_argument("--drift-domain", type=int, default=None)
    p.add_argument("--drift-window", default="60s")
    p.add_argument("--peer-reps", type=int, default=None)
    p.add_argument("--native-reps", type=int, default=1)
    p.add_argument("--no-native", action="store_true")
    p.add_argument("--peer-timeout", type=float, default=None,
                   help="seconds a peer's process (warm-up and repetitions) may run before it is stopped and "
                        "recorded as not finished")
    p.add_argument("--no-flink", action="store_true")
    p.add_argument("--flink-variants", nargs="+", default=["multijoin", "binary", "interval"])
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--work", help="working folder (default: a temporary one); generated workloads there are reused")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--tag", default="", help="results file evaluation[_quick]_<tag>.json (a part of the full run)")
    p.add_argument("--plot-only", metavar="JSON")
    p.add_argument("--peer-job", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.peer_job:
        return peer_job(args.peer_job)
    if args.plot_only:
        from plots import plot_all

        plot_all(json.loads(Path(args.plot_only).read_text()), Path(args.plot_only).with_suffix(""))
        return 0
    q = args.quick
    args.sf = args.sf or ([0.1] if q else [1.0])
    if args.tpcds_rate and args.duration:
        p.error("give at most one of --duration and --tpcds-rate")
    args.duration = args.duration or ("7m" if q and not args.tpcds_rate else None)
    args.reps = args.reps or (2 if q else 3)
    args.orders = args.orders or (6 if q else 0)
    args.taus = args.taus or ([10, 20] if q else [3, 5, 10, 13, 20, 30])
    args.lengths = args.lengths or ([10, 30] if q else [5, 10, 20, 40, 60, 90, 120])
    args.sens_limit = args.sens_limit or (None if q else 1200)
    args.sens_reps = args.sens_reps or (1 if q else 2)
    args.presets = args.presets or (["rate-swap", "match-drift"] if q else list(DRIFT_PRESETS))
    args.drift_duration = args.drift_duration or ("4m" if q else "20m")
    args.drift_rate = args.drift_rate or (20.0 if q else 50.0)
    args.drift_domain = args.drift_domain or (200 if q else 1000)
    args.peer_reps = args.peer_reps or (1 if q else 3)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("py4j", "mjoin.engine.interval", "mjoin.engine.batch", "mjoin.stats", "great_expectations",
                 "mjoin.forecast.holt"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("mjoin.gates").setLevel(logging.ERROR)  # a failed gate is an outcome here, counted
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = run(args)
    from plots import plot_all

    stem = Path(args.out) / stem_name(args)
    plot_all(result, stem)
    from report import print_summary

    print_summary(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
