"""mjoin_reoptimize: keep a multi-way stream join's probe orders optimal as its data changes.

One run covers the whole statistics cycles of the period that just ended: [end - period, end) with
end the last cycle boundary at or before the logical date (scheduled runs get logical dates like
...:31.905813), judged once its last cycle is complete (landed, or `landing_allowance` after its end):

    prepare -> land -> check_input -> join_mode -> join (Spark: the join, then the statistics)
                                                -> collect_statistics (Spark, continuous mode)
      -> check_statistics -> forecast -> check_forecast -> optimize -> check_plan -> deploy -> await_switch -> record

In cycle mode `join` is one spark-submit that joins the interval and then computes its statistics in the same
driver (jobs/join_stats.py: one JVM and Spark start per run instead of two); `collect_statistics` (the statistics
alone) runs in continuous mode, where the streaming job joins.

A failed gate fails its task: the steps after it do not run and the active plan stays.
A plan that is not better than the active one skips `deploy` ("no change"), so does a
dry run. `mode=auto` (the default, so scheduled runs) is continuous while the streaming join
job of the query runs (mjoin_join_job), else cycle. In continuous mode `join` is skipped and
`await_switch` waits until the running job's batches run the new version (else rolls back
and fails); in cycle mode `await_switch` is skipped. Backfill runs always use cycle mode, in
the `eval/backfill` namespace. A run whose previous run ended before its interval (a run that
overran its period) also covers the cycles in between, up to an hour; older ones are a `gap`
in its outcome. `gates` overrides gate
thresholds for the run. `record` always runs and writes the run's outcome; it is a
teardown task, so the run's state is the steps' (a failed gate or switch fails the run,
"no change" and dry runs succeed); every run gets an outcome with the reason it failed, also one
that failed in `prepare` (each task's failure callback keeps its error in the run folder).
Unknown param names fail the run at `prepare` (the api-server already refuses them with a 400,
plugins/mjoin_trigger_checks.py). Backfill runs go in logical-date order: each waits (rescheduled,
holding no worker slot) until the run of the interval before it has finished, so it sees the plan
that run deployed.
`mjoin_demo` is the same DAG without a schedule, for `make demo`'s runs (their simulated clock is the
`interval_end` param), so they stay out of mjoin_reoptimize's history.
Logic lives in mjoin.loop (docs/orchestration.md); this file only wires it. The tasks import their
step modules when they run, not here: the scheduler parses this file often, and the steps import pandas,
pyarrow and scipy (tests/test_dags.py checks what parsing imports).
"""
from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import (Asset, AssetAlias, AssetOrTimeSchedule, AssetWatcher, DeltaTriggerTimetable, Param, dag,
                         get_current_context, task, teardown)
from airflow.sdk.exceptions import AirflowFailException, AirflowRescheduleException, AirflowSkipException

from mjoin.loop.assets import (ALIASES, GROUP, asset_name, asset_uri, drift_asset, drift_watch_settings,
                               events as asset_events)
from mjoin.loop.params import PERIOD_MINUTES, REOPTIMIZE_PARAMS, spark_conf, spark_env, spark_remote
from mjoin.runtime.resources import Resources

PLUGINS = Path(__file__).resolve().parent.parent / "plugins"
if str(PLUGINS) not in sys.path:  # the drift watcher's trigger lives with the plugins (the triggerer imports it)
    sys.path.append(str(PLUGINS))
from mjoin_drift_trigger import DriftTrigger  # noqa: E402

JOBS = Path(__file__).resolve().parent.parent / "jobs"
SPARK_CONF = spark_conf()
SPARK_ENV = spark_env()  # spark-submit on PATH however the Airflow worker was started
#: MJOIN_SPARK_REMOTE set: collect_statistics (continuous mode) connects to that warm Spark Connect server instead of
#: a fresh spark-submit (~10 s of start-up per run); `join` (the engine needs a SparkContext) stays a spark-submit
SPARK_REMOTE = spark_remote()


#: the default query's assets, read by the tasks that use them (inlets; a run's events go to its own query's
#: assets through the record task's aliases)
ASSETS = {k: Asset(name=asset_name(k, REOPTIMIZE_PARAMS["query"][0]), uri=asset_uri(k, REOPTIMIZE_PARAMS["query"][0]),
                   group=GROUP) for k in ALIASES}


def _schedule():
    """The period, or (unless MJOIN_DRIFT=off) the period OR a drift event of the default query's drift watcher
    (docs/orchestration.md, "Drift-triggered runs")."""
    period = DeltaTriggerTimetable(timedelta(minutes=PERIOD_MINUTES))
    watch = drift_watch_settings()
    if watch is None:
        return period
    query = REOPTIMIZE_PARAMS["query"][0]
    trigger = DriftTrigger(lake=Resources.from_env().lake, query=query, **watch)
    drift = Asset(**drift_asset(query), watchers=[AssetWatcher(name=f"mjoin_drift_{query}", trigger=trigger)])
    return AssetOrTimeSchedule(timetable=period, assets=drift)


def _params():
    return {name: Param(default, type=typ, description=doc, **extra)
            for name, (default, typ, extra, doc) in REOPTIMIZE_PARAMS.items()}


#: how long a backfill run waits for the run of the interval before it (e.g. a backfill created --run-backwards
#: with --max-active-runs 1 can never proceed: it fails with a message instead of waiting forever)
BACKFILL_WAIT = timedelta(hours=6)


def _logical_date(ctx):
    """The run's logical date; a manual run created without one (Airflow 3 allows it) counts from its trigger time
    (the ``interval_end`` param, when given, wins over either: mjoin.loop.config.LoopConfig.judged_at)."""
    return ctx.get("logical_date") or ctx["dag_run"].run_after


def _run_type(run) -> str:
    return str(getattr(run.run_type, "value", run.run_type))


def _run_params(ctx) -> dict:
    return dict(ctx["params"], period=PERIOD_MINUTES * 60)


def _config():
    from mjoin.loop.config import LoopConfig

    ctx = get_current_context()
    run = ctx["dag_run"]
    unknown = sorted(set(run.conf or {}) - set(REOPTIMIZE_PARAMS))
    if unknown:
        raise ValueError(f"unknown param(s) {', '.join(unknown)}; known: {', '.join(REOPTIMIZE_PARAMS)}")
    return LoopConfig.from_params(_run_params(ctx), run_id=run.run_id, run_type=_run_type(run))


def _step(fn, *args):
    """Run a step; map its outcomes onto Airflow states (failed gate -> failed, no change -> skipped).
    A step after ``prepare`` gets the run's context first, with the mode prepare resolved."""
    from mjoin.loop.config import NoChange, StepFailed

    try:
        cfg = _config()
    except ValueError as exc:  # bad params (unknown gate key, bad value): a clear message, no retry
        raise AirflowFailException(f"invalid params: {exc}")
    if args and isinstance(args[0], dict):
        cfg.for_run(args[0])
    try:
        return fn(cfg, *args)
    except NoChange as exc:
        raise AirflowSkipException(str(exc))
    except StepFailed as exc:
        raise AirflowFailException(str(exc))


def _await_previous_backfill_run(ctx) -> None:
    """A backfill run starts only once the run of the interval before it has finished (sequential by default,
    whatever the backfill's max_active_runs): until then it is rescheduled, holding no worker slot."""
    run, ti = ctx["dag_run"], ctx["ti"]
    if _run_type(run) != "backfill" or run.logical_date is None:
        return
    previous = run.logical_date - timedelta(minutes=PERIOD_MINUTES)
    if not ti.get_dr_count(dag_id=ti.dag_id, logical_dates=[previous], states=["queued", "running"]):
        return
    now = datetime.now(timezone.utc)
    first = ti.get_first_reschedule_date(ctx)
    if first is not None and now - first > BACKFILL_WAIT:
        raise AirflowFailException(f"the run of the previous interval ({previous.isoformat()}) did not finish within "
                                   f"{BACKFILL_WAIT}: backfills run in logical-date order (do not use --run-backwards)")
    print(f"waiting for the run of the previous interval ({previous.isoformat()}) to finish: backfills run in order")
    raise AirflowRescheduleException(now + timedelta(seconds=10))


def _note_failure(context) -> None:
    """on_failure_callback of every task: keep the task's error in the run folder, for the outcome's reasons."""
    from mjoin.loop import config, outcome

    ti = context["ti"]
    try:
        folder = ti.xcom_pull(task_ids="prepare", key="run_dir")
        if not folder:  # prepare itself failed: the folder prepare would have made
            run = context["dag_run"]
            cfg, _ = config.lenient_config(_run_params(context), run_id=run.run_id, run_type=_run_type(run))
            folder = config.fallback_context(cfg, _logical_date(context))["run_dir"]
        outcome.note_failure(folder, ti.task_id, str(context.get("exception") or "failed"))
    except Exception as exc:  # a callback must not hide the task's own error
        print(f"could not record the failure of {ti.task_id}: {exc}")


def reoptimize_dag(dag_id: str, schedule, description: str, tags: list[str]):
    """The re-optimization DAG: ``mjoin_reoptimize`` on its schedule, ``mjoin_demo`` (no schedule) for the demo."""

    @dag(
        dag_id=dag_id,
        description=description,
        schedule=schedule,
        start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        params=_params(),
        default_args={"retries": 0, "on_failure_callback": _note_failure},
        tags=tags,
        doc_md=__doc__,
    )
    def reoptimize():
        _tasks()

    return reoptimize()


def _tasks():
    @task(multiple_outputs=True)
    def prepare():
        from mjoin.loop import collect

        ctx = get_current_context()
        _await_previous_backfill_run(ctx)
        return _step(lambda cfg: collect.prepare(cfg, _logical_date(ctx)))

    @task
    def land(ctx: dict):
        from mjoin.loop import collect

        return _step(collect.land, ctx)

    @task(trigger_rule="none_failed")
    def check_input(ctx: dict):
        from mjoin.loop import collect

        return _step(collect.check_input, ctx)

    @task.branch
    def join_mode(ctx: dict):
        return "join" if ctx["mode"] == "cycle" else "collect_statistics"

    @task(trigger_rule="none_failed_min_one_success")  # after join (cycle mode) or collect_statistics (continuous)
    def check_statistics(ctx: dict):
        from mjoin.loop import collect

        return _step(collect.check_statistics, ctx)

    @task(inlets=[ASSETS["statistics"]])
    def forecast(ctx: dict):
        from mjoin.loop import replan

        return _step(replan.forecast, ctx)

    @task
    def check_forecast(ctx: dict):
        from mjoin.loop import replan

        return _step(replan.check_forecast, ctx)

    @task(inlets=[ASSETS["forecast"], ASSETS["active_plan"]])
    def optimize(ctx: dict):
        from mjoin.loop import replan

        return _step(replan.optimize, ctx)

    @task
    def check_plan(ctx: dict):
        from mjoin.loop import replan

        return _step(replan.check_plan, ctx)

    @task
    def deploy(ctx: dict, gate: dict):
        from mjoin.loop import deploy as deploying

        return _step(deploying.deploy, ctx, gate)

    @task
    def await_switch(ctx: dict, deployed: dict):
        from mjoin.loop import deploy as deploying

        return _step(deploying.await_switch, ctx, deployed)

    @task(task_id="collect_statistics")
    def collect_statistics_remote(args: list):
        """The statistics job (jobs/stats.py's arguments) in the session of the server MJOIN_SPARK_REMOTE."""
        from mjoin.cli import main

        rc = main(["stats", *args])
        if rc:
            raise AirflowFailException(f"the statistics job failed (exit {rc}); see the log above")

    @teardown  # runs whatever happened before; as a teardown it leaves the run's state to the steps
    @task(outlets=[AssetAlias(a) for a in ALIASES.values()])
    def record():
        """The run's outcome, also when prepare failed (its context is then rebuilt from the params); the asset
        events of what the run produced (mjoin.loop.assets)."""
        from mjoin.loop import config, outcome

        c = get_current_context()
        ti, run = c["ti"], c["dag_run"]
        states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
        states = {t: s for t, s in states.items() if t != ti.task_id}
        cfg, _ = config.lenient_config(_run_params(c), run_id=run.run_id, run_type=_run_type(run))
        ctx = ti.xcom_pull(task_ids="prepare") or config.fallback_context(cfg, _logical_date(c))
        out = outcome.record(cfg.for_run(ctx), ctx, states, dag_id=ti.dag_id)
        for e in asset_events(out):
            c["outlet_events"][AssetAlias(e["alias"])].add(Asset(name=e["name"], uri=e["uri"], group=e["group"]),
                                                          extra=e["extra"])
        return out

    ctx = prepare()
    landed = land(ctx)
    gate_in = check_input(ctx)
    mode = join_mode(ctx)
    join = SparkSubmitOperator(
        task_id="join", application=str(JOBS / "join_stats.py"), application_args=ctx["join_stats_args"],
        inlets=[ASSETS["active_plan"]],
        conn_id="spark_default", name="mjoin-join", conf=SPARK_CONF, env_vars=SPARK_ENV, verbose=False)
    if SPARK_REMOTE:
        stats = collect_statistics_remote(ctx["stats_args"])
    else:
        stats = SparkSubmitOperator(
            task_id="collect_statistics", application=str(JOBS / "stats.py"), application_args=ctx["stats_args"],
            conn_id="spark_default", name="mjoin-stats", conf=SPARK_CONF, env_vars=SPARK_ENV, verbose=False)
    gate_stats = check_statistics(ctx)
    fc = forecast(ctx)
    gate_fc = check_forecast(ctx)
    cand = optimize(ctx)
    gate_plan = check_plan(ctx)
    deployed = deploy(ctx, gate_plan)
    switched = await_switch(ctx, deployed)
    done = record()

    landed >> gate_in >> mode >> [join, stats]
    [join, stats] >> gate_stats
    gate_stats >> fc >> gate_fc >> cand >> gate_plan >> deployed >> switched >> done


reoptimize_dag("mjoin_reoptimize", _schedule(),
               "statistics -> forecast -> optimize -> gate -> redeploy the multi-way join plan", ["mjoin"])
reoptimize_dag("mjoin_demo", None, "make demo's re-optimization runs (mjoin_reoptimize's tasks, no schedule), kept "
               "out of mjoin_reoptimize's history", ["mjoin", "demo"])
