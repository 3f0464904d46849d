"""The statistics job (exact mode) against pandas / DuckDB computed independently on small data."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mjoin.lake.layout import Lake
from mjoin.model.statistics import Statistics, StatisticsError
from mjoin.stats import history
from mjoin.stats.job import StatsConfig, StatsJobError, compute_statistics, run_statistics
from test_stats_helpers import (T0, canon, compare, four_streams_query, make_rows, measured, reference_edges,
                                reference_streams, write_stream)

pytestmark = pytest.mark.spark

TAU, N = 30, 8  # cycles [T0 + 30 j, T0 + 30 (j+1)), j = 0..7
EMPTY_CYCLE = 3  # no stream has a tuple in [T0 + 90, T0 + 120)
STREAM_COLS = ["tuples", "lambda", "window_tuples", "kappa"]
EDGE_COLS = ["q", "m", "s", "gamma", "mu"]


def _dataset(seed=7):
    rng = np.random.default_rng(seed)
    data = {
        # keys 200..203 only in a, 50/51 only in b, 70 only in c; ~10% NULL keys
        "a": make_rows(rng, 160, T0 - 130, T0 + N * TAU + 20, list(range(12)) + [200, 201, 202, 203], column="ka"),
        "b": make_rows(rng, 160, T0 - 200, T0 + N * TAU + 20, list(range(9)) + [50, 51], column="kb"),
        "c": make_rows(rng, 90, T0 - 60, T0 + N * TAU, list(range(5, 15)) + [70], column="kc"),
    }
    for s, df in data.items():
        lo, hi = T0 + EMPTY_CYCLE * TAU, T0 + (EMPTY_CYCLE + 1) * TAU
        data[s] = df[(df.ts < lo) | (df.ts >= hi)].reset_index(drop=True)
    # rows exactly on the boundaries: cycle starts, window edges, T1
    k = {"a": "ka", "b": "kb", "c": "kc"}
    extra = {"a": [(T0, 3), (T0 + TAU, 3), (T0 - 90, 3), (T0 + N * TAU, 3), (T0 + 60, 4)],
             "b": [(T0, 3), (T0 + TAU - 150, 3), (T0 + 60, 4), (T0 + 60 - 150, 4), (T0 + N * TAU - 1, 5)],
             "c": [(T0 + TAU, 3), (T0 + TAU - 40, 3), (T0 + 60, 4)]}
    for s, rows in extra.items():
        data[s] = pd.concat([data[s], pd.DataFrame(rows, columns=["ts", k[s]]).astype(float)], ignore_index=True)
    return data


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    q = four_streams_query()
    lake = Lake(str(tmp_path_factory.mktemp("stats") / "lake"))
    data = _dataset()
    for s in q.streams:
        if s.name in data:  # d: no data at all
            write_stream(lake, s, data[s.name])
    return q, lake, data


@pytest.fixture(scope="module")
def exact_run(spark, dataset):
    q, lake, _ = dataset
    return compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU, StatsConfig(histogram_buckets=8))


def test_every_statistic_matches_independent_computation(dataset, exact_run):
    q, _, data = dataset
    st, ed = measured(exact_run.rows, T0, TAU)
    compare(st, reference_streams(q, data, T0, N, TAU), ["j", "group", "stream"], STREAM_COLS)
    compare(ed, reference_edges(q, data, T0, N, TAU), ["j", "group", "stream", "right"], EDGE_COLS)
    # the data exercise what they should: matches exist, ties on boundaries, several windows
    assert ed["m"].sum() > 50 and ed["s"].sum() > ed["m"].sum()


def test_sql_method_gives_the_same_statistics(spark, dataset, exact_run):
    """The Spark SQL implementation (one aggregation per statistic) agrees with the references and the pass."""
    q, lake, data = dataset
    run = compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU, StatsConfig(histogram_buckets=8, method="sql"))
    st, ed = measured(run.rows, T0, TAU)
    compare(st, reference_streams(q, data, T0, N, TAU), ["j", "group", "stream"], STREAM_COLS)
    compare(ed, reference_edges(q, data, T0, N, TAU), ["j", "group", "stream", "right"], EDGE_COLS)
    key = ["cycle_start", "stream", "attr_class", "bucket"]
    pd.testing.assert_frame_equal(run.histogram.sort_values(key).reset_index(drop=True),
                                  exact_run.histogram.sort_values(key).reset_index(drop=True), check_dtype=False)
    def without_run(meta):  # per-cell statistics come from the pass only (sql: cells {})
        return {e: {k: v for k, v in m.items() if k not in ("run", "cells")} for e, m in meta.items()}

    assert without_run(run.cycle_meta) == without_run(exact_run.cycle_meta)  # NULL keys, kappa by class, ...
    assert run.cells == {} and "exact mode's one pass" in run.summary["cells"]["note"]
    assert "one_pass" in exact_run.summary["wall_seconds"] and "edges" in run.summary["wall_seconds"]


def _same_run(a, b):
    """Two runs hold the same rows, histogram and per-cycle meta (all but when they ran)."""
    pd.testing.assert_frame_equal(a.rows, b.rows)
    key = ["cycle_start", "stream", "attr_class", "bucket"]
    pd.testing.assert_frame_equal(a.histogram.sort_values(key).reset_index(drop=True),
                                  b.histogram.sort_values(key).reset_index(drop=True))

    def without_run(meta):
        return {e: {k: v for k, v in m.items() if k != "run"} for e, m in meta.items()}

    assert without_run(a.cycle_meta) == without_run(b.cycle_meta)


@pytest.mark.parametrize("rule", [None, {"method": "hash", "attr_class": "c0", "groups": 3}])
def test_kernel_on_executors_equals_kernel_on_driver(spark, dataset, exact_run, rule):
    """Small intervals run the kernel on the driver (no shuffle); ``driver_rows=0`` forces the executors'
    per-partition pass: the same statistics either way, and the summary says which ran."""
    q, lake, data = dataset
    on_driver = exact_run if rule is None else compute_statistics(
        spark, q, lake, T0, T0 + N * TAU, TAU, StatsConfig(histogram_buckets=8, partitioning=rule))
    on_executors = compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU,
                                      StatsConfig(histogram_buckets=8, partitioning=rule, driver_rows=0))
    assert on_driver.summary["kernel"]["where"] == "driver"
    assert on_executors.summary["kernel"]["where"] == "executors"
    _same_run(on_driver, on_executors)
    # the bound is the rows of the files read (footers), at least every row the job counted
    bound = on_driver.summary["kernel"]["rows_bound"]
    assert bound == sum(st["rows_in_files"] for st in on_driver.summary["streams"].values())
    assert sum(st["rows_read"] for st in on_driver.summary["streams"].values()) <= bound
    assert bound <= sum(len(df) for df in data.values())  # pruned arrivals are not counted (one class per stream)
    # one row over the limit and the executors run it
    just_over = compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU,
                                   StatsConfig(histogram_buckets=8, partitioning=rule, driver_rows=bound - 1))
    assert just_over.summary["kernel"]["where"] == "executors"
    with pytest.raises(StatsJobError, match="driver rows"):
        compute_statistics(spark, q, lake, T0, T0 + TAU, TAU, StatsConfig(driver_rows=-1))


def test_complete_rows_for_empty_cycle_and_stream_without_data(dataset, exact_run):
    q, _, _ = dataset
    rows = exact_run.rows
    assert len(rows) == N * (len(q.streams) + len(q.directed_edges))
    for j in range(N):
        snap = exact_run.snapshot(T0 + j * TAU)
        assert snap.check(q) is snap  # every stream and edge present, values in range
        assert snap.lam("d") == 0 and snap.kappa("d") == 0 and snap.window_tuples("d") == 0
        assert snap.gamma("a", "d") == 0 and snap.mu("a", "d") == 1
        assert snap.group(0).edges[("d", "a")].q == 0
    empty = exact_run.snapshot(T0 + EMPTY_CYCLE * TAU)
    for s in "abcd":
        assert empty.lam(s) == 0
    for l, r in q.directed_edges:
        assert (empty.gamma(l, r), empty.mu(l, r), empty.group(0).edges[(l, r)].q) == (0.0, 1.0, 0.0)
    assert empty.window_tuples("b") > 0  # the state still holds earlier tuples


def test_null_keys_and_counts_are_reported(dataset, exact_run):
    q, _, data = dataset
    s = exact_run.summary
    for name, col in (("a", "ka"), ("b", "kb"), ("c", "kc")):
        df = data[name]
        inside = df[(df.ts >= T0) & (df.ts < T0 + N * TAU)]
        assert s["streams"][name]["tuples"] == len(inside) - int(inside[col].isna().sum())  # NULL keys apart
        assert s["streams"][name]["null_keys"] == {col: int(inside[col].isna().sum())}
        assert s["streams"][name]["null_keys"][col] > 0
    assert s["streams"]["d"]["tuples"] == 0 and s["streams"]["d"]["files"] == 0
    assert s["null_keys"] == sum(sum(v["null_keys"].values()) for v in s["streams"].values())
    per_cycle = sum(m["null_keys"]["a"]["ka"] for m in exact_run.cycle_meta.values())
    assert per_cycle == s["streams"]["a"]["null_keys"]["ka"]
    assert s["wall_seconds"]["compute"] > 0


def test_histogram_matches_pandas(dataset, exact_run):
    q, _, data = dataset
    h = exact_run.histogram
    assert set(h["buckets"]) == {8}
    for name, col in (("a", "ka"), ("b", "kb"), ("c", "kc")):
        df = data[name].dropna(subset=[col])
        df = df[(df.ts >= T0) & (df.ts < T0 + N * TAU)]
        want = (df.assign(j=((df.ts - T0) // TAU).astype(int), bucket=np.mod(df[col].astype(np.int64), 8))
                .groupby(["j", "bucket"]).size().rename("tuples").reset_index())
        got = h[h.stream == name].copy()
        got["j"] = ((got["cycle_start"].map(lambda x: x.timestamp()) - T0) // TAU).astype(int)
        merged = want.merge(got, on=["j", "bucket"], how="outer", suffixes=("_want", "_got"))
        assert (merged["tuples_want"] == merged["tuples_got"]).all(), merged
        assert set(got["key_column"]) == {col} and set(got["attr_class"]) == {"c0"}
    # keys up to 203 do not fit 8 buckets: not exact keys
    assert exact_run.summary["streams"]["a"]["histogram_exact_keys"] == {"c0": False}


def test_histogram_of_exact_keys(spark, dataset):
    q, lake, data = dataset
    run = compute_statistics(spark, q, lake, T0, T0 + 2 * TAU, TAU, StatsConfig(histogram_buckets=0))
    h = run.histogram[run.histogram.stream == "a"]
    df = data["a"][(data["a"].ts >= T0) & (data["a"].ts < T0 + 2 * TAU)].dropna(subset=["ka"])
    want = df.groupby(df["ka"].astype(np.int64)).size()
    got = h.groupby("bucket")["tuples"].sum()
    assert got.to_dict() == want.to_dict() and 200 in got.index
    assert run.summary["streams"]["a"]["histogram_exact_keys"] == {"c0": True}


@pytest.mark.parametrize("rule, fn", [
    ({"method": "hash", "attr_class": "c0", "groups": 3}, lambda k: np.mod(k, 3)),
    ({"method": "range", "attr_class": "c0", "bounds": [4, 9]}, lambda k: np.searchsorted([4, 9], k, side="right")),
])
def test_per_group_statistics(spark, dataset, rule, fn):
    q, lake, data = dataset
    run = compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU, StatsConfig(partitioning=rule))
    groups = (fn, 3, "c0")
    st, ed = measured(run.rows, T0, TAU)
    compare(st, reference_streams(q, data, T0, N, TAU, groups), ["j", "group", "stream"], STREAM_COLS)
    compare(ed, reference_edges(q, data, T0, N, TAU, groups), ["j", "group", "stream", "right"], EDGE_COLS)
    snap = run.snapshot(T0)
    assert sorted(snap.groups) == [0, 1, 2] and snap.partitioning == rule
    # rows whose partitioning key is NULL belong to no group: reported, not silently dropped
    inside = data["a"][(data["a"].ts >= T0) & (data["a"].ts < T0 + N * TAU)]
    assert run.summary["streams"]["a"]["null_partition_key"] == int(inside["ka"].isna().sum())


def test_two_attribute_classes(spark, two_class_query, tmp_path):
    q = two_class_query
    lake = Lake(str(tmp_path / "lake"))
    rng = np.random.default_rng(3)
    tau, n = 60, 4
    data = {
        "sr": make_rows(rng, 120, T0 - 320, T0 + n * tau, range(20), column="sr_customer_sk"),
        "wr": make_rows(rng, 120, T0 - 320, T0 + n * tau, range(10), column="wr_refunded_addr_sk"),
        "cr": make_rows(rng, 80, T0 - 320, T0 + n * tau, range(12), column="cr_refunded_addr_sk"),
    }
    cu = make_rows(rng, 100, T0 - 320, T0 + n * tau, range(20), column="c_customer_sk")
    cu["c_current_addr_sk"] = make_rows(rng, 100, 0, 1, range(10), column="x")["x"].to_numpy()
    data["cu"] = cu
    for s in q.streams:
        write_stream(lake, s, data[s.name])
    run = compute_statistics(spark, q, lake, T0, T0 + n * tau, tau)
    st, ed = measured(run.rows, T0, tau)
    compare(st, reference_streams(q, data, T0, n, tau), ["j", "group", "stream"], STREAM_COLS)
    compare(ed, reference_edges(q, data, T0, n, tau), ["j", "group", "stream", "right"], EDGE_COLS)
    # kappa of cu is over its first class (customer key); the address class is in the meta
    meta = run.cycle_meta[T0]
    e = T0 + tau
    state = cu[(cu.ts > e - 300) & (cu.ts <= e)]
    assert meta["kappa_by_class"]["cu"]["c1"]["0"] == state["c_current_addr_sk"].nunique()
    assert run.snapshot(T0).kappa("cu") == state["c_customer_sk"].nunique()
    # cu's rows are routed once per class: the same on the executors' per-partition pass
    assert run.summary["kernel"]["where"] == "driver"
    _same_run(run, compute_statistics(spark, q, lake, T0, T0 + n * tau, tau, StatsConfig(driver_rows=0)))


def test_history_is_replaced_not_duplicated(spark, dataset, tmp_path):
    q, lake, _ = dataset
    out = tmp_path / "hist"
    first = run_statistics(spark, q, lake, T0, T0 + 4 * TAU, TAU, out=str(out))
    again = run_statistics(spark, q, lake, T0 + 2 * TAU, T0 + 6 * TAU, TAU, out=str(out))
    h = history.read_history(str(out), q.name)
    per_cycle = len(q.streams) + len(q.directed_edges)
    assert len(h) == 6 * per_cycle
    assert not h.duplicated(["cycle_start", "group", "entity", "stream", "right"]).any()
    assert history.list_cycles(str(out), q.name) == [T0 + j * TAU for j in range(6)]
    # the overlapping cycles hold the values of the later run (equal here: same data)
    pd.testing.assert_frame_equal(
        h[h.cycle_start >= pd.Timestamp(T0 + 2 * TAU, unit="s", tz="UTC")].reset_index(drop=True),
        again.rows.sort_values(["cycle_start", "group", "entity", "stream", "right"], na_position="first")
        .reset_index(drop=True), check_dtype=False)
    # range reads and snapshots
    part = history.read_history(str(out), q.name, start=T0 + TAU, end=T0 + 3 * TAU, meta=True)
    assert sorted(part["cycle_start"].unique()) == [pd.Timestamp(T0 + TAU, unit="s", tz="UTC"),
                                                    pd.Timestamp(T0 + 2 * TAU, unit="s", tz="UTC")]
    snap = history.snapshot(part, T0 + TAU)
    assert canon(snap) == canon(first.snapshot(T0 + TAU))
    assert snap.meta["mode"] == "exact"
    hist = history.read_histogram(str(out), q.name)
    assert hist["cycle_start"].nunique() == 5  # the empty cycle's histogram has no rows ...
    assert len(os.listdir(out / q.name / "_histogram")) == 6  # ... but it is written
    # no temporary or replaced folders are left behind
    assert not [n for n in os.listdir(out / q.name) if n.startswith(".")]
    assert os.path.exists(again.summary["summary_file"])
    # another cycle grid over the same time is refused
    with pytest.raises(StatisticsError, match="another grid"):
        run_statistics(spark, q, lake, T0 + 15, T0 + 15 + TAU, TAU, out=str(out))


def test_bad_input_is_reported_not_fatal(spark, tmp_path):
    q = four_streams_query()
    lake = Lake(str(tmp_path / "lake"))
    rng = np.random.default_rng(5)
    a = make_rows(rng, 50, T0, T0 + 60, range(5), column="ka")
    write_stream(lake, q.stream("a"), a)
    # a file without the key column, a file with a string key, rows with NULL event time
    bad1 = lake.stream_file("src_b", T0, part=0)
    os.makedirs(os.path.dirname(bad1), exist_ok=True)
    pq.write_table(pa.table({"ts": pa.array([T0 * 10**6], pa.timestamp("us", tz="UTC")), "other": [1]}), bad1)
    bad2 = lake.stream_file("src_c", T0, part=0)
    os.makedirs(os.path.dirname(bad2), exist_ok=True)
    pq.write_table(pa.table({"ts": pa.array([T0 * 10**6], pa.timestamp("us", tz="UTC")), "kc": ["x"]}), bad2)
    nulls = lake.stream_file("src_a", T0, part=1)
    pq.write_table(pa.table({"ts": pa.array([None, None], pa.timestamp("us", tz="UTC")), "ka": [1, 2], "pa": [0, 0]}), nulls)
    # nanosecond event times (pandas' default): read as the engine reads them (long nanoseconds div 1000)
    nanos = lake.stream_file("src_a", T0, part=2)
    pq.write_table(pa.table({"ts": pa.array([T0 * 10**9], pa.timestamp("ns", tz="UTC")), "ka": [1], "pa": [0]}), nanos)
    # an int32 key and an extra nanosecond column that is not needed: read fine
    narrow = lake.stream_file("src_a", T0, part=3)
    pq.write_table(pa.table({"ts": pa.array([(T0 + 5) * 10**6], pa.timestamp("us", tz="UTC")),
                             "ka": pa.array([4], pa.int32()), "other": pa.array([0], pa.timestamp("ns"))}), narrow)
    run = compute_statistics(spark, q, lake, T0, T0 + 60, 30)
    s = run.summary
    assert s["rejected_files"] == 2
    assert "column 'kb' is missing" in s["streams"]["b"]["rejected_files"][0]["reason"]
    assert "key column 'kc' has type string" in s["streams"]["c"]["rejected_files"][0]["reason"]
    assert not s["streams"]["a"]["rejected_files"]
    assert s["streams"]["a"]["bad_event_time"] == 2 and s["bad_event_time"] == 2
    # the nanosecond row and the narrow one; rows with a NULL key are not tuples (only NULL-key counts)
    assert s["streams"]["a"]["tuples"] == len(a) - int(a["ka"].isna().sum()) + 2
    assert run.snapshot(T0).check(q)


@pytest.mark.parametrize("start, end, cycle, words", [
    (T0, T0 + 100, 30, "not a whole number of 30s cycles"),
    (T0 + 60, T0, 30, "empty interval"),
    (T0, T0 + 60, 0, "positive whole number"),
])
def test_bad_interval_is_a_clear_error(spark, dataset, start, end, cycle, words):
    q, lake, _ = dataset
    with pytest.raises(StatsJobError, match=words):
        compute_statistics(spark, q, lake, start, end, cycle)


def test_cli_stats_then_forecast(spark, dataset, tmp_path, capsys):
    from mjoin.cli import main

    q, lake, _ = dataset
    spec = tmp_path / "stats_test.yaml"
    import yaml

    from test_stats_helpers import FOUR_STREAMS
    spec.write_text(yaml.safe_dump(FOUR_STREAMS))
    out = tmp_path / "hist"
    rc = main(["stats", "--query", str(spec), "--lake", lake.root, "--from", "2026-01-01T00:00:00Z",
               "--to", str(T0 + N * TAU), "--cycle", "30s", "--out", str(out), "--plan", "none"])
    text = capsys.readouterr().out
    assert rc == 0 and f"{N} cycles of 30s" in text and "NULL keys: ka" in text
    assert history.list_cycles(str(out), q.name) == [T0 + j * TAU for j in range(N)]
    fc = tmp_path / "forecast.json"
    rc = main(["forecast", "--stats-history", str(out / q.name), "--as-of", str(T0 + N * TAU), "--length", "60",
               "--out", str(fc)])
    text = capsys.readouterr().out
    assert rc == 0 and "series" in text
    st = Statistics.load(fc)  # the forecast file is a statistics document
    assert st.kind == "forecast" and st.cycle_start == "2026-01-01T00:04:00Z" and st.check(q)
    doc = json.loads(fc.read_text())
    assert len(doc["report"]) == 4 * 3 + len(q.directed_edges) * 2
    # a user error exits 2 with one line
    rc = main(["stats", "--query", str(spec), "--lake", lake.root, "--from", str(T0), "--to", str(T0 + 45),
               "--cycle", "30", "--out", str(out), "--plan", "none"])
    assert rc == 2 and "whole number" in capsys.readouterr().err


def test_cli_takes_key_groups_from_the_active_plan(dataset, tmp_path):
    import argparse

    from mjoin.commands.stats import _partitioning
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.lake.registry import PlanRegistry

    q, _, _ = dataset
    lake = Lake(str(tmp_path / "lake"))
    ns = argparse.Namespace(partitioning=None, plan="active")
    assert _partitioning(ns, q, lake) == (None, "no active plan")
    rule = {"method": "hash", "attr_class": "c0", "groups": 2}
    orders = orders_from_permutation(q, q.stream_names)
    plan = make_plan(q, {0: orders, 1: orders}, "fixed", partitioning=rule)
    reg = PlanRegistry(lake, q.name)
    reg.activate(reg.publish(plan, query=q))
    assert _partitioning(ns, q, lake) == (rule, "active plan v1")
    path = tmp_path / "plan.json"
    plan.save(path)
    assert _partitioning(argparse.Namespace(partitioning=None, plan=str(path)), q, lake)[0] == rule
    assert _partitioning(argparse.Namespace(partitioning='{"method": "hash", "attr_class": "c0", "groups": 5}',
                                            plan="active"), q, lake)[0]["groups"] == 5
    assert _partitioning(argparse.Namespace(partitioning=None, plan="none"), q, lake) == (None, "none")
