"""The statistics the streaming join job computes from its own state (mjoin.stats.emitted) equal the standalone
statistics job's (exact mode) on the same interval: every row of the history, the per-cycle meta (NULL keys,
kappa by class), the histogram and the per-cell statistics. On TPC-DS sf 0.1 (both queries), a two-class
synthetic preset, key groups (D > 1), a plan switch mid-cycle, a kill -9 and restart, micro-batches that split
arrival cycles (every run here: a batch takes fewer files than an arrival cycle holds, and arrival cycles are
not statistics cycles); a cycle whose folders cannot be written is kept and written later; rows the job
quarantines are in no statistic, only in the counts. Real local Spark, the real streaming job."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine_helpers import kill_tree, no_leaked_queries, replay_tpcds, start_job
from mjoin.engine import stream
from mjoin.engine.config import EngineConfig
from mjoin.engine.control import JobControl
from mjoin.engine.metrics import read_metrics
from mjoin.engine.runs import run_stream
from mjoin.engine.state import StateStore
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.model.keygroups import num_groups
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.model.query import load_query
from mjoin.model.timeutil import iso, to_epoch
from mjoin.stats import history
from mjoin.stats.emitted import JobStatistics
from mjoin.stats.job import StatsConfig, compute_statistics

pytestmark = [pytest.mark.spark, pytest.mark.slow]
_ = no_leaked_queries
TAU = 10
NUM = ["lambda", "kappa", "window_tuples", "tuples", "gamma", "mu", "q", "m", "s"]
KEY = ["cycle_start", "group", "entity", "stream", "right"]
#: meta of a cycle that says how or when, not what (the job adds its batch, the quarantine counts and its source)
HOW = ("run", "source", "job", "quarantined", "cells")


def stream_with_stats(spark, query, lake, *, files: int = 6, buckets: int = 4, plan=None, driver_rows=10**6):
    """The streaming job over what has landed, ``files`` landed files per micro-batch (an arrival cycle holds one
    file per table: a batch ends inside one), computing its statistics in 10-s cycles."""
    return run_stream(spark, query, lake, plan=plan, stats=JobStatistics(query, lake, TAU),
                      config=EngineConfig(buckets=buckets, max_files_per_trigger=files, driver_rows=driver_rows))


def _sorted(df):
    return df.sort_values(KEY, na_position="first").reset_index(drop=True)


def _same_rows(got, want, what):
    got, want = _sorted(got), _sorted(want)
    assert len(got) == len(want), f"{what}: {len(got)} rows vs {len(want)}"
    assert (got[KEY[1:]].astype(str).to_numpy() == want[KEY[1:]].astype(str).to_numpy()).all(), what
    assert (got["cycle_start"].to_numpy() == want["cycle_start"].to_numpy()).all(), what
    a, b = got[NUM].to_numpy(dtype=float), want[NUM].to_numpy(dtype=float)
    bad = ~(np.isclose(a, b, rtol=1e-12, atol=1e-12) | (np.isnan(a) & np.isnan(b)))
    if bad.any():
        i = np.flatnonzero(bad.any(axis=1))[:10]
        raise AssertionError(f"{what}: {int(bad.any(axis=1).sum())} rows differ:\n"
                             f"{pd.concat([got.iloc[i], want.iloc[i]], keys=['job', 'standalone'])}")


def emitted_cycles(lake, query) -> tuple[pd.DataFrame, list]:
    """The history and the cycles the job emitted (consecutive: no gap)."""
    h = history.read_history(history.history_root(lake), query.name, meta=True)
    metas = h.attrs["cycles"]
    mine = sorted(int(to_epoch(c)) for c, m in metas.items() if m.get("source") == "job")
    assert mine, "the job emitted no cycle"
    assert mine == list(range(mine[0], mine[-1] + TAU, TAU)), "a gap in the emitted cycles"
    return h, mine


def assert_emitted_equal_standalone(spark, query, lake, *, reference_lake=None, min_cycles: int = 10) -> list:
    """Every cycle the job emitted equals the standalone job's over the same cycles (of ``reference_lake`` if
    given: the lake without the input the job quarantines), cycle runs with one partitioning at a time. Returns
    the cycles compared."""
    root = history.history_root(lake)
    h, cycles = emitted_cycles(lake, query)
    assert len(cycles) >= min_cycles, cycles
    metas = h.attrs["cycles"]
    runs = []  # (rule, first, end) of consecutive cycles under one partitioning
    for e in cycles:
        rule = metas[iso(e)].get("partitioning")
        if runs and runs[-1][0] == rule and runs[-1][2] == e:
            runs[-1][2] = e + TAU
        else:
            runs.append([rule, e, e + TAU])
    starts = pd.to_datetime(h["cycle_start"], utc=True)
    for rule, a, b in runs:
        ref = compute_statistics(spark, query, reference_lake or lake, a, b, TAU, StatsConfig(partitioning=rule))
        got = h[(starts >= pd.Timestamp(a, unit="s", tz="UTC")) & (starts < pd.Timestamp(b, unit="s", tz="UTC"))]
        _same_rows(got, ref.rows, f"{query.name} [{iso(a)}, {iso(b)}) under {rule}")
        for e in range(a, b, TAU):
            mine, theirs = metas[iso(e)], ref.cycle_meta[e]
            assert {k: v for k, v in mine.items() if k not in HOW} == {k: v for k, v in theirs.items() if k not in HOW}
            assert mine["source"] == "job" and mine["cells"].get("buckets") == theirs["cells"].get("buckets")
            for s, n in ((s, sum(v.values()) // max(len(v), 1)) for s, v in mine["null_keys"].items()):
                assert mine["quarantined"].get(s, {}).get("null_key", 0) == n  # the NULL keys the job quarantined
        hist = history.read_histogram(root, query.name, a, b)
        k = ["cycle_start", "stream", "attr_class", "bucket"]
        pd.testing.assert_frame_equal(hist.sort_values(k).reset_index(drop=True),
                                      ref.histogram.sort_values(k).reset_index(drop=True), check_dtype=False)
        if "buckets" in ref.cells:
            _same_rows(history.read_cells(root, query.name, "buckets", a, b), ref.cells["buckets"][1], "bucket cells")
        ranges = history.read_cells(root, query.name, "ranges", a, b)
        by_rule = {}
        for cyc, r in (ranges.attrs.get("rules") or {}).items():
            by_rule.setdefault(json.dumps(r, sort_keys=True), []).append(int(to_epoch(cyc)))
        for r, es in by_rule.items():  # the job's range cells: the statistics under that range rule
            es = sorted(es)
            assert es == list(range(es[0], es[-1] + TAU, TAU))
            want = compute_statistics(spark, query, reference_lake or lake, es[0], es[-1] + TAU, TAU,
                                      StatsConfig(partitioning=json.loads(r), key_buckets=0, key_ranges=0)).rows
            cs = pd.to_datetime(ranges["cycle_start"], utc=True)
            _same_rows(ranges[(cs >= pd.Timestamp(es[0], unit="s", tz="UTC"))
                              & (cs <= pd.Timestamp(es[-1], unit="s", tz="UTC"))], want, "range cells")
        if len(query.all_classes) == 1:
            assert set(mine["cells"]) == {"buckets", "ranges"}
    return cycles


def assert_each_cycle_emitted_once(lake, query, cycles):
    """Every cycle was written by exactly one committed batch (re-runs of a batch replaced, not added)."""
    written = [c for r in read_metrics(lake, query.name) for c in (r.get("job_stats") or {}).get("written", [])]
    assert sorted(written) == sorted(set(written)), "a cycle was emitted by two committed batches"
    assert set(cycles) <= set(written)


@pytest.fixture(scope="module")
def tpcds01(tmp_path_factory):
    """TPC-DS sf 0.1 (~60 k rows over the four tables) replayed at 100 rows/s in 15-s arrival cycles."""
    stage = Lake(str(tmp_path_factory.mktemp("tpcds01") / "lake"))
    info = replay_tpcds(stage, 0.1, rate=100, arrival_cycle=15)
    return stage, info


def _copy_lake(stage: Lake, root: Path) -> Lake:
    shutil.copytree(stage.streams(), Path(root) / "lake" / "streams")
    return Lake(str(Path(root) / "lake"))


@pytest.mark.parametrize("query_name", ["tpcds_returns_by_address", "tpcds_returns_by_customer_and_address"])
def test_tpcds_sf01_statistics_from_the_job_equal_the_statistics_job(spark, tpcds01, tmp_path, query_name):
    stage, info = tpcds01
    lake = _copy_lake(stage, tmp_path)
    q = load_query(query_name)
    s = stream_with_stats(spark, q, lake, files=6)
    assert len(s.batches) > 20
    cycles = assert_emitted_equal_standalone(spark, q, lake, min_cycles=40)
    assert_each_cycle_emitted_once(lake, q, cycles)
    # the data exercise every statistic: matches on every edge, NULL keys the job quarantined
    h, _ = emitted_cycles(lake, q)
    edges = h[h.entity == "edge"]
    assert (edges.groupby(["stream", "right"])["m"].sum() > 0).all()
    assert sum(sum(m.get("quarantined", {}).get("sr", {}).values()) for m in h.attrs["cycles"].values()) > 0
    rec = read_metrics(lake, q.name)
    assert all(r["job_stats"]["errors"] == [] for r in rec)


def test_two_class_synthetic_preset(spark, tmp_path):
    from mjoin.workloads.synthetic import generate_synthetic

    root = tmp_path / "w"
    generate_synthetic(root, streams=4, duration="6m", rate=15, window="1m", cycle="10s", schedule="twoclass-step",
                       seed=5)
    q = load_query(str(root / "query.yaml"))
    assert len(q.attribute_classes) == 2
    lake = Lake(str(root))
    stream_with_stats(spark, q, lake, files=3)
    assert_emitted_equal_standalone(spark, q, lake, min_cycles=20)


def _plan(query, perm, rule=None):
    orders = orders_from_permutation(query, perm)
    if rule:
        orders = {g: orders for g in range(num_groups(rule))}
    return make_plan(query, orders, "fixedOrder", partitioning=rule)


def test_key_groups_and_a_plan_switch_mid_cycle(spark, tmp_path, monkeypatch):
    """A plan with D = 4 hash groups from the start, then (between two batches inside a cycle) a range rule of
    three groups, then one group again: every cycle has the statistics of the groups of the batch that emitted
    it, equal to the statistics job's under that rule."""
    lake = Lake(str(tmp_path / "lake"))
    replay_tpcds(lake, 0.01, rate=20, arrival_cycle=15)
    q = load_query("tpcds_returns_by_address")
    reg = PlanRegistry(lake, q.name)
    hash4 = {"method": "hash", "attr_class": "c0", "groups": 4}
    ranges3 = {"method": "range", "attr_class": "c0", "bounds": [3000, 9000]}
    reg.activate(reg.publish(_plan(q, ["sr", "cu", "wr", "cr"], hash4)), by="test")
    switches = {12: lambda: reg.activate(reg.publish(_plan(q, ["cr", "wr", "sr", "cu"], ranges3)), by="test"),
                20: lambda: reg.activate(reg.publish(_plan(q, ["cu", "sr", "cr", "wr"])), by="test")}
    process = stream.StreamJob.process

    def process_then_switch(self, df, batch_id):
        process(self, df, batch_id)
        switches.get(batch_id, lambda: None)()

    monkeypatch.setattr(stream.StreamJob, "process", process_then_switch)
    stream_with_stats(spark, q, lake, files=2)
    h, cycles = emitted_cycles(lake, q)
    rules = [h.attrs["cycles"][iso(e)].get("partitioning") for e in cycles]
    assert hash4 in rules and ranges3 in rules and None in rules
    rec = read_metrics(lake, q.name)
    switched = [r["batch_id"] for r in rec if r["plan_switch"]]
    assert switched == [13, 21]
    assert_emitted_equal_standalone(spark, q, lake, min_cycles=15)
    groups = h.groupby(pd.to_datetime(h["cycle_start"], utc=True))["group"].nunique()
    assert set(groups) == {4, 3, 1}


def test_kill_9_and_restart_mid_cycle(spark, tmp_path):
    """The job is killed (SIGKILL, whole process tree) inside a batch after it wrote that batch's cycles to the
    history, before the batch's commit; restarted, it re-runs the batch (the cycles replaced, not added) and goes
    on: the emitted cycles equal the statistics job's, each written by one committed batch, no gap."""
    lake = Lake(str(tmp_path / "lake"))
    replay_tpcds(lake, 0.01, rate=20, arrival_cycle=15)
    q = load_query("tpcds_returns_by_address")
    control = JobControl(lake, q.name)
    log = tmp_path / "job.log"
    job = start_job(lake, log, "--stream", "--query", q.name, "--buckets", "4", "--max-files-per-trigger", "3",
                    "--stats-cycle", str(TAU), "--inject-fault", "pause_before_commit:9:600", spark_submit=False)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert job.poll() is None, log.read_text()[-3000:]
            st = control.status()
            if (st.get("fault_pause") or {}).get("batch_id") == 9:
                break
            time.sleep(0.5)
        else:
            raise AssertionError(log.read_text()[-3000:])
        kill_tree(job)
    finally:
        if job.poll() is None:
            job.kill()
    assert StateStore(lake.state(q.name)).versions()[-1] == 8  # batch 9 was not committed
    prev = StateStore(lake.state(q.name)).latest()
    assert prev["jobstats"]["next"] is not None  # cycles were emitted before the kill, more are open
    s = stream_with_stats(spark, q, lake, files=3)
    assert s.batches[0] == 9  # the killed batch, re-run
    cycles = assert_emitted_equal_standalone(spark, q, lake, min_cycles=15)
    assert_each_cycle_emitted_once(lake, q, cycles)
    assert cycles[0] < prev["jobstats"]["next"] * TAU < cycles[-1]  # emitted before and after the kill


def test_a_cycle_that_cannot_be_written_is_kept_and_written_later(spark, tmp_path, monkeypatch):
    """While the history cannot take a cycle's folders (here: a file where its per-cell folder must go), the
    job keeps the assembled cycles beside its state and retries at every batch; a reader never sees a cycle
    without its cells. Once the history is writable, every kept cycle is written, in order, equal to the
    statistics job's."""
    lake = Lake(str(tmp_path / "lake"))
    replay_tpcds(lake, 0.01, rate=20, arrival_cycle=15)
    q = load_query("tpcds_returns_by_address")
    blocker = Path(history.query_dir(history.history_root(lake), q.name)) / history.CELLS_DIR
    aside = blocker.with_name("_cells_aside")  # readers skip names starting with "_"
    process = stream.StreamJob.process

    def process_blocked(self, df, batch_id):
        if batch_id == 6:  # the per-cell folders cannot be made: a file where their parent must be
            if blocker.exists():
                blocker.rename(aside)
            blocker.parent.mkdir(parents=True, exist_ok=True)
            blocker.write_text("not a folder")
        if batch_id == 12:
            blocker.unlink()
            if aside.exists():
                aside.rename(blocker)
        process(self, df, batch_id)
        if 6 <= batch_id < 12:  # nothing of the blocked batches reached the history
            h = history.read_history(history.history_root(lake), q.name, meta=True)
            written = {int(to_epoch(c)) for c in h.attrs["cycles"]}
            assert not written & set(self.records[-1]["job_stats"]["pending"])

    monkeypatch.setattr(stream.StreamJob, "process", process_blocked)
    stream_with_stats(spark, q, lake, files=2)
    rec = {r["batch_id"]: r["job_stats"] for r in read_metrics(lake, q.name)}
    kept = sorted({c for b in range(6, 12) for c in rec[b]["pending"]})
    assert kept and all("kept and retried" in e or "still cannot" in e for b in range(6, 12) for e in rec[b]["errors"])
    assert set(kept) <= set(rec[12]["written"]) and rec[12]["pending"] == []
    assert not list(Path(lake.state(q.name), "jobstats").glob("pending-*"))  # nothing kept any more
    cycles = assert_emitted_equal_standalone(spark, q, lake, min_cycles=15)
    assert set(kept) <= set(cycles)


def test_rows_the_job_quarantines_are_in_no_statistic(spark, tmp_path):
    """A duplicate of a landed file and a file landed after its rows' time (late: below the watermark) are
    quarantined by the job, and so are the rows with a NULL key: its statistics equal the statistics job's over
    the lake without the two files (the statistics job reads what landed), and each cycle counts the NULL-key
    rows it holds as the job's quarantine does (the meta's ``null_keys`` and ``quarantined``)."""
    lake = Lake(str(tmp_path / "lake"))
    info = replay_tpcds(lake, 0.01, rate=20, arrival_cycle=15)
    clean = Lake(str(tmp_path / "clean"))
    shutil.copytree(lake.streams(), clean.streams())
    q = load_query("tpcds_returns_by_address")
    arrivals = lake.arrivals("web_returns")
    src = lake.stream_files("web_returns", arrivals[3], arrivals[3] + 1)[0]
    dup = Path(lake.arrival_dir("web_returns", arrivals[4])) / "copy.parquet"
    shutil.copy(src, dup)  # the same rows again: a duplicate file
    late = Path(lake.arrival_dir("store_returns", arrivals[-2])) / "late.parquet"
    t = pq.read_table(lake.stream_files("store_returns", arrivals[2], arrivals[2] + 1)[0])
    t = t.set_column(t.schema.get_field_index("sr_ticket_number"), "sr_ticket_number",
                     pa.array(np.arange(10**9, 10**9 + t.num_rows), pa.int64()))
    pq.write_table(t, late)  # rows of arrival 2's time landed near the end: late
    stream_with_stats(spark, q, lake, files=4)
    rec = read_metrics(lake, q.name)
    quarantined = {}
    for r in rec:
        for s, reasons in r["quarantined"].items():
            for why, n in reasons.items():
                quarantined[(s, why)] = quarantined.get((s, why), 0) + n
    assert quarantined.get(("wr", "duplicate_file"), 0) > 0 and quarantined.get(("sr", "late"), 0) > 0
    assert quarantined.get(("sr", "null_key"), 0) > 0
    assert_emitted_equal_standalone(spark, q, lake, reference_lake=clean, min_cycles=15)


def test_the_lead_in_the_state_keeps_is_at_most_one_cycle(spark, tmp_path):
    """With the job's statistics the state holds, per stream, at most one statistics cycle of event time more
    than without (the lead-in of the cycle still open): compared batch by batch on the same input."""
    base = Lake(str(tmp_path / "base"))
    replay_tpcds(base, 0.01, rate=10, arrival_cycle=15)  # ~10 min: longer than the 5-min window
    q = load_query("tpcds_returns_by_address")
    other = Lake(str(tmp_path / "other"))
    shutil.copytree(base.streams(), other.streams())
    stream_with_stats(spark, q, base, files=4)
    run_stream(spark, q, other, config=EngineConfig(buckets=4, max_files_per_trigger=4))
    with_stats = {r["batch_id"]: r for r in read_metrics(base, q.name)}
    without = {r["batch_id"]: r for r in read_metrics(other, q.name)}
    assert with_stats.keys() == without.keys()
    most = {s.name: _most_in_one_cycle(base, s) for s in q.streams}  # a cycle's tuples, at most
    extra = {s: max(r["state_tuples"][s] - without[b]["state_tuples"][s] for b, r in with_stats.items())
             for s in q.stream_names}
    for s in q.stream_names:
        assert 0 <= extra[s] <= most[s], (s, extra[s], most[s])
    assert sum(extra.values()) > 0


def _most_in_one_cycle(lake: Lake, stream) -> int:
    """The most rows of ``stream`` with event times in any interval of one cycle's length (keyed rows)."""
    ts = []
    for f in lake.stream_files(stream.source):
        t = pq.read_table(f, columns=[stream.event_time.column] + list(stream.keys))
        ok = np.ones(t.num_rows, bool)
        for k in stream.keys:
            ok &= np.asarray(t.column(k).is_valid().to_numpy(zero_copy_only=False), bool)
        ts.append(t.column(stream.event_time.column).cast(pa.int64()).to_numpy()[ok])
    ts = np.sort(np.concatenate(ts))
    return int((np.searchsorted(ts, ts + TAU * 1_000_000, side="right") - np.arange(len(ts))).max())
