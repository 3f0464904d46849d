"""The steps of one re-optimization run, as plain functions (the DAG only wires them).

ARCHITECTURE.md, "Data flow of one re-optimization": for the interval
``[end - period, end)`` ending at the run's logical date:

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

Gate thresholds: one :class:`mjoin.gates.GateConfig` per run, its defaults
overridden by the ``gates`` param; the ``improvement_threshold`` param is a
shortcut for ``gates.improvement_threshold`` (the latter wins when both are
given). Every step uses :meth:`LoopConfig.gate_config`, and messages print the
threshold the plan gate actually used.

Outcomes: ``record`` writes ``outcome.json`` into the run folder (one file per
run, atomically); :func:`mjoin.ui.read_outcomes` reads them back sorted, so two
runs at once in one namespace never lose each other's outcome.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timedelta, timezone

from . import fsutil
from .lake import Lake
from .timeutil import iso, parse_duration, parse_time

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
    deploy_timeout: float = 600.0  # continuous mode: wait this long for the job to switch
    run_id: str = ""
    run_type: str = "manual"

    @classmethod
    def from_params(cls, params: dict, *, run_id: str = "", run_type: str = "manual") -> "LoopConfig":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in (params or {}).items() if k in known and v is not None}
        for k in ("cycle", "period", "deploy_timeout"):
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
            from .resources import Resources

            cfg.lake = Resources.from_env().lake
        if cfg.mode not in ("cycle", "continuous"):
            raise ValueError(f"mode {cfg.mode!r}: use cycle or continuous")
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
        from .gates import GateConfig

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

    def gate_config(self):
        """The run's GateConfig: the defaults with this run's overrides (the only source of thresholds)."""
        from .gates import GateConfig

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
        from .query import load_query

        return load_query(self.query)


def interval_for(logical_date, period: float) -> tuple[datetime, datetime]:
    """The run's interval ``[logical_date - period, logical_date)``.

    Airflow 3 gives manual runs and ``airflow dags test`` a zero-length data
    interval, so the interval is derived from the logical date and the period,
    the same way for scheduled, manual and backfill runs."""
    end = parse_time(logical_date)
    return end - timedelta(seconds=period), end


def run_dir(cfg: LoopConfig, query_name: str, end) -> str:
    stamp = parse_time(end).strftime("%Y%m%dT%H%M%SZ")
    return fsutil.join(cfg.lake_.reports(query_name), "runs", stamp)


def _write(path: str, doc) -> str:
    fsutil.atomic_write_text(path, json.dumps(doc, indent=2, default=str))
    return path


def _read(path: str):
    return json.loads(fsutil.read_text(path))


# ---- 0. prepare ------------------------------------------------------------------

def prepare(cfg: LoopConfig, logical_date) -> dict:
    """Resolve the interval and run folder; the Spark job arguments for the join and the statistics."""
    query = cfg.load_query()
    start, end = interval_for(logical_date, cfg.period)
    folder = run_dir(cfg, query.name, end)
    fsutil.makedirs(folder)
    ctx = {"query": query.name, "start": iso(start), "end": iso(end), "run_dir": folder, "namespace": cfg.namespace,
           "lake": cfg.lake, "mode": cfg.mode, "config": cfg.to_json()}
    ctx["join_args"] = join_args(cfg, query, start, end, folder)
    ctx["stats_args"] = stats_args(cfg, query, start, end)
    _write(fsutil.join(folder, "context.json"), ctx)
    log.info("re-optimization of %s for [%s, %s) in %s", query.name, ctx["start"], ctx["end"], folder)
    return ctx


def _first_plan(cfg: LoopConfig, query, folder: str) -> str | None:
    """The plan the join uses: the registry's active plan, else the fixed order of
    ``initial_order`` (written to the run folder), else None (the engine's spec order)."""
    from .plan import make_plan, orders_from_permutation
    from .registry import PlanRegistry

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
    from .stats.history import history_root

    return history_root(cfg.lake_)


# ---- 1. land (cycle mode with a generated workload) ------------------------------

def land(cfg: LoopConfig, ctx: dict) -> dict:
    if cfg.mode != "cycle" or not cfg.workload or cfg.namespace:
        reason = ("continuous mode: data lands by itself" if cfg.mode != "cycle" else
                  "evaluation namespace: history is already in the lake" if cfg.namespace else
                  "no workload parameter: data lands by itself")
        raise NoChange(reason)
    from .workloads import land as land_workload

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


def check_input(cfg: LoopConfig, ctx: dict) -> dict:
    from .gates import check_input as gate

    query = cfg.load_query()
    return _finish_gate(gate(query, Lake(cfg.lake), ctx["start"], ctx["end"], cycle=cfg.cycle, config=_gate_config(cfg)),
                        ctx, "input")


def read_stats_history(cfg: LoopConfig, query, start=None, end=None):
    from .stats.history import read_history

    return read_history(stats_root(cfg), query.name, start=start, end=end)


def check_statistics(cfg: LoopConfig, ctx: dict) -> dict:
    from .gates import check_statistics as gate

    query = cfg.load_query()
    start = parse_time(ctx["end"]) - timedelta(seconds=cfg.length * cfg.cycle)
    history = read_stats_history(cfg, query, start=start, end=ctx["end"])
    return _finish_gate(gate(query, history, ctx["start"], ctx["end"], cfg.cycle, config=_gate_config(cfg)), ctx, "stats")


# ---- 2. forecast --------------------------------------------------------------------

def forecast(cfg: LoopConfig, ctx: dict) -> dict:
    """Holt forecast of the next cycle from the last L cycles before the interval end (no look-ahead)."""
    from .forecast import forecast as holt

    query = cfg.load_query()
    start = parse_time(ctx["end"]) - timedelta(seconds=cfg.length * cfg.cycle)
    history = read_stats_history(cfg, query, start=start, end=ctx["end"])
    res = holt(history, ctx["end"], length=cfg.length)
    path = fsutil.join(ctx["run_dir"], "forecast.json")
    res.statistics.save(path)
    _write(fsutil.join(ctx["run_dir"], "forecast_report.json"), res.to_json())
    methods = {str(k): int(v) for k, v in res.report["method"].value_counts().items()} if len(res.report) else {}
    return {"forecast": path, "methods": methods, "series": int(len(res.report))}


def check_forecast(cfg: LoopConfig, ctx: dict) -> dict:
    from .gates import check_forecast as gate

    query = cfg.load_query()
    start = parse_time(ctx["end"]) - timedelta(seconds=cfg.length * cfg.cycle)
    history = read_stats_history(cfg, query, start=start, end=ctx["end"])
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
    batches (``mjoin.calibrate.calibrate_from_lake``), writing the model the optimizer and the plan gate read.

    Skipped for an explicit ``cost_model`` and in evaluation namespaces (their joins are not the live job's);
    a weak fit (R^2 under ``calibration_min_r2``) or no metrics keeps the previous model. The outcome is in
    ``calibration.json`` of the run folder."""
    from .calibrate import CalibrationError, calibrate_from_lake

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


def optimize(cfg: LoopConfig, ctx: dict) -> dict:
    from .optimize import optimize as run_optimizer
    from .statistics import Statistics

    query = cfg.load_query()
    calibration = calibrate(cfg, query, ctx["run_dir"])
    stats = Statistics.load(fsutil.join(ctx["run_dir"], "forecast.json"))
    t0 = time.perf_counter()
    plan = run_optimizer(query, stats, cfg.strategy, initial_order=cfg.initial_order or None,
                         cost_model=cost_model_path(cfg),
                         source={"statistics": stats_root(cfg), "forecast": fsutil.join(ctx["run_dir"], "forecast.json"),
                                 "interval": [ctx["start"], ctx["end"]], "run_id": cfg.run_id})
    path = fsutil.join(ctx["run_dir"], "candidate_plan.json")
    plan.save(path)
    return {"plan": path, "strategy": plan.strategy, "estimated_cost": plan.estimated_cost,
            "seconds": round(time.perf_counter() - t0, 4), "calibration": calibration["status"],
            "cost_model": calibration["cost_model"],
            "orders": {s: [r for _, r in pairs] for s, pairs in plan.orders[0].items()}}


def check_plan(cfg: LoopConfig, ctx: dict) -> dict:
    """Plan gate: valid for the query, cost finite, better than the active plan under the same forecast."""
    from .cost import plan_cost
    from .gates import check_plan as gate
    from .registry import PlanRegistry
    from .statistics import Statistics

    query = cfg.load_query()
    stats = Statistics.load(fsutil.join(ctx["run_dir"], "forecast.json"))
    active = PlanRegistry(cfg.lake_, query.name).active(query)
    model = cost_model_path(cfg)
    result = gate(query, fsutil.join(ctx["run_dir"], "candidate_plan.json"), active=active,
                  cost_fn=lambda p: plan_cost(query, stats, p, model), config=_gate_config(cfg))
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
    from .plan import load_plan
    from .registry import PlanRegistry

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
        from .engine.control import JobControl

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
    from .engine.metrics import BATCH_FILE

    ids = [int(m.group(1)) for n in fsutil.listdir(lake.metrics(query_name)) if (m := BATCH_FILE.match(n))]
    return max(ids) if ids else None


def _batches_after(lake: Lake, query_name: str, after) -> list[dict]:
    """The streaming job's metrics records of batches with id > ``after`` (none yet: [])."""
    from .engine.metrics import BATCH_FILE

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
    from .engine.control import JobControl

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
    from .registry import PlanRegistry, RegistryError

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

def _read_opt(folder: str, name: str) -> dict:
    path = fsutil.join(folder, name)
    return _read(path) if fsutil.exists(path) else {}


def record(cfg: LoopConfig, ctx: dict, states: dict) -> dict:
    """Write the run's outcome (status, gates, the version it deployed, plan diff, estimated gain).

    ``status``: ``deployed`` (active, and in continuous mode the job switched), ``rolled_back``
    (deployed, then undone because the job did not switch), ``failed`` (a gate or step failed;
    the active plan is what it was, or what ``active_version`` says), ``no_change``, ``dry_run``,
    ``skipped``. One ``outcome.json`` per run folder (see the module docstring)."""
    from .registry import PlanRegistry

    query = cfg.load_query()
    folder = ctx["run_dir"]
    gates = {g: _read_opt(folder, f"gate_{g}.json").get("status") for g in ("input", "stats", "forecast", "plan")}
    reg = PlanRegistry(cfg.lake_, query.name)
    dep = _read_opt(folder, "deploy.json") if states.get("deploy") == "success" else {}
    switch = _read_opt(folder, "switch.json") if dep else {}
    version = dep.get("version")
    changes = []
    if version is not None:
        prev = dep.get("previous")
        changes = reg.get(version).diff(reg.get(prev) if prev is not None else None)
    failed = [t for t, s in states.items() if s in ("failed", "upstream_failed")]
    if switch.get("outcome") == "rolled_back":
        status = "rolled_back"
    elif failed:
        status = "failed"
    elif version is not None:
        status = "deployed"
    else:
        status = ("no_change" if gates.get("plan") == "no_change" else "dry_run" if cfg.dry_run else "skipped")
    plan_gate = _read_opt(folder, "gate_plan.json")
    outcome = {"query": query.name, "run_id": cfg.run_id, "run_type": cfg.run_type, "namespace": cfg.namespace,
               "mode": cfg.mode, "interval_start": ctx["start"], "interval_end": ctx["end"], "status": status,
               "strategy": cfg.strategy, "version": version, "previous": dep.get("previous"),
               "active_version": reg.active_version(), "deployed": status == "deployed",
               "switch": switch or None, "estimated_gain": (plan_gate.get("details") or {}).get("improvement"),
               "threshold": (plan_gate.get("details") or {}).get("threshold", cfg.improvement_threshold),
               "gates": gates, "changes": changes, "failed_tasks": failed, "tasks": states,
               "recorded_at": iso(datetime.now(timezone.utc))}
    _write(fsutil.join(folder, "outcome.json"), outcome)
    log.info("outcome %s: %s%s (active v%s)", ctx["end"], status, f" v{version}" if version is not None else "",
             outcome["active_version"])
    return outcome
