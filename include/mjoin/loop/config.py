"""A re-optimization run: its config (the DAG params, one place of defaults), its interval of whole
statistics cycles, its run folder, and the documents its steps write there (docs/orchestration.md)."""
from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta, timezone

from mjoin.gates.config import GateConfig
from mjoin.lake.layout import Lake
from mjoin.loop.links import data_docs_url, gate_page
from mjoin.model.query import QuerySpecError, load_query
from mjoin.model.timeutil import iso, parse_duration, parse_time
from mjoin.optimizer.partitioning import GROUP_COUNTS, METHODS
from mjoin.runtime import fsutil
from mjoin.runtime.resources import Resources
from mjoin.stats.history import history_root

log = logging.getLogger(__name__)


BACKFILL_NAMESPACE = "eval/backfill"
MODES = ("auto", "cycle", "continuous")
#: how far back a run covers the cycles that no earlier run covered (runs that overran their period, Airflow
#: stopped for a while): older cycles with landed data are reported as a gap in the run's outcome
CATCH_UP_SECONDS = 3600.0


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
    #: auto: continuous while the streaming join job of the query runs, else cycle (resolved by prepare)
    mode: str = "auto"  # auto | cycle | continuous
    #: the end of the interval the run judges, instead of its logical date (the demo replays a simulated clock)
    interval_end: str = ""
    #: at most this far back before the interval a run covers cycles no earlier run covered
    catch_up: float = CATCH_UP_SECONDS
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
    #: continuous mode: the statistics step uses the cycles the join job emitted (else the statistics job)
    job_statistics: bool = True
    #: a cycle counts as complete once every stream landed it (or a later cycle), or this long after its end
    landing_allowance: float = 30.0
    run_id: str = ""
    run_type: str = "manual"

    @classmethod
    def from_params(cls, params: dict, *, run_id: str = "", run_type: str = "manual") -> "LoopConfig":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (params or {}).items() if k in known and v is not None}
        for k in ("cycle", "period", "deploy_timeout", "landing_allowance", "catch_up"):
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
            cfg.lake = Resources.from_env().lake
        if cfg.mode not in MODES:
            raise ValueError(f"mode {cfg.mode!r}: use {', '.join(MODES)}")
        if cfg.interval_end:
            cfg.interval_end = iso(parse_time(cfg.interval_end))  # a bad date fails here, at prepare
        cfg._check_partitioning()
        if run_type == "backfill":
            if not cfg.namespace:
                cfg.namespace = BACKFILL_NAMESPACE
            if cfg.mode == "continuous":
                log.warning("backfill run: mode %s ignored, a backfill always runs in cycle mode", cfg.mode)
            cfg.mode = "cycle"
        cfg._resolve_gates()
        if cfg.period < cfg.cycle or cfg.cycle <= 0:
            raise ValueError(f"period ({cfg.period} s) must be at least one statistics cycle ({cfg.cycle} s)")
        return cfg

    def _resolve_gates(self) -> None:
        """One improvement threshold: ``gates.improvement_threshold`` > the param > GateConfig's default.
        Validates every override (unknown keys and bad values raise GateConfigError, a ValueError)."""
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
        if self.partition_method not in ("auto", "none") + METHODS:
            raise ValueError(f"partition_method {self.partition_method!r}: use auto, none or one of {', '.join(METHODS)}")
        g = str(self.partition_groups).strip()
        if g != "auto" and not (g.isdigit() and 1 <= int(g) <= 64):
            raise ValueError(f"partition_groups {self.partition_groups!r}: use auto or a number of groups 1..64")
        self.partition_groups = g

    def partition_search(self) -> tuple[tuple, tuple, bool] | None:
        """``(methods, counts, forced)`` the optimizer chooses key groups from; None: one group (no rule).
        ``forced``: a fixed ``D`` > 1 is used even where one group prices lower."""
        if self.partition_method == "none" or self.partition_groups == "1":
            return None
        methods = METHODS if self.partition_method == "auto" else (self.partition_method,)
        counts = GROUP_COUNTS if self.partition_groups == "auto" else (1, int(self.partition_groups))
        return methods, counts, self.partition_groups != "auto"

    def gate_config(self):
        """The run's GateConfig: the defaults with this run's overrides (the only source of thresholds); the
        gates' Checkpoints store their results in the lake's GX context (:func:`results_store`) under the run id."""
        overrides = dict(self.gates or {})
        if "improvement_threshold" not in overrides and self.improvement_threshold is not None:
            overrides["improvement_threshold"] = self.improvement_threshold
        if "results_store" not in overrides:
            overrides["results_store"] = results_store(self.lake_)
        overrides.setdefault("results_run", self.run_id)
        return GateConfig.from_dict(overrides)

    def to_json(self) -> dict:
        return asdict(self)

    def for_run(self, ctx: dict | None) -> "LoopConfig":
        """This config with what ``prepare`` resolved for the run (its ``ctx``): the mode ``auto`` became."""
        mode = (ctx or {}).get("mode")
        if self.mode == "auto" and mode in ("cycle", "continuous"):
            self.mode = mode
        return self

    def judged_at(self, logical_date):
        """The time the run's interval ends at (before snapping to cycles): ``interval_end``, else the logical date."""
        return self.interval_end or logical_date

    # ---- derived -----------------------------------------------------------------
    @property
    def lake_(self) -> Lake:
        return Lake(self.lake, self.namespace)

    def load_query(self):
        return load_query(self.query)


#: ``MJOIN_GATE_RESULTS=off`` keeps every run's gates on the fast path (no stored results, no Data Docs);
#: one run says so with its ``gates`` param: ``{"results_store": "off"}``
RESULTS_ENV = "MJOIN_GATE_RESULTS"


def results_store(lake: Lake) -> str:
    """Where a run's gates store their results: the lake's GX context (:meth:`Lake.gx`), ``off`` when
    ``MJOIN_GATE_RESULTS=off``; a lake on a URL (HDFS, an object store) has no folder GX can write a file
    context to: ``MJOIN_GATE_RESULTS`` may name a local folder for it, else nothing is stored."""
    setting = os.environ.get(RESULTS_ENV, "").strip()
    if setting.lower() in ("off", "false", "0", "no"):
        return "off"
    if fsutil.is_url(lake.root):
        return setting or "off"
    return setting or lake.gx()


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


STAMP = re.compile(r"^(\d{8}T\d{6}Z)(?:\.|$)")


def covered_until(cfg: LoopConfig, query_name: str, end) -> datetime | None:
    """The newest interval end before ``end`` that a run of this namespace recorded an outcome for (whatever its
    status: a failed run is reported, not silent), or None: no run before this one."""
    runs = fsutil.join(cfg.lake_.reports(query_name), "runs")
    limit = parse_time(end).strftime("%Y%m%dT%H%M%SZ")
    by_stamp: dict = {}
    for name in fsutil.listdir(runs):
        m = STAMP.match(name)
        if m and m.group(1) < limit:
            by_stamp.setdefault(m.group(1), []).append(name)
    for stamp in sorted(by_stamp, reverse=True):
        if any(fsutil.exists(fsutil.join(runs, name, "outcome.json")) for name in by_stamp[stamp]):
            return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    return None


def write_doc(path: str, doc) -> str:
    fsutil.atomic_write_text(path, json.dumps(doc, indent=2, default=str))
    return path


def read_doc(path: str):
    return json.loads(fsutil.read_text(path))


def read_optional(folder: str, name: str) -> dict:
    path = fsutil.join(folder, name)
    return read_doc(path) if fsutil.exists(path) else {}


STATISTICS_REPORT = "statistics.json"


def statistics_source(folder: str) -> dict | None:
    """Where the run's statistics came from (``statistics.json`` of the run folder, written by its statistics
    step): ``source`` ``job`` (the cycles the join job emitted) or ``standalone`` (the statistics job), and when
    it fell back to the statistics job, why (``fallback``). None: the step did not report."""
    doc = read_optional(folder, STATISTICS_REPORT)
    if not doc:
        return None
    return {k: doc[k] for k in ("source", "fallback", "cycles", "from_job", "waited_seconds", "wall_seconds")
            if k in doc}


def stats_root(cfg: LoopConfig) -> str:
    return history_root(cfg.lake_)


def finish_gate(result, ctx: dict, name: str) -> dict:
    doc = result.to_json()
    write_doc(fsutil.join(ctx["run_dir"], f"gate_{name}.json"), doc)
    for line in result.summary().splitlines():
        log.info("%s", line)
    brief = {"gate": name, "status": result.status, "failures": [f.expectation for f in result.failures],
             "warnings": result.warning_expectations, "result": fsutil.join(ctx["run_dir"], f"gate_{name}.json")}
    page = gate_page(doc)
    if page:
        brief["data_docs"] = data_docs_url(ctx.get("namespace") or "", page)
        if result.status == "failed" or result.warning_expectations:
            log.info("Data Docs of this validation: %s", brief["data_docs"])
    if result.status == "failed":
        failing = [f for f in result.failures if f.fails_gate] or result.failures
        raise StepFailed(f"{name} gate failed: " + "; ".join(f.describe() for f in failing[:5])
                         + (f" (Data Docs: {brief['data_docs']})" if page else ""), brief)
    return brief


def pct(x) -> str:
    return "-" if x is None else f"{float(x):.1%}"


def lenient_config(params: dict, *, run_id: str = "", run_type: str = "manual") -> tuple[LoopConfig, str | None]:
    """``(config, problem)``: the run's config, or, when its params are invalid, one with just enough to find
    its run folder (query reference, lake, namespace, cycle, period) and the problem."""
    try:
        return LoopConfig.from_params(params, run_id=run_id, run_type=run_type), None
    except ValueError as exc:
        problem = f"invalid params: {exc}"
    cfg = LoopConfig(run_id=run_id, run_type=run_type)
    for name in ("query", "lake", "namespace", "mode", "interval_end"):
        if isinstance((params or {}).get(name), str) and params[name]:
            setattr(cfg, name, params[name])
    for name in ("cycle", "period"):
        try:
            setattr(cfg, name, parse_duration(params[name]) or getattr(cfg, name))
        except (KeyError, TypeError, ValueError):
            pass
    if not cfg.lake:
        cfg.lake = Resources.from_env().lake
    if run_type == "backfill" and not cfg.namespace:
        cfg.namespace = BACKFILL_NAMESPACE
    return cfg, problem


def query_name(ref: str) -> str:
    """The spec's name, or (a spec that does not load) its reference made safe for a folder name."""
    try:
        return load_query(ref).name
    except (QuerySpecError, OSError, ValueError):
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(ref).rsplit("/", 1)[-1].removesuffix(".yaml")) or "unknown"


def fallback_context(cfg: LoopConfig, logical_date) -> dict:
    """The context of a run whose ``prepare`` failed: its interval and run folder, as prepare would have
    resolved them (best effort), so that its failure is recorded where its outcome belongs."""
    try:
        start, end = interval_for(cfg.judged_at(logical_date), cfg.period, cfg.cycle if cfg.cycle > 0 else None)
    except (TypeError, ValueError):
        start = end = parse_time(logical_date)
    name = query_name(cfg.query)
    return {"query": name, "start": iso(start), "end": iso(end), "run_dir": run_dir(cfg, name, end),
            "namespace": cfg.namespace, "lake": cfg.lake, "mode": cfg.mode, "logical_date": iso(logical_date),
            "config": cfg.to_json()}
