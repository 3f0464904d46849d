"""The engine and the statistics job on the native Spark standalone cluster (`make cluster-up`): executors
in two worker processes, a worker killed mid-batch, the driver killed mid-batch, results identical to
local mode (count + fingerprint over all output columns).

What local mode hides and these runs check: the executors run in their workers' folders (the job is
given a *relative* lake), write the state, results, partial results and quarantine files that the
driver then reads, keep the state in their Python workers' memory between batches (a batch retried on
the other worker, or a new executor, must not see a stale cache), and the job's flock claim lives in
the driver (a killed driver frees it at once; the restart is not refused).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster_helpers import cluster_dir, job_env, require_cluster
from engine_helpers import land_first_arrivals, replay_tpcds
from mjoin.runtime import cluster
from mjoin.runtime import fsutil
from mjoin.engine.config import EngineConfig
from mjoin.engine.results import committed_batches
from mjoin.engine.metrics import read_metrics
from mjoin.engine.runs import run_stream
from mjoin.engine.control import JobControl
from mjoin.engine.results import result_fingerprint
from mjoin.lake.layout import Lake

pytestmark = [pytest.mark.cluster, pytest.mark.spark]
QUERY = "tpcds_returns_by_address"
ARRIVALS = 10  # arrival cycles landed: 40 files, 8 per batch: batches 0..4
FILES_PER_BATCH = "8"


@pytest.fixture(scope="module")
def on_cluster():
    require_cluster()
    return cluster.load(cluster_dir())


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    """TPC-DS sf 0.01 replayed (the paper's interleaving), the first arrival cycles landed in a lake."""
    root = tmp_path_factory.mktemp("cluster_engine")
    stage = Lake(str(root / "stage"))
    info = replay_tpcds(stage, 0.01)
    lake = Lake(str(root / "lake"))
    arrivals = land_first_arrivals(stage, lake, ARRIVALS)
    return {"root": root, "lake": lake, "start": info["start"], "end": arrivals[-1] + 60}


def _start(root: Path, log: Path, *args) -> subprocess.Popen:
    """``python -m mjoin run --stream`` on the cluster, from ``root`` with the lake given relative to it."""
    cmd = [sys.executable, "-m", "mjoin", "run", "--stream", "--query", QUERY, "--lake", "lake", "--namespace",
           "cluster", "--max-files-per-trigger", FILES_PER_BATCH, "--driver-rows", "0", *args]
    with open(log, "a") as fh:
        return subprocess.Popen(cmd, cwd=root, env=job_env({"MJOIN_SPARK_UI": "false"}), stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait(what: str, check, job: subprocess.Popen, log: Path, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if job.poll() is not None:
            pytest.fail(f"the job ended (exit {job.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        time.sleep(0.3)
    pytest.fail(f"no {what} within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def _kill_driver(job: subprocess.Popen) -> None:
    """SIGKILL the driver's whole tree (Python driver, its JVM, PySpark's daemon on the driver)."""
    import psutil

    tree = [psutil.Process(job.pid)] + psutil.Process(job.pid).children(recursive=True)
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    job.wait(timeout=60)


def test_streaming_job_on_two_workers_survives_a_worker_kill_and_a_driver_kill(on_cluster, landed, spark):
    """Batch 1: the worker running partition 0's task is killed (with its executor and Python workers)
    while the task sleeps; Spark retries it on the other worker; the worker is started again and gets a
    new executor. Batch 3: the driver is killed after its tasks wrote their files, before the commit; the
    restart (not refused: the kernel released the claim) re-runs batch 3 and finishes. Same rows as the
    job in local mode on the same files."""
    root, lake = landed["root"], landed["lake"]
    ns = Lake(lake.root, "cluster")
    local = Lake(lake.root, "local")
    # the reference: the same job in local mode (local[2], in-process), same batches
    ref = run_stream(spark, QUERY, local, config=EngineConfig(max_files_per_trigger=8, driver_rows=0))
    assert ref.batches == [0, 1, 2, 3, 4]

    log = root / "cluster_job.log"
    marker = Path(fsutil.join(ns.checkpoints(QUERY), "_control", "fault_in_task-1.json"))
    control = JobControl(ns, QUERY)
    job = _start(root, log, "--inject-fault", "pause_in_task:1:300,pause_before_commit:3:600")
    try:
        doc = _wait("batch 1's task paused on an executor", lambda: marker.exists() and json.loads(marker.read_text()),
                    job, log)
        victim = cluster.worker_of(cluster.load(cluster_dir()), int(doc["pid"]))
        assert victim is not None, f"the task ran in process {doc['pid']}, in no worker's process tree"
        assert committed_batches(ns, QUERY) == [0]  # mid-batch: 1 is not committed
        cluster.kill_worker(cluster_dir(), victim)
        state = cluster.load(cluster_dir())
        cluster.start_worker(cluster_dir(), state, victim)  # the cluster heals: a new executor there
        st = _wait("the pause before batch 3's commit",
                   lambda: (s := control.status()).get("fault_pause", {}).get("batch_id") == 3 and s, job, log)
        assert st["running"] and st["batch_in_progress"] == 3
        execs = _wait("executors on both workers", lambda: (e := cluster.executors(cluster.load(cluster_dir())))
                      and all(e.get(i) for i in (0, 1)) and e, job, log, timeout=90)
        assert len(execs) == 2
        assert committed_batches(ns, QUERY) == [0, 1, 2]
        _kill_driver(job)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert control.status()["state"] == "dead"  # killed without recording a stop

    job = _start(root, log)  # restarted at once: the claim died with the driver
    assert job.wait(timeout=600) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert "already running" not in text
    assert control.status()["state"] == "stopped"
    assert committed_batches(ns, QUERY) == [0, 1, 2, 3, 4]
    records = read_metrics(ns, QUERY)
    assert sorted({r["batch_id"] for r in records}) == [0, 1, 2, 3, 4]
    assert all(r["execution"]["where"] == "executors" for r in records)
    got, want = result_fingerprint(ns, QUERY), result_fingerprint(local, QUERY)
    assert want["rows"] > 100 and got == want, (got, want)
    # the relative lake was resolved by the driver: nothing landed in the workers' folders
    assert not list((cluster_dir() / "work").rglob("lake")), "an executor wrote into its worker's folder"


def test_statistics_job_on_the_cluster_equals_local_mode(on_cluster, landed, spark):
    """`python -m mjoin stats` on the cluster with the kernel on the executors (--driver-rows 0) writes the
    same statistics history as the job in local mode."""
    from mjoin.stats.history import read_history
    from mjoin.stats.job import StatsConfig, run_statistics
    from mjoin.model.query import load_query
    from mjoin.model.timeutil import iso

    root, lake = landed["root"], landed["lake"]
    start, end = iso(landed["start"] + 60), iso(landed["end"])
    out_local, out_cluster = root / "stats_local", root / "stats_cluster"
    run_statistics(spark, load_query(QUERY), lake, start, end, 30, out=str(out_local),
                   config=StatsConfig(driver_rows=0, partitioning=None))
    proc = subprocess.run([sys.executable, "-m", "mjoin", "stats", "--query", QUERY, "--lake", lake.root,
                           "--from", start, "--to", end, "--cycle", "30", "--plan", "none", "--driver-rows", "0",
                           "--out", str(out_cluster), "--json"], env=job_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["spark"]["master"] == cluster.master_url(on_cluster), summary["spark"]
    assert summary["kernel"]["where"] == "executors", summary.get("kernel")
    a = read_history(str(out_cluster), QUERY)
    b = read_history(str(out_local), QUERY)
    assert len(a) > 0 and len(a) == len(b)
    cols = sorted(b.columns)
    key = ["cycle_start", "group", "entity", "stream", "right"]
    a = a[cols].sort_values(key).reset_index(drop=True)
    b = b[cols].sort_values(key).reset_index(drop=True)
    import pandas as pd

    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-9)
