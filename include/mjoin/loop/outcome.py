"""Step 5 of a run: its outcome (``outcome.json`` in the run folder), for every run, with why a failed run
failed (each task's failure note)."""
from __future__ import annotations

import logging
from datetime import datetime, timezone

from mjoin.lake.registry import PlanRegistry
from mjoin.loop.config import LoopConfig, pct, query_name, read_optional, write_doc
from mjoin.loop.links import GATES, run_links
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)


FAILED_PREFIX = "failed_"


def note_failure(folder: str, task_id: str, message: str) -> str:
    """Keep why a task failed (``failed_<task>.json`` in the run folder) for :func:`record` (the DAG's
    failure callback calls this for every task, Spark jobs included)."""
    fsutil.makedirs(folder)
    return write_doc(fsutil.join(folder, f"{FAILED_PREFIX}{task_id}.json"),
                  {"task": task_id, "message": str(message)[:4000], "at": iso(datetime.now(timezone.utc))})


def failure_reasons(folder: str) -> dict:
    """``{task: message}`` of the tasks that failed in this run, in the order they failed."""
    notes = [read_optional(folder, n) for n in fsutil.listdir(folder) if n.startswith(FAILED_PREFIX) and n.endswith(".json")]
    return {d["task"]: d["message"] for d in sorted(notes, key=lambda d: d.get("at", "")) if d.get("task")}


def record(cfg: LoopConfig, ctx: dict, states: dict) -> dict:
    """Write the run's outcome (status, gates, the version it deployed, plan diff, estimated gain, and why
    it failed): every run gets one, also one whose ``prepare`` failed (``ctx`` from :func:`fallback_context`).

    ``status``: ``deployed`` (active, and in continuous mode the job switched), ``rolled_back``
    (deployed, then undone because the job did not switch), ``failed`` (a gate or step failed;
    the active plan is what it was, or what ``active_version`` says), ``no_change``, ``dry_run``,
    ``skipped``. ``reason``: the first failed task's message (``reasons``: every failed task's), or why
    nothing was deployed. One ``outcome.json`` per run folder (see the module docstring)."""
    name = ctx.get("query") or query_name(cfg.query)
    folder = ctx["run_dir"]
    fsutil.makedirs(folder)
    gates = {g: read_optional(folder, f"gate_{g}.json").get("status") for g in ("input", "stats", "forecast", "plan")}
    reg = PlanRegistry(cfg.lake_, name)
    dep = read_optional(folder, "deploy.json") if states.get("deploy") == "success" else {}
    switch = read_optional(folder, "switch.json") if dep else {}
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
    plan_gate = read_optional(folder, "gate_plan.json")
    details = plan_gate.get("details") or {}
    if reasons:
        reason = next(iter(reasons.values()))
    elif status == "rolled_back":
        reason = switch.get("message")
    elif status == "no_change":
        reason = (f"the candidate is not better than the active plan by the threshold "
                  f"{pct(details.get('threshold', cfg.improvement_threshold))} "
                  f"(estimated improvement {pct(details.get('improvement'))})")
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
    outcome["links"] = run_links(cfg.lake_, name, {g: read_optional(folder, f"gate_{g}.json") for g in GATES},
                                 version if version is not None else outcome["active_version"])
    write_doc(fsutil.join(folder, "outcome.json"), outcome)
    log.info("outcome %s: %s%s (active v%s)%s", ctx["end"], status, f" v{version}" if version is not None else "",
             outcome["active_version"], f": {reason}" if reason and status == "failed" else "")
    return outcome
