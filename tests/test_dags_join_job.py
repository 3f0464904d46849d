"""The streaming join job's lifecycle through mjoin_join_job, with real Airflow (`airflow dags test`) and a real
spark-submit, and a continuous-mode mjoin_reoptimize run while the job runs. The same setup as test_dags.py
(dags_world.py) in its own Airflow home and lake."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from mjoin.runtime import fsutil
from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso

from airflow_helpers import dags_test, list_runs, task_states
from dags_world import CYCLE, PERIOD, QUERY, START, logical, make_world

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("dags_join_job"))


class Lander(threading.Thread):
    """Lands the workload's arrival cycles following the simulated clock, until stopped (a live feed)."""

    class Stop(Exception):
        pass

    def __init__(self, workload, lake, since: str, until: str, speed: float):
        super().__init__(name="lander", daemon=True)
        self.args = (workload, lake, since, until, speed)
        self.halt = threading.Event()
        self.error = None

    def _sleep(self, seconds: float) -> None:
        if self.halt.wait(seconds):
            raise Lander.Stop()

    def run(self):
        from mjoin.workloads.lander import land

        workload, lake, since, until, speed = self.args
        try:
            land(workload, Lake(str(lake)), until=until, since=since, speed=speed, sleep=self._sleep)
        except Lander.Stop:
            pass
        except Exception as exc:  # reported by the test
            self.error = exc

    def stop(self):
        self.halt.set()
        self.join(timeout=60)


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
