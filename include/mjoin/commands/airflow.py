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
Runs made by `make demo` (airflow dags test) are visible here. Stop with Ctrl-C.
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
        _standalone(env)
    finally:
        if feed is not None:
            _stop(feed)
        if server is not None:
            connect_server.stop()
    return 0


def _standalone(env: dict) -> None:
    """``airflow standalone`` in its own process group until it exits, or Ctrl-C / SIGTERM here: then the whole
    group gets SIGINT (what a terminal's Ctrl-C does), 30 s to stop, then SIGTERM, then SIGKILL. Measured:
    standalone itself may hang reaping its components, or exit leaving them running, so the group is signalled,
    and the feed and the Spark Connect server stop after it in any case."""
    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "standalone"], env=env,
                            start_new_session=True)
    try:
        proc.wait()
    except KeyboardInterrupt:
        for sig, grace in ((signal.SIGINT, 30), (signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _group_alive(proc.pid):
                proc.poll()
                time.sleep(0.5)
            if not _group_alive(proc.pid):
                break
        proc.poll()


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


def _stop(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGINT)  # stops between cycles: every landed cycle is complete
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
