"""The join job's lifecycle: the claim (one job per query, freed by a crash), status from this and
from another host, `python -m mjoin job status|stop`, and on Spark: status while running, a
second start refused, a clean stop at a batch boundary, a restart from the checkpoint that
continues without losing or repeating a result."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from engine_helpers import TPCDS_TABLES, assert_same_results, multiset, no_leaked_queries, reference, replay_tpcds
from mjoin.engine.config import EngineConfig
from mjoin.engine.results import committed_batches, read_results
from mjoin.engine.metrics import read_metrics
from mjoin.engine.runs import run_stream
from mjoin.engine.control import JobControl, JobRunning
from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso

PROJECT = Path(__file__).resolve().parent.parent
QUERY = "tpcds_returns_by_address"
_ = no_leaked_queries  # fixture (engine_helpers)

HOLDER = """
import sys, time
from mjoin.engine.control import JobControl
from mjoin.lake.layout import Lake
c = JobControl(Lake(sys.argv[1]), sys.argv[2])
claim = c.claim({"trigger": "processingTime", "interval": 5.0, "engine": "mjoin"})
c.write("running", **claim.info, batches_this_run=1, last_batch_id=4, batch_in_progress=5)
print("claimed", flush=True)
time.sleep(600)
"""


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(PROJECT / "include")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def job_cli(lake: Lake, *args) -> subprocess.CompletedProcess:
    """``python -m mjoin job ...`` as an operator runs it (its own process)."""
    return subprocess.run([sys.executable, "-m", "mjoin", "job", *args, "--query", QUERY, "--lake", lake.root],
                          capture_output=True, text=True, env=_env(), timeout=120)


def test_claim_is_exclusive_and_a_killed_holder_frees_it_at_once(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    control = JobControl(lake, QUERY)
    st = control.status()
    assert (st["state"], st["running"]) == ("never started", False)
    r = job_cli(lake, "status")
    assert r.returncode == 3 and "never started" in r.stdout, r.stdout + r.stderr

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, lake.root, QUERY], stdout=subprocess.PIPE, text=True,
                              env=_env())
    try:
        assert holder.stdout.readline().strip() == "claimed"
        st = control.status()
        assert st["running"] and st["state"] == "running" and st["pid"] == holder.pid
        assert st["host"] == socket.gethostname() and "alive" in st["note"]
        with pytest.raises(JobRunning, match=rf"already running \(pid {holder.pid}"):
            control.claim()
        r = job_cli(lake, "status")
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"{QUERY}: running; run {st['run_id']}, pid {holder.pid}" in r.stdout
        assert "last batch 4" in r.stdout and "batch 5 in progress" in r.stdout

        os.kill(holder.pid, signal.SIGKILL)  # no chance to record anything
        holder.wait(30)
        st = control.status()
        assert (st["state"], st["recorded_state"], st["running"]) == ("dead", "running", False)
        assert "killed or crashed in batch 5" in st["note"]
        r = job_cli(lake, "status")
        assert r.returncode == 1 and "dead (recorded: running)" in r.stdout and "killed or crashed" in r.stdout
        r = job_cli(lake, "stop", "--timeout", "5")
        assert r.returncode == 0 and "not running" in r.stdout
        assert control.stop_requested() is None  # nothing to stop: no request left behind

        # the restart claims at once (the heartbeat is seconds old; the kernel freed the lock)
        claim = control.claim({"trigger": "availableNow"})
        try:
            st = control.status()
            assert st["running"] and (st["state"], st["pid"], st["run_id"]) == ("starting", os.getpid(), claim.run_id)
            with pytest.raises(JobRunning):  # a second claim, even from this process
                control.claim()
        finally:
            claim.release()
        control.write("stopped", **claim.info, reason="test")
        assert not control.status()["running"]
        control.claim().release()  # free again after a release
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)


def test_status_judges_liveness_by_pid_here_and_by_heartbeat_elsewhere(tmp_path):
    control = JobControl(Lake(str(tmp_path / "lake")), QUERY)
    now = datetime.now(timezone.utc)

    def status_of(**doc):
        base = {"run_id": "r1", "started_at": iso(now), "pid": 4242, "host": "other-host"}
        control.write("running", **dict(base, **doc))
        return control.status(stale_after=30)

    st = status_of()  # another host, fresh heartbeat
    assert st["running"] and st["state"] == "running" and "another host" in st["note"]
    body = json.loads(Path(control.status_path).read_text())
    body["heartbeat_at"] = iso(now - timedelta(seconds=31))
    Path(control.status_path).write_text(json.dumps(body))
    st = control.status(stale_after=30)
    assert (st["state"], st["running"]) == ("lost", False) and "no heartbeat from other-host" in st["note"]
    # this host: the pid decides, not the heartbeat
    me = {"host": socket.gethostname(), "pid": os.getpid()}
    assert status_of(**me)["running"]
    import psutil

    started = psutil.Process().create_time()
    assert status_of(**me, pid_started=started)["running"]
    st = status_of(**me, pid_started=started - 100)  # same pid, another process: recycled
    assert (st["state"], st["running"]) == ("dead", False) and "pid reused" in st["note"]
    st = status_of(host=socket.gethostname(), pid=_dead_pid())
    assert (st["state"], st["running"]) == ("dead", False)
    control.write("stopped", run_id="r1", reason="done", stopped_at=iso(now))
    st = control.status()
    assert (st["state"], st["running"]) == ("stopped", False) and st["note"].endswith("done")
    Path(control.status_path).write_text("{not json")
    assert control.status()["state"] == "unknown"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.spark
def test_status_stop_at_a_boundary_and_restart_from_checkpoint(spark, seed_query, tmp_path):
    from test_engine_stream import land

    stage = Lake(str(tmp_path / "stage"))
    replay_tpcds(stage, 0.01)
    arrivals = sorted({a for t in TPCDS_TABLES for a in stage.arrivals(t)})
    first = arrivals[:8]
    lake = Lake(str(tmp_path / "lake"))
    control = JobControl(lake, seed_query.name)
    land(stage, lake, first)
    errors = []
    cfg = EngineConfig(buckets=4, max_files_per_trigger=8)  # 32 files: 4 batches, unless stopped before

    def continuous():
        try:
            run_stream(spark, seed_query, lake, trigger="processingTime", interval=1.0, config=cfg)
        except Exception as exc:  # reported by the assertions below
            errors.append(exc)

    job = threading.Thread(target=continuous, name="join-job")
    job.start()
    try:
        st = control.wait_running(timeout=120, poll=0.2)
        assert st["running"] and st["state"] == "running", st
        assert (st["pid"], st["trigger"], st["interval"]) == (os.getpid(), "processingTime", 1.0)
        deadline = time.monotonic() + 120
        while not committed_batches(lake, seed_query.name) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert committed_batches(lake, seed_query.name), f"the job committed no batch: {errors}"
        with pytest.raises(JobRunning, match="already running"):
            run_stream(spark, seed_query, lake, trigger="availableNow", config=cfg)
        r = job_cli(lake, "stop", "--by", "test", "--reason", "lifecycle test", "--timeout", "120")
        assert r.returncode == 0 and "stopped after batch" in r.stdout, r.stdout + r.stderr
    finally:
        if job.is_alive():
            control.request_stop(by="test cleanup")
            job.join(timeout=120)
    assert not errors, errors
    assert not job.is_alive()
    st = control.status()
    assert (st["state"], st["running"]) == ("stopped", False)
    assert st["reason"] == "stop requested by test: lifecycle test"
    assert control.stop_requested() is None  # the job consumed the request
    done = committed_batches(lake, seed_query.name)
    assert done == list(range(len(done))) and st["last_batch_id"] == done[-1]
    assert f"stopped after batch {done[-1]}" in r.stdout
    # stopped at a boundary: Spark committed every batch that ran; at most the next one is planned
    ckpt = Path(lake.checkpoints(seed_query.name))
    offsets = sorted(int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit())
    commits = sorted(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
    assert commits == done and offsets in (done, done + [done[-1] + 1])
    assert job_cli(lake, "status").returncode == 3

    # restart from the checkpoint with the rest landed: only new files, nothing lost or repeated
    land(stage, lake, arrivals[8:12])
    summary = run_stream(spark, seed_query, lake, trigger="availableNow", config=EngineConfig(buckets=4))
    # everything left in one batch (two if Spark had planned the next batch when it stopped)
    assert summary.batches == list(range(done[-1] + 1, offsets[-1] + 2))
    st = control.status()
    assert (st["state"], st["running"]) == ("stopped", False) and "availableNow" in st["reason"]
    res = read_results(lake, seed_query.name)
    ref = reference(seed_query, lake)
    assert_same_results(res, ref, "stop + restart")
    assert max(multiset(res).values()) == 1
    records = read_metrics(lake, seed_query.name)
    assert [r["batch_id"] for r in records] == list(range(len(records)))
    assert sum(r["result_rows"] for r in records) == len(ref)
