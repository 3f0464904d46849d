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
they read only data before each run's interval end (no look-ahead).
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
    improvement_threshold: float = 0.05
    dry_run: bool = False
    mode: str = "cycle"  # cycle | continuous
    workload: str = ""  # cycle mode: land each interval from this generated workload
    initial_order: list = field(default_factory=list)
    cost_model: str = ""  # path of a calibrated cost model JSON ("" = <lake>/.../cost_model.json if present)
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
        cfg = cls(**values, run_id=run_id, run_type=run_type)
        if not cfg.lake:
            from .resources import Resources

            cfg.lake = Resources.from_env().lake
        if run_type == "backfill" and not cfg.namespace:
            cfg.namespace = BACKFILL_NAMESPACE
        if cfg.mode not in ("cycle", "continuous"):
            raise ValueError(f"mode {cfg.mode!r}: use cycle or continuous")
        if cfg.period < cfg.cycle or cfg.cycle <= 0:
            raise ValueError(f"period ({cfg.period} s) must be at least one statistics cycle ({cfg.cycle} s)")
        return cfg

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
    from .gates import GateConfig

    overrides = dict(cfg.gates or {})
    overrides.setdefault("improvement_threshold", cfg.improvement_threshold)
    return GateConfig.from_dict(overrides)


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


def optimize(cfg: LoopConfig, ctx: dict) -> dict:
    from .optimize import optimize as run_optimizer
    from .statistics import Statistics

    query = cfg.load_query()
    stats = Statistics.load(fsutil.join(ctx["run_dir"], "forecast.json"))
    t0 = time.perf_counter()
    plan = run_optimizer(query, stats, cfg.strategy, initial_order=cfg.initial_order or None,
                         cost_model=cost_model_path(cfg),
                         source={"statistics": stats_root(cfg), "forecast": fsutil.join(ctx["run_dir"], "forecast.json"),
                                 "interval": [ctx["start"], ctx["end"]], "run_id": cfg.run_id})
    path = fsutil.join(ctx["run_dir"], "candidate_plan.json")
    plan.save(path)
    return {"plan": path, "strategy": plan.strategy, "estimated_cost": plan.estimated_cost,
            "seconds": round(time.perf_counter() - t0, 4),
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
    brief["improvement"] = result.details.get("improvement") if hasattr(result, "details") else None
    return brief


# ---- 4. deploy ----------------------------------------------------------------------

def deploy(cfg: LoopConfig, ctx: dict, plan_gate: dict) -> dict:
    """Publish the candidate with its lineage and activate it (skipped on no change or dry run)."""
    from .plan import load_plan
    from .registry import PlanRegistry

    if plan_gate.get("status") == "no_change":
        raise NoChange(f"no change: the candidate is not better than active v{plan_gate.get('active_version')} "
                       f"by the threshold ({cfg.improvement_threshold:.0%}); improvement {plan_gate.get('improvement')}")
    if cfg.dry_run:
        raise NoChange("dry run: optimized and gated, not deployed")
    query = cfg.load_query()
    plan = load_plan(fsutil.join(ctx["run_dir"], "candidate_plan.json"), query)
    reg = PlanRegistry(cfg.lake_, query.name)
    lineage = {"run": cfg.run_id, "run_type": cfg.run_type, "interval": [ctx["start"], ctx["end"]],
               "statistics": stats_root(cfg), "forecast": fsutil.join(ctx["run_dir"], "forecast.json"),
               "gates": {g: fsutil.join(ctx["run_dir"], f"gate_{g}.json") for g in ("input", "stats", "forecast", "plan")},
               "improvement": plan_gate.get("improvement"), "previous": plan_gate.get("active_version")}
    version = reg.publish(plan, lineage, query)
    rec = reg.activate(version, by=cfg.run_id or "mjoin", reason=f"{cfg.strategy} for {ctx['end']}")
    log.info("published and activated %s v%d (previous %s)", query.name, version, rec.previous)
    return {"version": version, "previous": rec.previous}


def await_switch(cfg: LoopConfig, ctx: dict, deployed: dict, poll: float = 5.0) -> dict:
    """Continuous mode: wait until the running job's metrics show the new version; on timeout roll back and fail."""
    from .registry import PlanRegistry

    if cfg.mode != "continuous":
        raise NoChange("cycle mode: the next cycle's join run uses the new plan")
    from .engine import read_metrics

    query = cfg.load_query()
    version = deployed["version"]
    deadline = time.monotonic() + cfg.deploy_timeout
    while time.monotonic() < deadline:
        seen = [m for m in read_metrics(cfg.lake_, query.name) if m.get("plan_version") == version]
        if seen:
            return {"version": version, "batch_id": seen[0].get("batch_id"), "switched_at": seen[0].get("started_at")}
        time.sleep(poll)
    rec = PlanRegistry(cfg.lake_, query.name).rollback(by=cfg.run_id or "mjoin",
                                                      reason=f"v{version} not picked up within {cfg.deploy_timeout:.0f} s")
    raise StepFailed(f"the join job did not switch to v{version} within {cfg.deploy_timeout:.0f} s: "
                     f"rolled back to v{rec.version}", {"rolled_back_to": rec.version})


# ---- 5. record ----------------------------------------------------------------------

def record(cfg: LoopConfig, ctx: dict, states: dict) -> dict:
    """Append the run's outcome (gates, plan diff, estimated gain, version) to the report log."""
    from .plan import load_plan
    from .registry import PlanRegistry
    from .ui import OUTCOMES

    query = cfg.load_query()
    folder = ctx["run_dir"]
    gates = {}
    for g in ("input", "stats", "forecast", "plan"):
        p = fsutil.join(folder, f"gate_{g}.json")
        gates[g] = _read(p).get("status") if fsutil.exists(p) else None
    reg = PlanRegistry(cfg.lake_, query.name)
    changes, version = [], None
    deployed = states.get("deploy") == "success"
    if deployed:
        version = reg.active_version()
        cur = reg.get(version)
        prev = reg.lineage(version).get("previous")
        changes = cur.diff(reg.get(prev) if prev else None)
    failed = [t for t, s in states.items() if s in ("failed", "upstream_failed")]
    status = ("failed" if failed else "deployed" if deployed else
              "no_change" if gates.get("plan") == "no_change" else "dry_run" if cfg.dry_run else "skipped")
    plan_gate = _read(fsutil.join(folder, "gate_plan.json")) if fsutil.exists(fsutil.join(folder, "gate_plan.json")) else {}
    outcome = {"query": query.name, "run_id": cfg.run_id, "run_type": cfg.run_type, "namespace": cfg.namespace,
               "interval_start": ctx["start"], "interval_end": ctx["end"], "status": status, "strategy": cfg.strategy,
               "version": version if deployed else reg.active_version(), "deployed": deployed,
               "estimated_gain": (plan_gate.get("details") or {}).get("improvement"),
               "gates": gates, "changes": changes, "failed_tasks": failed, "tasks": states,
               "recorded_at": iso(datetime.now(timezone.utc))}
    _write(fsutil.join(folder, "outcome.json"), outcome)
    log_path = fsutil.join(cfg.lake_.reports(query.name), OUTCOMES)
    old = fsutil.read_text(log_path) if fsutil.exists(log_path) else ""
    lines = [l for l in old.splitlines() if l.strip() and json.loads(l).get("interval_end") != ctx["end"]]
    fsutil.atomic_write_text(log_path, "\n".join(lines + [json.dumps(outcome, default=str)]) + "\n")
    log.info("outcome %s: %s%s", ctx["end"], status, f" (v{version})" if deployed else "")
    return outcome
