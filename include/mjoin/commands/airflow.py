"""python -m mjoin airflow: start Airflow on this project's dags/ and plugins/ (UI on :8080)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from mjoin.loop.airflow_env import admin_password, airflow_env, ensure_db
from mjoin.runtime import connect_server
from mjoin.runtime.resources import Resources

NAME = "airflow"
HELP = "start Airflow (api-server, scheduler, dag-processor, triggerer) on the project's DAGs"
DESCRIPTION = """Start `airflow standalone` with the project's environment: AIRFLOW_HOME=.airflow
(SQLite), dags/ and plugins/ of this checkout, parallelism sized for 2 cores, the
Spark connection spark_default -> local[*]. The UI is on http://localhost:PORT; log in
as admin with the password the simple auth manager writes to
$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated (printed below once it exists).
Runs made by `make demo` (airflow dags test, DAG mjoin_demo) are visible here, its lake on the
mjoin page. Stop with Ctrl-C (or SIGTERM): Airflow and the feed stop within about 6 s.
With --live (what `make airflow` does), a real-time TPC-DS replay lands into the lake the DAGs
read from now on (`python -m mjoin live`, log in $AIRFLOW_HOME/live.log), so the scheduled
mjoin_reoptimize runs (DAGs are not paused at creation here) have data; without it the DAGs
read whatever lands in MJOIN_LAKE (a real source: docs/workloads.md, the landing contract).
With --spark-connect, a Spark Connect server is started too (or the running one reused) and
the DAGs' statistics step runs in its warm session instead of a fresh spark-submit per run
(MJOIN_SPARK_REMOTE; see `python -m mjoin spark-connect --help`)."""


def add_arguments(p):
    p.add_argument("--port", type=int, default=int(os.environ.get("AIRFLOW__API__PORT", 8080)), help="UI/API port (default 8080)")
    p.add_argument("--home", help="AIRFLOW_HOME (default .airflow in the project)")
    p.add_argument("--lake", help="lake root the DAGs use (default: MJOIN_LAKE or .lake)")
    p.add_argument("--live", action="store_true",
                   help="also run the real-time TPC-DS feed into the lake (python -m mjoin live; stopped with Airflow)")
    p.add_argument("--live-sf", type=float, default=0.1, help="scale factor of the live feed (default 0.1)")
    p.add_argument("--spark-connect", action="store_true",
                   help="also run a Spark Connect server for the statistics step (stopped with Airflow)")


def run(args) -> int:
    env = airflow_env(args.home, args.lake)
    env["AIRFLOW__API__PORT"] = str(args.port)
    # tasks report to the api-server's execution API: on another port than 8080 they must be told where it is
    env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://localhost:{args.port}/execution/"
    ensure_db(env)
    print(f"Airflow home {env['AIRFLOW_HOME']}, DAGs from {env['AIRFLOW__CORE__DAGS_FOLDER']}")
    print(f"UI: http://localhost:{args.port}  (user admin)")

    def announce():
        for _ in range(240):
            pw = admin_password(env)
            if pw:
                print(f"\n*** log in as admin / {pw}  "
                      f"(from {Path(env['AIRFLOW_HOME']) / 'simple_auth_manager_passwords.json.generated'})\n", flush=True)
                return
            time.sleep(1)

    threading.Thread(target=announce, daemon=True).start()
    feed = _start_feed(env, args.live_sf) if args.live else None
    server = None
    if args.spark_connect:
        was = connect_server.status()["state"]
        server = connect_server.start()
        env["MJOIN_SPARK_REMOTE"] = server["url"]
        print(f"Spark Connect server {server['url']} (pid {server['pid']}, log {server['log']}): "
              "collect_statistics runs in its session")
        if was == "running":
            server = None  # someone else's: leave it running
    try:
        _standalone(env, [feed] if feed is not None else [])
    finally:
        if server is not None:
            connect_server.stop()
    return 0


#: seconds Airflow's components and the feed get to stop after Ctrl-C or SIGTERM before they are killed: a stop
#: takes at most this plus a moment (Airflow's own graceful stop waited for its components for ~30-90 s)
STOP_GRACE = 6.0


def _standalone(env: dict, others: list) -> None:
    """``airflow standalone`` in its own process group until it exits, or Ctrl-C / SIGTERM here. Then, at once,
    the whole group gets SIGTERM (each component stops itself; a task's spark-submit is in the group too) and
    ``others`` (the feed, in groups of their own) SIGINT (the feed stops between two cycles); whatever is left
    after :data:`STOP_GRACE` seconds is killed. A task cut short is the scheduler's to clean up when it starts again;
    the lake stays consistent (every landed cycle, plan version and batch is written atomically)."""
    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "standalone"], env=env,
                            start_new_session=True)
    try:
        proc.wait()
    except KeyboardInterrupt:
        print(f"\nstopping Airflow{' and the feed' if others else ''} (at most {STOP_GRACE:.0f} s)...", flush=True)
    groups = [(proc.pid, signal.SIGTERM)] + [(p.pid, signal.SIGINT) for p in others]
    for pgid, sig in groups:
        _signal(pgid, sig)
    deadline = time.monotonic() + STOP_GRACE
    while time.monotonic() < deadline and any(_group_alive(g) for g, _ in groups):
        for p in [proc, *others]:
            p.poll()  # reap the leaders, so that a stopped group counts as gone
        time.sleep(0.2)
    for pgid, _ in groups:
        _signal(pgid, signal.SIGKILL)
    for p in [proc, *others]:
        try:
            p.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass


def _signal(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _start_feed(env: dict, sf: float):
    """``python -m mjoin live`` into the DAGs' lake, as a child process with its own log."""

    lake = env.get("MJOIN_LAKE") or Resources.from_env().lake
    log_path = Path(env["AIRFLOW_HOME"]) / "live.log"
    out = open(log_path, "a")
    proc = subprocess.Popen([sys.executable, "-m", "mjoin", "live", "--lake", lake, "--sf", str(sf)], env=env,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    print(f"live TPC-DS feed (sf {sf:g}) into {lake} from now on (pid {proc.pid}, log {log_path})")
    return proc


