"""Airflow on the native cluster: a real scheduler (api-server, scheduler, dag-processor, LocalExecutor) whose
metadata database is the cluster's PostgreSQL, its Spark jobs submitted to the standalone master.

A live TPC-DS feed lands into the lake; mjoin_reoptimize (created unpaused, every minute) runs on its
schedule for several periods, each deploying a plan or reporting no change, its join and statistics
jobs on the cluster; mjoin_evaluate, triggered over the REST API, costs the strategies on the feed's
history. Reuses tests/airflow_helpers.py (the project's Airflow environment, the services, the feed).
"""
from __future__ import annotations

import json
import os
import time

import pytest

from airflow_helpers import LiveFeed, api, list_runs, make_env, services, task_states
from cluster_helpers import cluster_dir, job_env, require_cluster
from mjoin.runtime import cluster
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.model.timeutil import iso

pytestmark = [pytest.mark.cluster, pytest.mark.airflow, pytest.mark.slow]
QUERY = "tpcds_returns_by_address"
PERIODS = 2  # consecutive scheduled runs that must deploy or report no change


@pytest.fixture
def pg_airflow(tmp_path, monkeypatch):
    """A fresh Airflow metadata database on the cluster's PostgreSQL, and the cluster profile's env."""
    require_cluster(postgres=True)
    name = f"mjoin_test_{os.getpid()}"
    url = cluster.create_database(cluster_dir(), name)
    # created paused, unpaused once the api-server answers (a task started before it is killed by its supervisor)
    for k, v in job_env({"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
                         "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True"}).items():
        monkeypatch.setenv(k, v)
    yield url
    cluster.drop_database(cluster_dir(), name)


def test_scheduler_on_postgres_runs_reoptimize_for_several_periods_and_evaluate(pg_airflow, tmp_path):
    from mjoin.loop.airflow_env import airflow_cmd
    from mjoin.loop.ui import read_outcomes

    t0 = time.time()
    lake = Lake(str(tmp_path / "lake"))
    env = make_env(tmp_path / "airflow", lake.root, period_minutes=1)  # `airflow db migrate` on PostgreSQL
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    airflow_cmd(["dags", "reserialize"], env, capture=True)
    feed = LiveFeed(lake.root, tmp_path / "live_work", sf=0.01, cycle=10, chunk="10m", backlog="3m").start()
    scheduled, evaluation = [], None
    try:
        with services(env, tmp_path) as (senv, port):
            for dag in ("mjoin_reoptimize", "mjoin_evaluate"):
                airflow_cmd(["dags", "unpause", dag], env, capture=True)
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline:
                outcomes = [o for o in read_outcomes(lake, QUERY) if o["run_type"] == "scheduled"]
                while outcomes and outcomes[0]["status"] == "skipped":  # made before the feed's first cycle
                    outcomes.pop(0)
                scheduled = outcomes
                if len(scheduled) >= PERIODS or any(o["status"] == "failed" for o in scheduled):
                    break
                time.sleep(5)
            airflow_cmd(["dags", "pause", "mjoin_reoptimize"], env, capture=True)
            # then the evaluation of the feed's history, alone on the cluster (a job at once on 2 cores)
            first = min(a for s in ("customer", "store_returns") for a in lake.arrivals(s))
            start = (first // 60 + 1) * 60
            conf = {"query": QUERY, "lake": lake.root, "start": iso(start), "end": iso(start + 120), "period": 60,
                    "cycle": 10, "length": 6, "strategies": ["fixed", "exact"]}
            run = api(port, "/api/v2/dags/mjoin_evaluate/dagRuns", senv, "POST", {"logical_date": None, "conf": conf})
            deadline = time.monotonic() + 600
            while evaluation not in ("success", "failed") and time.monotonic() < deadline:
                time.sleep(5)
                evaluation = api(port, f"/api/v2/dags/mjoin_evaluate/dagRuns/{run['dag_run_id']}", senv)["state"]
    finally:
        feed.stop()
    assert feed.error is None, feed.error
    got = scheduled[:PERIODS]
    assert len(got) == PERIODS and all(o["status"] in ("deployed", "no_change") for o in got), \
        [(o["logical_date"], o["status"], o.get("reason")) for o in scheduled]
    states = {r["run_id"]: r for r in list_runs(env, "mjoin_reoptimize")}
    for o in got:
        assert states[o["run_id"]]["state"] == "success"
        ts = task_states(env, "mjoin_reoptimize", o["run_id"])
        assert ts["join"] == "success" and ts["collect_statistics"] == "skipped", ts  # cycle mode: one submit
    ends = [o["interval_end"] for o in got]
    assert len(set(ends)) == PERIODS  # consecutive periods, not one period twice
    assert PlanRegistry(lake, QUERY).active_version() is not None
    # the Spark jobs ran on the standalone master, not in local mode
    doc = cluster.master_json(cluster.load(cluster_dir())) or {}
    apps = [a for a in doc.get("completedapps", []) + doc.get("activeapps", []) if a.get("starttime", 0) >= t0 * 1000]
    assert len(apps) >= PERIODS + 1, [a.get("name") for a in apps]  # per run the join then its statistics, the evaluation
    assert evaluation == "success", task_states(env, "mjoin_evaluate", run["dag_run_id"])
    summary = json.loads(open(os.path.join(Lake(lake.root, "eval/evaluate").reports(QUERY), "evaluation",
                                           "summary.json")).read())
    assert {r["strategy"] for r in summary["summary"]} >= {"fixed", "exact"}, summary["summary"]
