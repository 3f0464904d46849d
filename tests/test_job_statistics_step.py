"""The statistics step of a continuous-mode run (pure: no Spark): it uses the cycles the join job emitted when the
history holds all of them and they validate, waits while a running job catches up, and otherwise says why not
(the step then runs the statistics job); the run's arguments ask for it in continuous mode only, and the outcome
reports where the statistics came from. The job's emission plan: which cycles a batch counts, and its purge
bound."""
from __future__ import annotations

import json

import pytest

from mjoin.lake.layout import Lake
from mjoin.loop.collect import stats_args
from mjoin.loop.config import STATISTICS_REPORT, LoopConfig, statistics_source
from mjoin.model.query import load_query, parse_query
from mjoin.runtime import fsutil
from mjoin.stats import kernel
from mjoin.stats.emitted import JobStatistics, final_end, use_job_statistics
from mjoin.stats.job import write_run
from mjoin.stats.sources import US
from test_stats_helpers import T0

TAU = 10
J0 = T0 // TAU


@pytest.fixture
def query():
    return load_query("tpcds_returns_by_address")


def _emit(lake, query, lo, hi, **meta):
    """Cycles lo .. hi - 1 in the history as the job writes them (no rows counted: zeros, complete)."""
    job = JobStatistics(query, lake, TAU, key_buckets=0, key_ranges=0)
    run, grid = job.assemble(kernel.OUT_SCHEMA.empty_table(), lo, hi, 1, {}, None, {"batch_id": 1})
    for m in run.cycle_meta.values():
        m.update(meta)
    write_run(job.root, query, grid, run)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_the_emitted_cycles_are_used_when_all_are_there_and_valid(tmp_path, query):
    lake = Lake(str(tmp_path / "lake"))
    _emit(lake, query, J0, J0 + 6)
    got = use_job_statistics(query, lake, T0, T0 + 6 * TAU, TAU, running=lambda: True)
    assert got["source"] == "job" and got["cycles"] == got["from_job"] == 6 and not got["missing"]


def test_a_running_job_is_waited_for_a_stopped_one_is_not(tmp_path, query):
    lake = Lake(str(tmp_path / "lake"))
    _emit(lake, query, J0, J0 + 4)
    clock = Clock()
    lagging = use_job_statistics(query, lake, T0, T0 + 6 * TAU, TAU, running=lambda: True, wait=20, clock=clock,
                                 sleep=clock.sleep)
    assert lagging["source"] is None and "lagging" in lagging["fallback"] and "4 of the 6" in lagging["fallback"]
    assert clock.t >= 20
    stopped = use_job_statistics(query, lake, T0, T0 + 6 * TAU, TAU, running=lambda: False, wait=20)
    assert stopped["source"] is None and stopped["fallback"].startswith("the join job is not running")
    assert stopped["waited_seconds"] < 5
    calls = []

    def catching_up():  # the job emits the last two cycles while the step waits
        calls.append(1)
        if len(calls) == 2:
            _emit(lake, query, J0 + 4, J0 + 6)
        return True

    clock = Clock()
    got = use_job_statistics(query, lake, T0, T0 + 6 * TAU, TAU, running=catching_up, wait=60, clock=clock,
                             sleep=clock.sleep)
    assert got["source"] == "job" and got["waited_seconds"] > 0


def test_cycles_that_do_not_validate_are_not_used(tmp_path, query):
    lake = Lake(str(tmp_path / "lake"))
    _emit(lake, query, J0, J0 + 3, query_fingerprint="another spec")
    got = use_job_statistics(query, lake, T0, T0 + 3 * TAU, TAU, running=lambda: True)
    assert got["source"] is None and "do not validate" in got["fallback"] and "another version" in got["fallback"]


def test_a_query_with_band_predicates_falls_back_at_once(tmp_path):
    spec = {"spec_version": 1, "name": "banded", "streams": [
        {"name": "a", "source": "sa", "event_time": "ts", "window": "60s",
         "columns": {"ts": "timestamp", "k": "long", "x": "double"}, "keys": ["k"]},
        {"name": "b", "source": "sb", "event_time": "ts", "window": "60s",
         "columns": {"ts": "timestamp", "k": "long", "y": "double"}, "keys": ["k"]}],
        "predicates": ["a.k = b.k", "abs(a.x - b.y) <= 2"], "output": ["a.k"]}
    q = parse_query(spec)
    lake = Lake(str(tmp_path / "lake"))
    assert JobStatistics(q, lake, TAU).emission(None, 10**9, None) is None  # the job counts nothing for it
    got = use_job_statistics(q, lake, T0, T0 + TAU, TAU, running=lambda: True, wait=600)
    assert got["source"] is None and "band predicates" in got["fallback"] and got["waited_seconds"] == 0


def test_a_job_computing_no_or_other_cycles_is_not_waited_for(tmp_path, query):
    """The running job's status says which statistics cycle it computes (its claim): none, or another than the
    run's, falls back at once instead of waiting for cycles that will never come; the same cycle is waited for."""
    lake = Lake(str(tmp_path / "lake"))
    clock = Clock()
    none = use_job_statistics(query, lake, T0, T0 + 6 * TAU, TAU, running=lambda: True, wait=600, clock=clock,
                              sleep=clock.sleep, job_cycle=0)
    assert none["source"] is None and "without --stats-cycle" in none["fallback"] and clock.t == 0
    other = use_job_statistics(query, lake, T0, T0 + 6 * TAU, TAU, running=lambda: True, wait=600, clock=clock,
                               sleep=clock.sleep, job_cycle=2 * TAU)
    assert other["source"] is None and f"computes {2 * TAU:g}-s cycles" in other["fallback"] and clock.t == 0
    same = use_job_statistics(query, lake, T0, T0 + 6 * TAU, TAU, running=lambda: True, wait=30, clock=clock,
                              sleep=clock.sleep, job_cycle=TAU)
    assert same["source"] is None and "lagging" in same["fallback"] and clock.t >= 30


def test_which_cycles_a_batch_counts_and_its_purge_bound(tmp_path, query):
    lake = Lake(str(tmp_path / "lake"))
    job = JobStatistics(query, lake, TAU)

    class Plan:
        partitioning, version, source = None, 1, "registry"

    # a cycle is final once the batch's watermark is past its end: (j + 1) tau < wm
    wm = (J0 + 5) * TAU * US + 1
    assert final_end(wm, TAU * US) == J0 + 5 and final_end((J0 + 5) * TAU * US, TAU * US) == J0 + 4
    # no watermark yet: nothing final, nothing purged
    em = job.emission(None, None, Plan())
    assert em.hi is None and not em.counts_cycles and job.purge_bound(None, em) is None
    # the first watermark: from the state's oldest row (lo None) to the last final cycle
    em = job.emission({"jobstats": {"cycle_seconds": TAU, "next": None}}, wm, Plan())
    assert (em.lo, em.hi) == (None, J0 + 5) and em.counts_cycles
    # the state keeps the lead-in of the first cycle still open: purged at its start, at most one cycle below
    assert job.purge_bound(wm, em) == (J0 + 5) * TAU * US and wm - job.purge_bound(wm, em) <= TAU * US
    # the next batch goes on where the committed manifest says
    em = job.emission({"jobstats": {"cycle_seconds": TAU, "next": J0 + 3, "span": 1024}}, wm, Plan())
    assert (em.lo, em.hi, em.span) == (J0 + 3, J0 + 5, 1024)
    # a state the job purged without its statistics (or with another cycle): from the watermark on only
    em = job.emission({"event_time": {}, "jobstats": {"cycle_seconds": 30, "next": 5}}, wm, Plan())
    assert em.lo == J0 + 6 and not em.counts_cycles
    # the manifest section after a batch that counts nothing: the open cycles' quarantine counts are kept
    em = job.emission({"jobstats": {"cycle_seconds": TAU, "next": J0 + 5}}, wm, Plan())
    man, rec = job.after_tasks(3, em, [{"by_cycle": {"sr": {"null_key": {str(J0 + 6): 2, str(J0 + 1): 1}}}}],
                               {"jobstats": {"cycle_seconds": TAU, "next": J0 + 5}}, Plan())
    assert man["jobstats"]["next"] == J0 + 5 and man["jobstats"]["quarantined"] == {str(J0 + 6): {"sr": {"null_key": 2}}}
    assert rec["job_stats"]["written"] == [] and rec["job_stats"]["errors"] == []


def test_the_run_asks_for_the_job_statistics_in_continuous_mode_and_reports_the_source(tmp_path, query):
    base = {"query": query.name, "lake": str(tmp_path), "cycle": TAU}
    cont = LoopConfig.from_params({**base, "mode": "continuous"})
    assert "--prefer-job" in stats_args(cont, query, T0, T0 + 60, str(tmp_path))
    assert stats_args(cont, query, T0, T0 + 60, str(tmp_path))[-2:] == ["--report", fsutil.join(str(tmp_path),
                                                                                            STATISTICS_REPORT)]
    off = LoopConfig.from_params({**base, "mode": "continuous", "job_statistics": False})
    cyc = LoopConfig.from_params(base)
    backfill = LoopConfig.from_params({**base, "mode": "continuous"}, run_type="backfill")
    for cfg in (off, cyc, backfill):
        assert "--prefer-job" not in stats_args(cfg, query, T0, T0 + 60, str(tmp_path))
    assert statistics_source(str(tmp_path)) is None
    fsutil.atomic_write_text(fsutil.join(str(tmp_path), STATISTICS_REPORT), json.dumps(
        {"source": "standalone", "fallback": "the join job is not running: ...", "cycles": 6, "history": "x"}))
    assert statistics_source(str(tmp_path)) == {"source": "standalone", "fallback": "the join job is not running: ...",
                                                 "cycles": 6}
