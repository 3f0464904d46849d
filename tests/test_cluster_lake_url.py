"""The lake as a Hadoop filesystem URL (``file:///...``): the code path a lake on HDFS or S3A takes, run here.

Every path built from the URL stays a URL (the source's file log, what Spark reads on the executors,
state, results), Python opens them through ``pyarrow.fs.FileSystem.from_uri``, and the job's claim is the
URL fallback (status file, write then verify) instead of a flock. Same results as the plain-path lake.
"""
from __future__ import annotations

import os

import pytest

from engine_helpers import land_first_arrivals, replay_tpcds
from mjoin.runtime import fsutil
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.runs import run_stream
from mjoin.engine.control import JobControl, JobRunning
from mjoin.engine.results import result_fingerprint
from mjoin.engine.source import FileLog, file_log_dir
from mjoin.lake.layout import Lake

pytestmark = pytest.mark.spark
QUERY = "tpcds_returns_by_address"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("urllake")
    stage = Lake(str(root / "stage"))
    replay_tpcds(stage, 0.01)
    lake = Lake(str(root / "lake"))
    land_first_arrivals(stage, lake, 4)
    return lake


def test_file_url_lake_takes_the_url_path_and_joins_the_same_rows(spark, plain):
    url = Lake("file://" + plain.root)
    assert url.root.startswith("file:///") and fsutil.is_url(url.root) and url.local_path() is None
    assert url.stream_files("customer") and all(f.startswith("file:///") for f in url.stream_files("customer"))

    ref = run_stream(spark, QUERY, Lake(plain.root, "plain"), config=EngineConfig(max_files_per_trigger=8))
    got = run_stream(spark, QUERY, Lake(url.root, "url"),
                     config=EngineConfig(max_files_per_trigger=8, driver_rows=0))  # Spark reads the URLs
    assert got.batches == ref.batches == [0, 1]
    a, b = result_fingerprint(Lake(url.root, "url"), QUERY), result_fingerprint(Lake(plain.root, "plain"), QUERY)
    assert b["rows"] > 0 and a == b, (a, b)
    assert {m["execution"]["where"] for m in read_metrics(Lake(url.root, "url"), QUERY)} == {"executors"}
    # the job's own file log holds URLs, as it handed them to Spark
    flog = FileLog(file_log_dir(Lake(url.root, "url").checkpoints(QUERY)))
    assert len(flog.entries) == 16 and all(e.path.startswith("file:///") for e in flog.entries)
    # the outputs are where the URL says (the same folder as the plain path)
    assert os.path.isdir(os.path.join(plain.root, "url", "results", QUERY, "batch=0"))


def test_claim_on_a_url_lake_is_the_status_file_not_a_flock(plain):
    local = JobControl(Lake(plain.root, "claims"), QUERY).claim()
    try:
        assert local.locked  # a plain path: flock
    finally:
        local.release()
    control = JobControl(Lake("file://" + plain.root, "claims_url"), QUERY)
    first = control.claim()
    try:
        assert not first.locked and control.status()["state"] == "starting"
        with pytest.raises(JobRunning, match="already starting"):
            control.claim()  # this process is alive: the status file refuses the second start
    finally:
        first.release()
        control.write("stopped", **first.info)
