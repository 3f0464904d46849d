"""The DAGs with real Airflow (SQLite home in a temp folder) and real Spark jobs through spark-submit.

One module-scoped setup (tiny TPC-DS workload, 1-minute periods, 5 s statistics cycles)
is shared by the tests in order: three consecutive `airflow dags test` runs (the third one
"no change": deploy skipped), a failing gate, the REST API's trigger form and a backfill with a
running scheduler, a rollback, and runs refused for unknown params. (The long scheduler test is not
last: pytest-xdist queues another module on a worker once its module has two tests left.) The streaming join job's lifecycle is in test_dags_join_job.py
(its own Airflow home and lake, so the two modules run on different test workers).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from mjoin.runtime import fsutil
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.model.timeutil import iso, parse_time

from airflow_helpers import api, dags_test, json_out, list_runs, services, task_states
from dags_world import CYCLE, PERIOD, PROJECT, QUERY, START, logical, make_world

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("dags"))


def outcome(world, k: int, namespace: str = "") -> dict | None:
    from mjoin.loop.config import LoopConfig, run_dir

    path = fsutil.join(run_dir(LoopConfig(lake=str(world["lake"]), namespace=namespace), QUERY, logical(k)), "outcome.json")
    return json.loads(fsutil.read_text(path)) if fsutil.exists(path) else None


DAG_FILES = ("mjoin_reoptimize.py", "mjoin_evaluate.py", "mjoin_join_job.py")
HEAVY = ("pandas", "pyspark", "statsmodels", "great_expectations", "numpy", "pyarrow", "duckdb", "sklearn", "matplotlib")
PARSE_SECONDS_MAX = 5.0  # per DAG file, beyond Airflow's own imports (generous: measured ~0.1-0.5 s)


def test_dag_files_parse_fast_without_heavy_imports():
    """Each DAG file is parsed in a fresh interpreter the way the dag-processor does (Airflow's SDK and the
    Spark provider already imported): its own time is bounded and it imports no heavy module."""
    code = ("import json, runpy, sys, time; t = time.perf_counter(); import airflow.sdk; "
            "from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator; "
            "framework = time.perf_counter() - t; t = time.perf_counter(); runpy.run_path(sys.argv[1]); "
            f"heavy = [m for m in {HEAVY!r} if m in sys.modules]; "
            "print(json.dumps({'framework': framework, 'file': time.perf_counter() - t, 'heavy': heavy}))")
    for name in DAG_FILES:
        proc = subprocess.run([sys.executable, "-c", code, f"dags/{name}"], capture_output=True, text=True, cwd=PROJECT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {got['file']:.3f} s (Airflow's own imports {got['framework']:.2f} s)")
        assert got["heavy"] == [], f"parsing {name} imported heavy modules: {got['heavy']}"
        assert got["file"] < PARSE_SECONDS_MAX, f"parsing {name} took {got['file']:.2f} s"


def test_no_import_errors(world):
    from mjoin.loop.airflow_env import airflow_cmd

    errors = json_out(airflow_cmd(["dags", "list-import-errors", "-o", "json"], world["env"], capture=True).stdout)
    assert errors == [], errors
    listed = {d["dag_id"] for d in json_out(airflow_cmd(["dags", "list", "-o", "json"], world["env"], capture=True).stdout)}
    assert {"mjoin_reoptimize", "mjoin_evaluate", "mjoin_join_job"} <= listed, listed


def stats_summary(world, k: int) -> dict:
    """The statistics job's own summary of run k's interval."""
    from mjoin.stats.history import RUNS_DIR, history_root, query_dir

    name = f"{int(parse_time(logical(k - 1)).timestamp())}-{int(parse_time(logical(k)).timestamp())}.json"
    return json.loads(fsutil.read_text(fsutil.join(query_dir(history_root(Lake(str(world["lake"]))), QUERY), RUNS_DIR, name)))


def test_three_consecutive_runs_leave_plans_with_lineage(world):
    """Runs 1-2 deploy when the plan is better; run 3 asks for a 99 % improvement through the gates
    param (the improvement_threshold param says 0 and loses): "no change", its deploy task skipped.
    In cycle mode `join` is one spark-submit that also computes the interval's statistics (collect_statistics is
    skipped), also with MJOIN_SPARK_REMOTE set (run 2, to a server that does not exist: nothing connects to it; the
    continuous mode's collect_statistics does, test_dags_join_job.py)."""
    from mjoin.loop.ui import read_outcomes

    env, conf = world["env"], world["conf"]
    for k in (1, 2, 3):
        extra = {"improvement_threshold": 0.0, "gates": {**conf["gates"], "improvement_threshold": 0.99}} if k == 3 else {}
        run_env = {**env, "MJOIN_SPARK_REMOTE": "sc://127.0.0.1:9"} if k == 2 else env
        proc = dags_test(run_env, "mjoin_reoptimize", logical(k), {**conf, **extra}, log=world["log"])
        out = outcome(world, k)
        assert out is not None, f"run {k} recorded no outcome (exit {proc.returncode}); see {world['log']}"
        assert out["status"] in ("deployed", "no_change"), (k, out)
        assert all(out["gates"][g] in ("passed", "no_change") for g in ("input", "stats", "forecast", "plan")), out
    reg = PlanRegistry(Lake(str(world["lake"])), QUERY)
    assert reg.active_version() is not None and reg.versions()
    assert outcome(world, 1)["status"] == "deployed"  # the first plan always deploys (nothing active)
    third = outcome(world, 3)
    assert (third["status"], third["threshold"], third["version"]) == ("no_change", 0.99, None), third
    assert third["active_version"] == reg.active_version()
    runs = {r["run_id"]: r["state"] for r in list_runs(env, "mjoin_reoptimize")}
    assert [runs[outcome(world, k)["run_id"]] for k in (1, 2, 3)] == ["success"] * 3  # no change is not a failure
    sessions = [stats_summary(world, k)["spark"]["session"] for k in (1, 2, 3)]
    assert sessions == ["classic", "classic", "classic"], sessions
    states = task_states(env, "mjoin_reoptimize", third["run_id"])
    assert states["deploy"] == "skipped" and states["await_switch"] == "skipped" and states["record"] == "success"
    assert states["join"] == "success" and states["collect_statistics"] == "skipped"
    assert third["mode"] == "cycle" and third["mode_reason"].startswith("mode auto: no streaming join job")
    assert "threshold 99.0%" in proc.stdout  # the skip message names the threshold actually used
    for v in reg.versions():
        lin = reg.lineage(v)
        assert lin["run"].startswith("manual__") and lin["interval"][1] in {logical(k) for k in (1, 2, 3)}
        assert fsutil.exists(lin["forecast"]) and all(fsutil.exists(p) for p in lin["gates"].values())
    # the join of each run used the plan active at that time (metrics carry the version)
    from mjoin.engine.metrics import read_metrics

    versions = [m.get("plan_version") for m in read_metrics(Lake(str(world["lake"])), QUERY)]
    assert versions and versions[0] is None and 1 in versions  # run 1: spec order; later runs: v1 or newer
    rows = read_outcomes(Lake(str(world["lake"])), QUERY)
    assert [r["interval_end"] for r in rows] == [logical(k) for k in (1, 2, 3)]


def test_unknown_gate_setting_fails_the_run_at_prepare_with_a_clear_message(world):
    """prepare fails on the bad param; record (a teardown) still writes the outcome, with the reason, where the
    run's outcome belongs (the plugin page lists it)."""
    from mjoin.loop.ui import registry_page

    when = iso(START + timedelta(seconds=4 * PERIOD - 30))
    proc = dags_test(world["env"], "mjoin_reoptimize", when, {**world["conf"], "gates": {"null_frac": 0.5}},
                     mark_success="^(join|collect_statistics)$", log=world["log"])
    assert "invalid params: unknown gate setting(s) null_frac; known: null_key_fraction_max" in proc.stdout
    run = next(r for r in list_runs(world["env"], "mjoin_reoptimize") if r["logical_date"].startswith(when[:19]))
    states = task_states(world["env"], "mjoin_reoptimize", run["run_id"])
    assert run["state"] == "failed" and states["prepare"] == "failed" and states["land"] == "upstream_failed"
    assert states["record"] == "success"
    from mjoin.loop.config import LoopConfig, interval_for, run_dir

    end = interval_for(when, PERIOD, CYCLE)[1]  # 00:03:30 snapped to the 5 s grid: itself
    out = json.loads(fsutil.read_text(fsutil.join(run_dir(LoopConfig(lake=str(world["lake"])), QUERY, end), "outcome.json")))
    assert (out["status"], out["run_id"], out["interval_end"]) == ("failed", run["run_id"], iso(end))
    assert out["reason"].startswith("invalid params: unknown gate setting(s) null_frac")
    assert out["reasons"] == {"prepare": out["reason"]} and "prepare" in out["failed_tasks"]
    assert "unknown gate setting(s) null_frac" in registry_page(Lake(str(world["lake"])))


def test_failing_gate_stops_before_deploy_and_keeps_the_active_plan(world):
    """Inject bad statistics for run 4's interval; the Spark jobs are marked success (not run)
    so the statistics gate reads exactly the injected history."""
    from mjoin.stats.history import history_root, write_cycle
    from mjoin.model.statistics import Statistics
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
    # record (a teardown) succeeded, yet the run is failed: the failed gate decides the run's state
    assert {r["run_id"]: r["state"] for r in list_runs(world["env"], "mjoin_reoptimize")}[out["run_id"]] == "failed"
    for later in ("forecast", "optimize", "check_plan", "deploy"):
        assert out["tasks"][later] == "upstream_failed", out["tasks"]
    gate = json.loads(Path(out and fsutil.join(str(Path(world["lake"]) / "reports" / QUERY / "runs"),
                                               parse_time(logical(4)).strftime("%Y%m%dT%H%M%SZ"), "gate_stats.json")).read_text())
    failed = {f["expectation"] for f in gate["failures"]}
    assert {"stats.gamma_in_unit_interval", "stats.kappa_non_negative"} <= failed, failed
    assert reg.active_version() == active_before and reg.versions() == versions_before


def test_live_scheduler_trigger_checks_and_sequential_backfill(world):
    """One scheduler session (api-server + scheduler + dag-processor) for all that needs one, at once:

    - live: a real-time TPC-DS replay lands into its own lake (the services' MJOIN_LAKE, what scheduled runs
      read with the defaults: 10 s cycles, default gates); mjoin_reoptimize was created unpaused (the embedded
      profile) and runs every minute with logical dates like ...:31.905813: at least 3 consecutive scheduled runs
      deploy or report no change;
    - the trigger form: params with types, limits and the spec choices; a query that is not a spec present,
      or an unknown param name, is a 400 and creates no run;
    - a backfill over 3 intervals created without --max-active-runs (Airflow's default would start 10 at once):
      its runs go in logical-date order, each joining with the plan the previous one left active; the first
      date already had a (failed) run and is re-run inside the backfill (--reprocess-behavior completed), in
      the evaluation namespace, without touching the live registry.
    """
    from mjoin.loop.airflow_env import airflow_cmd
    from mjoin.loop.ui import read_outcomes
    from mjoin.workloads.lander import land

    from airflow_helpers import LiveFeed, api_call

    env = world["env"]
    lake = Lake(str(world["lake"]))
    live = PlanRegistry(lake, QUERY)
    live_state = (live.versions(), live.active_version(), len(live.activations()))
    live_lake = Lake(str(world["root"] / "lake_live"))
    feed = LiveFeed(live_lake.root, world["root"] / "live_work", sf=0.01, cycle=10, chunk="10m", backlog="3m").start()
    try:
        # the embedded profile creates DAGs unpaused: no `dags unpause` here
        listed = json_out(airflow_cmd(["dags", "list", "-o", "json"], env, capture=True).stdout)
        assert str(next(d for d in listed if d["dag_id"] == "mjoin_reoptimize")["is_paused"]).lower() == "false"
        # history of the backfill's intervals 4-6 (4 already has a failed run from the gate test)
        land(world["workload"], lake, until=logical(6))
        assert next(r for r in list_runs(env, "mjoin_reoptimize") if r["logical_date"].startswith(logical(4)[:19]))
        # Create the backfill before the services start: on SQLite, creating it while the scheduler and the
        # dag-processor write failed with "database is locked" under load, although the embedded profile waits 60 s
        # for the lock (docs/orchestration.md, "Backfill and historical evaluation"); on PostgreSQL the order does
        # not matter.
        conf = {k: v for k, v in world["conf"].items() if k != "workload"}
        created = airflow_cmd(["backfill", "create", "--dag-id", "mjoin_reoptimize", "--from-date", logical(4),
                               "--to-date", logical(6), "--reprocess-behavior", "completed",
                               "--dag-run-conf", json.dumps(conf)], env, capture=True, check=False)
        assert created.returncode == 0 and created.stdout.count("Created backfill Dag run") == 3, created.stdout[-2000:]
        services_env = {**env, "MJOIN_LAKE": live_lake.root}
        with services(services_env, world["root"]) as (senv, port):
            params = api(port, "/api/v2/dags/mjoin_reoptimize/details", senv)["params"]
            assert params["strategy"]["schema"]["enum"] == ["fixed", "selectivity_first", "greedy", "dppick", "exact",
                                                              "dppick_query", "dppick_match", "exact_query", "exact_match"]
            # every spec in include/queries/, as the form offers them (the api-server's view of the DAG file)
            specs = sorted(f.stem for f in (Path(__file__).parents[1] / "include" / "queries").glob("*.yaml"))
            assert params["query"]["schema"]["enum"] == specs and "tpcds_returns_by_address" in specs
            assert params["length"]["schema"]["type"] == "integer" and params["length"]["schema"]["minimum"] == 2
            assert params["improvement_threshold"]["schema"]["maximum"] == 1
            assert params["improvement_threshold"]["value"] is None  # empty: GateConfig's default
            assert params["gates"]["schema"]["type"] == "object" and params["gates"]["value"] == {}
            assert params["mode"]["schema"]["enum"] == ["auto", "cycle", "continuous"]
            assert params["mode"]["value"] == "auto"
            # optional text params: null in the form (empty means the default), so the form submits without them
            for name in ("workload", "lake", "namespace", "initial_order", "interval_end"):
                assert params[name]["value"] is None and params[name]["schema"]["type"] == ["null", "string"], name
            assert params["dry_run"]["schema"]["type"] == "boolean" and params["dry_run"]["value"] is False
            assert params["cycle"]["value"] == 10 and params["landing_allowance"]["value"] == 30
            # PMJoin key groups: method and D, both with auto (the default)
            assert params["partition_method"]["schema"]["enum"] == ["auto", "none", "hash", "range", "rate", "cost"]
            assert params["partition_groups"]["schema"]["enum"] == ["auto", "1", "2", "4", "8", "16"]
            assert params["partition_method"]["value"] == params["partition_groups"]["value"] == "auto"
            # trigger-time validation, over HTTP
            runs_path = "/api/v2/dags/mjoin_reoptimize/dagRuns"
            before = api(port, runs_path, senv)["total_entries"]
            status, doc = api_call(port, runs_path, senv, "POST", {"logical_date": None, "conf": {"query": "nope"}})
            assert status == 400 and "query" in json.dumps(doc) and "nope" in json.dumps(doc), doc
            status, doc = api_call(port, runs_path, senv, "POST",
                                   {"logical_date": None, "conf": {"qurey": QUERY, "dry_run": True}})
            assert status == 400 and doc["detail"].startswith("unknown param(s) qurey for mjoin_reoptimize"), doc
            status, doc = api_call(port, "/api/v2/backfills/dry_run", senv, "POST",
                                   {"dag_id": "mjoin_reoptimize", "from_date": logical(1), "to_date": logical(2),
                                    "dag_run_conf": {"strategy": "exact", "treshold": 0.1}})
            assert status == 400 and "treshold" in doc["detail"], doc
            assert api(port, runs_path, senv)["total_entries"] == before  # nothing was created

            deadline = time.monotonic() + 900
            backfill, scheduled = [], []
            while time.monotonic() < deadline:
                # over the REST API: an `airflow dags list-runs` costs ~4 s of CPU, every 5 s on a 2-core machine
                runs = [{"run_id": r["dag_run_id"], "logical_date": r["logical_date"], "state": r["state"]}
                        for r in api(port, f"{runs_path}?limit=100", senv)["dag_runs"]]
                backfill = sorted((r for r in runs if r["logical_date"][:19] in {logical(k)[:19] for k in (4, 5, 6)}),
                                  key=lambda r: r["logical_date"])
                outcomes = [o for o in read_outcomes(live_lake, QUERY) if o["run_type"] == "scheduled"]
                while outcomes and outcomes[0]["status"] == "skipped":  # made before the feed's first cycle
                    outcomes.pop(0)
                scheduled = outcomes
                done = len(backfill) == 3 and all(r["state"] in ("success", "failed") for r in backfill)
                # an outcome is written by the run's last task (record), before the scheduler marks the run
                ended = {r["run_id"] for r in runs if r["state"] in ("success", "failed")}
                if done and (len(scheduled) >= 3 and {o["run_id"] for o in scheduled[:3]} <= ended
                             or any(o["status"] == "failed" and o["run_id"] in ended for o in scheduled)):
                    break
                time.sleep(5)
            airflow_cmd(["dags", "pause", "mjoin_reoptimize"], env, capture=True)
    finally:
        feed.stop()
    assert feed.error is None, feed.error
    # live: three consecutive scheduled runs with unaligned logical dates, each deployed or no change
    first3 = scheduled[:3]
    assert len(first3) == 3 and all(o["status"] in ("deployed", "no_change") for o in first3), \
        [(o["logical_date"], o["status"], o.get("reason")) for o in scheduled]
    for o in first3:
        at = parse_time(o["logical_date"])
        assert at.microsecond or at.second % 10, o["logical_date"]  # not on a cycle boundary
        assert parse_time(o["interval_end"]).timestamp() % 10 == 0 and o["gates"]["input"] == "passed"
    states = {r["run_id"]: r["state"] for r in list_runs(env, "mjoin_reoptimize")}
    assert [states[o["run_id"]] for o in first3] == ["success"] * 3
    assert PlanRegistry(live_lake, QUERY).active_version() is not None
    # backfill: all three in the evaluation namespace, in order, each after the previous one, with its plan
    ns = Lake(str(world["lake"]), "eval/backfill")
    assert [r["state"] for r in backfill] == ["success"] * 3, \
        {r["run_id"]: task_states(env, "mjoin_reoptimize", r["run_id"]) for r in backfill}
    outs = [outcome(world, k, namespace="eval/backfill") for k in (4, 5, 6)]
    assert all(o is not None and o["run_type"] == "backfill" and o["status"] in ("deployed", "no_change") for o in outs), outs
    assert outs[0]["run_id"].startswith("manual__")  # the date that already had a run: re-run inside the backfill
    contexts = [_context(ns, k) for k in (4, 5, 6)]
    for k in (1, 2):
        assert contexts[k]["prepared_at"] >= outs[k - 1]["recorded_at"]  # prepared after the previous one ended
        active = outs[k - 1]["active_version"]
        assert outs[k]["previous"] in (None, active) and active is not None
        assert _plan_arg(contexts[k]) == fsutil.join(PlanRegistry(ns, QUERY).root, f"v{active:06d}.json")
    ev = PlanRegistry(ns, QUERY)
    assert ev.versions() and all(ev.lineage(v)["run_type"] == "backfill" for v in ev.versions())
    assert (live.versions(), live.active_version(), len(live.activations())) == live_state
    # no look-ahead: every forecast used only cycles before its run's interval end
    for k in (4, 5, 6):
        folder = fsutil.join(ns.reports(QUERY), "runs", parse_time(logical(k)).strftime("%Y%m%dT%H%M%SZ"))
        fc = json.loads(fsutil.read_text(fsutil.join(folder, "forecast.json")))
        assert parse_time(fc["cycle_start"]) >= parse_time(logical(k))
        assert parse_time(fc["meta"]["last_cycle"]) < parse_time(logical(k))


def test_rollback_through_the_cli(world):
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.model.query import load_query

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


def test_unknown_param_name_fails_at_prepare_and_evaluate_refuses_an_empty_range(world):
    """Runs made without the API (dags test; the api-server refuses them with a 400, tested below) are checked
    by prepare: an unknown param name fails the run with the names, and the outcome says so. mjoin_evaluate over
    a range where nothing landed fails at its first task with a clear message, before any Spark job."""
    when = iso(START + timedelta(seconds=4 * PERIOD - 20))
    proc = dags_test(world["env"], "mjoin_reoptimize", when, {**world["conf"], "dryrun": True},
                     mark_success="^(join|collect_statistics)$", log=world["log"])
    assert "invalid params: unknown param(s) dryrun; known: query, strategy" in proc.stdout
    from mjoin.loop.config import LoopConfig, interval_for, run_dir

    end = interval_for(when, PERIOD, CYCLE)[1]
    out = json.loads(fsutil.read_text(fsutil.join(run_dir(LoopConfig(lake=str(world["lake"])), QUERY, end), "outcome.json")))
    assert out["status"] == "failed" and out["failed_tasks"][0] == "prepare"
    assert out["reason"].startswith("invalid params: unknown param(s) dryrun")
    ev = dags_test(world["env"], "mjoin_evaluate", "2026-03-01T00:00:00Z",
                   {"query": QUERY, "lake": str(world["lake"]), "start": "2026-03-01T00:00:00Z",
                    "end": "2026-03-01T00:10:00Z", "period": 60, "cycle": CYCLE}, log=world["log"])
    assert "no data to evaluate in [2026-03-01T00:00:00Z, 2026-03-01T00:10:00Z)" in ev.stdout
    run = next(r for r in list_runs(world["env"], "mjoin_evaluate") if r["logical_date"].startswith("2026-03-01"))
    states = task_states(world["env"], "mjoin_evaluate", run["run_id"])
    assert run["state"] == "failed" and states["arguments"] == "failed" and states["evaluate"] == "upstream_failed"


def _context(lake: Lake, k: int) -> dict:
    folder = fsutil.join(lake.reports(QUERY), "runs", parse_time(logical(k)).strftime("%Y%m%dT%H%M%SZ"))
    return json.loads(fsutil.read_text(fsutil.join(folder, "context.json")))


def _plan_arg(ctx: dict):
    args = ctx["join_args"]
    return args[args.index("--plan") + 1] if "--plan" in args else None
