"""Steps 2-3 of a run: the Holt forecast of the active plan's key groups and its gate, then the candidate
plan (cost model calibrated from the live join, key groups, probe orders) and the plan gate against the
active plan."""
from __future__ import annotations

import hashlib
import json
import logging
import time
from datetime import timedelta

from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.forecast.holt import ForecastConfig, forecast as holt
from mjoin.gates.forecast import check_forecast as forecast_gate
from mjoin.gates.plan import check_plan as plan_gate
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.loop.config import LoopConfig, finish_gate, read_doc, stats_root, write_doc
from mjoin.loop.drift import shift_since
from mjoin.model.statistics import Statistics
from mjoin.model.timeutil import iso, parse_time
from mjoin.optimizer.calibrate import CalibrationError, calibrate_from_lake
from mjoin.optimizer.cost import GroupOverhead, plan_cost
from mjoin.optimizer.partitioning import Cells, optimize_partitioned, overhead_from_metrics
from mjoin.optimizer.strategies import optimize as run_optimizer
from mjoin.runtime import fsutil
from mjoin.stats.cells import history_for_rule
from mjoin.stats.effective import effective_statistics, engine_state_summary
from mjoin.stats.history import CELL_KINDS, HistoryError, read_cells

log = logging.getLogger(__name__)


def active_rule(cfg: LoopConfig, query) -> dict | None:
    """The key-to-group rule of the active plan (None: one group, or no active plan)."""
    plan = PlanRegistry(cfg.lake_, query.name).active(query)
    return (plan.partitioning or None) if plan else None


def rule_history(cfg: LoopConfig, query, rule, end):
    """The last L cycles before ``end`` as statistics of ``rule``'s key groups (:func:`mjoin.stats.cells.
    history_for_rule`: cycles computed under another rule are re-aggregated from their per-cell statistics);
    after a level shift the drift watcher recorded inside that window, only the cycles since it
    (:func:`mjoin.loop.drift.shift_since`)."""
    start = parse_time(end) - timedelta(seconds=cfg.length * cfg.cycle)
    shift = shift_since(cfg.lake_, query.name, start, end)
    if shift is not None:
        log.info("forecast of %s from %s on: the drift watcher saw a level shift there", query.name, iso(shift))
        start = shift
    return history_for_rule(stats_root(cfg), query.name, rule, start=start, end=end)


def _rule_tag(rule) -> str:
    return "" if not rule else hashlib.sha1(json.dumps(rule, sort_keys=True).encode()).hexdigest()[:10]


def forecast_path(ctx: dict, rule) -> str:
    """``forecast.json`` (the active plan's key groups) or ``forecast_<rule tag>.json`` (another rule's)."""
    tag = _rule_tag(rule)
    return fsutil.join(ctx["run_dir"], "forecast.json" if tag == ctx.get("forecast_rule_tag", "") else
                       f"forecast_{tag or 'one_group'}.json")


def forecast_config(cfg: LoopConfig):
    """The forecast's settings: Holt kept within the forecast gate's bound of this run (``forecast_bound``)."""
    return ForecastConfig(bound=cfg.gate_config().forecast_bound() if cfg.forecast_bound else None)


def forecast_rule(cfg: LoopConfig, ctx: dict, query, rule, path: str | None = None):
    """Holt forecast of ``rule``'s key groups from the last L cycles before the interval end (no look-ahead),
    written to ``path`` with its report; the statistics. Never blind after a rule change: every cycle of the
    window counts, re-aggregated from its cells when it was computed under another rule."""
    history, report = rule_history(cfg, query, rule, ctx["end"])
    res = holt(history, ctx["end"], length=cfg.length, config=forecast_config(cfg))
    res.statistics.partitioning = rule or None
    res.statistics.meta["history"] = report
    path = path or forecast_path(ctx, rule)
    res.statistics.save(path)
    write_doc(path[: -len(".json")] + "_report.json", {**res.to_json(), "history": report})
    if report["regrouped"]:
        log.info("forecast of %s: %d cycle(s) as stored, %s re-aggregated from per-cell statistics for the key groups "
                 "%s", query.name, report["as_stored"], report["regrouped"], rule)
    return res


def forecast(cfg: LoopConfig, ctx: dict) -> dict:
    """Holt forecast of the next cycle of the active plan's key groups from the last L cycles before the interval
    end (no look-ahead)."""
    query = cfg.load_query()
    rule = active_rule(cfg, query)
    path = fsutil.join(ctx["run_dir"], "forecast.json")
    res = forecast_rule(cfg, ctx, query, rule, path)
    write_doc(fsutil.join(ctx["run_dir"], "forecast_rule.json"), {"rule": rule, "tag": _rule_tag(rule)})
    methods = {str(k): int(v) for k, v in res.report["method"].value_counts().items()} if len(res.report) else {}
    out_of_range = res.statistics.meta["out_of_range"]
    log.info("forecast of %s: %d series, %d Holt forecast(s) outside the forecast gate's recent range replaced by "
             "the last value%s", query.name, len(res.report), len(out_of_range),
             f" ({', '.join(out_of_range)})" if out_of_range else "" if cfg.forecast_bound else " (bound off)")
    return {"forecast": path, "methods": methods, "series": int(len(res.report)), "key_groups": rule,
            "out_of_range": len(out_of_range), "out_of_range_series": out_of_range,
            "forecast_bound": cfg.forecast_bound, "history": res.statistics.meta["history"]}


def _forecast_rule_tag(ctx: dict) -> str:
    p = fsutil.join(ctx["run_dir"], "forecast_rule.json")
    return read_doc(p)["tag"] if fsutil.exists(p) else ""


def stats_for_rule(cfg: LoopConfig, ctx: dict, query, rule):
    """The forecast of ``rule``'s key groups for this run: ``forecast.json`` when it is the active plan's rule,
    else made once (:func:`forecast_rule`) and kept in the run folder."""
    ctx = {**ctx, "forecast_rule_tag": _forecast_rule_tag(ctx)}
    path = forecast_path(ctx, rule)
    if fsutil.exists(path):
        return Statistics.load(path)
    return forecast_rule(cfg, ctx, query, rule, path).statistics


def check_forecast(cfg: LoopConfig, ctx: dict) -> dict:
    query = cfg.load_query()
    history, _ = rule_history(cfg, query, active_rule(cfg, query), ctx["end"])
    return finish_gate(forecast_gate(query, fsutil.join(ctx["run_dir"], "forecast.json"), history, config=cfg.gate_config()),
                        ctx, "forecast")


def cost_model_path(cfg: LoopConfig) -> str | None:
    if cfg.cost_model:
        return cfg.cost_model
    default = fsutil.join(Lake(cfg.lake).plans(cfg.load_query().name), "cost_model.json")
    return default if fsutil.exists(default) else None


def calibrate(cfg: LoopConfig, query, run_dir: str) -> dict:
    """Refit alpha_q, alpha_m and the per-call cost (docs/algorithms.md Eq. 1-8) to the live join job's newest
    batches (``mjoin.optimizer.calibrate.calibrate_from_lake``), writing the model the optimizer and the plan gate read.

    Skipped for an explicit ``cost_model`` and in evaluation namespaces (their joins are not the live job's);
    a weak fit (R^2 under ``calibration_min_r2``) or no metrics keeps the previous model. The outcome is in
    ``calibration.json`` of the run folder."""
    if not cfg.calibrate or cfg.cost_model or cfg.namespace:
        why = ("off (calibrate=false)" if not cfg.calibrate else "explicit cost_model" if cfg.cost_model
               else "evaluation namespace")
        doc = {"status": "skipped", "reason": why}
    else:
        try:
            _, report, path = calibrate_from_lake(Lake(cfg.lake), query, last=cfg.calibration_batches,
                                                  min_r2=cfg.calibration_min_r2)
            doc = {"status": "fitted", "path": path, "r2": report.get("r2"), "records": report.get("records"),
                   "batches": report.get("batches"), "coefficients": report.get("coefficients")}
        except CalibrationError as exc:
            doc = {"status": "kept", "reason": str(exc)}
    doc["cost_model"] = cost_model_path(cfg) or "defaults (uncalibrated)"
    fsutil.atomic_write_text(fsutil.join(run_dir, "calibration.json"), json.dumps(doc, indent=2, default=str))
    log.info("calibration: %s (%s); cost model: %s", doc["status"],
             doc.get("reason") or f"R^2 {doc['r2']:.3f} over {doc['records']} batches", doc["cost_model"])
    return doc


def effective_state(cfg: LoopConfig, query, run_dir: str, stats):
    """The forecast with kappa, window tuples and lambda as the live join holds and probes them under
    punctuations (:mod:`mjoin.stats.effective`), from its newest batches; unchanged without punctuations (and
    for evaluation namespaces, which have no live join). Recorded in ``effective_state.json``."""
    if cfg.namespace:
        return stats
    try:
        records = read_metrics(Lake(cfg.lake), query.name)[-cfg.calibration_batches:]
    except (OSError, ValueError):
        records = []
    summary = engine_state_summary(records)
    write_doc(fsutil.join(run_dir, "effective_state.json"), {"applied": summary is not None, "per_stream": summary,
                                                           "batches": len(records)})
    return effective_statistics(stats, summary)


def group_overhead(cfg: LoopConfig, query, run_dir: str):
    """The per-group overhead (``mjoin.optimizer.cost.GroupOverhead``) for this run: a probe chain's fixed cost measured in
    the live join's newest batches where there are enough (the defaults otherwise; evaluation namespaces have
    no live join), batches of one statistics cycle, the engine's key buckets; kept in ``group_overhead.json``."""
    path = fsutil.join(run_dir, "group_overhead.json")
    if fsutil.exists(path):
        return GroupOverhead(**read_doc(path)["overhead"])
    records = []
    if not cfg.namespace:
        try:
            records = read_metrics(Lake(cfg.lake), query.name)[-cfg.calibration_batches:]
        except (OSError, ValueError):
            records = []
    overhead, how = overhead_from_metrics(records, cost_model_path(cfg), batch_seconds=cfg.cycle,
                                          buckets=EngineConfig().buckets)
    write_doc(path, {"overhead": overhead.to_json(), "from": how, "batches": len(records)})
    return overhead


def key_group_cells(cfg: LoopConfig, ctx: dict, query) -> dict:
    """``{kind: Cells}``: the per-cell statistics of the run's interval (its cycles of one cell rule, the newest)."""
    out = {}
    for kind in CELL_KINDS:
        try:
            rows = read_cells(stats_root(cfg), query.name, kind, start=ctx["start"], end=ctx["end"])
        except HistoryError:  # no history at all
            return {}
        rules = rows.attrs.get("rules") or {}
        if rows.empty or not rules:
            continue
        newest = rules[max(rules)]
        same = {c for c, r in rules.items() if r == newest}
        starts = rows["cycle_start"].map(lambda t: iso(t))
        out[kind] = Cells.from_rows(kind, newest, rows[starts.isin(same)])
    return out


def optimize(cfg: LoopConfig, ctx: dict) -> dict:
    """The candidate plan: key groups chosen from the interval's per-cell statistics (``partition_method``,
    ``partition_groups``; :func:`mjoin.optimizer.partitioning.optimize_partitioned`), every group's orders from the forecast of
    those groups (``strategy``)."""
    query = cfg.load_query()
    calibration = calibrate(cfg, query, ctx["run_dir"])
    model = cost_model_path(cfg)
    t0 = time.perf_counter()
    source = {"statistics": stats_root(cfg), "interval": [ctx["start"], ctx["end"]], "run_id": cfg.run_id}
    search = cfg.partition_search()
    cells = key_group_cells(cfg, ctx, query) if search else {}
    forecast_of = lambda rule: effective_state(cfg, query, ctx["run_dir"], stats_for_rule(cfg, ctx, query, rule))  # noqa: E731
    choice = None
    if search and cells and len(query.all_classes) == 1:
        methods, counts, forced = search
        plan, choice = optimize_partitioned(
            query, cells, cfg.strategy, methods=methods, counts=counts, cost_model=model, forced=forced,
            overhead=group_overhead(cfg, query, ctx["run_dir"]), stats_for=forecast_of,
            initial_order=cfg.initial_order or None, source=source)
        write_doc(fsutil.join(ctx["run_dir"], "key_groups.json"), choice.to_json())
        for line in choice.describe().splitlines():
            log.info("%s", line)
    else:
        why = ("partition_method none / partition_groups 1" if not search else
               f"{query.name} joins on {len(query.all_classes)} attribute classes" if len(query.all_classes) != 1
               else "no per-cell statistics in the interval")
        plan = run_optimizer(query, forecast_of(None), cfg.strategy, initial_order=cfg.initial_order or None,
                             cost_model=model, partitioning={}, source={**source, "key_groups": {"note": why}})
    plan.source["forecast"] = forecast_path({**ctx, "forecast_rule_tag": _forecast_rule_tag(ctx)}, plan.partitioning)
    path = fsutil.join(ctx["run_dir"], "candidate_plan.json")
    plan.save(path)
    return {"plan": path, "strategy": plan.strategy, "estimated_cost": plan.estimated_cost,
            "seconds": round(time.perf_counter() - t0, 4), "calibration": calibration["status"],
            "cost_model": calibration["cost_model"],
            "key_groups": {"method": choice.method, "groups": choice.groups, "gain": choice.gain} if choice else None,
            "orders": {s: [r for _, r in pairs] for s, pairs in plan.orders[plan.group_ids[0]].items()}}


def check_plan(cfg: LoopConfig, ctx: dict) -> dict:
    """Plan gate: valid for the query, cost finite, better than the active plan by the threshold, each plan
    costed under the forecast of its own key groups (one history, regrouped) plus its per-group overhead: the
    whole plan, rule and orders, with one hysteresis."""
    query = cfg.load_query()
    active = PlanRegistry(cfg.lake_, query.name).active(query)
    model = cost_model_path(cfg)
    overhead = group_overhead(cfg, query, ctx["run_dir"])
    buckets = key_group_cells(cfg, ctx, query).get("buckets")  # the overhead per engine bucket, as priced
    cells = (buckets.stats, buckets.rule) if buckets else None
    result = plan_gate(query, fsutil.join(ctx["run_dir"], "candidate_plan.json"), active=active,
                  cost_fn=lambda p: plan_cost(query, stats_for_rule(cfg, ctx, query, p.partitioning), p, model,
                                              overhead, cells=cells),
                  config=cfg.gate_config())
    brief = finish_gate(result, ctx, "plan")
    brief["active_version"] = active.version if active else None
    brief["improvement"] = result.details.get("improvement")
    brief["threshold"] = result.details.get("threshold")
    return brief
