"""mjoin.runtime.cluster without starting anything: what status and down say when nothing runs, a taken port refused
before any process starts, a recycled pid never taken for ours, where PostgreSQL's folder goes."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from mjoin.runtime import cluster


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mjoin", "cluster", *args], capture_output=True, text=True)


def test_status_and_down_when_nothing_was_started(tmp_path):
    st = _cli("status", "--dir", str(tmp_path))
    assert st.returncode == 1 and "cluster not up: no cluster started from" in st.stdout
    down = _cli("down", "--dir", str(tmp_path))
    assert down.returncode == 0 and "nothing was running" in down.stdout
    with pytest.raises(cluster.ClusterError, match="make cluster-up"):
        cluster.env(tmp_path)


def test_a_taken_port_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as s:
        s.bind((cluster.HOST, 0))
        s.listen()
        port = s.getsockname()[1]
        r = _cli("up", "--dir", str(tmp_path), "--master-port", str(port), "--no-postgres")
    assert r.returncode == 2 and f"port {port}" in r.stderr and "taken" in r.stderr, r.stderr
    assert "pid" not in cluster.load(tmp_path).get("master", {})  # nothing was started


def test_a_recorded_pid_counts_only_with_its_start_time():
    me = {"pid": os.getpid(), "started": cluster._started(os.getpid())}
    assert cluster.alive(me)
    assert not cluster.alive({**me, "started": me["started"] - 3600})  # the pid, recycled by another process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not cluster.alive({"pid": child.pid, "started": time.time()})
    assert cluster._stop({"pid": child.pid, "started": 0.0}) is False  # never signalled


def test_postgres_folder_is_reachable_by_its_user(tmp_path):
    assert cluster._pg_base(tmp_path, None) == tmp_path.resolve() / "postgres"
    locked = tmp_path / "private"
    (locked / "proj").mkdir(parents=True)
    os.chmod(locked, 0o700)
    base = cluster._pg_base(locked / "proj", "postgres")
    assert not str(base).startswith(str(locked)) and base.name.startswith("mjoin-postgres-")
