"""The statistics job's driver read (pyarrow, no Spark job) gives exactly the rows Spark's projection gives.

Small intervals run the kernel on the driver; their files are then read with pyarrow there too
(``StatsConfig.driver_read``). Every event-time type it takes (zone-less millisecond timestamps, dates,
int32 epoch seconds, fractional epoch seconds with NULLs, NaN and values that overflow), int32 keys, and
every partitioning rule: the same statistics, histogram and per-cycle meta as when Spark reads them."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mjoin.lake.layout import Lake
from mjoin.model.query import parse_query
from mjoin.stats.job import StatsConfig, compute_statistics
from test_stats_helpers import T0

pytestmark = pytest.mark.spark

TAU, N = 20, 6
SPEC = {
    "spec_version": 1, "name": "driver_read_test",
    "streams": [
        {"name": "a", "source": "src_a", "event_time": "ts", "window": "45s",
         "columns": {"ts": "timestamp", "ka": "int"}, "keys": ["ka"]},
        {"name": "b", "source": "src_b", "event_time": "ts", "window": "30s",
         "columns": {"ts": "long", "kb": "long"}, "keys": ["kb"]},
        {"name": "c", "source": "src_c", "event_time": "ts", "window": "60s",
         "columns": {"ts": "double", "kc": "long"}, "keys": ["kc"]},
        {"name": "d", "source": "src_d", "event_time": "day", "window": "2d",
         "columns": {"day": "date", "kd": "long"}, "keys": ["kd"]},
    ],
    "predicates": ["a.ka = b.kb", "b.kb = c.kc", "c.kc = d.kd"],
    "output": ["a.ka"],
}


def _land(lake, source, arrival, table):
    path = lake.stream_file(source, int(arrival))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    q = parse_query(SPEC)
    lake = Lake(str(tmp_path_factory.mktemp("driver_read") / "lake"))
    rng = np.random.default_rng(11)
    for arrival in range(T0 - 60, T0 + N * TAU + 20, 20):
        n = 40
        ts = rng.uniform(arrival - 20, arrival, n)
        keys = rng.integers(-3, 12, n)
        null = rng.random(n) < 0.1
        # a: zone-less millisecond timestamps, int32 keys (NULLs)
        _land(lake, "src_a", arrival, pa.table({
            "ts": pa.array((np.floor(ts * 1000)).astype(np.int64), pa.timestamp("ms")),
            "ka": pa.array(keys.astype(np.int32), mask=null)}))
        # b: int32 epoch seconds, some NULL event times
        _land(lake, "src_b", arrival, pa.table({
            "ts": pa.array(np.floor(ts).astype(np.int32), mask=rng.random(n) < 0.05),
            "kb": pa.array(keys[::-1].astype(np.int64))}))
        # c: fractional epoch seconds: NULL, NaN, inf and one far beyond a bigint of microseconds
        tc = ts.copy()
        tc[:3] = [np.nan, np.inf, 1e300]
        _land(lake, "src_c", arrival, pa.table({
            "ts": pa.array(tc, mask=np.arange(n) == 5), "kc": pa.array(keys.astype(np.int64), mask=null[::-1])}))
    # b: rows on the boundaries: T1 (in the last window state), T1 + 1 (after it), T0 - W_b (just out of the
    # lead-in) and T0 - W_b + 1 (in it)
    t1 = T0 + N * TAU
    _land(lake, "src_b", t1, pa.table({"ts": pa.array([t1, t1, t1 + 1, T0 - 30, T0 - 29], pa.int32()),
                                       "kb": pa.array([1, 2, 1, 1, 2], pa.int64())}))
    # a: one file with other Arrow types (zone-aware microseconds, int64 keys): read as its own group
    _land(lake, "src_a", t1, pa.table({"ts": pa.array([t1 * 10**6, (t1 - 7) * 10**6], pa.timestamp("us", "UTC")),
                                       "ka": pa.array([2, None], pa.int64())}))
    # d: dates (midnight UTC), one file
    _land(lake, "src_d", T0, pa.table({
        "day": pa.array(np.array([T0 // 86400 - 1, T0 // 86400, T0 // 86400 - 1], np.int32), pa.date32()),
        "kd": pa.array([1, 2, None], pa.int64())}))
    return q, lake


@pytest.mark.parametrize("rule", [
    None,  # hash rules: tests/test_stats_job.py compares the driver (now this read) with the executors
    {"method": "range", "attr_class": "c0", "bounds": [0, 4, 9]},
    {"method": "table", "attr_class": "c0", "modulus": 5, "assignment": [1, 0, 1, 2, 0]},
])
def test_driver_read_equals_spark_read(spark, mixed, rule):
    q, lake = mixed
    cfg = dict(histogram_buckets=8, partitioning=rule)
    fast = compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU, StatsConfig(**cfg))
    slow = compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU, StatsConfig(driver_read=False, **cfg))
    assert fast.summary["kernel"]["read"] == "pyarrow on the driver"
    assert slow.summary["kernel"]["read"] == "spark" and slow.summary["kernel"]["where"] == "driver"
    import pandas as pd

    pd.testing.assert_frame_equal(fast.rows, slow.rows)
    key = ["cycle_start", "stream", "attr_class", "bucket"]
    pd.testing.assert_frame_equal(fast.histogram.sort_values(key).reset_index(drop=True),
                                  slow.histogram.sort_values(key).reset_index(drop=True))
    assert {e: {k: v for k, v in m.items() if k != "run"} for e, m in fast.cycle_meta.items()} == \
        {e: {k: v for k, v in m.items() if k != "run"} for e, m in slow.cycle_meta.items()}
    for kind, (r, rows) in fast.cells.items():
        pd.testing.assert_frame_equal(rows, slow.cells[kind][1])
    # what the summary counts (rows read, unusable event times, NULL keys) is the same too
    strip = ("rejected_files",)
    assert {s: {k: v for k, v in st.items() if k not in strip} for s, st in fast.summary["streams"].items()} == \
        {s: {k: v for k, v in st.items() if k not in strip} for s, st in slow.summary["streams"].items()}
    # the data exercise it: NULL and unusable event times, NULL keys, and every stream joined
    assert fast.summary["bad_event_time"] > 0 and fast.summary["null_keys"] > 0
    assert (fast.rows["m"].fillna(0) > 0).any()


def test_event_time_from_an_expression_stays_with_spark(spark, mixed):
    q0, lake = mixed
    spec = {**SPEC, "streams": [dict(s) for s in SPEC["streams"]]}
    spec["streams"][1]["event_time"] = {"expr": "timestamp_seconds(ts)"}
    q = parse_query(spec)
    run = compute_statistics(spark, q, lake, T0, T0 + 2 * TAU, TAU)
    assert run.summary["kernel"]["read"] == "spark"
    assert "expression" in run.summary["kernel"]["read_note"]
    same = compute_statistics(spark, q0, lake, T0, T0 + 2 * TAU, TAU)
    import pandas as pd

    pd.testing.assert_frame_equal(run.rows, same.rows)  # timestamp_seconds(ts) is what a long ts means


def test_decimal_epoch_seconds_are_read_on_the_driver_as_spark_reads_them(spark, tmp_path):
    """Epoch seconds declared double but landed as decimals (the landing contract accepts any fractional type):
    the driver read computes them exactly as Spark does (mjoin.model.eventtime: decimal arithmetic, HALF_UP), so the
    interval is read on the driver and gives Spark's statistics."""
    import decimal

    import pandas as pd

    spec = {**SPEC, "name": "decimal_time", "streams": [dict(s) for s in SPEC["streams"][:2]],
            "predicates": ["a.ka = b.kb"]}
    spec["streams"][1]["columns"] = {"ts": "double", "kb": "long"}
    q = parse_query(spec)
    lake = Lake(str(tmp_path / "lake"))
    ts = [T0 + 1, T0 + 2.5, T0 + 11]
    _land(lake, "src_a", T0, pa.table({"ts": pa.array([(t * 1000) for t in (T0, T0 + 3)], pa.timestamp("ms")),
                                       "ka": pa.array([1, 2], pa.int32())}))
    _land(lake, "src_b", T0, pa.table({"ts": pa.array([decimal.Decimal(f"{t:.3f}") for t in ts], pa.decimal128(14, 3)),
                                       "kb": pa.array([1, 2, 1], pa.int64())}))
    run = compute_statistics(spark, q, lake, T0, T0 + TAU, TAU)
    assert run.summary["kernel"]["where"] == "driver" and run.summary["kernel"]["read"] == "pyarrow on the driver"
    same = compute_statistics(spark, q, lake, T0, T0 + TAU, TAU, StatsConfig(driver_read=False))
    pd.testing.assert_frame_equal(run.rows, same.rows)
    assert run.rows["tuples"].sum() == 5  # every row counted
