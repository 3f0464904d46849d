"""A run's mode and coverage, outside Airflow (the real step functions on a real lake, real job control files):
``mode=auto`` follows the streaming join job, a run after a run that overran its period covers the cycles in
between, older ones are a gap in the outcome; a failed Spark task's reason is its error's own line."""
from __future__ import annotations

import json
import os

import pytest

from mjoin.engine.control import JobControl
from mjoin.lake.layout import Lake
from mjoin.loop.collect import prepare, resolve_mode
from mjoin.loop.config import LoopConfig, StepFailed, covered_until
from mjoin.loop.outcome import note_failure, one_line, record
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil

QUERY = "tpcds_returns_by_address"
LIVE0 = 1767225600  # 2026-01-01T00:00:00Z


def _land_cycles(lake: Lake, query, epochs):
    from test_gates_support import write_stream_file

    for e in epochs:
        for s in query.streams:
            write_stream_file(lake, query, s.name, int(e), 20, seed=int(e) % 1000, cycle=10)


def _cfg(lake: Lake, run_id: str, **extra) -> LoopConfig:
    return LoopConfig.from_params({"query": QUERY, "lake": lake.root, "period": 60, "cycle": 10, **extra},
                                  run_id=run_id, run_type="scheduled")


def _recorded(cfg: LoopConfig, at: str) -> dict:
    """A run over the interval ending at ``at`` that got as far as its outcome (prepare, then record)."""
    ctx = prepare(cfg, at)
    record(cfg.for_run(ctx), ctx, {"prepare": "success", "deploy": "skipped"}, dag_id="mjoin_reoptimize")
    return ctx


def test_mode_auto_is_continuous_while_the_streaming_job_runs(tmp_path, seed_query):
    """The job's claim and status as the engine writes them (JobControl): while a processingTime job holds the
    query, auto resolves to continuous; a cycle run's own join (availableNow) or no job is cycle; an explicit
    cycle while the streaming job runs fails at once with what to do instead."""
    lake = Lake(str(tmp_path / "lake"))
    control = JobControl(lake, QUERY)
    cfg = _cfg(lake, "scheduled__1")
    assert resolve_mode(cfg, seed_query)[0] == "cycle"
    claim = control.claim({"trigger": "availableNow"})
    control.write("running", **claim.info)
    assert resolve_mode(cfg, seed_query)[0] == "cycle"  # another cycle run's join: not the streaming job
    claim.release()
    claim = control.claim({"trigger": "processingTime"})
    try:
        control.write("running", **claim.info, last_batch_id=3)
        mode, why = resolve_mode(cfg, seed_query)
        assert mode == "continuous" and "the streaming join job of tpcds_returns_by_address runs" in why
        with pytest.raises(StepFailed, match="mode cycle, but the streaming join job .* use mode auto"):
            resolve_mode(_cfg(lake, "manual__2", mode="cycle"), seed_query)
        assert resolve_mode(_cfg(lake, "manual__3", mode="continuous"), seed_query)[0] == "continuous"
        # prepare records the resolved mode in the run's context; a step's config takes it from there
        _land_cycles(lake, seed_query, range(LIVE0, LIVE0 + 120, 10))
        ctx = prepare(cfg, iso(LIVE0 + 121.5))
        assert ctx["mode"] == "continuous" and "--stream" in ctx["join_args"]
        assert _cfg(lake, "scheduled__1").for_run(ctx).mode == "continuous"
    finally:
        control.write("stopped", **claim.info)
        claim.release()
    assert resolve_mode(_cfg(lake, "scheduled__4"), seed_query)[0] == "cycle"
    # backfills are always cycle mode, whatever runs live
    assert LoopConfig.from_params({"query": QUERY, "lake": lake.root}, run_type="backfill").mode == "cycle"


def test_a_run_after_a_run_that_overran_covers_the_cycles_in_between(tmp_path, seed_query):
    """Runs every minute; the run of 00:02 recorded, then none until 00:05 (the one in between overran its period,
    so Airflow made no run for 00:03 and 00:04): the 00:05 run covers [00:02, 00:05) and says so."""
    lake = Lake(str(tmp_path / "lake"))
    _land_cycles(lake, seed_query, range(LIVE0, LIVE0 + 330, 10))
    cfg = _cfg(lake, "scheduled__a")
    first = _recorded(cfg, iso(LIVE0 + 121.9))
    assert (first["start"], first["end"], first["coverage"]["caught_up_from"]) == (
        "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z", None)  # its own interval: the previous run is further back
    assert iso(covered_until(cfg, QUERY, iso(LIVE0 + 300))) == "2026-01-01T00:02:00Z"
    late = prepare(_cfg(lake, "scheduled__b"), iso(LIVE0 + 301.2))
    assert (late["start"], late["end"]) == ("2026-01-01T00:02:00Z", "2026-01-01T00:05:00Z")
    assert late["coverage"] == {"previous_end": "2026-01-01T00:02:00Z", "caught_up_from": "2026-01-01T00:04:00Z",
                                "gap": None}
    stats_from = late["stats_args"][late["stats_args"].index("--from") + 1]
    assert stats_from <= "2026-01-01T00:02:00Z"  # the statistics job covers the missed cycles too
    out = record(_cfg(lake, "scheduled__b").for_run(late), late, {"prepare": "success"}, dag_id="mjoin_reoptimize")
    assert (out["caught_up_from"], out["gap"], out["interval_start"]) == ("2026-01-01T00:04:00Z", None,
                                                                          "2026-01-01T00:02:00Z")


def test_cycles_beyond_the_catch_up_are_a_gap_in_the_outcome(tmp_path, seed_query):
    """Airflow stopped for 20 minutes while the feed landed: the next run covers at most ``catch_up`` before its end;
    the landed cycles before that are a gap, in its outcome and on the mjoin page. A pause with nothing landed is
    no gap."""
    from mjoin.loop.ui import registry_page

    lake = Lake(str(tmp_path / "lake"))
    _land_cycles(lake, seed_query, range(LIVE0, LIVE0 + 1500, 10))
    _recorded(_cfg(lake, "scheduled__a", catch_up=300), iso(LIVE0 + 120.3))
    cfg = _cfg(lake, "scheduled__b", catch_up=300)
    ctx = prepare(cfg, iso(LIVE0 + 1320.4))  # 00:22:00: covers [00:17, 00:22), the cycles [00:02, 00:17) are a gap
    assert (ctx["start"], ctx["coverage"]["gap"]["from"], ctx["coverage"]["gap"]["to"]) == (
        "2026-01-01T00:17:00Z", "2026-01-01T00:02:00Z", "2026-01-01T00:17:00Z")
    assert ctx["coverage"]["gap"]["cycles"] == 90
    out = record(cfg.for_run(ctx), ctx, {"prepare": "success"}, dag_id="mjoin_reoptimize")
    assert out["gap"]["cycles"] == 90 and "covered by no run" in out["gap"]["message"]
    page = registry_page(lake)
    assert "gap: 90 cycle(s) [2026-01-01T00:02:00Z, 2026-01-01T00:17:00Z) covered by no run" in page
    # nothing landed while nothing ran: no gap
    quiet = Lake(str(tmp_path / "quiet"))
    _land_cycles(quiet, seed_query, list(range(LIVE0, LIVE0 + 120, 10)) + list(range(LIVE0 + 1200, LIVE0 + 1330, 10)))
    _recorded(_cfg(quiet, "scheduled__c", catch_up=300), iso(LIVE0 + 120.3))
    ctx = prepare(_cfg(quiet, "scheduled__d", catch_up=300), iso(LIVE0 + 1320.4))
    assert ctx["coverage"]["gap"] is None and ctx["start"] == "2026-01-01T00:17:00Z"


SPARK_FAILURE = """Cannot execute: spark-submit --master local[*] --conf spark.sql.shuffle.partitions=4 --conf \
spark.ui.enabled=false --name mjoin-join --verbose /x/jobs/join.py --query tpcds_returns_by_address --lake /l \
--stream --trigger availableNow. Error code is: 2.
Last spark-submit output:
26/11/28 13:00:01 INFO SparkContext: Running Spark version 4.2.0
26/11/28 13:00:02 INFO ResourceUtils: ==============================================================
2026-11-28 13:00:05,000 INFO mjoin.engine.stream: starting the streaming query
error: the join job of tpcds_returns_by_address is already running (pid 5 on h since t, run r); stop it first \
(python -m mjoin job stop --query tpcds_returns_by_address --lake <lake>)
26/11/28 13:00:06 INFO ShutdownHookManager: Shutdown hook called
26/11/28 13:00:06 INFO ShutdownHookManager: Deleting directory /tmp/spark-1"""


def test_a_failed_spark_task_is_reported_by_its_own_error_with_the_whole_log_kept(tmp_path):
    """What the DAG's failure callback gets from a failed SparkSubmitOperator (the command, the exit code and the
    tail of spark-submit's output): the outcome's reason is the job's error line; the whole text is kept beside
    it, and the mjoin page links to it."""
    from mjoin.loop.ui import registry_page, report_target

    assert one_line(SPARK_FAILURE) == ("spark-submit exit 2: the join job of tpcds_returns_by_address is already "
                                       "running (pid 5 on h since t, run r); stop it first (python -m mjoin job stop "
                                       "--query tpcds_returns_by_address --lake <lake>)")
    traceback = ("Cannot execute: spark-submit x. Error code is: 1.\nLast spark-submit output:\nTraceback (most recent "
                 "call last):\n  File \"jobs/stats.py\", line 9, in <module>\nValueError: interval is not a whole "
                 "number of cycles\n26/11/28 INFO ShutdownHookManager: Shutdown hook called")
    assert one_line(traceback) == "spark-submit exit 1: ValueError: interval is not a whole number of cycles"
    assert one_line("Cannot execute: spark-submit x. Error code is: 137.").startswith("spark-submit exit 137: no error")
    assert one_line("input gate failed: a\nsecond line") == "input gate failed: a"
    lake = Lake(str(tmp_path / "lake"))
    cfg = LoopConfig.from_params({"query": QUERY, "lake": lake.root, "period": 60, "cycle": 10},
                                 run_id="scheduled__2026-01-01T00:05:31+00:00", run_type="scheduled")
    from mjoin.loop.config import fallback_context

    ctx = fallback_context(cfg, "2026-01-01T00:05:31Z")
    note_failure(ctx["run_dir"], "join", SPARK_FAILURE)
    out = record(cfg, ctx, {"prepare": "success", "join": "failed", "collect_statistics": "upstream_failed"},
                 dag_id="mjoin_reoptimize")
    assert out["reason"] == one_line(SPARK_FAILURE) and out["logs"] == {"join": "failed_join.log"}
    page = registry_page(lake)
    assert one_line(SPARK_FAILURE) in page.replace("&lt;", "<").replace("&gt;", ">")
    assert "ShutdownHookManager" not in page and "Running Spark version" not in page
    link = f"files/live/live/{QUERY}/runs/20260101T000530Z/failed_join.log"
    assert link in page
    assert "../dags/mjoin_reoptimize/runs/scheduled__2026-01-01T00%3A05%3A31%2B00%3A00/tasks/join" in page
    served = report_target(QUERY, "runs/20260101T000530Z/failed_join.log", lake)
    assert served and open(served).read() == SPARK_FAILURE
    assert json.loads(fsutil.read_text(os.path.join(ctx["run_dir"], "failed_join.json")))["log"] == "failed_join.log"


def test_the_statistics_gate_judges_every_cycle_of_a_run_that_caught_up(tmp_path, seed_query):
    """A run that caught up covers more than the L cycles the forecast reads: its statistics gate reads the whole
    interval (found by the loop's run-time benchmark: it read only the last L cycles and called the earlier ones
    of the interval missing)."""
    import pandas as pd

    from test_gates_support import T0, history
    from mjoin.loop.collect import check_statistics
    from mjoin.stats.history import history_root, write_cycle

    lake = Lake(str(tmp_path / "lake"))
    cfg = LoopConfig.from_params({"query": QUERY, "lake": lake.root, "period": 300, "cycle": 60, "length": 6},
                                 run_id="scheduled__c")
    rows = history(seed_query, 20, start=T0)
    for t, part in rows.groupby("cycle_start"):
        write_cycle(history_root(lake), QUERY, t, part.assign(cycle_start=pd.Timestamp(t)))
    folder = tmp_path / "run"
    folder.mkdir()
    ctx = {"query": QUERY, "start": T0, "end": iso(LIVE0 + 20 * 60), "run_dir": str(folder), "mode": "cycle"}
    assert check_statistics(cfg, ctx)["status"] == "passed"  # 20 cycles of a 6-cycle forecast window
