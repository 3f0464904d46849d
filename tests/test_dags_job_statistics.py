"""Continuous mode with the real Airflow scheduler (api-server, scheduler, dag-processor) and a real streaming join
job computing its own statistics: mjoin_reoptimize's statistics step uses the cycles the job emitted (no stream
read), and when the job is stopped it falls back to the statistics job (Spark) and the run's outcome says so. The
same tiny TPC-DS setup as test_dags.py (dags_world.py), in its own Airflow home and lake."""
from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from airflow_helpers import api, services
from dags_world import CYCLE, PERIOD, QUERY, START, Lander, make_world
from engine_helpers import start_job
from mjoin.engine.control import JobControl
from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso, parse_time, to_epoch
from mjoin.runtime import fsutil
from mjoin.stats import history

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


def _run(port, env, lake, logical_date, conf) -> dict:
    """Trigger mjoin_reoptimize for ``logical_date`` through the REST API and wait for its outcome."""
    runs = "/api/v2/dags/mjoin_reoptimize/dagRuns"
    run = api(port, runs, env, "POST", {"logical_date": iso(logical_date), "conf": conf})
    folder = fsutil.join(Lake(str(lake)).reports(QUERY), "runs", logical_date.strftime("%Y%m%dT%H%M%SZ"))
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        state = api(port, f"{runs}/{run['dag_run_id']}", env)["state"]
        if state in ("success", "failed") and fsutil.exists(fsutil.join(folder, "outcome.json")):
            out = json.loads(fsutil.read_text(fsutil.join(folder, "outcome.json")))
            out["_folder"] = folder
            return out
        time.sleep(3)
    raise AssertionError(f"run {run['dag_run_id']} did not finish")


def test_continuous_runs_use_the_job_statistics_and_fall_back_when_it_is_stopped(tmp_path):
    from mjoin.engine.state import StateStore
    from mjoin.workloads.lander import land
    from mjoin.workloads.tpcds_replay import generate_tpcds

    world = make_world(tmp_path)
    workload = world["root"] / "workload_long"  # long enough to feed the lake past the job's stop
    generate_tpcds(workload, sf=0.01, duration="30m", cycle=CYCLE, start=iso(START))
    lake = Lake(str(world["root"] / "lake_continuous"))
    t_run = START + timedelta(seconds=3 * PERIOD)
    land(workload, lake, until=iso(t_run))
    control = JobControl(lake, QUERY)
    log = world["root"] / "join_job.log"
    job = start_job(lake, log, "--stream", "--query", QUERY, "--trigger", "processingTime", "--interval", "2",
                    "--buckets", "4", "--stats-cycle", str(CYCLE), spark_submit=False)
    lander = Lander(workload, lake.root, since=iso(t_run), until=iso(START + timedelta(minutes=30)), speed=1.0)
    conf = {"query": QUERY, "lake": lake.root, "cycle": CYCLE, "strategy": "exact", "mode": "continuous",
            "dry_run": True, "gates": {**world["conf"]["gates"], "min_history": 5}}
    try:
        assert control.wait_running(timeout=300, poll=2)["running"], log.read_text()[-3000:]
        lander.start()
        with services(world["env"], world["root"]) as (env, port):
            out = _run(port, env, lake.root, t_run, conf)
            assert out["statistics"]["source"] == "job", (out, log.read_text()[-2000:])
            assert out["statistics"]["cycles"] == PERIOD // CYCLE and "fallback" not in out["statistics"]
            assert out["tasks"]["collect_statistics"] == "success" and out["status"] in ("dry_run", "no_change"), out
            h = history.read_history(history.history_root(lake), QUERY, start=t_run - timedelta(seconds=PERIOD),
                                     end=t_run, meta=True)
            assert {m["source"] for m in h.attrs["cycles"].values()} == {"job"}
            assert out["gates"]["stats"] == "passed"

            control.request_stop(by="test", reason="fallback")
            assert not control.wait_stopped(180)["running"]
            # the first whole period after the last cycle the job emitted: the job emitted none of it
            emitted_to = StateStore(lake.state(QUERY)).latest()["jobstats"]["next"] * CYCLE
            t_next = parse_time((emitted_to // PERIOD + 2) * PERIOD)
            while lander.is_alive() and not _landed(lake, t_next + timedelta(seconds=CYCLE)):
                time.sleep(2)
            assert _landed(lake, t_next + timedelta(seconds=CYCLE))
            out = _run(port, env, lake.root, t_next, conf)
            assert out["statistics"]["source"] == "standalone", out
            assert "the join job is not running" in out["statistics"]["fallback"]
            assert out["tasks"]["collect_statistics"] == "success" and out["gates"]["stats"] == "passed", out
            h = history.read_history(history.history_root(lake), QUERY, start=t_next - timedelta(seconds=PERIOD),
                                     end=t_next, meta=True)
            assert len(h.attrs["cycles"]) == PERIOD // CYCLE
            assert {m["source"] for m in h.attrs["cycles"].values()} == {"standalone"}
    finally:
        lander.stop()
        if job.poll() is None:
            control.request_stop(by="test", reason="teardown")
            try:
                job.wait(180)
            except Exception:
                job.kill()
    assert lander.error is None, lander.error


def _landed(lake: Lake, until) -> bool:
    from mjoin.model.query import load_query

    q = load_query(QUERY)
    return all((lake.arrivals(s.source) or [0])[-1] >= to_epoch(until) - CYCLE for s in q.streams)
