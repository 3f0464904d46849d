"""Step 4 of a run: publish and activate the candidate plan, and in continuous mode wait until the running
join job's batches run it (else roll back and fail)."""
from __future__ import annotations

import json
import logging
import re
import time

from mjoin.engine.control import JobControl
from mjoin.engine.metrics import BATCH_FILE
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry, RegistryError
from mjoin.loop.config import LoopConfig, NoChange, StepFailed, pct, stats_root, write_doc
from mjoin.model.plan import load_plan
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)


def deploy(cfg: LoopConfig, ctx: dict, plan_gate: dict) -> dict:
    """Publish the candidate with its lineage and activate it (skipped on no change or dry run).

    Writes ``deploy.json`` (version, previous, activation time and, in continuous mode, the
    join job's last batch before the switch) for ``await_switch`` and ``record``."""
    if plan_gate.get("status") == "no_change":
        threshold = plan_gate.get("threshold")
        gain = plan_gate.get("improvement")
        raise NoChange(f"no change: the candidate is not better than active v{plan_gate.get('active_version')} "
                       f"by the threshold {pct(threshold)} (estimated improvement {pct(gain)})")
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
        st = JobControl(cfg.lake_, query.name).status()
        job = {k: st.get(k) for k in ("running", "state", "last_batch_id", "plan_version")}
        if job["last_batch_id"] is None:  # no batch in this run of the job yet: the newest batch of earlier runs
            job["last_batch_id"] = _last_batch_id(cfg.lake_, query.name)
    version = reg.publish(plan, lineage, query)
    rec = reg.activate(version, by=cfg.run_id or "mjoin", reason=f"{cfg.strategy} for {ctx['end']}")
    log.info("published and activated %s v%d (previous %s)", query.name, version, rec.previous)
    out = {"version": version, "previous": rec.previous, "activated_at": rec.activated_at, "job": job}
    write_doc(fsutil.join(ctx["run_dir"], "deploy.json"), out)
    return out


def _last_batch_id(lake: Lake, query_name: str):
    ids = [int(m.group(1)) for n in fsutil.listdir(lake.metrics(query_name)) if (m := BATCH_FILE.match(n))]
    return max(ids) if ids else None


def _batches_after(lake: Lake, query_name: str, after) -> list[dict]:
    """The streaming job's metrics records of batches with id > ``after`` (none yet: [])."""
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
            write_doc(path, out)
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
            write_doc(path, {"outcome": "not_running", "version": version, "job": st, "message": msg})
            raise StepFailed(msg, {"outcome": "not_running", "version": version})
        if time.monotonic() >= deadline:
            _rollback_and_fail(cfg, ctx, query.name, version, "timeout",
                               f"the join job did not switch to v{version} within {cfg.deploy_timeout:.0f} s "
                               f"(last batch {st.get('last_batch_id')} ran v{st.get('plan_version')})")
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())) or 0.1)


def _rollback_and_fail(cfg: LoopConfig, ctx: dict, query_name: str, version: int, why: str, message: str):
    reg = PlanRegistry(cfg.lake_, query_name)
    out = {"version": version, "reason": why, "message": message}
    try:
        rec = reg.rollback(by=cfg.run_id or "mjoin", reason=f"{why}: {message}"[:500], expect_active=version)
        out.update(outcome="rolled_back", rolled_back_to=rec.version)
        text = f"{message}: rolled back to v{rec.version}"
    except RegistryError as exc:  # someone activated another version meanwhile, or nothing to go back to
        out.update(outcome="not_rolled_back", active_version=reg.active_version_or_none()[0], registry=str(exc))
        text = f"{message}; {exc}"
    write_doc(fsutil.join(ctx["run_dir"], "switch.json"), out)
    log.error("%s", text)
    raise StepFailed(text, out)
