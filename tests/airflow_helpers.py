"""Real Airflow for the DAG tests: a project-local home on SQLite, `airflow dags test`, and
(for backfills and the REST API) api-server + scheduler + dag-processor on a free port."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mjoin.loop.airflow_env import admin_password, airflow_cmd, airflow_env, ensure_db


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_env(home: Path, lake: Path, period_minutes: int) -> dict:
    """The project's Airflow environment (DAGs not paused at creation, as in the embedded profile)."""
    env = airflow_env(home, lake=str(lake))
    env["MJOIN_PERIOD_MINUTES"] = str(period_minutes)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent / "include"),
                                                      env.get("PYTHONPATH", "")]))
    ensure_db(env)
    return env


def dags_test(env: dict, dag_id: str, logical_date: str, conf: dict, *, mark_success: str | None = None,
              log: Path | None = None) -> subprocess.CompletedProcess:
    args = ["dags", "test", dag_id, logical_date, "--conf", json.dumps(conf)]
    if mark_success:
        args += ["--mark-success-pattern", mark_success]
    proc = airflow_cmd(args, env, check=False, capture=True, timeout=900)
    if log is not None:
        with open(log, "a") as f:
            f.write(f"\n==== {' '.join(args)}\n{proc.stdout}")
    return proc


def json_out(stdout: str):
    """The JSON document a CLI command printed after its log lines (the last line starting with [ or {)."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith(("[", "{")):
            return json.loads(line)
    raise ValueError(f"no JSON in the output: {stdout[-500:]}")


def task_states(env: dict, dag_id: str, run_id: str) -> dict:
    proc = airflow_cmd(["tasks", "states-for-dag-run", dag_id, run_id, "-o", "json"], env, capture=True)
    return {row["task_id"]: row["state"] for row in json_out(proc.stdout)}


def list_runs(env: dict, dag_id: str) -> list[dict]:
    proc = airflow_cmd(["dags", "list-runs", dag_id, "-o", "json"], env, capture=True)
    return json_out(proc.stdout)


@contextlib.contextmanager
def services(env: dict, log_dir: Path, components=("api-server", "scheduler", "dag-processor")):
    """Start Airflow components (the execution API of the api-server is what tasks talk to)."""
    port = free_port()
    env = dict(env)
    env["AIRFLOW__API__PORT"] = str(port)
    env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://localhost:{port}/execution/"
    env["AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL"] = "5"
    env["AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC"] = "2"
    exe = str(Path(sys.executable).parent / "airflow")
    procs = []
    try:
        for comp in components:
            args = [exe, comp] + (["--port", str(port)] if comp == "api-server" else [])
            out = open(log_dir / f"{comp}.log", "w")
            procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        wait_http(f"http://localhost:{port}/api/v2/monitor/health", timeout=120)
        yield env, port
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in procs:
            try:
                p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        # then whatever is left in the components' process groups: a scheduler that is shutting down may start
        # a LocalExecutor worker after its group got the SIGTERM (seen with the forkserver start method: idle
        # workers, and the multiprocessing resource tracker waiting for them, outlived the test)
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status < 500:
                    return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(1)
    raise TimeoutError(f"{url} not up within {timeout}s: {last}")


def api(port: int, path: str, env: dict, method: str = "GET", body: dict | None = None) -> dict:
    """Call the REST API with a token from POST /auth/token (simple auth manager's admin password)."""
    status, doc = api_call(port, path, env, method, body)
    if status >= 400:
        raise RuntimeError(f"{method} {path}: HTTP {status}: {doc}")
    return doc


def api_call(port: int, path: str, env: dict, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
    """``(HTTP status, JSON body)`` of a REST API call, errors included (a 400 is an answer, not an exception)."""
    import urllib.error

    pw = admin_password(env)
    req = urllib.request.Request(f"http://localhost:{port}/auth/token", method="POST",
                                 data=json.dumps({"username": "admin", "password": pw}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        token = json.loads(r.read())["access_token"]
    req = urllib.request.Request(f"http://localhost:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, {"text": text.decode(errors="replace")}


class LiveFeed:
    """``mjoin.workloads.live.run_live`` in a thread (a real-time TPC-DS replay into a lake), stoppable."""

    class Stop(Exception):
        pass

    def __init__(self, lake, workdir, **kwargs):
        import threading

        self.halt = threading.Event()
        self.error = None
        self.cycles = []
        self.kwargs = dict(kwargs, workdir=str(workdir))
        self.lake = str(lake)
        self.thread = threading.Thread(target=self._run, name="live-feed", daemon=True)

    def _sleep(self, seconds: float) -> None:
        if self.halt.wait(seconds):
            raise LiveFeed.Stop()

    def _run(self):
        from mjoin.workloads.live import run_live

        try:
            run_live(self.lake, sleep=self._sleep, on_cycle=lambda e, c: self.cycles.append((e, time.time())),
                     **self.kwargs)
        except LiveFeed.Stop:
            pass
        except Exception as exc:  # reported by the test
            self.error = exc

    def start(self) -> "LiveFeed":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(timeout=120)
