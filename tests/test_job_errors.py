"""Errors a user can read: a read-only folder or a full disk ends the streaming job with one line naming the
cause and the path (exit 1, the traceback in the log above it), ``job status`` records the failure, and a
restart once the disk is fixed continues without loss; a second start is refused before Spark starts, naming
the real lake.

The reproductions: a 400-line traceback whose first error was a ``FileNotFoundError`` on a ``.tmp`` file,
``job status`` saying ``dead (recorded: running)``; the second of two starts refused only after its own Spark
start (~60 s), its message naming a literal ``<lake>``. Read-only folders are read-only bind mounts and the full
disk a 24 MB tmpfs (the tests run as root; elsewhere they are skipped, saying why).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine_helpers import TPCDS_TABLES, job_env, no_leaked_queries, replay_tpcds
from hostile_helpers import same_results
from mjoin import cli
from mjoin.engine.config import EngineConfig
from mjoin.engine.control import JobControl
from mjoin.engine.failure import Failure, filesystem_failure
from mjoin.engine.runs import run_interval, run_stream
from mjoin.lake.layout import Lake

_ = no_leaked_queries
PROJECT = Path(__file__).resolve().parent.parent
QUERY = "tpcds_returns_by_address"
ROFS, NOSPC = os.strerror(errno.EROFS), os.strerror(errno.ENOSPC)


# ---- the one line, pure ------------------------------------------------------------------------------------


def test_the_cause_is_found_in_chains_and_in_relayed_text():
    try:
        try:
            raise FileNotFoundError(errno.ENOENT, "No such file", "/l/results/q/batch=3/.part-s1.parquet.ab12.tmp")
        except FileNotFoundError:
            raise OSError(errno.EROFS, "Cannot create directory '/l/results/q'. Detail: [errno 30] Read-only")
    except OSError as exc:
        assert filesystem_failure(exc) == Failure(ROFS, "/l/results/q")
    relayed = RuntimeError("py4j ... Traceback (most recent call last):\n"
                           '  File "/x/mjoin/runtime/fsutil.py", line 135, in atomic_write_bytes\n'
                           "OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device\n"
                           "OSError: [Errno 28] No space left on device: '/l/checkpoints/q/mjoin/files/000000000020.json'")
    assert filesystem_failure(relayed) == Failure(NOSPC, "/l/checkpoints/q/mjoin/files/000000000020.json")
    java = RuntimeError("java.nio.file.FileSystemException: /l/checkpoints/q/offsets/.7.tmp: Read-only file system")
    assert filesystem_failure(java).line() == (
        f"the join job failed: {ROFS} (writing into /l/checkpoints/q/offsets); make it writable, then restart the "
        "job (it continues from its checkpoint)")
    assert filesystem_failure(RuntimeError("java.io.IOException: No space left on device")) == Failure(NOSPC, None)
    assert filesystem_failure(ValueError("a bad plan"), None) is None
    # a permission error (the tests run as root: no chmod makes one), raised and as Spark relays it
    denied = os.strerror(errno.EACCES)
    assert filesystem_failure(PermissionError(errno.EACCES, denied, "/l/state/q")).line() == (
        f"the join job failed: {denied} (at /l/state/q); give the job's user write access, then restart the job")
    assert filesystem_failure(RuntimeError(
        "org.apache.hadoop.security.AccessControlException: x\njava.nio.file.AccessDeniedException: "
        "/l/checkpoints/q/commits/.3.tmp")) == Failure(denied, "/l/checkpoints/q/commits/.3.tmp")
    # the job's own first error wins over what Spark made of it
    assert filesystem_failure(OSError(errno.ENOSPC, NOSPC, "/l/state/q/v3"), java).path == "/l/state/q/v3"


# ---- a second start --------------------------------------------------------------------------------------------

HOLDER = """
import sys, time
from mjoin.engine.control import JobControl
from mjoin.lake.layout import Lake
c = JobControl(Lake(sys.argv[1]), sys.argv[2])
claim = c.claim({"trigger": "processingTime", "interval": 5.0, "engine": "mjoin"})
c.write("running", **claim.info)
print("claimed", flush=True)
time.sleep(600)
"""


@contextmanager
def held(lake: Lake):
    """The job of QUERY claimed by another process (as a running job holds it)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, lake.root, QUERY], stdout=subprocess.PIPE, text=True,
                            env=job_env())
    try:
        assert proc.stdout.readline().strip() == "claimed"
        yield proc
    finally:
        proc.kill()
        proc.wait(30)


def test_a_second_start_is_refused_before_spark_starts(tmp_path, monkeypatch, capsys):
    lake = Lake(str(tmp_path / "lake"))
    from mjoin.commands import run as run_command

    def no_spark(*a, **k):
        raise AssertionError("Spark was started for a start that must be refused")

    monkeypatch.setattr(run_command, "get_spark", no_spark)
    with held(lake) as holder:
        assert cli.main(["run", "--stream", "--query", QUERY, "--lake", lake.root]) == 2
        err = capsys.readouterr().err
        assert f"already running (pid {holder.pid}" in err
        assert f"python -m mjoin job stop --query {QUERY} --lake {lake.root})" in err and "<lake>" not in err
        # as an operator starts it: its own process, refused without a Spark log line
        done = subprocess.run([sys.executable, "-m", "mjoin", "run", "--stream", "--query", QUERY, "--lake",
                               lake.root], capture_output=True, text=True, env=job_env(), timeout=120)
        assert done.returncode == 2 and f"--lake {lake.root}" in done.stderr
        assert "log4j" not in done.stderr and "SparkContext" not in done.stderr, done.stderr[-2000:]
    st = JobControl(lake, QUERY).status()
    assert st["recorded_state"] == "running" and not st["running"]  # the holder's; the refused start wrote nothing


def test_job_status_names_the_plan_of_the_last_batch(tmp_path, capsys):
    """The spec's order has no version: ``(plan default)``, not ``(plan default vNone)``."""
    lake = Lake(str(tmp_path / "lake"))
    control = JobControl(lake, QUERY)
    claim = control.claim({"trigger": "availableNow", "engine": "mjoin"})
    for source, version, shown in (("default", None, "(plan default)"), ("registry", 3, "(plan registry v3)")):
        control.write("stopped", **claim.info, last_batch_id=4, last_batch_at="t", plan_source=source,
                      plan_version=version, stopped_at="t2", reason="all landed data processed (availableNow)")
        assert cli.main(["job", "status", "--query", QUERY, "--lake", lake.root]) == 3  # (stopped)
        out = capsys.readouterr().out
        assert f"last batch 4 at t {shown}" in out and "None" not in out, out
    claim.release()


# ---- read-only folders and a full disk, on Spark ---------------------------------------------------------------


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    stage = Lake(str(tmp_path_factory.mktemp("staging") / "lake"))
    info = replay_tpcds(stage, 0.01, rate=10.0, arrival_cycle=60)
    return stage, info


def land(stage: Lake, lake: Lake, first: int, last: int) -> None:
    """Arrival cycles ``first`` to ``last - 1`` of every source."""
    for t in TPCDS_TABLES:
        for a in stage.arrivals(t)[first:last]:
            shutil.copytree(stage.arrival_dir(t, a), lake.arrival_dir(t, a))


def mount(*args) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount ({' '.join(args)}): {done.stderr.strip()} (needs root)")


@contextmanager
def read_only(folder: str):
    os.makedirs(folder, exist_ok=True)
    mount("--bind", folder, folder)
    try:
        mount("-o", "remount,ro,bind", folder)
        yield
    finally:
        subprocess.run(["umount", folder], check=True)


def run_job(lake: Lake, log: Path, spark_submit: bool) -> subprocess.CompletedProcess:
    if spark_submit:
        cmd = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[2]", "--conf",
               "spark.ui.enabled=false", "--driver-memory", "1g", str(PROJECT / "jobs" / "join.py")]
    else:
        cmd = [sys.executable, "-m", "mjoin", "run"]
    with open(log, "w") as fh:  # (spark-submit merges the driver's stderr into its stdout)
        return subprocess.run(cmd + ["--stream", "--query", QUERY, "--lake", lake.root, "--buckets", "4"],
                              stdout=fh, stderr=subprocess.STDOUT, text=True, env=job_env(), timeout=900)


def check_failed(done, log: Path, lake: Lake, cause: str, where: str) -> dict:
    err = log.read_text()
    assert done.returncode == 1, err[-3000:]
    lines = err.splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(ends) == 1, err[-3000:]  # one line ...
    last = lines[ends[0]]
    assert last.startswith(f"error: the join job failed: {cause} (") and where in last, last
    assert "Traceback (most recent call last)" in "\n".join(lines[:ends[0]])  # ... under the traceback, in the log
    st = JobControl(lake, QUERY).status()
    assert (st["state"], st["running"]) == ("failed", False), st
    assert st["error"] == last[len("error: "):]
    return st


def interval_out(spark, query, lake: Lake, info, out) -> str:
    start, end = info["start"] - 3600, info["end"] + 60
    run_interval(spark, query, None, lake, start, end, end - start, str(out), config=EngineConfig(buckets=4))
    return str(out)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("folder,spark_submit", [("results", True), ("state", False)])
def test_a_read_only_folder_ends_the_job_with_one_line(spark, staged, seed_query, tmp_path, folder, spark_submit):
    stage, info = staged
    lake = Lake(str(tmp_path / "lake"))
    land(stage, lake, 0, 5)
    target = os.path.join(lake.root, folder)
    with read_only(target):
        done = run_job(lake, tmp_path / "job.log", spark_submit)
        check_failed(done, tmp_path / "job.log", lake, ROFS, f"{target}")
    # writable again: a restart continues from the checkpoint, the rest lands, nothing lost
    run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4))
    land(stage, lake, 5, 100)
    run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=8))
    same_results(lake, interval_out(spark, seed_query, lake, info, tmp_path / "interval"), seed_query,
                 f"read-only {folder}, then a restart")


@pytest.mark.spark
@pytest.mark.slow
def test_a_full_disk_ends_the_job_with_one_line_and_is_recorded(spark, staged, seed_query, tmp_path):
    """The lake on a 24 MB tmpfs: a first run, the rest lands, the disk fills up; the next run fails with
    ``No space left on device`` naming the file it could not write, and ``job status`` records it (the status
    rewritten in place: a new file cannot be made). Space freed, a restart joins everything."""
    stage, info = staged
    root = tmp_path / "disk"
    root.mkdir()
    mount("-t", "tmpfs", "-o", "size=24m", "tmpfs", str(root))
    try:
        lake = Lake(str(root / "lake"))
        land(stage, lake, 0, 5)
        first = run_job(lake, tmp_path / "first.log", spark_submit=False)
        assert first.returncode == 0, (tmp_path / "first.log").read_text()[-3000:]
        land(stage, lake, 5, 100)
        with open(root / "filler", "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        done = run_job(lake, tmp_path / "job.log", spark_submit=False)
        check_failed(done, tmp_path / "job.log", lake, NOSPC, f"{lake.root}/")
        os.remove(root / "filler")
        run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4))
        same_results(lake, interval_out(spark, seed_query, lake, info, tmp_path / "interval"), seed_query,
                     "a full disk, then a restart")
    finally:
        subprocess.run(["umount", str(root)], check=False)
