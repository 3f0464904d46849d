"""`python -m mjoin airflow --live` (what `make airflow` runs) as a user starts and stops it: it starts without the
warnings a user would have to act on, serves the UI on this machine only, takes a backfill created while it runs,
and stops with everything it started, the live feed included, within 10 s of Ctrl-C or SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from airflow_helpers import free_port, wait_http

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
PROJECT = Path(__file__).resolve().parent.parent
#: start-up warnings a user would act on (each was printed before: tests fail if one comes back)
ACTIONABLE = ("looks like production", "HMAC key", "Using `httpx` with `starlette.testclient`")


def _alive(pid: int) -> bool:
    """Running (a zombie is dead, waiting to be reaped)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict = {}
    for p, pp in (line.split() for line in out.splitlines()):
        children.setdefault(int(pp), []).append(int(p))
    seen, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def test_make_airflow_starts_quietly_and_stops_within_10_s(tmp_path):
    """Ctrl-C (SIGINT; SIGTERM takes the same path) while a scheduled run works on the feed's backlog."""
    sig = signal.SIGINT
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT / "include"),
                                                                      os.environ.get("PYTHONPATH")]))}
    log = tmp_path / "airflow.out"
    args = [sys.executable, "-m", "mjoin", "airflow", "--live", "--home", str(tmp_path / "home"),
            "--lake", str(tmp_path / "lake"), "--port", str(port)]
    # its own session, as a terminal runs `make airflow`; SIGINT as Ctrl-C sends it (a shell's background job would
    # ignore it)
    proc = subprocess.Popen(args, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=PROJECT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    started = []
    try:
        wait_http(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=240)
        # the feed landed its backlog, a scheduled run started (the DAGs are not paused): the whole set is running
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not (tmp_path / "lake" / "reports").exists():
            time.sleep(2)
        # a backfill created as a live user does, while the scheduler writes (README, "Backfills"): it is made
        now = datetime.now(timezone.utc)
        backfill = subprocess.run(
            [sys.executable, "-m", "mjoin", "airflow-cli", "--home", str(tmp_path / "home"), "--lake",
             str(tmp_path / "lake"), "backfill", "create", "--dag-id", "mjoin_reoptimize",
             "--from-date", (now - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ"),
             "--to-date", now.strftime("%Y-%m-%dT%H:%M:%SZ"), "--max-active-runs", "1",
             "--reprocess-behavior", "completed"], env=env, cwd=PROJECT, capture_output=True, text=True, timeout=300)
        assert backfill.returncode == 0 and "Created backfill Dag run" in backfill.stdout, \
            (backfill.stdout + backfill.stderr)[-3000:]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=30) as r:
            health = json.loads(r.read())
        assert health["scheduler"]["status"] == "healthy", health
        started = sorted(_descendants(proc.pid))
        assert len(started) >= 4, started  # standalone, its components, the feed
    finally:
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        took = time.monotonic() - t0
    print(f"stopped in {took:.1f} s after {signal.Signals(sig).name}, exit {rc}")
    time.sleep(0.5)
    left = [p for p in started if _alive(p)]
    assert not left, subprocess.run(["ps", "-o", "pid,cmd", "-p", ",".join(map(str, left))], capture_output=True,
                                    text=True).stdout
    assert took < 10, f"stopping took {took:.1f} s"
    out = log.read_text()
    assert "log in as admin" in out and f"http://localhost:{port}" in out
    found = [w for w in ACTIONABLE if w in out]
    assert not found, [line for line in out.splitlines() if any(w in line for w in found)][:5]
    assert f"Uvicorn running on http://127.0.0.1:{port}" in out  # this machine only
