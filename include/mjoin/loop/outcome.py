"""Step 5 of a run: its outcome (``outcome.json`` in the run folder), for every run, with why a failed run
failed (each task's failure note)."""
from __future__ import annotations

import logging
import re
from datetime import datetime, timezone

from mjoin.lake.registry import PlanRegistry
from mjoin.loop.config import LoopConfig, pct, query_name, read_optional, statistics_source, write_doc
from mjoin.loop.links import GATES, run_links
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)


FAILED_PREFIX = "failed_"
#: how long the one-line reason of a failed task may be (the whole error is in ``failed_<task>.log``)
REASON_CHARS = 1000
#: what the join and statistics jobs print for an error the user can fix (jobs/*.py: ``error: <message>``)
JOB_ERROR = re.compile(r"^\s*error: (?P<msg>.+)$")
#: the last line of a Python traceback: ``SomeError: message`` (also dotted, e.g. ``pyspark.errors...Exception``)
PY_EXCEPTION = re.compile(r"^(?P<msg>(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Failed)\b.*)$")
#: a JVM exception in a Py4J error or a Java stack trace: ``: org...SparkException: msg`` or ``Caused by: ...``
JAVA_EXCEPTION = re.compile(r"^(?:: |Caused by: )(?P<msg>(?:[\w$]+\.)+[\w$]*(?:Exception|Error)\b.*)$")
#: a log line at level ERROR (Python logging as the jobs configure it, or log4j)
LOG_ERROR = re.compile(r"\b(?:ERROR|FATAL)\b[^:]*: (?P<msg>.+)$")
SPARK_SUBMIT = re.compile(r"^Cannot execute: .*?Error code is: (?P<code>-?\d+)\.", re.S)


def one_line(message: str) -> str:
    """The error's own message in one line: for a ``spark-submit`` failure (the command and the tail of its log),
    the job's own error line (``error: ...``, else the last Python exception line, else the last ERROR log line)
    with the exit code; for any other error its first line. At most :data:`REASON_CHARS` characters."""
    text = str(message or "").strip()
    submit = SPARK_SUBMIT.match(text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[0] if lines else "failed"
    if submit:
        line = f"spark-submit exit {submit.group('code')}: {_job_error(lines[1:]) or 'no error line in its output'}"
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "\u2026"


def _job_error(lines: list[str]) -> str | None:
    """The error line of a Spark job's output: the job's own ``error: ...`` line, else the last Python exception
    (for a Py4J error, the JVM exception under it: its deepest ``Caused by``), else the last ERROR log line."""
    hit = next((m.group("msg") for ln in reversed(lines) if (m := JOB_ERROR.match(ln))), None)
    if hit:
        return hit.strip()
    at = next((i for i in range(len(lines) - 1, -1, -1) if PY_EXCEPTION.match(lines[i])), None)
    if at is not None:
        java = [(ln.startswith("Caused by: "), m.group("msg")) for ln in lines[at + 1:] if (m := JAVA_EXCEPTION.match(ln))]
        causes = [msg for caused, msg in java if caused]
        return (causes[-1] if causes else java[0][1] if java else lines[at]).strip()
    return next((m.group("msg").strip() for ln in reversed(lines) if (m := LOG_ERROR.search(ln))), None)


def note_failure(folder: str, task_id: str, message: str) -> str:
    """Keep why a task failed for :func:`record` (the DAG's failure callback calls this for every task, Spark jobs
    included): ``failed_<task>.json`` with the one-line reason (:func:`one_line`) and ``failed_<task>.log`` with the
    whole error (a Spark job's: the command and the tail of its output), which the mjoin page links to."""
    fsutil.makedirs(folder)
    log_name = f"{FAILED_PREFIX}{task_id}.log"
    fsutil.atomic_write_text(fsutil.join(folder, log_name), str(message))
    return write_doc(fsutil.join(folder, f"{FAILED_PREFIX}{task_id}.json"),
                     {"task": task_id, "message": one_line(message), "log": log_name,
                      "at": iso(datetime.now(timezone.utc))})


def failure_reasons(folder: str) -> dict:
    """``{task: message}`` of the tasks that failed in this run, in the order they failed."""
    notes = [read_optional(folder, n) for n in fsutil.listdir(folder) if n.startswith(FAILED_PREFIX) and n.endswith(".json")]
    return {d["task"]: d["message"] for d in sorted(notes, key=lambda d: d.get("at", "")) if d.get("task")}


def record(cfg: LoopConfig, ctx: dict, states: dict, dag_id: str = "") -> dict:
    """Write the run's outcome (status, gates, the version it deployed, plan diff, estimated gain, and why
    it failed): every run gets one, also one whose ``prepare`` failed (``ctx`` from :func:`fallback_context`).

    ``status``: ``deployed`` (active, and in continuous mode the job switched), ``rolled_back``
    (deployed, then undone because the job did not switch), ``failed`` (a gate or step failed;
    the active plan is what it was, or what ``active_version`` says), ``no_change``, ``dry_run``,
    ``skipped``. ``reason``: the first failed task's message in one line (``reasons``: every failed task's;
    ``logs``: the files with their whole errors), or why nothing was deployed. ``coverage``: the cycles before the
    interval it caught up on and any ``gap`` no run covers (:func:`mjoin.loop.collect.coverage`). One
    ``outcome.json`` per run folder (see the module docstring)."""
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
    logs = {t: f"{FAILED_PREFIX}{t}.log" for t in reasons if fsutil.exists(fsutil.join(folder, f"{FAILED_PREFIX}{t}.log"))}
    covered = ctx.get("coverage") or {}
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
    outcome = {"query": name, "dag_id": dag_id, "run_id": cfg.run_id, "run_type": cfg.run_type,
               "namespace": cfg.namespace, "mode": ctx.get("mode") or cfg.mode, "mode_reason": ctx.get("mode_reason"),
               "logical_date": ctx.get("logical_date"), "interval_start": ctx["start"], "interval_end": ctx["end"],
               "caught_up_from": covered.get("caught_up_from"), "gap": covered.get("gap"),
               "status": status, "reason": reason, "reasons": reasons, "logs": logs,
               "strategy": cfg.strategy, "version": version, "previous": dep.get("previous"),
               "active_version": reg.active_version_or_none()[0], "deployed": status == "deployed",
               "switch": switch or None, "estimated_gain": details.get("improvement"),
               "threshold": details.get("threshold", cfg.improvement_threshold),
               "gates": gates, "statistics": statistics_source(folder), "changes": changes, "failed_tasks": failed,
               "tasks": states,
               "recorded_at": iso(datetime.now(timezone.utc))}
    if (outcome["statistics"] or {}).get("fallback"):
        log.warning("statistics from the statistics job, not the join job's: %s", outcome["statistics"]["fallback"])
    outcome["links"] = run_links(cfg.lake_, name, {g: read_optional(folder, f"gate_{g}.json") for g in GATES},
                                 version if version is not None else outcome["active_version"])
    write_doc(fsutil.join(folder, "outcome.json"), outcome)
    log.info("outcome %s: %s%s (active v%s)%s", ctx["end"], status, f" v{version}" if version is not None else "",
             outcome["active_version"], f": {reason}" if reason and status == "failed" else "")
    if outcome["gap"]:
        log.warning("%s", outcome["gap"]["message"])
    return outcome
