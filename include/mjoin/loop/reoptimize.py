"""The steps of one re-optimization run, as plain functions (the DAG only wires them).

ARCHITECTURE.md, "Data flow of one re-optimization": for the interval
``[end - period, end)`` of whole statistics cycles ending at the last cycle
boundary at or before the run's logical date (:func:`interval_for`), judged
once its last cycle is complete (:func:`await_cycles`):

    land (cycle mode) -> input gate -> join (Spark) -> statistics (Spark) -> gate
      -> forecast (Holt) -> gate -> optimize -> plan gate -> publish + activate -> record

Each step reads what the earlier ones wrote in the run folder
``<lake>[/<namespace>]/reports/<query>/runs/<end>/`` and returns a small
JSON-able dict (Airflow passes it as XCom). A failed gate raises
:class:`StepFailed` after writing its machine-readable result there; a plan
that is not better than the active one is the outcome ``no_change``.

Runs of a backfill (``run_type == "backfill"``) and evaluations work in a
separate namespace of the lake (default ``eval/backfill``): their statistics,
plans, registry, results and reports never touch the live deployment, and
they read only data before each run's interval end (no look-ahead). A backfill
always runs in cycle mode (its join is the interval evaluation of its own
interval; there is no running job of the past to hot-reload), whatever ``mode``
says.

Gate thresholds: one :class:`mjoin.gates.config.GateConfig` per run, its defaults
overridden by the ``gates`` param; the ``improvement_threshold`` param is a
shortcut for ``gates.improvement_threshold`` (the latter wins when both are
given). Every step uses :meth:`LoopConfig.gate_config`, and messages print the
threshold the plan gate actually used.

Outcomes: ``record`` writes ``outcome.json`` into the run folder (one file per
run, atomically), for every run, with the reason a failed one failed (the
DAG's failure callback keeps each task's error there, :func:`note_failure`;
a run whose ``prepare`` failed gets the folder :func:`fallback_context`
rebuilds); :func:`mjoin.loop.ui.read_outcomes` reads them back sorted, so two runs
at once in one namespace never lose each other's outcome.
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta, timezone

from mjoin.lake import fsutil
from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso, parse_duration, parse_time

log = logging.getLogger(__name__)

BACKFILL_NAMESPACE = "eval/backfill"


class StepFailed(RuntimeError):
    """A gate failed (or a step could not run): the run stops here, the active plan stays."""

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message)
        self.result = result or {}


class NoChange(RuntimeError):
    """The step has nothing to do (the DAG shows it as skipped, not failed)."""


@dataclass
class LoopConfig:
    """Everything a run needs; built from the DAG params (one place of defaults)."""

    query: str = "tpcds_returns_by_address"
    lake: str = ""
    namespace: str = ""
    strategy: str = "exact"
    length: int = 60  # L: statistics cycles the forecast reads
    #: a Holt forecast outside the range the forecast gate accepts becomes the series' last value (mjoin.forecast.holt)
    forecast_bound: bool = True
    cycle: float = 10.0  # tau: statistics cycle, seconds
    period: float = 300.0  # the re-optimization period (the DAG schedule), seconds
    improvement_threshold: float | None = None  # None: GateConfig's default (resolved in from_params)
    dry_run: bool = False
    mode: str = "cycle"  # cycle | continuous
    workload: str = ""  # cycle mode: land each interval from this generated workload
    initial_order: list = field(default_factory=list)
    cost_model: str = ""  # path of a calibrated cost model JSON ("" = <lake>/.../cost_model.json if present)
    calibrate: bool = True  # refit the cost model from the live join's metrics before optimizing
    calibration_batches: int = 200  # ... from its newest batches
    calibration_min_r2: float = 0.3  # ... and keep the previous model when the fit explains less
    gates: dict = field(default_factory=dict)  # GateConfig overrides
    stats_mode: str = "exact"  # exact | sketch
    #: PMJoin key groups: the rule's method (auto: the cheapest of all; none: one group) and D (auto: the cheapest)
    partition_method: str = "auto"
    partition_groups: str = "auto"
    deploy_timeout: float = 600.0  # continuous mode: wait this long for the job to switch
    #: a cycle counts as complete once every stream landed it (or a later cycle), or this long after its end
    landing_allowance: float = 30.0
    run_id: str = ""
    run_type: str = "manual"

    @classmethod
    def from_params(cls, params: dict, *, run_id: str = "", run_type: str = "manual") -> "LoopConfig":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (params or {}).items() if k in known and v is not None}
        for k in ("cycle", "period", "deploy_timeout", "landing_allowance"):
            if k in values:
                values[k] = parse_duration(values[k])
        if isinstance(values.get("initial_order"), str):
            values["initial_order"] = [s.strip() for s in values["initial_order"].split(",") if s.strip()]
        if isinstance(values.get("gates"), str):
            values["gates"] = json.loads(values["gates"] or "{}")
        if not isinstance(values.get("gates", {}), dict):
            raise ValueError(f"gates must be an object of threshold overrides, not {values['gates']!r}")
        cfg = cls(**values, run_id=run_id, run_type=run_type)
        if not cfg.lake:
            from mjoin.runtime.resources import Resources

            cfg.lake = Resources.from_env().lake
        if cfg.mode not in ("cycle", "continuous"):
            raise ValueError(f"mode {cfg.mode!r}: use cycle or continuous")
        cfg._check_partitioning()
        if run_type == "backfill":
            if not cfg.namespace:
                cfg.namespace = BACKFILL_NAMESPACE
            if cfg.mode != "cycle":
                log.warning("backfill run: mode %s ignored, a backfill always runs in cycle mode", cfg.mode)
                cfg.mode = "cycle"
        cfg._resolve_gates()
        if cfg.period < cfg.cycle or cfg.cycle <= 0:
            raise ValueError(f"period ({cfg.period} s) must be at least one statistics cycle ({cfg.cycle} s)")
        return cfg

    def _resolve_gates(self) -> None:
        """One improvement threshold: ``gates.improvement_threshold`` > the param > GateConfig's default.
        Validates every override (unknown keys and bad values raise GateConfigError, a ValueError)."""
        from mjoin.gates.config import GateConfig

        gates = dict(self.gates or {})
        param = self.improvement_threshold
        if "improvement_threshold" not in gates and param is not None:
            gates["improvement_threshold"] = param
        config = GateConfig.from_dict(gates)
        if param is not None and "improvement_threshold" in (self.gates or {}) and \
                float(param) != config.improvement_threshold:
            log.warning("improvement threshold %s (gates.improvement_threshold) wins over the improvement_threshold "
                        "param (%s)", config.improvement_threshold, param)
        self.gates = gates
        self.improvement_threshold = config.improvement_threshold

    def _check_partitioning(self) -> None:
        from mjoin.optimizer.partitioning import METHODS

        if self.partition_method not in ("auto", "none") + METHODS:
            raise ValueError(f"partition_method {self.partition_method!r}: use auto, none or one of {', '.join(METHODS)}")
        g = str(self.partition_groups).strip()
        if g != "auto" and not (g.isdigit() and 1 <= int(g) <= 64):
            raise ValueError(f"partition_groups {self.partition_groups!r}: use auto or a number of groups 1..64")
        self.partition_groups = g

    def partition_search(self) -> tuple[tuple, tuple, bool] | None:
        """``(methods, counts, forced)`` the optimizer chooses key groups from; None: one group (no rule).
        ``forced``: a fixed ``D`` > 1 is used even where one group prices lower."""
        from mjoin.optimizer.partitioning import GROUP_COUNTS, METHODS

        if self.partition_method == "none" or self.partition_groups == "1":
            return None
        methods = METHODS if self.partition_method == "auto" else (self.partition_method,)
        counts = GROUP_COUNTS if self.partition_groups == "auto" else (1, int(self.partition_groups))
        return methods, counts, self.partition_groups != "auto"

    def gate_config(self):
        """The run's GateConfig: the defaults with this run's overrides (the only source of thresholds)."""
        from mjoin.gates.config import GateConfig

        overrides = dict(self.gates or {})
        if "improvement_threshold" not in overrides and self.improvement_threshold is not None:
            overrides["improvement_threshold"] = self.improvement_threshold
        return GateConfig.from_dict(overrides)

    def to_json(self) -> dict:
        return asdict(self)

    # ---- derived -----------------------------------------------------------------
    @property
    def lake_(self) -> Lake:
        return Lake(self.lake, self.namespace)

    def load_query(self):
        from mjoin.model.query import load_query

        return load_query(self.query)


def interval_for(logical_date, period: float, cycle: float | None = None) -> tuple[datetime, datetime]:
    """The run's interval: the whole statistics cycles ``[end - n cycle, end)`` with ``end`` the last cycle
    boundary at or before the logical date (cycles are aligned to multiples of ``cycle`` from the epoch, as
    the lake's arrival folders are) and ``n = round(period / cycle)`` (at least 1).

    Derived from the logical date alone, the same way for scheduled runs (logical dates like
    ``...:31.905813``), UI triggers at "now", manual runs with any date and backfills (Airflow 3 gives
    manual runs a zero-length data interval). Without ``cycle``: ``[logical_date - period, logical_date)``."""
    at = parse_time(logical_date)
    if not cycle:
        return at - timedelta(seconds=period), at
    end = parse_time(math.floor(round(at.timestamp(), 6) / cycle) * cycle)
    n = max(1, int(round(period / cycle)))
    return end - timedelta(seconds=n * cycle), end


def run_dir(cfg: LoopConfig, query_name: str, end) -> str:
    """``<lake>[/<ns>]/reports/<query>/runs/<interval end>/``; a second run over the same interval (another
    run id, e.g. a UI trigger within a cycle of a scheduled run) gets ``<interval end>.<run id>/`` so no
    run's outcome replaces another's (a retry or a cleared run keeps its folder)."""
    stamp = parse_time(end).strftime("%Y%m%dT%H%M%SZ")
    runs = fsutil.join(cfg.lake_.reports(query_name), "runs")
    folder = fsutil.join(runs, stamp)
    if cfg.run_id:
        ctx_path = fsutil.join(folder, "context.json")
        try:
            owner = json.loads(fsutil.read_text(ctx_path)).get("config", {}).get("run_id") \
                if fsutil.exists(ctx_path) else None
        except (OSError, ValueError):
            owner = None
        if owner and owner != cfg.run_id:
            folder = fsutil.join(runs, f"{stamp}.{re.sub(r'[^A-Za-z0-9_.-]+', '_', cfg.run_id)}")
    return folder


def _write(path: str, doc) -> str:
    fsutil.atomic_write_text(path, json.dumps(doc, indent=2, default=str))
    return path


def _read(path: str):
    return json.loads(fsutil.read_text(path))


# ---- 0. prepare ------------------------------------------------------------------

def lands_itself(cfg: LoopConfig) -> bool:
    """Cycle mode with a ``workload`` in the live namespace: the run lands its own interval (demo, tests)."""
    return cfg.mode == "cycle" and bool(cfg.workload) and not cfg.namespace


def prepare(cfg: LoopConfig, logical_date) -> dict:
    """Resolve the interval (whole cycles, see :func:`interval_for`) and run folder; the Spark job arguments.

    On a lake fed from outside (not :func:`lands_itself`) the interval starts no earlier than the first
    cycle landed for the query (a cycle before the feed began is not a cycle of missing data; an interval
    wholly before it fails), and the statistics job also covers the landed cycles before the interval that
    the statistics history lacks (up to ``L`` cycles), so a fresh deployment's first run already has the
    history its forecast needs."""
    query = cfg.load_query()
    start, end = interval_for(logical_date, cfg.period, cfg.cycle)
    clipped, stats_from, skip = None, start, None
    if not lands_itself(cfg):
        began = first_cycle(cfg, query)
        if began is None:
            raise StepFailed(f"nothing has landed for {query.name} ({', '.join(sorted({s.source for s in query.streams}))}) "
                             f"under {Lake(cfg.lake).streams()}: start a feed (python -m mjoin live, or land a workload)")
        if began >= end:  # not missing data: the lake's history starts later (e.g. a run made before the feed began)
            skip = (f"the interval [{iso(start)}, {iso(end)}) ends before the first landed cycle {iso(began)} of "
                    f"{query.name}: nothing to judge or re-optimize")
        else:
            if began > start:
                clipped, start = iso(start), began
            stats_from = _stats_from(cfg, query, start, end, began)
    folder = run_dir(cfg, query.name, end)
    fsutil.makedirs(folder)
    ctx = {"query": query.name, "start": iso(start), "end": iso(end), "run_dir": folder, "namespace": cfg.namespace,
           "lake": cfg.lake, "mode": cfg.mode, "logical_date": iso(logical_date), "clipped_from": clipped,
           "stats_from": iso(stats_from), "skip": skip, "prepared_at": iso(datetime.now(timezone.utc)),
           "config": cfg.to_json()}
    ctx["join_args"] = join_args(cfg, query, start, end, folder)
    ctx["stats_args"] = stats_args(cfg, query, stats_from, end)
    _write(fsutil.join(folder, "context.json"), ctx)
    log.info("re-optimization of %s for [%s, %s) (logical date %s%s) in %s", query.name, ctx["start"], ctx["end"],
             ctx["logical_date"], f"; starts at the first landed cycle, not {clipped}" if clipped else "", folder)
    return ctx


def first_cycle(cfg: LoopConfig, query) -> datetime | None:
    """The first statistics cycle holding landed data of the query (its first arrival, up to the cycle grid)."""
    from mjoin.gates.input import first_arrival

    a = first_arrival(query, Lake(cfg.lake))
    return None if a is None else parse_time(math.ceil(a / cfg.cycle - 1e-9) * cfg.cycle)


def _stats_from(cfg: LoopConfig, query, start: datetime, end: datetime, began: datetime) -> datetime:
    """Where the statistics job starts: ``start``, or earlier when the history lacks the cycles before it
    that the forecast gate needs (``min_history``), back to L cycles before ``end`` and the first landed one."""
    from mjoin.stats.history import list_cycles

    need = cfg.gate_config().min_history
    lo = max(began, end - timedelta(seconds=cfg.length * cfg.cycle))
    if lo >= start:
        return start
    have = len(list_cycles(stats_root(cfg), query.name, lo, start))
    if have + (end - start).total_seconds() / cfg.cycle >= need:
        return start
    log.info("the statistics history holds %d cycles before %s (the forecast gate needs %d): the statistics job "
             "covers the landed cycles from %s", have, iso(start), need, iso(lo))
    return lo


def _first_plan(cfg: LoopConfig, query, folder: str) -> str | None:
    """The plan the join uses: the registry's active plan, else the fixed order of
    ``initial_order`` (written to the run folder), else None (the engine's spec order)."""
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.lake.registry import PlanRegistry

    reg = PlanRegistry(cfg.lake_, query.name)
    version = reg.active_version()
    if version is not None:
        return fsutil.join(reg.root, f"v{version:06d}.json")
    if cfg.initial_order:
        path = fsutil.join(folder, "initial_plan.json")
        make_plan(query, orders_from_permutation(query, cfg.initial_order), "fixed",
                  source={"initial_order": list(cfg.initial_order)}).save(path)
        return path
    return None


def join_args(cfg: LoopConfig, query, start, end, folder: str) -> list[str]:
    """Arguments of ``jobs/join.py`` for this run.

    Live cycle mode: the streaming job over what has landed (trigger availableNow); it
    reads the live registry's active plan at every batch boundary. Evaluation namespaces
    (backfills): the interval evaluation of ``[start, end)`` with that namespace's active
    plan, outputs in the namespace (the streaming checkpoint belongs to the live job)."""
    base = ["--query", cfg.query, "--lake", cfg.lake]
    plan = _first_plan(cfg, query, folder)
    if cfg.namespace:
        out = fsutil.join(cfg.lake, cfg.namespace, "joins", parse_time(end).strftime("%Y%m%dT%H%M%SZ"))
        return base + ["--from", iso(start), "--to", iso(end), "--cycle", str(cfg.cycle), "--out", out] + \
            (["--plan", plan] if plan else [])
    return base + ["--stream", "--trigger", "availableNow"] + (["--plan", plan] if plan and cfg.initial_order else [])


def stats_args(cfg: LoopConfig, query, start, end) -> list[str]:
    args = ["--query", cfg.query, "--lake", cfg.lake, "--from", iso(start), "--to", iso(end), "--cycle", str(cfg.cycle),
            "--mode", cfg.stats_mode]
    return args + (["--namespace", cfg.namespace] if cfg.namespace else [])


def stats_root(cfg: LoopConfig) -> str:
    from mjoin.stats.history import history_root

    return history_root(cfg.lake_)


# ---- 1. land (cycle mode with a generated workload) ------------------------------

def land(cfg: LoopConfig, ctx: dict) -> dict:
    if cfg.mode != "cycle" or not cfg.workload or cfg.namespace:
        reason = ("continuous mode: data lands by itself" if cfg.mode != "cycle" else
                  "evaluation namespace: history is already in the lake" if cfg.namespace else
                  "no workload parameter: data lands by itself")
        raise NoChange(reason)
    from mjoin.workloads.lander import land as land_workload

    res = land_workload(cfg.workload, Lake(cfg.lake), until=ctx["end"], since=ctx["start"])
    out = res.to_dict()
    _write(fsutil.join(ctx["run_dir"], "land.json"), out)
    return out


# ---- gates -------------------------------------------------------------------------

def _gate_config(cfg: LoopConfig):
    return cfg.gate_config()


def _finish_gate(result, ctx: dict, name: str) -> dict:
    doc = result.to_json()
    _write(fsutil.join(ctx["run_dir"], f"gate_{name}.json"), doc)
    for line in result.summary().splitlines():
        log.info("%s", line)
    brief = {"gate": name, "status": result.status, "failures": [f.expectation for f in result.failures],
             "result": fsutil.join(ctx["run_dir"], f"gate_{name}.json")}
    if result.status == "failed":
        raise StepFailed(f"{name} gate failed: " + "; ".join(f.describe() if hasattr(f, "describe") else str(f)
                                                              for f in result.failures[:5]), brief)
    return brief


def check_input(cfg: LoopConfig, ctx: dict, *, clock=time.time, sleep=time.sleep) -> dict:
    """Gate 1 on complete cycles: first wait until the interval's last cycle is complete (:func:`await_cycles`)."""
    from mjoin.gates.input import check_input as gate

    if ctx.get("skip"):
        raise NoChange(ctx["skip"])
    query = cfg.load_query()
    waited = None if lands_itself(cfg) else await_cycles(cfg, query, ctx["end"], clock=clock, sleep=sleep)
    brief = _finish_gate(gate(query, Lake(cfg.lake), ctx["start"], ctx["end"], cycle=cfg.cycle,
                              config=_gate_config(cfg)), ctx, "input")
    out = {**brief, "completeness": waited}
    if ctx.get("mode") == "continuous":
        out["job_quarantine"] = job_quarantine_since_last_run(cfg, query.name, ctx["run_dir"])
    return out


def job_quarantine_since_last_run(cfg: LoopConfig, query_name: str, run_dir: str) -> dict:
    """Continuous mode: what the running join job quarantined (files by contract rule, rows by reason)
    since the previous run reported, from its batch metrics; written to ``job_quarantine.json`` of the
    run folder and logged (the job enforces the landing contract itself; the gate judged the files)."""
    from mjoin.lake.quarantine import job_report

    lake = Lake(cfg.lake, cfg.namespace)
    marker = fsutil.join(lake.reports(query_name), "quarantine_reported.json")
    after = json.loads(fsutil.read_text(marker))["last_batch"] if fsutil.exists(marker) else None
    report = job_report(lake, query_name, after)
    _write(fsutil.join(run_dir, "job_quarantine.json"), report)
    _write(marker, {"last_batch": report["last_batch"]})
    if report["rows"] or report["files"]:
        log.warning("the join job quarantined %d rows and %d files in batches %s: %s", report["rows"],
                    len(report["files"]), report["batches"], report["by_stream"])
    return {k: report[k] for k in ("batches", "rows", "by_stream")} | {"files": len(report["files"])}


def cycle_landed(lake: Lake, source: str, end: float, cycle: float) -> bool:
    """Whether ``source`` has landed every arrival cycle ending by ``end``: its newest folder's cycle reaches
    ``end`` (each source lands its cycles in order, each folder atomically, so a folder at or after the last
    cycle means the cycles before are final, possibly empty). The landing cycle is the smallest spacing of
    the source's folders (at most the statistics ``cycle``)."""
    arrivals = lake.arrivals(source)
    if not arrivals:
        return False
    step = min([cycle] + [b - a for a, b in zip(arrivals, arrivals[1:]) if b > a])
    return arrivals[-1] + step >= end - 1e-6


def await_cycles(cfg: LoopConfig, query, end, *, clock=time.time, sleep=time.sleep, poll: float = 1.0) -> dict:
    """Wait until the last cycle before ``end`` is complete: every source of the query has landed it or a later
    cycle, or ``landing_allowance`` seconds have passed since ``end`` (a sparse source may have no folder for it:
    no rows). The landing contract has no per-cycle completion marker, so the allowance is what makes a quiet
    cycle final. An interval ending more than a period in the future fails at once (nothing to wait for)."""
    lake = Lake(cfg.lake)
    t_end = parse_time(end).timestamp()
    last = t_end - cfg.cycle
    sources = sorted({s.source for s in query.streams})
    deadline = t_end + cfg.landing_allowance
    if deadline - clock() > cfg.period + cfg.landing_allowance:
        raise StepFailed(f"the interval ends at {iso(t_end)}, {t_end - clock():.0f} s in the future: a run judges only "
                         "complete cycles (trigger it with a logical date at or before now)")
    t0 = clock()
    while True:
        missing = [src for src in sources if not cycle_landed(lake, src, t_end, cfg.cycle)]
        if not missing:
            how = "landed"
            break
        if clock() >= deadline:
            how = "allowance"
            log.info("cycle %s: no folder from %s %.0f s after its end (landing_allowance): taken as no rows",
                     iso(last), ", ".join(missing), cfg.landing_allowance)
            break
        sleep(min(poll, max(0.05, deadline - clock())))
    out = {"last_cycle": iso(last), "complete_by": how, "waited_seconds": round(clock() - t0, 3),
           "not_landed": missing if how == "allowance" else []}
    if out["waited_seconds"] > 0.5:
        log.info("waited %.1f s for cycle %s to complete (%s)", out["waited_seconds"], iso(last), how)
    return out


def read_stats_history(cfg: LoopConfig, query, start=None, end=None):
    from mjoin.stats.history import read_history

    return read_history(stats_root(cfg), query.name, start=start, end=end)


def check_statistics(cfg: LoopConfig, ctx: dict) -> dict:
    from mjoin.gates.stats import check_statistics as gate

    query = cfg.load_query()
    start = parse_time(ctx["end"]) - timedelta(seconds=cfg.length * cfg.cycle)
    history = read_stats_history(cfg, query, start=start, end=ctx["end"])
    return _finish_gate(gate(query, history, ctx["start"], ctx["end"], cfg.cycle, config=_gate_config(cfg)), ctx, "stats")


# ---- 2. forecast --------------------------------------------------------------------

def active_rule(cfg: LoopConfig, query) -> dict | None:
    """The key-to-group rule of the active plan (None: one group, or no active plan)."""
    from mjoin.lake.registry import PlanRegistry

    plan = PlanRegistry(cfg.lake_, query.name).active(query)
    return (plan.partitioning or None) if plan else None


def rule_history(cfg: LoopConfig, query, rule, end):
    """The last L cycles before ``end`` as statistics of ``rule``'s key groups (:func:`mjoin.stats.cells.
    history_for_rule`: cycles computed under another rule are re-aggregated from their per-cell statistics)."""
    from mjoin.stats.cells import history_for_rule

    start = parse_time(end) - timedelta(seconds=cfg.length * cfg.cycle)
    return history_for_rule(stats_root(cfg), query.name, rule, start=start, end=end)


def _rule_tag(rule) -> str:
    import hashlib

    return "" if not rule else hashlib.sha1(json.dumps(rule, sort_keys=True).encode()).hexdigest()[:10]


def forecast_path(ctx: dict, rule) -> str:
    """``forecast.json`` (the active plan's key groups) or ``forecast_<rule tag>.json`` (another rule's)."""
    tag = _rule_tag(rule)
    return fsutil.join(ctx["run_dir"], "forecast.json" if tag == ctx.get("forecast_rule_tag", "") else
                       f"forecast_{tag or 'one_group'}.json")


def forecast_config(cfg: LoopConfig):
    """The forecast's settings: Holt kept within the forecast gate's bound of this run (``forecast_bound``)."""
    from mjoin.forecast.holt import ForecastConfig

    return ForecastConfig(bound=_gate_config(cfg).forecast_bound() if cfg.forecast_bound else None)


def forecast_rule(cfg: LoopConfig, ctx: dict, query, rule, path: str | None = None):
    """Holt forecast of ``rule``'s key groups from the last L cycles before the interval end (no look-ahead),
    written to ``path`` with its report; the statistics. Never blind after a rule change: every cycle of the
    window counts, re-aggregated from its cells when it was computed under another rule."""
    from mjoin.forecast.holt import forecast as holt

    history, report = rule_history(cfg, query, rule, ctx["end"])
    res = holt(history, ctx["end"], length=cfg.length, config=forecast_config(cfg))
    res.statistics.partitioning = rule or None
    res.statistics.meta["history"] = report
    path = path or forecast_path(ctx, rule)
    res.statistics.save(path)
    _write(path[: -len(".json")] + "_report.json", {**res.to_json(), "history": report})
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
    _write(fsutil.join(ctx["run_dir"], "forecast_rule.json"), {"rule": rule, "tag": _rule_tag(rule)})
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
    return _read(p)["tag"] if fsutil.exists(p) else ""


def stats_for_rule(cfg: LoopConfig, ctx: dict, query, rule):
    """The forecast of ``rule``'s key groups for this run: ``forecast.json`` when it is the active plan's rule,
    else made once (:func:`forecast_rule`) and kept in the run folder."""
    from mjoin.model.statistics import Statistics

    ctx = {**ctx, "forecast_rule_tag": _forecast_rule_tag(ctx)}
    path = forecast_path(ctx, rule)
    if fsutil.exists(path):
        return Statistics.load(path)
    return forecast_rule(cfg, ctx, query, rule, path).statistics


def check_forecast(cfg: LoopConfig, ctx: dict) -> dict:
    from mjoin.gates.forecast import check_forecast as gate

    query = cfg.load_query()
    history, _ = rule_history(cfg, query, active_rule(cfg, query), ctx["end"])
    return _finish_gate(gate(query, fsutil.join(ctx["run_dir"], "forecast.json"), history, config=_gate_config(cfg)),
                        ctx, "forecast")


# ---- 3. optimize --------------------------------------------------------------------

def cost_model_path(cfg: LoopConfig) -> str | None:
    if cfg.cost_model:
        return cfg.cost_model
    default = fsutil.join(Lake(cfg.lake).plans(cfg.load_query().name), "cost_model.json")
    return default if fsutil.exists(default) else None


def calibrate(cfg: LoopConfig, query, run_dir: str) -> dict:
    """Refit alpha_q, alpha_m and the per-call cost (ALGORITHMS.md Eq. 1-8) to the live join job's newest
    batches (``mjoin.optimizer.calibrate.calibrate_from_lake``), writing the model the optimizer and the plan gate read.

    Skipped for an explicit ``cost_model`` and in evaluation namespaces (their joins are not the live job's);
    a weak fit (R^2 under ``calibration_min_r2``) or no metrics keeps the previous model. The outcome is in
    ``calibration.json`` of the run folder."""
    from mjoin.optimizer.calibrate import CalibrationError, calibrate_from_lake

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
    from mjoin.stats.effective import effective_statistics, engine_state_summary
    from mjoin.engine.metrics import read_metrics

    if cfg.namespace:
        return stats
    try:
        records = read_metrics(Lake(cfg.lake), query.name)[-cfg.calibration_batches:]
    except (OSError, ValueError):
        records = []
    summary = engine_state_summary(records)
    _write(fsutil.join(run_dir, "effective_state.json"), {"applied": summary is not None, "per_stream": summary,
                                                           "batches": len(records)})
    return effective_statistics(stats, summary)


def group_overhead(cfg: LoopConfig, query, run_dir: str):
    """The per-group overhead (``mjoin.optimizer.cost.GroupOverhead``) for this run: a probe chain's fixed cost measured in
    the live join's newest batches where there are enough (the defaults otherwise; evaluation namespaces have
    no live join), batches of one statistics cycle, the engine's key buckets; kept in ``group_overhead.json``."""
    from mjoin.optimizer.cost import GroupOverhead
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.optimizer.partitioning import overhead_from_metrics

    path = fsutil.join(run_dir, "group_overhead.json")
    if fsutil.exists(path):
        return GroupOverhead(**_read(path)["overhead"])
    records = []
    if not cfg.namespace:
        try:
            records = read_metrics(Lake(cfg.lake), query.name)[-cfg.calibration_batches:]
        except (OSError, ValueError):
            records = []
    overhead, how = overhead_from_metrics(records, cost_model_path(cfg), batch_seconds=cfg.cycle,
                                          buckets=EngineConfig().buckets)
    _write(path, {"overhead": overhead.to_json(), "from": how, "batches": len(records)})
    return overhead


def key_group_cells(cfg: LoopConfig, ctx: dict, query) -> dict:
    """``{kind: Cells}``: the per-cell statistics of the run's interval (its cycles of one cell rule, the newest)."""
    from mjoin.optimizer.partitioning import Cells
    from mjoin.stats.history import CELL_KINDS, HistoryError, read_cells

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
    from mjoin.optimizer.strategies import optimize as run_optimizer
    from mjoin.optimizer.partitioning import optimize_partitioned

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
        _write(fsutil.join(ctx["run_dir"], "key_groups.json"), choice.to_json())
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
    from mjoin.optimizer.cost import plan_cost
    from mjoin.gates.plan import check_plan as gate
    from mjoin.lake.registry import PlanRegistry

    query = cfg.load_query()
    active = PlanRegistry(cfg.lake_, query.name).active(query)
    model = cost_model_path(cfg)
    overhead = group_overhead(cfg, query, ctx["run_dir"])
    buckets = key_group_cells(cfg, ctx, query).get("buckets")  # the overhead per engine bucket, as priced
    cells = (buckets.stats, buckets.rule) if buckets else None
    result = gate(query, fsutil.join(ctx["run_dir"], "candidate_plan.json"), active=active,
                  cost_fn=lambda p: plan_cost(query, stats_for_rule(cfg, ctx, query, p.partitioning), p, model,
                                              overhead, cells=cells),
                  config=_gate_config(cfg))
    brief = _finish_gate(result, ctx, "plan")
    brief["active_version"] = active.version if active else None
    brief["improvement"] = result.details.get("improvement")
    brief["threshold"] = result.details.get("threshold")
    return brief


# ---- 4. deploy ----------------------------------------------------------------------

def deploy(cfg: LoopConfig, ctx: dict, plan_gate: dict) -> dict:
    """Publish the candidate with its lineage and activate it (skipped on no change or dry run).

    Writes ``deploy.json`` (version, previous, activation time and, in continuous mode, the
    join job's last batch before the switch) for ``await_switch`` and ``record``."""
    from mjoin.model.plan import load_plan
    from mjoin.lake.registry import PlanRegistry

    if plan_gate.get("status") == "no_change":
        threshold = plan_gate.get("threshold")
        gain = plan_gate.get("improvement")
        raise NoChange(f"no change: the candidate is not better than active v{plan_gate.get('active_version')} "
                       f"by the threshold {_pct(threshold)} (estimated improvement {_pct(gain)})")
    if cfg.dry_run:
        raise NoChange("dry run: optimized and gated, not deployed")
    query = cfg.load_query()
    plan = load_plan(fsutil.join(ctx["run_dir"], "candidate_plan.json"), query)
    reg = PlanRegistry(cfg.lake_, query.name)
    lineage = {"run": cfg.run_id, "run_type": cfg.run_type, "interval": [ctx["start"], ctx["end"]],
               "statistics": stats_root(cfg), "forecast": fsutil.join(ctx["run_dir"], "forecast.json"),
               "gates": {g: fsutil.join(ctx["run_dir"], f"gate_{g}.json") for g in ("input", "stats", "forecast", "plan")},
               "improvement": plan_gate.get("improvement"), "threshold": plan_gate.get("threshold"),
               "previous": plan_gate.get("active_version")}
    job = None
    if cfg.mode == "continuous":
        from mjoin.engine.control import JobControl

        st = JobControl(cfg.lake_, query.name).status()
        job = {k: st.get(k) for k in ("running", "state", "last_batch_id", "plan_version")}
        if job["last_batch_id"] is None:  # no batch in this run of the job yet: the newest batch of earlier runs
            job["last_batch_id"] = _last_batch_id(cfg.lake_, query.name)
    version = reg.publish(plan, lineage, query)
    rec = reg.activate(version, by=cfg.run_id or "mjoin", reason=f"{cfg.strategy} for {ctx['end']}")
    log.info("published and activated %s v%d (previous %s)", query.name, version, rec.previous)
    out = {"version": version, "previous": rec.previous, "activated_at": rec.activated_at, "job": job}
    _write(fsutil.join(ctx["run_dir"], "deploy.json"), out)
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{float(x):.1%}"


def _last_batch_id(lake: Lake, query_name: str):
    from mjoin.engine.metrics import BATCH_FILE

    ids = [int(m.group(1)) for n in fsutil.listdir(lake.metrics(query_name)) if (m := BATCH_FILE.match(n))]
    return max(ids) if ids else None


def _batches_after(lake: Lake, query_name: str, after) -> list[dict]:
    """The streaming job's metrics records of batches with id > ``after`` (none yet: [])."""
    from mjoin.engine.metrics import BATCH_FILE

    folder = lake.metrics(query_name)
    out = []
    for name in fsutil.listdir(folder):  # [] while no batch has run (no folder yet)
        m = BATCH_FILE.match(name)
        if m and (after is None or int(m.group(1)) > int(after)):
            try:
                out.append(json.loads(fsutil.read_text(fsutil.join(folder, name))))
            except (FileNotFoundError, json.JSONDecodeError):  # replaced atomically; gone = cleared: skip
                continue
    return sorted(out, key=lambda r: r["batch_id"])


def _mentions(error, version: int) -> bool:
    import re

    return bool(error) and re.search(rf"\bv{int(version)}\b", str(error)) is not None


def await_switch(cfg: LoopConfig, ctx: dict, deployed: dict, poll: float = 5.0) -> dict:
    """Continuous mode: wait until the running job's batches run the version this run deployed.

    - a batch ran it: done (``switch.json`` says ``switched``);
    - the job reports it cannot load it (``plan_error`` naming the version): roll back, fail;
    - no batch ran it within ``deploy_timeout``: roll back, fail;
    - the job is not running (never started, stopped, failed, lost): fail at once; the version
      stays active, so the job uses it when it starts (nothing to confirm it against now).

    A rollback happens only while the deployed version is still active: a version activated
    in the meantime (by an operator or another run) is never undone."""
    from mjoin.engine.control import JobControl

    if cfg.mode != "continuous":
        raise NoChange("cycle mode: the next cycle's join run uses the new plan")
    query = cfg.load_query()
    version = int(deployed["version"])
    control = JobControl(cfg.lake_, query.name)
    baseline = (deployed.get("job") or {}).get("last_batch_id")
    path = fsutil.join(ctx["run_dir"], "switch.json")
    deadline = time.monotonic() + cfg.deploy_timeout
    while True:
        st = control.status()
        batches = _batches_after(cfg.lake_, query.name, baseline) if st.get("last_batch_id") != baseline else []
        hit = next((b for b in batches if b.get("plan_version") == version and b.get("plan_source", "registry") == "registry"),
                   None)
        if hit is not None:
            out = {"outcome": "switched", "version": version, "batch_id": hit["batch_id"],
                   "switched_at": hit.get("started_at"), "job_pid": st.get("pid")}
            _write(path, out)
            log.info("the join job runs v%d since batch %s", version, hit["batch_id"])
            return out
        bad = next((b for b in batches if _mentions(b.get("plan_error"), version)), None)
        if bad is not None:
            _rollback_and_fail(cfg, ctx, query.name, version, "plan_error",
                               f"the join job cannot run v{version} (batch {bad['batch_id']}: {bad['plan_error']})")
        if not st.get("running"):
            what = st.get("state", "not running")
            detail = f": {st.get('error') or st.get('reason')}" if (st.get("error") or st.get("reason")) else ""
            msg = (f"the join job of {query.name} is not running ({what}{detail}), so the switch to v{version} "
                   f"cannot be confirmed; v{version} stays active and the job uses it when started "
                   f"(mjoin_join_job action=start, or python -m mjoin run --stream)")
            _write(path, {"outcome": "not_running", "version": version, "job": st, "message": msg})
            raise StepFailed(msg, {"outcome": "not_running", "version": version})
        if time.monotonic() >= deadline:
            _rollback_and_fail(cfg, ctx, query.name, version, "timeout",
                               f"the join job did not switch to v{version} within {cfg.deploy_timeout:.0f} s "
                               f"(last batch {st.get('last_batch_id')} ran v{st.get('plan_version')})")
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())) or 0.1)


def _rollback_and_fail(cfg: LoopConfig, ctx: dict, query_name: str, version: int, why: str, message: str):
    from mjoin.lake.registry import PlanRegistry, RegistryError

    reg = PlanRegistry(cfg.lake_, query_name)
    out = {"version": version, "reason": why, "message": message}
    try:
        rec = reg.rollback(by=cfg.run_id or "mjoin", reason=f"{why}: {message}"[:500], expect_active=version)
        out.update(outcome="rolled_back", rolled_back_to=rec.version)
        text = f"{message}: rolled back to v{rec.version}"
    except RegistryError as exc:  # someone activated another version meanwhile, or nothing to go back to
        out.update(outcome="not_rolled_back", active_version=reg.active_version(), registry=str(exc))
        text = f"{message}; {exc}"
    _write(fsutil.join(ctx["run_dir"], "switch.json"), out)
    log.error("%s", text)
    raise StepFailed(text, out)


# ---- 5. record ----------------------------------------------------------------------

FAILED_PREFIX = "failed_"


def _read_opt(folder: str, name: str) -> dict:
    path = fsutil.join(folder, name)
    return _read(path) if fsutil.exists(path) else {}


def note_failure(folder: str, task_id: str, message: str) -> str:
    """Keep why a task failed (``failed_<task>.json`` in the run folder) for :func:`record` (the DAG's
    failure callback calls this for every task, Spark jobs included)."""
    fsutil.makedirs(folder)
    return _write(fsutil.join(folder, f"{FAILED_PREFIX}{task_id}.json"),
                  {"task": task_id, "message": str(message)[:4000], "at": iso(datetime.now(timezone.utc))})


def failure_reasons(folder: str) -> dict:
    """``{task: message}`` of the tasks that failed in this run, in the order they failed."""
    notes = [_read_opt(folder, n) for n in fsutil.listdir(folder) if n.startswith(FAILED_PREFIX) and n.endswith(".json")]
    return {d["task"]: d["message"] for d in sorted(notes, key=lambda d: d.get("at", "")) if d.get("task")}


def lenient_config(params: dict, *, run_id: str = "", run_type: str = "manual") -> tuple[LoopConfig, str | None]:
    """``(config, problem)``: the run's config, or, when its params are invalid, one with just enough to find
    its run folder (query reference, lake, namespace, cycle, period) and the problem."""
    try:
        return LoopConfig.from_params(params, run_id=run_id, run_type=run_type), None
    except ValueError as exc:
        problem = f"invalid params: {exc}"
    cfg = LoopConfig(run_id=run_id, run_type=run_type)
    for name in ("query", "lake", "namespace", "mode"):
        if isinstance((params or {}).get(name), str) and params[name]:
            setattr(cfg, name, params[name])
    for name in ("cycle", "period"):
        try:
            setattr(cfg, name, parse_duration(params[name]) or getattr(cfg, name))
        except (KeyError, TypeError, ValueError):
            pass
    if not cfg.lake:
        from mjoin.runtime.resources import Resources

        cfg.lake = Resources.from_env().lake
    if run_type == "backfill" and not cfg.namespace:
        cfg.namespace = BACKFILL_NAMESPACE
    return cfg, problem


def query_name(ref: str) -> str:
    """The spec's name, or (a spec that does not load) its reference made safe for a folder name."""
    from mjoin.model.query import QuerySpecError, load_query

    try:
        return load_query(ref).name
    except (QuerySpecError, OSError, ValueError):
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(ref).rsplit("/", 1)[-1].removesuffix(".yaml")) or "unknown"


def fallback_context(cfg: LoopConfig, logical_date) -> dict:
    """The context of a run whose ``prepare`` failed: its interval and run folder, as prepare would have
    resolved them (best effort), so that its failure is recorded where its outcome belongs."""
    try:
        start, end = interval_for(logical_date, cfg.period, cfg.cycle if cfg.cycle > 0 else None)
    except (TypeError, ValueError):
        start = end = parse_time(logical_date)
    name = query_name(cfg.query)
    return {"query": name, "start": iso(start), "end": iso(end), "run_dir": run_dir(cfg, name, end),
            "namespace": cfg.namespace, "lake": cfg.lake, "mode": cfg.mode, "logical_date": iso(logical_date),
            "config": cfg.to_json()}


def record(cfg: LoopConfig, ctx: dict, states: dict) -> dict:
    """Write the run's outcome (status, gates, the version it deployed, plan diff, estimated gain, and why
    it failed): every run gets one, also one whose ``prepare`` failed (``ctx`` from :func:`fallback_context`).

    ``status``: ``deployed`` (active, and in continuous mode the job switched), ``rolled_back``
    (deployed, then undone because the job did not switch), ``failed`` (a gate or step failed;
    the active plan is what it was, or what ``active_version`` says), ``no_change``, ``dry_run``,
    ``skipped``. ``reason``: the first failed task's message (``reasons``: every failed task's), or why
    nothing was deployed. One ``outcome.json`` per run folder (see the module docstring)."""
    from mjoin.lake.registry import PlanRegistry

    name = ctx.get("query") or query_name(cfg.query)
    folder = ctx["run_dir"]
    fsutil.makedirs(folder)
    gates = {g: _read_opt(folder, f"gate_{g}.json").get("status") for g in ("input", "stats", "forecast", "plan")}
    reg = PlanRegistry(cfg.lake_, name)
    dep = _read_opt(folder, "deploy.json") if states.get("deploy") == "success" else {}
    switch = _read_opt(folder, "switch.json") if dep else {}
    version = dep.get("version")
    changes = []
    if version is not None:
        prev = dep.get("previous")
        changes = reg.get(version).diff(reg.get(prev) if prev is not None else None)
    failed = [t for t, s in states.items() if s in ("failed", "upstream_failed")]
    # only tasks failed now: a cleared and re-run run may have notes of an earlier attempt that since succeeded
    reasons = {t: m for t, m in failure_reasons(folder).items() if states.get(t) == "failed"}
    for t in failed:
        if states[t] == "failed" and t not in reasons:  # failed without a note (e.g. killed): say where to look
            reasons[t] = f"{t} failed; see its task log"
    if switch.get("outcome") == "rolled_back":
        status = "rolled_back"
    elif failed:
        status = "failed"
    elif version is not None:
        status = "deployed"
    else:
        status = ("no_change" if gates.get("plan") == "no_change" else "dry_run" if cfg.dry_run else "skipped")
    plan_gate = _read_opt(folder, "gate_plan.json")
    details = plan_gate.get("details") or {}
    if reasons:
        reason = next(iter(reasons.values()))
    elif status == "rolled_back":
        reason = switch.get("message")
    elif status == "no_change":
        reason = (f"the candidate is not better than the active plan by the threshold "
                  f"{_pct(details.get('threshold', cfg.improvement_threshold))} "
                  f"(estimated improvement {_pct(details.get('improvement'))})")
    elif status == "dry_run":
        reason = "dry run: optimized and gated, not deployed"
    else:
        reason = ctx.get("skip")
    outcome = {"query": name, "run_id": cfg.run_id, "run_type": cfg.run_type, "namespace": cfg.namespace,
               "mode": cfg.mode, "logical_date": ctx.get("logical_date"), "interval_start": ctx["start"],
               "interval_end": ctx["end"], "status": status, "reason": reason, "reasons": reasons,
               "strategy": cfg.strategy, "version": version, "previous": dep.get("previous"),
               "active_version": reg.active_version(), "deployed": status == "deployed",
               "switch": switch or None, "estimated_gain": details.get("improvement"),
               "threshold": details.get("threshold", cfg.improvement_threshold),
               "gates": gates, "changes": changes, "failed_tasks": failed, "tasks": states,
               "recorded_at": iso(datetime.now(timezone.utc))}
    _write(fsutil.join(folder, "outcome.json"), outcome)
    log.info("outcome %s: %s%s (active v%s)%s", ctx["end"], status, f" v{version}" if version is not None else "",
             outcome["active_version"], f": {reason}" if reason and status == "failed" else "")
    return outcome
