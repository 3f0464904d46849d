"""Historical evaluation: what would each strategy have cost on the same data?

For every interval ``[t_k, t_k + period)`` of ``[start, end)``:

- statistics known before ``t_k`` only (no look-ahead): the Holt forecast
  (``mjoin.forecast.holt``) and the last cycle's values (the paper's noSmooth);
- the hindsight oracle's statistics: the interval's own measured statistics;
- one plan per strategy: ``fixed`` (from the initial order), ``selectivity_first``,
  ``greedy``, ``dppick``, ``exact``, the ablations ``dppick_query`` /
  ``dppick_match`` on the forecast, ``dppick_nosmooth`` (dpPick on the last
  values), and ``oracle`` (exact on the interval's own statistics). With no
  history yet (the first interval of a stream), every adaptive strategy runs
  the initial order, as the paper's operator does before its first cycle;
- PMJoin key groups beside them: ``exact_pmjoin`` (the loop's choice: key-to-group rule and
  ``D`` chosen from the per-cell statistics of the period before ``t_k``, every group's
  orders by ``exact`` on the forecast of those groups) and ``oracle_pmjoin`` (the same
  choice and orders on the interval's own per-cell statistics); queries on several
  attribute classes, or without per-cell statistics, get one group (noted);
- every distinct plan is run by the engine's interval evaluation
  (``mjoin.engine.interval.run_interval_plans``: input read once, state built from the
  window before ``t_k``), ``repeats`` rounds (3 by default), and its cost measured: the engine's
  CPU time (its tasks' CPU, what other processes on a shared machine do not inflate), wall time
  of the batches, time in the probe steps, and the deterministic probe work (lookups and
  matches). The summary ranks the strategies by their engine CPU: per round the total over the
  intervals, the median over rounds, with the rounds' spread (min, max) beside it;
- results must be identical for every plan (same multiset size): checked.

The table (Parquet + CSV), the summary and an HTML report with plots go to
``<lake>/<namespace>/reports/<query>/evaluation/``.
"""
from __future__ import annotations

import json
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta

from mjoin.engine.config import EngineConfig
from mjoin.engine.interval import run_interval_plans
from mjoin.engine.metrics import read_metrics
from mjoin.evaluation.report import write_evaluation_report
from mjoin.forecast import holt as forecast_mod
from mjoin.lake.layout import Lake
from mjoin.model.keygroups import num_groups
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.model.query import load_query
from mjoin.model.statistics import aggregate_rows
from mjoin.model.timeutil import iso, parse_duration, parse_time
from mjoin.optimizer.cost import GroupOverhead, plan_cost, resolve_cost_model
from mjoin.optimizer.partitioning import Cells, optimize_partitioned
from mjoin.optimizer.strategies import optimize
from mjoin.runtime import fsutil
from mjoin.stats.cells import cell_map, history_for_rule, regroup_rows
from mjoin.stats.history import CELL_KINDS, HistoryError, history_root, read_cells, read_history
from mjoin.stats.job import StatsConfig, run_statistics

log = logging.getLogger(__name__)

ADAPTIVE = ("selectivity_first", "greedy", "dppick", "exact", "dppick_query", "dppick_match")
#: PMJoin key groups chosen per interval (mjoin.optimizer.partitioning.optimize_partitioned), beside the one-group strategies
PARTITIONED = ("exact_pmjoin", "oracle_pmjoin")
STRATEGIES = ("fixed",) + ADAPTIVE + ("dppick_nosmooth", "oracle") + PARTITIONED
#: what a strategy is built from: (optimizer, statistics source)
RECIPES = {**{s: (s, "forecast") for s in ADAPTIVE}, "fixed": ("fixed", "forecast"),
           "dppick_nosmooth": ("dppick", "last_value"), "oracle": ("exact", "oracle"),
           "exact_pmjoin": ("exact", "forecast"), "oracle_pmjoin": ("exact", "oracle"),
           "ajosc": ("ajosc", "forecast")}  # a peer (mjoin.optimizer.strategies.PEERS): the drift evaluation runs it


class EvaluationError(ValueError):
    """An evaluation that cannot run as asked (bad range, unknown strategy, engines disagree)."""


@dataclass
class EvalConfig:
    query: str
    lake: str
    start: str
    end: str
    period: float = 300.0  # interval length, seconds
    cycle: float = 10.0  # statistics cycle tau, seconds
    batch: float = 0.0  # engine batch length for the evaluation (0: = cycle)
    length: int = 60
    strategies: tuple = STRATEGIES
    initial_orders: tuple = ()  # permutations; empty: the spec's stream order
    namespace: str = "eval/evaluate"
    cost_model: str = ""
    stats_mode: str = "exact"
    reuse_stats: bool = False
    #: rounds: every distinct plan of an interval runs this often; the report ranks by the median CPU, with spread
    repeats: int = 3
    buckets: int = 0  # engine key buckets (0: engine default)

    def __post_init__(self):
        self.period = parse_duration(self.period)
        self.cycle = parse_duration(self.cycle)
        self.batch = parse_duration(self.batch) or self.cycle
        unknown = [s for s in self.strategies if s not in RECIPES]
        if unknown:
            raise EvaluationError(f"unknown strategies {unknown} (known: {', '.join(STRATEGIES)})")
        if parse_time(self.end) <= parse_time(self.start):
            raise EvaluationError(f"empty range [{self.start}, {self.end})")
        if self.period < self.batch:
            raise EvaluationError("period must be at least one batch")


@dataclass
class EvalResult:
    rows: list  # one per (interval, initial order, strategy)
    summary: list  # one per (initial order, strategy)
    report_dir: str
    seconds: float
    series: list = field(default_factory=list)  # forecast vs actual statistics per interval
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


#: an evaluation without a range covers this many periods before its run (mjoin_evaluate with the defaults)
RECENT_INTERVALS = 6


def recent_range(start, end, at, period: float, cycle: float) -> tuple[str, str]:
    """The range to evaluate: ``[start, end)`` as given; an empty ``end`` is the last cycle boundary at or before
    ``at`` (the run's time), an empty ``start`` :data:`RECENT_INTERVALS` periods before the end."""
    e = parse_time(end) if end else parse_time(math.floor(round(parse_time(at).timestamp(), 6) / cycle) * cycle)
    s = parse_time(start) if start else e - timedelta(seconds=RECENT_INTERVALS * parse_duration(period))
    return iso(s), iso(e)


def intervals(cfg: EvalConfig) -> list[tuple]:
    t0, t1 = parse_time(cfg.start), parse_time(cfg.end)
    out, t = [], t0
    while t < t1:
        out.append((t, min(t + timedelta(seconds=cfg.period), t1)))
        t += timedelta(seconds=cfg.period)
    return out


def check_has_data(cfg: EvalConfig, query=None) -> dict:
    """``{source: files}`` landed with arrival in ``[start, end)``; a range where no stream landed anything
    raises :class:`EvaluationError` naming what the lake holds (an all-zero report would look like a result)."""
    query = query or load_query(cfg.query)
    lake = Lake(cfg.lake)
    t0, t1 = parse_time(cfg.start).timestamp(), parse_time(cfg.end).timestamp()
    sources = sorted({s.source for s in query.streams})
    files = {src: len(lake.stream_files(src, t0, t1)) for src in sources}
    if not any(files.values()):
        arrivals = [a for src in sources for a in lake.arrivals(src)]
        held = (f"its streams hold arrival cycles from {iso(min(arrivals))} to {iso(max(arrivals))}" if arrivals
                else "nothing has landed for them")
        raise EvaluationError(f"no data to evaluate in [{iso(t0)}, {iso(t1)}): no stream of {query.name} "
                              f"({', '.join(sources)}) landed a file in that range under {lake.streams()}; {held}")
    return files


def plan_signature(plan) -> str:
    """Identity of what a plan executes (orders and partitioning), for sharing runs between strategies."""
    return json.dumps([plan.partitioning, {g: plan.orders[g] for g in plan.group_ids}, plan.options], sort_keys=True,
                      default=list)


def _stats_inputs(query, history, t, t_end, cfg: EvalConfig, forecast_mod):
    """(forecast, last_value, oracle, note) statistics for the interval starting at ``t``."""
    before = history[history["cycle_start"] < t] if len(history) else history
    inside = history[(history["cycle_start"] >= t) & (history["cycle_start"] < t_end)] if len(history) else history
    oracle = aggregate_rows(inside.to_dict("records"), kind="measured") if len(inside) else None
    flowed = before[before["entity"] == "stream"]["tuples"].fillna(0).sum() if len(before) else 0
    if flowed == 0:  # no cycle before the interval saw a tuple: nothing to forecast from
        return None, None, oracle, "no data before the interval: adaptive strategies use the initial order"
    fc = forecast_mod.forecast(before, t, length=cfg.length).statistics
    lv = forecast_mod.last_value(before, t, length=cfg.length)
    return fc, lv, oracle, ""


def build_plans(query, cfg: EvalConfig, order, fc, lv, oracle, cost_model, *, partitioned=None) -> tuple[dict, dict]:
    """``({strategy: Plan}, {strategy: why it fell back})`` for one interval and one initial order.
    ``partitioned``: ``{strategy: callable() -> Plan}`` for the PMJoin strategies (:func:`partitioned_plans`)."""
    plans, notes = {}, {}
    fixed = optimize(query, fc or oracle, "fixed", initial_order=order, cost_model=cost_model) if (fc or oracle) else None
    if fixed is None:
        fixed = make_plan(query, orders_from_permutation(query, order), "fixed")
    for name in cfg.strategies:
        optimizer, source = RECIPES[name]
        stats = {"forecast": fc, "last_value": lv, "oracle": oracle}[source]
        if name == "fixed":
            plans[name] = fixed
        elif name in PARTITIONED:
            made = (partitioned or {}).get(name)
            plan, why = made() if made else (None, "no per-cell statistics")
            if plan is None:  # one group: the same optimizer on the same statistics
                plan = optimize(query, stats, optimizer, initial_order=order, cost_model=cost_model) if stats else fixed
                notes[name] = f"one group: {why}"
            plans[name] = plan
        elif stats is None:
            plans[name] = fixed
            notes[name] = f"no {source} statistics: initial order"
        else:
            plans[name] = optimize(query, stats, optimizer, initial_order=order, cost_model=cost_model)
    return plans, notes


def partitioned_plans(query, cfg: EvalConfig, root: str, t, t_end, cost_model, buckets: int) -> dict:
    """``{strategy: callable() -> (Plan or None, note)}`` of the PMJoin strategies for the interval ``[t, t_end)``:
    key groups chosen on the per-cell statistics of the period before ``t`` (``exact_pmjoin``, orders from the
    forecast of the chosen groups) or of the interval itself (``oracle_pmjoin``, orders from its own statistics)."""
    overhead = GroupOverhead.for_model(cost_model, batch_seconds=cfg.batch, buckets=buckets)

    def cells_of(a, b) -> dict:
        out = {}
        for kind in CELL_KINDS:
            try:
                rows = read_cells(root, query.name, kind, start=a, end=b)
            except HistoryError:
                return {}
            rules = rows.attrs.get("rules") or {}
            if len(rows) and rules:
                newest = rules[max(rules)]
                keep = rows["cycle_start"].map(iso).isin({c for c, r in rules.items() if r == newest})
                if keep.any() and rows[keep & (rows["entity"] == "stream")]["tuples"].sum() > 0:
                    out[kind] = Cells.from_rows(kind, newest, rows[keep])
        return out

    def before():
        cells = cells_of(t - timedelta(seconds=cfg.period), t)
        if not cells or len(query.all_classes) != 1:
            return None, "no per-cell statistics before the interval" if not cells else "several attribute classes"

        def stats_for(rule):
            hist, _ = history_for_rule(root, query.name, rule, start=t - timedelta(seconds=cfg.length * cfg.cycle),
                                       end=t)
            return forecast_mod.forecast(hist, t, length=cfg.length).statistics

        plan, _ = optimize_partitioned(query, cells, "exact", cost_model=cost_model, overhead=overhead,
                                       stats_for=stats_for)
        return plan, ""

    def inside():
        cells = cells_of(t, t_end)
        if not cells or len(query.all_classes) != 1:
            return None, "no per-cell statistics in the interval" if not cells else "several attribute classes"
        plan, _ = optimize_partitioned(query, cells, "exact", cost_model=cost_model, overhead=overhead)
        return plan, ""

    return {"exact_pmjoin": before, "oracle_pmjoin": inside}


def _work(metrics: list[dict]) -> dict:
    """Probe work and time of a run, summed over batches, chains and steps (from the engine's metrics); the engine's
    CPU is its tasks' CPU time (``task_cpu_seconds``; a record without it: its chains')."""
    lookups = matches = 0
    probe = materialise = batch = cpu = 0.0
    for m in metrics:
        batch += float(m.get("wall_seconds") or 0)
        chain_cpu = sum(float(c.get("cpu_seconds") or 0) for c in m.get("chains", []))
        cpu += float(m["task_cpu_seconds"]) if m.get("task_cpu_seconds") is not None else chain_cpu
        for c in m.get("chains", []):
            materialise += float(c.get("materialise_seconds") or 0)
            for st in c.get("steps", []):
                lookups += int(st.get("lookups") or 0)
                matches += int(st.get("matches") or 0)
                probe += float(st.get("seconds") or 0)
    return {"lookups": lookups, "matches": matches, "probe_work": lookups + matches, "probe_seconds": probe,
            "materialise_seconds": materialise, "batch_seconds": batch, "engine_cpu_seconds": cpu}


def evaluate(spark, cfg: EvalConfig) -> EvalResult:
    """Run the evaluation described in the module docstring; writes the table and the report."""
    t_begin = time.perf_counter()
    query = load_query(cfg.query)
    check_has_data(cfg, query)
    lake_in = Lake(cfg.lake)
    ns = Lake(cfg.lake, cfg.namespace)
    model = resolve_cost_model(cfg.cost_model or None)
    orders = [list(o) for o in cfg.initial_orders] or [query.stream_names]
    spans = intervals(cfg)
    hist_start = parse_time(cfg.start) - timedelta(seconds=cfg.length * cfg.cycle)
    root = history_root(ns)

    # 1. statistics over the whole range once (they do not depend on plans)
    if not cfg.reuse_stats:
        run_statistics(spark, query, lake_in, hist_start, cfg.end, cfg.cycle, out=root,
                       config=StatsConfig(mode=cfg.stats_mode))
    history = read_history(root, query.name, start=hist_start, end=cfg.end)
    if len(history):
        history = history.assign(cycle_start=history["cycle_start"].map(parse_time))

    engine_config = EngineConfig(buckets=cfg.buckets) if cfg.buckets else EngineConfig()
    rows, series = [], []
    for k, (t, t_end) in enumerate(spans):
        fc, lv, oracle, note = _stats_inputs(query, history, t, t_end, cfg, forecast_mod)
        series += forecast_vs_actual(query, k, t, fc, lv, oracle)
        by_sig, assignments = {}, []
        made = partitioned_plans(query, cfg, root, t, t_end, model, engine_config.buckets) \
            if any(s in PARTITIONED for s in cfg.strategies) else None
        for order in orders:
            plans, notes = build_plans(query, cfg, order, fc, lv, oracle, model, partitioned=made)
            for name, plan in plans.items():
                sig = plan_signature(plan)
                label = by_sig.setdefault(sig, (f"p{len(by_sig)}", plan))[0]
                assignments.append((order, name, plan, label, notes.get(name, note if RECIPES[name][1] != "oracle" else "")))
        unique = {label: plan for label, plan in by_sig.values()}
        out = fsutil.join(ns.reports(query.name), "evaluation_runs", f"k{k:04d}")
        measured = {label: [] for label in unique}
        for _ in range(max(1, cfg.repeats)):
            summaries = run_interval_plans(spark, query, unique, lake_in, t, t_end, cfg.batch, out, config=engine_config)
            for label, summ in summaries.items():
                measured[label].append((summ, _work(read_metrics(summ.metrics_path))))
        results = {label: {s.result_rows for s, _ in runs} for label, runs in measured.items()}
        distinct = {n for v in results.values() for n in v}
        if len(distinct) > 1:
            raise EvaluationError(f"interval {iso(t)}: plans produced different result counts {results}: engine bug")
        for order, name, plan, label, why in assignments:
            runs = measured[label]
            med = _median_run(runs)
            rows.append({
                "interval": k, "interval_start": iso(t), "interval_end": iso(t_end), "initial_order": ",".join(order),
                "strategy": name, "plan_id": label, "orders": {s: [r for _, r in p] for s, p in plan.orders[0].items()},
                "key_groups": len(plan.group_ids), "partitioning": plan.partitioning,
                "estimated_cost_forecast": _safe_cost(plan_cost, query, _as_groups(fc, plan, root, query, t, t_end,
                                                                                     "before"), plan, model),
                "estimated_cost_oracle": _safe_cost(plan_cost, query, _as_groups(oracle, plan, root, query, t, t_end,
                                                                                   "inside"), plan, model),
                "result_rows": runs[0][0].result_rows, "repeats": len(runs), "note": why, **med,
                "engine_cpu_rounds": [w["engine_cpu_seconds"] for _, w in runs]})
        log.info("interval %d/%d %s: %d plans for %d strategies x %d orders", k + 1, len(spans), iso(t), len(unique),
                 len(cfg.strategies), len(orders))
    summary = summarize(rows)
    report_dir = fsutil.join(ns.reports(query.name), "evaluation")
    result = EvalResult(rows=rows, summary=summary, report_dir=report_dir, seconds=time.perf_counter() - t_begin,
                        series=series, meta={"config": asdict(cfg), "query": query.name, "history_root": root,
                              "intervals": [[iso(a), iso(b)] for a, b in spans], "cost_model": model.to_json()})

    write_evaluation_report(result, history=history, query=query)
    return result


def _as_groups(stats, plan, root, query, t, t_end, which):
    """``stats`` for a plan of one group; for a partitioned plan, the interval's own (``inside``) statistics or
    the forecast's source (``before``: the forecast is not per group, so the last period's cells) regrouped
    into its groups (None where there are no cells)."""
    if stats is None or not plan.partitioning:
        return stats

    if which == "before":
        return None  # the forecast of this plan's groups is not kept: its estimated cost is left empty
    for kind in CELL_KINDS:
        try:
            rows = read_cells(root, query.name, kind, start=t, end=t_end)
        except Exception:
            return None
        rules = rows.attrs.get("rules") or {}
        if rows.empty or not rules:
            continue
        cell_rule = rules[max(rules)]
        mapping = cell_map(cell_rule, plan.partitioning)
        if mapping is None:
            continue
        keep = rows["cycle_start"].map(iso).isin({c for c, r in rules.items() if r == cell_rule})
        st = aggregate_rows(regroup_rows(rows[keep], mapping, num_groups(plan.partitioning)).to_dict("records"))
        st.partitioning = plan.partitioning
        return st
    return None


def _median_run(runs) -> dict:
    """The run with the median batch time among repeats (its work counters are the same for all), with the median
    engine CPU over the repeats."""
    cpu = statistics.median(w["engine_cpu_seconds"] for _, w in runs)
    runs = sorted(runs, key=lambda sw: sw[1]["batch_seconds"])
    summ, work = runs[len(runs) // 2]
    return {**work, "engine_cpu_seconds": cpu, "wall_seconds": summ.wall_seconds}


def _safe_cost(plan_cost, query, stats, plan, model):
    if stats is None:
        return None
    try:
        v = float(plan_cost(query, stats, plan, model))
        return v if math.isfinite(v) else None
    except Exception as exc:  # statistics incomplete for this interval: say so in the table
        log.debug("cannot cost %s: %s", plan.strategy, exc)
        return None


def forecast_vs_actual(query, k: int, t, fc, lv, oracle) -> list[dict]:
    """Per statistic (lambda per stream, gamma and mu per edge): forecast, last value and actual."""
    out = []

    def get(stats, fn, *args):
        try:
            return None if stats is None else float(fn(stats)(*args))
        except Exception:
            return None

    for s in query.stream_names:
        out.append({"interval": k, "interval_start": iso(t), "statistic": "lambda", "series": s,
                    **{name: get(st, lambda x: x.lam, s) for name, st in (("forecast", fc), ("last_value", lv), ("actual", oracle))}})
    for l, r in query.directed_edges:
        for stat in ("gamma", "mu"):
            out.append({"interval": k, "interval_start": iso(t), "statistic": stat, "series": f"{l}->{r}",
                        **{name: get(st, lambda x: getattr(x, stat), l, r)
                           for name, st in (("forecast", fc), ("last_value", lv), ("actual", oracle))}})
    return out


def summarize(rows: list[dict]) -> list[dict]:
    """Per (initial order, strategy): totals over intervals and the regret against the oracle, ranked by the engine's
    measured CPU.

    ``engine_cpu_seconds``: per round, the CPU of the strategy's plans summed over the intervals; the median over the
    rounds (``engine_cpu_min``, ``engine_cpu_max``: the rounds' spread; ``rounds``: how many). The summary is sorted
    by it (then by probe work): what the plans cost on this machine, measured, with the deterministic probe work
    (lookups + matches) beside it.
    ``regret_work``: measured probe work minus the oracle plan's, summed over intervals (can be
    negative: the cost model is a model, so a plan it ranks worse may measure a little less);
    ``regret_estimated``: the plan's cost minus the oracle plan's, both under the interval's own
    measured statistics (Eq. 1-8; >= 0 because the oracle is the exact optimum of that cost)."""
    oracle = {(r["initial_order"], r["interval"]): r for r in rows if r["strategy"] == "oracle"}
    acc: dict = {}
    for r in rows:
        a = acc.setdefault((r["initial_order"], r["strategy"]), {
            "initial_order": r["initial_order"], "strategy": r["strategy"], "intervals": 0, "batch_seconds": 0.0,
            "probe_seconds": 0.0, "probe_work": 0, "lookups": 0, "matches": 0, "regret_work": 0,
            "regret_estimated": 0.0, "plan_changes": 0, "key_groups": [], "_last": None, "_rounds": []})
        a["intervals"] += 1
        a["key_groups"].append(int(r.get("key_groups") or 1))  # per interval: how many groups its plan had
        for f in ("batch_seconds", "probe_seconds", "probe_work", "lookups", "matches"):
            a[f] += r[f]
        per_round = r.get("engine_cpu_rounds") or [r.get("engine_cpu_seconds") or 0.0]
        a["_rounds"] = [x + y for x, y in zip(a["_rounds"], per_round)] if a["_rounds"] else list(per_round)
        o = oracle.get((r["initial_order"], r["interval"]))
        if o is not None:
            a["regret_work"] += r["probe_work"] - o["probe_work"]
            if r.get("estimated_cost_oracle") is not None and o.get("estimated_cost_oracle") is not None:
                a["regret_estimated"] += r["estimated_cost_oracle"] - o["estimated_cost_oracle"]
        sig = json.dumps([r["orders"], r.get("partitioning")], sort_keys=True)
        if a["_last"] is not None and sig != a["_last"]:
            a["plan_changes"] += 1
        a["_last"] = sig
    out = []
    for a in acc.values():
        a.pop("_last")
        rounds = a.pop("_rounds")
        a.update(engine_cpu_seconds=statistics.median(rounds), engine_cpu_min=min(rounds),
                 engine_cpu_max=max(rounds), rounds=len(rounds))
        out.append(a)
    return sorted(out, key=lambda a: (a["initial_order"], a["engine_cpu_seconds"], a["probe_work"]))
