"""The DAGs with real Airflow (SQLite home in a temp folder) and real Spark jobs through spark-submit.

One module-scoped setup (tiny TPC-DS workload, 1-minute periods, 5 s statistics cycles)
is shared by the tests in order: three consecutive `airflow dags test` runs, a failing
gate, a rollback, then the REST API's trigger form and a backfill with a running scheduler.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from mjoin import fsutil
from mjoin.lake import Lake
from mjoin.registry import PlanRegistry
from mjoin.timeutil import iso, parse_time

from airflow_helpers import api, dags_test, json_out, list_runs, make_env, services, task_states

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parent.parent
QUERY = "tpcds_returns_by_address"
START = parse_time("2026-01-01T00:00:00Z")
PERIOD = 60  # seconds (MJOIN_PERIOD_MINUTES=1)
CYCLE = 5


def logical(k: int) -> str:
    return iso(START + timedelta(seconds=k * PERIOD))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from mjoin.workloads import generate_tpcds

    root = tmp_path_factory.mktemp("dags")
    workload = root / "workload"
    generate_tpcds(workload, sf=0.01, duration=f"{8 * PERIOD}s", cycle=CYCLE, start=iso(START))
    lake = root / "lake"
    env = make_env(root / "airflow", lake, period_minutes=PERIOD // 60)
    conf = {"query": QUERY, "lake": str(lake), "workload": str(workload), "cycle": CYCLE, "strategy": "exact"}
    from mjoin.airflow_env import airflow_cmd

    airflow_cmd(["dags", "reserialize"], env, capture=True)  # parse dags/ into the metadata DB
    return {"root": root, "workload": workload, "lake": lake, "env": env, "conf": conf, "log": root / "airflow.log"}


def outcome(world, k: int, namespace: str = "") -> dict | None:
    from mjoin.reoptimize import LoopConfig, run_dir

    path = fsutil.join(run_dir(LoopConfig(lake=str(world["lake"]), namespace=namespace), QUERY, logical(k)), "outcome.json")
    return json.loads(fsutil.read_text(path)) if fsutil.exists(path) else None


def test_dag_files_parse_without_errors_or_heavy_imports():
    code = ("import sys, time, runpy; t = time.perf_counter(); "
            "runpy.run_path('dags/mjoin_reoptimize.py'); runpy.run_path('dags/mjoin_evaluate.py'); "
            "heavy = [m for m in ('pandas', 'pyspark', 'statsmodels', 'great_expectations', 'numpy', 'pyarrow', "
            "'duckdb', 'sklearn', 'matplotlib') if m in sys.modules]; "
            "print(round(time.perf_counter() - t, 3), ','.join(heavy))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT, check=True)
    seconds, _, heavy = proc.stdout.strip().splitlines()[-1].partition(" ")
    print(f"parsing both DAG files took {seconds} s")  # measured and reported; Airflow's own imports dominate
    assert heavy == "", f"parsing the DAGs imported heavy modules: {heavy}"


def test_no_import_errors(world):
    from mjoin.airflow_env import airflow_cmd

    errors = json_out(airflow_cmd(["dags", "list-import-errors", "-o", "json"], world["env"], capture=True).stdout)
    assert errors == [], errors
    listed = {d["dag_id"] for d in json_out(airflow_cmd(["dags", "list", "-o", "json"], world["env"], capture=True).stdout)}
    assert {"mjoin_reoptimize", "mjoin_evaluate"} <= listed, listed


def test_three_consecutive_runs_leave_plans_with_lineage(world):
    env, conf = world["env"], world["conf"]
    for k in (1, 2, 3):
        proc = dags_test(env, "mjoin_reoptimize", logical(k), conf, log=world["log"])
        out = outcome(world, k)
        assert out is not None, f"run {k} recorded no outcome (exit {proc.returncode}); see {world['log']}"
        assert out["status"] in ("deployed", "no_change"), (k, out)
        assert all(out["gates"][g] in ("passed", "no_change") for g in ("input", "stats", "forecast", "plan")), out
    reg = PlanRegistry(Lake(str(world["lake"])), QUERY)
    assert reg.active_version() is not None and reg.versions()
    assert outcome(world, 1)["status"] == "deployed"  # the first plan always deploys (nothing active)
    for v in reg.versions():
        lin = reg.lineage(v)
        assert lin["run"].startswith("manual__") and lin["interval"][1] in {logical(k) for k in (1, 2, 3)}
        assert fsutil.exists(lin["forecast"]) and all(fsutil.exists(p) for p in lin["gates"].values())
    # the join of each run used the plan active at that time (metrics carry the version)
    from mjoin.engine import read_metrics

    versions = [m.get("plan_version") for m in read_metrics(Lake(str(world["lake"])), QUERY)]
    assert versions and versions[0] is None and 1 in versions  # run 1: spec order; later runs: v1 or newer
    log = Lake(str(world["lake"])).reports(QUERY) + "/outcomes.jsonl"
    assert len(Path(log).read_text().splitlines()) == 3


def test_failing_gate_stops_before_deploy_and_keeps_the_active_plan(world):
    """Inject bad statistics for run 4's interval; the Spark jobs are marked success (not run)
    so the statistics gate reads exactly the injected history."""
    from mjoin.stats.history import history_root, write_cycle
    from mjoin.statistics import Statistics
    from mjoin.stats.history import read_history, snapshot

    lake = Lake(str(world["lake"]))
    reg = PlanRegistry(lake, QUERY)
    active_before, versions_before = reg.active_version(), reg.versions()
    root = history_root(lake)
    template = snapshot(read_history(root, QUERY), iso(START + timedelta(seconds=2 * PERIOD)))
    for j in range(PERIOD // CYCLE):
        t = START + timedelta(seconds=3 * PERIOD + j * CYCLE)
        st = Statistics.from_json(template.to_json())
        st.cycle_start = iso(t)
        st.groups[0].edges[("cu", "sr")].gamma = 1.7  # impossible: a match rate above 1
        st.groups[0].streams["wr"].kappa = -3.0
        import pandas as pd

        write_cycle(root, QUERY, t, pd.DataFrame(st.to_rows()).assign(cycle_start=pd.Timestamp(t)))
    dags_test(world["env"], "mjoin_reoptimize", logical(4), world["conf"], mark_success="^(join|collect_statistics)$",
              log=world["log"])
    out = outcome(world, 4)
    assert out["status"] == "failed" and "check_statistics" in out["failed_tasks"]
    for later in ("forecast", "optimize", "check_plan", "deploy"):
        assert out["tasks"][later] == "upstream_failed", out["tasks"]
    gate = json.loads(Path(out and fsutil.join(str(Path(world["lake"]) / "reports" / QUERY / "runs"),
                                               parse_time(logical(4)).strftime("%Y%m%dT%H%M%SZ"), "gate_stats.json")).read_text())
    failed = {f["expectation"] for f in gate["failures"]}
    assert {"stats.gamma_in_unit_interval", "stats.kappa_non_negative"} <= failed, failed
    assert reg.active_version() == active_before and reg.versions() == versions_before


def test_rollback_through_the_cli(world):
    from mjoin.plan import make_plan, orders_from_permutation
    from mjoin.query import load_query

    q = load_query(QUERY)
    lake = Lake(str(world["lake"]))
    reg = PlanRegistry(lake, QUERY)
    before = reg.active_version()
    plan_file = world["root"] / "manual_plan.json"
    make_plan(q, orders_from_permutation(q, ["cr", "wr", "sr", "cu"]), "fixed").save(plan_file)
    cli = [sys.executable, "-m", "mjoin", "plans"]
    common = ["--query", QUERY, "--lake", str(world["lake"])]
    subprocess.run(cli + ["publish", *common, "--plan", str(plan_file), "--activate"], check=True, capture_output=True)
    assert reg.active_version() == reg.versions()[-1] != before
    done = subprocess.run(cli + ["rollback", *common], check=True, capture_output=True, text=True)
    assert f"back to v{before}" in done.stdout
    assert reg.active_version() == before


def test_trigger_form_and_backfill_with_a_running_scheduler(world):
    """The REST API shows the params with types and limits; a backfill over three past intervals
    completes with a running scheduler, in the evaluation namespace, without touching the live registry."""
    from mjoin.airflow_env import airflow_cmd

    lake = Lake(str(world["lake"]))
    live = PlanRegistry(lake, QUERY)
    live_state = (live.versions(), live.active_version(), len(live.activations()))
    env = world["env"]
    # history: the data of intervals 5-7 is in the lake (the dags-test runs used 1-4, and a backfill
    # does not reprocess logical dates that already have runs)
    from mjoin.workloads import land

    land(world["workload"], Lake(str(world["lake"])), until=logical(7))
    # Create the backfill before the services start: SQLite allows one writer at a time, and the
    # scheduler and dag-processor write constantly (on PostgreSQL this order does not matter).
    airflow_cmd(["dags", "unpause", "mjoin_reoptimize"], env, capture=True)
    conf = {k: v for k, v in world["conf"].items() if k != "workload"}
    created = airflow_cmd(["backfill", "create", "--dag-id", "mjoin_reoptimize", "--from-date", logical(5),
                           "--to-date", logical(7), "--max-active-runs", "1", "--dag-run-conf", json.dumps(conf)],
                          env, capture=True, check=False)
    assert created.returncode == 0 and created.stdout.count("Created backfill Dag run") == 3, created.stdout[-2000:]
    with services(env, world["root"]) as (env, port):
        details = api(port, "/api/v2/dags/mjoin_reoptimize/details", env)
        params = details["params"]
        assert params["strategy"]["schema"]["enum"] == ["fixed", "selectivity_first", "greedy", "dppick", "exact",
                                                          "dppick_query", "dppick_match"]
        assert params["length"]["schema"]["type"] == "integer" and params["length"]["schema"]["minimum"] == 2
        assert params["improvement_threshold"]["schema"]["maximum"] == 1
        assert params["dry_run"]["schema"]["type"] == "boolean" and params["dry_run"]["value"] is False
        assert params["cycle"]["value"] == 10 and params["query"]["value"] == QUERY

        deadline = time.monotonic() + 600
        runs = []
        while time.monotonic() < deadline:
            runs = [r for r in list_runs(env, "mjoin_reoptimize") if r["run_id"].startswith("backfill__")]
            if len(runs) == 3 and all(r["state"] in ("success", "failed") for r in runs):
                break
            time.sleep(5)
        airflow_cmd(["dags", "pause", "mjoin_reoptimize"], env, capture=True)
    assert len(runs) == 3 and all(r["state"] == "success" for r in runs), \
        {r["run_id"]: task_states(world["env"], "mjoin_reoptimize", r["run_id"]) for r in runs}
    for k in (5, 6, 7):
        out = outcome(world, k, namespace="eval/backfill")
        assert out is not None and out["run_type"] == "backfill" and out["status"] in ("deployed", "no_change"), out
    ev = PlanRegistry(Lake(str(world["lake"]), "eval/backfill"), QUERY)
    assert ev.versions() and all(ev.lineage(v)["run_type"] == "backfill" for v in ev.versions())
    assert (live.versions(), live.active_version(), len(live.activations())) == live_state
    # no look-ahead: every forecast used only cycles before its run's interval end
    for k in (5, 6, 7):
        folder = fsutil.join(Lake(str(world["lake"]), "eval/backfill").reports(QUERY), "runs",
                             parse_time(logical(k)).strftime("%Y%m%dT%H%M%SZ"))
        fc = json.loads(fsutil.read_text(fsutil.join(folder, "forecast.json")))
        assert parse_time(fc["cycle_start"]) >= parse_time(logical(k))
        assert parse_time(fc["meta"]["last_cycle"]) < parse_time(logical(k))
