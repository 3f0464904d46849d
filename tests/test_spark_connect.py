"""The statistics job over a long-lived Spark Connect server (MJOIN_SPARK_REMOTE), the way a DAG run uses
it: a fresh Python process with no JVM of its own. Its history equals in-process Spark's; the server's
start/status/stop; a server that does not answer is a clear error at once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from mjoin.lake.layout import Lake
from mjoin.runtime.resources import Resources
from mjoin.stats import history
from mjoin.stats.job import StatsConfig, run_statistics
from test_stats_helpers import FOUR_STREAMS, T0, four_streams_query, write_stream
from test_stats_job import N, TAU, _dataset

pytestmark = [pytest.mark.spark, pytest.mark.slow]
PROJECT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from mjoin.runtime import connect_server

    folder = tmp_path_factory.mktemp("connect")
    res = Resources(spark_master="local[2]", shuffle_partitions=4)
    info = connect_server.start(folder, 0, res, driver_memory="1g")
    yield {**info, "dir": folder}
    before = connect_server.stop(folder)
    assert before["state"] == "running"
    assert connect_server.status(folder)["state"] == "stopped"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    q = four_streams_query()
    root = tmp_path_factory.mktemp("connect-lake")
    lake = Lake(str(root / "lake"))
    rows = _dataset()
    for s in q.streams:
        if s.name in rows:
            write_stream(lake, s, rows[s.name])
    spec = root / "stats_test.yaml"
    spec.write_text(yaml.safe_dump(FOUR_STREAMS))
    return q, lake, spec


def _mjoin(args: list[str], **env) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(PROJECT / "include"), **env)
    return subprocess.run([sys.executable, "-m", "mjoin", *args], capture_output=True, text=True, env=full, cwd=PROJECT,
                          timeout=300)


def _sorted(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return df.sort_values(keys, na_position="first").reset_index(drop=True)


@pytest.mark.parametrize("rule, method, driver_rows", [
    ({"method": "hash", "attr_class": "c0", "groups": 2}, "pass", 0),
    (None, "pass", None),
    (None, "sql", None),
], ids=["pass-with-groups-on-executors", "pass-on-driver", "sql"])
def test_cli_over_connect_writes_the_history_in_process_spark_writes(spark, server, data, tmp_path, rule, method,
                                                                      driver_rows):
    """Over Connect (the kernel on the server's executors, or on the client after an Arrow collect) the history
    equals in-process Spark's (the kernel on its driver: the data are small)."""
    q, lake, spec = data
    out = tmp_path / "connect"
    args = ["stats", "--query", str(spec), "--lake", lake.root, "--from", str(T0), "--to", str(T0 + N * TAU),
            "--cycle", str(TAU), "--out", str(out), "--histogram-buckets", "8", "--method", method, "--json"]
    args += ["--partitioning", json.dumps(rule)] if rule else ["--plan", "none"]
    args += [] if driver_rows is None else ["--driver-rows", str(driver_rows)]
    proc = _mjoin(args, MJOIN_SPARK_REMOTE=server["url"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["spark"] == {"session": "connect", "remote": server["url"]}
    if method == "pass":
        assert summary["kernel"]["where"] == ("executors" if driver_rows == 0 else "driver")
    want = run_statistics(spark, q, lake, T0, T0 + N * TAU, TAU, out=str(tmp_path / "local"),
                          config=StatsConfig(histogram_buckets=8, partitioning=rule, method=method))
    assert want.summary["spark"]["session"] == "classic"
    got_rows = history.read_history(str(out), q.name)
    want_rows = history.read_history(str(tmp_path / "local"), q.name)
    groups = rule["groups"] if rule else 1
    assert len(got_rows) == len(want_rows) == N * groups * (len(q.streams) + len(q.directed_edges))
    keys = ["cycle_start", "group", "entity", "stream", "right"]
    pd.testing.assert_frame_equal(_sorted(got_rows, keys), _sorted(want_rows, keys))
    assert got_rows["m"].sum() > 0  # there are matches: not a comparison of empty statistics
    hk = ["cycle_start", "stream", "attr_class", "bucket"]
    pd.testing.assert_frame_equal(_sorted(history.read_histogram(str(out), q.name), hk),
                                  _sorted(history.read_histogram(str(tmp_path / "local"), q.name), hk))
    assert {k: v for k, v in summary["streams"]["a"].items() if k != "rejected_files"} == \
        {k: v for k, v in want.summary["streams"]["a"].items() if k != "rejected_files"}


def test_status_restart_and_a_server_that_does_not_answer(server, data):
    from mjoin.runtime import connect_server

    st = _mjoin(["spark-connect", "status", "--dir", str(server["dir"]), "--json"])
    assert st.returncode == 0 and json.loads(st.stdout)["state"] == "running"
    # a second start on the same folder returns the running server; on another port it is refused
    assert connect_server.start(server["dir"], server["port"])["pid"] == server["pid"]
    assert connect_server.start(server["dir"], 0)["pid"] == server["pid"]  # any port: the running one
    with pytest.raises(connect_server.ConnectServerError, match="already runs"):
        connect_server.start(server["dir"], server["port"] + 1)
    # nothing listens there: exit 2 with one clear line at once (the client alone would retry for minutes)
    q, lake, spec = data
    proc = _mjoin(["stats", "--query", str(spec), "--lake", lake.root, "--from", str(T0), "--to", str(T0 + TAU),
                   "--cycle", str(TAU), "--plan", "none"], MJOIN_SPARK_REMOTE=f"sc://localhost:{connect_server.free_port()}")
    assert proc.returncode == 2 and "does not answer" in proc.stderr and "Traceback" not in proc.stderr


def test_processes_share_one_session_and_skip_a_closed_one(server):
    """Every process of a job kind joins the same server session (its Python workers stay warm); a session
    the server closed is skipped for the next stable id."""
    code = f"""
from mjoin.runtime.resources import Resources
from mjoin.runtime.spark import connect_session, session_url
r = Resources(spark_remote={server['url']!r}, shuffle_partitions=4)
a = connect_session(r, name="closing")
assert a._mjoin_session_url == session_url(r.spark_remote, "closing", 0)
assert a.range(3).count() == 3
a.stop()  # releases the session: the server refuses its id from now on
b = connect_session(r, name="closing")
assert b._mjoin_session_url == session_url(r.spark_remote, "closing", 1), b._mjoin_session_url
assert b.range(5).count() == 5
assert b.conf.get("spark.sql.shuffle.partitions") == "4"
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(PROJECT / "include")))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    from mjoin.runtime.spark import session_url

    url = "sc://h:1"
    assert session_url(url, "x") == session_url(url, "x") != session_url(url, "y")
    assert session_url(url, "x").startswith("sc://h:1/;session_id=")
    assert session_url("sc://h:1/;session_id=abc", "x") == "sc://h:1/;session_id=abc"  # the user's own id wins


def test_resources_reject_a_remote_that_is_not_spark_connect():
    with pytest.raises(ValueError, match="sc://"):
        Resources.from_env({"MJOIN_SPARK_REMOTE": "spark://host:7077"})
    assert Resources.from_env({"MJOIN_SPARK_REMOTE": "sc://h:1"}).spark_remote == "sc://h:1"
    assert Resources.from_env({}).spark_remote == ""
