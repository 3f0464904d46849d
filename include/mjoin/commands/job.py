"""python -m mjoin job: is the streaming join job running; stop it cleanly."""
from __future__ import annotations

import json

from mjoin.engine.control import JobControl
from mjoin.lake.layout import Lake
from mjoin.model.query import load_query
from mjoin.runtime.resources import Resources

NAME = "job"
HELP = "status of the streaming join job, or stop it cleanly at a batch boundary"
DESCRIPTION = """The streaming join job (`python -m mjoin run --stream`, `spark-submit jobs/join.py
--stream`, or the mjoin_join_job DAG) keeps a status file beside its checkpoint
(<lake>/checkpoints/<query>/_control/status.json).

  python -m mjoin job status --query tpcds_returns_by_address --lake .lake
  python -m mjoin job stop --query tpcds_returns_by_address --lake .lake --timeout 120

status prints the state and why, exit codes as LSB init scripts: 0 running (or
starting), 1 dead or lost (it recorded running but its process is gone: killed or
crashed; a restart continues from the checkpoint), 3 not running (stopped, failed,
never started), 4 unknown (unreadable status).
stop asks the job to stop at its next batch boundary and waits for it: exit 0 once
it is not running (also when it was not running), 1 if it still runs after --timeout
(the request stays; the job honours it at its next boundary)."""

EXIT = {"running": 0, "starting": 0, "dead": 1, "lost": 1, "stopped": 3, "failed": 3, "never started": 3,
        "unknown": 4}


def add_arguments(p):
    p.add_argument("action", choices=("status", "stop"))
    p.add_argument("--query", required=True, help="query spec (YAML path or name)")
    p.add_argument("--lake", help="lake root (default $MJOIN_LAKE or <project>/.lake)")
    p.add_argument("--namespace", default="", help="lake namespace of the job")
    p.add_argument("--timeout", type=float, default=300.0, help="stop: seconds to wait for the job (default 300)")
    p.add_argument("--by", default="cli", help="stop: who asks (recorded in the job's status)")
    p.add_argument("--reason", default="python -m mjoin job stop", help="stop: why (recorded)")
    p.add_argument("--json", action="store_true", help="status: print the status document as JSON")


def describe(st: dict) -> str:
    """Two lines: the state with the job's identity and progress, then why."""
    state = st["state"]
    head = f"{st['query']}: {state}"
    if state != "never started" and st.get("recorded_state") not in (None, state):
        head += f" (recorded: {st['recorded_state']})"
    if st.get("run_id"):
        trig = st.get("trigger")
        if trig == "processingTime":
            trig += f" every {st.get('interval')}s"
        head += (f"; run {st['run_id']}, pid {st.get('pid')} on {st.get('host')} since {st.get('started_at')}, "
                 f"{trig}")
        if st.get("last_batch_id") is not None:
            version = st.get("plan_version")  # none for the spec's order (source default)
            head += (f"; last batch {st['last_batch_id']} at {st.get('last_batch_at')} "
                     f"(plan {st.get('plan_source')}{'' if version is None else f' v{version}'})")
        else:
            head += "; no batch finished in this run"
        if st.get("batch_in_progress") is not None:
            head += f"; batch {st['batch_in_progress']} in progress since {st.get('batch_started_at')}"
    lines = [head]
    if st.get("note"):
        lines.append(f"  {st['note']}")
    if st.get("stop_requested") and st["running"]:
        ask = st["stop_requested"]
        lines.append(f"  stop requested by {ask.get('by')} at {ask.get('requested_at')}: {ask.get('reason')}")
    return "\n".join(lines)


def run(args) -> int:
    query = load_query(args.query)
    control = JobControl(Lake(args.lake or Resources.from_env().lake, args.namespace), query.name)
    if args.action == "stop":
        before = control.status()
        if not before["running"]:
            print(f"{query.name}: the join job is not running\n{describe(before)}")
            return 0
        control.request_stop(by=args.by, reason=args.reason)
        st = control.wait_stopped(args.timeout, poll=0.5)
        if st["running"]:
            print(f"{query.name}: stop requested, but the job still runs after {args.timeout:.0f}s (it stops at its "
                  f"next batch boundary)\n{describe(st)}")
            return 1
        print(f"{query.name}: stopped after batch {st.get('last_batch_id')}\n{describe(st)}")
        return 0
    st = control.status()
    print(json.dumps(st, indent=2, default=str) if args.json else describe(st))
    return EXIT.get(st["state"], 4)
