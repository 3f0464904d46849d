"""The streaming join job's lifecycle through mjoin_join_job, with real Airflow (`airflow dags test`) and a real
spark-submit, and a continuous-mode mjoin_reoptimize run while the job runs; then production as it runs: the job
started through a real scheduler, a real-time feed, and mjoin_reoptimize's scheduled runs re-optimizing it in
continuous mode (mode auto) period after period. The same setup as test_dags.py (dags_world.py) in its own Airflow
home and lakes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from mjoin.runtime import fsutil
from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso

from airflow_helpers import dags_test, list_runs, task_states
from dags_world import CYCLE, PERIOD, QUERY, START, Lander, logical, make_world

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("dags_join_job"))


def test_join_job_lifecycle_and_continuous_reoptimization(world):
    """mjoin_join_job start (spark-submit, processingTime trigger; its `dags test` runs in the background
    for as long as the job), a continuous-mode mjoin_reoptimize run while it runs (the job picks up the new
    version at its next batch and await_switch sees it), then stop and status runs. Own lake, so the live
    registry of the other tests is untouched."""
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.control import JobControl
    from mjoin.workloads.lander import land

    env, lake = world["env"], world["root"] / "lake_continuous"
    control = JobControl(Lake(str(lake)), QUERY)
    t_run = START + timedelta(seconds=2 * PERIOD + PERIOD // 2)  # between the other tests' logical dates
    land(world["workload"], Lake(str(lake)), until=iso(t_run))
    job_conf = {"query": QUERY, "lake": str(lake), "interval": 2, "stop_timeout": 120, "stats_cycle": CYCLE}
    args = ["dags", "test", "mjoin_join_job", "2026-02-01T00:00:00Z", "--conf", json.dumps({**job_conf, "action": "start"})]
    start_log = open(world["root"] / "join_job_start.log", "w")
    starter = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), *args], env=env, stdout=start_log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    lander = Lander(world["workload"], lake, since=iso(t_run), until=logical(8), speed=1.5)
    try:
        st = control.wait_running(timeout=300, poll=2)
        assert st["running"] and st["trigger"] == "processingTime", (st, starter.poll())
        lander.start()
        conf = {"query": QUERY, "lake": str(lake), "cycle": CYCLE, "strategy": "exact", "mode": "continuous",
                "deploy_timeout": 240, "gates": {**world["conf"]["gates"], "min_history": 5}}
        proc = dags_test(env, "mjoin_reoptimize", iso(t_run), conf, log=world["log"])
        folder = fsutil.join(Lake(str(lake)).reports(QUERY), "runs", t_run.strftime("%Y%m%dT%H%M%SZ"))
        out = json.loads(fsutil.read_text(fsutil.join(folder, "outcome.json")))
        assert out["status"] == "deployed", (out, proc.stdout[-3000:])
        assert out["tasks"]["join"] == "skipped" and out["tasks"]["await_switch"] == "success", out["tasks"]
        switch = json.loads(fsutil.read_text(fsutil.join(folder, "switch.json")))
        assert switch["outcome"] == "switched" and switch["version"] == out["version"] == 1
        batch = next(m for m in read_metrics(Lake(str(lake)), QUERY) if m["batch_id"] == switch["batch_id"])
        assert batch["plan_version"] == 1 and batch["plan_source"] == "registry" and batch["plan_switch"]["to"] == 1
        assert control.status()["running"] and starter.poll() is None  # still streaming
    finally:
        lander.stop()
        stop = dags_test(env, "mjoin_join_job", "2026-02-01T00:10:00Z", {**job_conf, "action": "stop"},
                         log=world["log"])
        try:
            starter.wait(timeout=180)
        finally:
            if starter.poll() is None:
                os.killpg(starter.pid, signal.SIGTERM)
            start_log.close()
    assert lander.error is None, lander.error
    st = control.status()
    assert not st["running"] and st["state"] == "stopped" and "stop requested" in (st.get("reason") or ""), st
    assert st.get("plan_version") == 1  # the job ran v1 until the end
    runs = {r["logical_date"][:16]: r for r in list_runs(env, "mjoin_join_job")}
    started, stopped = runs["2026-02-01T00:00"], runs["2026-02-01T00:10"]
    assert starter.returncode == 0 and started["state"] == "success", open(world["root"] / "join_job_start.log").read()[-3000:]
    assert task_states(env, "mjoin_join_job", started["run_id"]) == {
        "control": "success", "should_start": "success", "run_join_job": "success"}
    assert stop.returncode == 0 and task_states(env, "mjoin_join_job", stopped["run_id"]) == {
        "control": "success", "should_start": "success", "run_join_job": "skipped"}
    status = dags_test(env, "mjoin_join_job", "2026-02-01T00:20:00Z", {**job_conf, "action": "status"},
                       log=world["log"])
    assert status.returncode == 0 and f"join job of {QUERY}: stopped" in status.stdout
    status_run = next(r for r in list_runs(env, "mjoin_join_job") if r["logical_date"].startswith("2026-02-01T00:20"))
    assert task_states(env, "mjoin_join_job", status_run["run_id"])["run_join_job"] == "skipped"


@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    """A Spark Connect server (python -m mjoin spark-connect) for collect_statistics (MJOIN_SPARK_REMOTE)."""
    from mjoin.runtime import connect_server
    from mjoin.runtime.resources import Resources

    folder = tmp_path_factory.mktemp("connect")
    info = connect_server.start(folder, 0, Resources(spark_master="local[2]", shuffle_partitions=4),
                                driver_memory="1g")
    yield info
    connect_server.stop(folder)


def _stats_summary(lake, end: str) -> dict:
    """The statistics job's own summary of the run whose interval ends at ``end``."""
    from mjoin.model.timeutil import parse_time
    from mjoin.stats.history import RUNS_DIR, history_root, query_dir

    folder = fsutil.join(query_dir(history_root(lake), QUERY), RUNS_DIR)
    name = next(n for n in fsutil.listdir(folder) if n.endswith(f"-{int(parse_time(end).timestamp())}.json"))
    return json.loads(fsutil.read_text(fsutil.join(folder, name)))


def test_scheduled_runs_reoptimize_the_running_streaming_job(world, connect):
    """Production: the streaming join job runs (started by mjoin_join_job through the scheduler), a real-time feed
    lands into the lake, and mjoin_reoptimize runs on its schedule (1-minute periods, unaligned logical dates) with
    the default params. Every scheduled run resolves mode auto to continuous: it skips `join` (which would be
    refused: the job holds the query), its statistics (the job computes none here) run in the Spark Connect
    server's session at once, and it deploys
    (the job switches to the new version at its next batch) or reports no change, for several periods, the job
    running all along. Runs that overran their period leave no cycle uncovered: each run starts where the one
    before it ended."""
    from mjoin.engine.control import JobControl
    from mjoin.engine.metrics import read_metrics
    from mjoin.lake.registry import PlanRegistry
    from mjoin.loop.ui import read_outcomes
    from mjoin.model.timeutil import parse_time

    from mjoin.loop.airflow_env import airflow_cmd

    from airflow_helpers import LiveFeed, api, services

    lake = Lake(str(world["root"] / "lake_scheduled"))
    airflow_cmd(["dags", "pause", "mjoin_reoptimize"], world["env"], capture=True)  # until the job runs
    control = JobControl(lake, QUERY)
    feed = LiveFeed(lake.root, world["root"] / "live_scheduled", sf=0.01, cycle=10, chunk="10m", backlog="3m").start()
    env = {**world["env"], "MJOIN_LAKE": lake.root, "MJOIN_SPARK_REMOTE": connect["url"]}
    try:
        with services(env, world["root"]) as (senv, port):
            runs = "/api/v2/dags/mjoin_reoptimize/dagRuns"
            api(port, "/api/v2/dags/mjoin_join_job/dagRuns", senv, "POST",
                {"logical_date": None, "conf": {"action": "start", "interval": 5, "stats_cycle": 0}})
            st = control.wait_running(timeout=400, poll=2)
            assert st["running"] and st["trigger"] == "processingTime", st
            started = parse_time(st["started_at"])
            api(port, "/api/v2/dags/mjoin_reoptimize", senv, "PATCH", {"is_paused": False})
            deadline = time.monotonic() + 1200
            scheduled = []
            while time.monotonic() < deadline:
                outcomes = [o for o in read_outcomes(lake, QUERY) if o["run_type"] == "scheduled"
                            and parse_time(o["recorded_at"]) > started]
                scheduled = [o for o in outcomes if o["mode"] == "continuous"]
                if len(scheduled) >= 3 or any(o["status"] not in ("deployed", "no_change") for o in outcomes):
                    break
                time.sleep(5)
            api(port, "/api/v2/dags/mjoin_reoptimize", senv, "PATCH", {"is_paused": True})
            running_during = control.status()
            api(port, "/api/v2/dags/mjoin_join_job/dagRuns", senv, "POST",
                {"logical_date": None, "conf": {"action": "stop", "stop_timeout": 120}})
            stopped = control.wait_stopped(180)
            # the start run's task ends with the job, then Airflow records it; a re-optimization run's outcome is
            # written by its last task (record), before the scheduler marks the run itself: wait for both
            until = time.monotonic() + 180
            while time.monotonic() < until:
                job_runs = api(port, "/api/v2/dags/mjoin_join_job/dagRuns?order_by=run_after", senv)["dag_runs"]
                listed = {r["dag_run_id"]: r["state"] for r in api(port, f"{runs}?limit=100", senv)["dag_runs"]}
                if (all(r["state"] in ("success", "failed") for r in job_runs)
                        and all(listed.get(o["run_id"]) in ("success", "failed") for o in scheduled)):
                    break
                time.sleep(3)
    finally:
        feed.stop()
    assert feed.error is None, feed.error
    described = [(o["logical_date"], o["mode"], o["status"], o.get("reason")) for o in outcomes]
    assert len(scheduled) >= 3 and all(o["status"] in ("deployed", "no_change") for o in scheduled), described
    assert running_during["running"] and running_during["pid"] == st["pid"]  # one job, running all along
    assert not stopped["running"] and stopped["state"] == "stopped", stopped
    assert [r["state"] for r in job_runs[-2:]] == ["success", "success"]  # start: its task lasted as long as the job
    for o in scheduled:
        at = parse_time(o["logical_date"])
        assert at.microsecond or at.second % 10, o["logical_date"]  # a scheduled run's unaligned logical date
        assert o["mode_reason"].startswith("mode auto: the streaming join job") and listed[o["run_id"]] == "success"
        assert o["tasks"]["join"] == "skipped" and o["tasks"]["collect_statistics"] == "success", o["tasks"]
        # a job started without its own statistics: the step does not wait for them, the statistics job runs in
        # the Connect server's session (the job's own statistics: tests/test_dags_job_statistics.py)
        assert o["statistics"]["source"] == "standalone" and "without --stats-cycle" in o["statistics"]["fallback"]
        assert o["statistics"]["waited_seconds"] == 0, o["statistics"]
        assert _stats_summary(lake, o["interval_end"])["spark"]["session"] == "connect"
        if o["status"] == "deployed":
            assert o["switch"]["outcome"] == "switched" and o["switch"]["version"] == o["version"]
    # every cycle from the first scheduled run's start to the last one's end is covered by a run: a run that
    # overran its period made the next one start where it ended (caught up), nothing is left as a gap
    for a, b in zip(scheduled, scheduled[1:]):
        assert b["interval_start"] <= a["interval_end"] and not b["gap"], (a, b)
    deployed = [o for o in scheduled if o["status"] == "deployed"]
    versions = {m.get("plan_version") for m in read_metrics(lake, QUERY)}
    assert {o["version"] for o in deployed} <= versions  # the job ran every version deployed
    assert PlanRegistry(lake, QUERY).active_version() is not None
