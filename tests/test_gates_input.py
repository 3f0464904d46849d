"""Input gate: good landed files pass; each kind of bad input fails with exactly the expected expectations.

Counts are compared with an independent DuckDB scan of the same files.
"""
from __future__ import annotations

import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from mjoin.gates import GateConfig, GateConfigError, check_input, summarize_input
from mjoin.gates.input import type_problem
from test_gates_support import CYCLE, EPOCH0, good_lake, write_stream_file

START, END = EPOCH0, EPOCH0 + int(2 * CYCLE)
A0, A1 = EPOCH0, EPOCH0 + int(CYCLE)  # the two arrival cycles


def run(query, lake, **kw):
    return check_input(query, lake, START, END, cycle=kw.pop("cycle", CYCLE), **kw)


@pytest.fixture
def good(lake, seed_query):
    good_lake(lake, seed_query)
    return lake


def test_good_input_passes(seed_query, good):
    res = run(seed_query, good)
    assert res.status == "passed", res.summary()
    assert res.details["files"] == 8
    # every file was settled from its footer alone (statistics present, no NULL keys, times inside)
    assert res.details["files_footer_only"] == 8
    by_stream = {s["where"]: s for s in res.details["streams"]}
    assert by_stream["sr"]["rows"] == 100 and by_stream["sr"]["late"] == 0


def _duckdb_counts(lake, source, key, lo, hi):
    con = duckdb.connect()
    q = (f"SELECT count(*), count(*) FILTER (WHERE {key} IS NULL), "
         f"count(*) FILTER (WHERE epoch_us(ts) < {int(lo * 1e6)}), count(*) FILTER (WHERE epoch_us(ts) >= {int(hi * 1e6)}) "
         f"FROM read_parquet('{lake.streams(source)}/*/*.parquet')")
    return con.execute(q).fetchone()


@pytest.mark.parametrize("statistics", [True, False], ids=["footer-stats", "no-footer-stats"])
def test_counts_match_duckdb(seed_query, good, statistics):
    """NULL keys, late and future rows: the gate's counts equal DuckDB's, with and without footer statistics."""
    write_stream_file(good, seed_query, "sr", A1, 80, part=1, seed=7, null_keys=9, late=3, future=2,
                      interval_end=END, statistics=statistics)
    cfg = GateConfig(null_key_fraction_max=1.0, late_fraction_max=1.0, future_fraction_max=1.0)
    frames = summarize_input(seed_query, good, START, END, cycle=CYCLE, config=cfg)
    sr = frames["streams"].set_index("where").loc["sr"]
    rows, nulls, late, future = _duckdb_counts(good, "store_returns", "sr_addr_sk", START, END)
    assert (sr["rows"], sr["null_key_rows"], sr["late"], sr["future"]) == (rows, nulls, late, future) == (180, 9, 3, 2)
    assert run(seed_query, good, config=cfg).status == "passed"


def test_null_keys_above_threshold(seed_query, good):
    write_stream_file(good, seed_query, "wr", A1, 50, part=1, null_keys=25)
    res = run(seed_query, good)
    assert res.failed_expectations == ["input.null_key_fraction_below_max"]
    (f,) = res.failures
    assert f.values[0]["where"] == "wr" and f.values[0]["null_key_rows"] == 25
    assert f.values[0]["null_key_fraction"] == pytest.approx(25 / 150)
    # under the threshold it passes
    assert run(seed_query, good, config=GateConfig(null_key_fraction_max=0.2)).status == "passed"


def test_late_tuples(seed_query, good):
    write_stream_file(good, seed_query, "cu", A0, 50, part=1, late=10)
    res = run(seed_query, good)
    assert res.failed_expectations == ["input.late_fraction_below_max"]
    assert res.failures[0].values[0]["late"] == 10
    # allowed lateness of one hour covers them
    assert run(seed_query, good, config=GateConfig.from_dict({"late_tolerance": "1h"})).status == "passed"


def test_future_tuples(seed_query, good):
    write_stream_file(good, seed_query, "cr", A1, 50, part=1, future=1, interval_end=END)
    res = run(seed_query, good)
    assert res.failed_expectations == ["input.future_fraction_below_max"]
    assert res.failures[0].values[0]["future"] == 1


def test_wrong_schema_file(seed_query, good):
    n = 20
    write_stream_file(good, seed_query, "sr", A1, n, part=1,
                      overrides={"sr_item_sk": pa.array([str(i) for i in range(n)])}, drop=("sr_ticket_number",))
    res = run(seed_query, good)
    assert res.failed_expectations == ["input.schema_matches_spec"]
    (f,) = res.failures
    assert f.values[0]["where"] == "streams/store_returns/arrival=%d/part-00001.parquet" % A1
    assert f.values[0]["schema_problem"] == "missing column sr_ticket_number; sr_item_sk is string, spec says long"


def test_missing_key_column(seed_query, good):
    write_stream_file(good, seed_query, "cr", A0, 20, part=1, drop=("cr_refunded_addr_sk",))
    res = run(seed_query, good)
    assert res.failed_expectations == ["input.key_columns_present"]
    assert res.failures[0].rendered[0].endswith("missing key column(s) cr_refunded_addr_sk")


def test_duplicate_file(seed_query, good):
    src = good.stream_file("web_returns", A0, 0)
    dst = good.stream_file("web_returns", A1, 1)
    shutil.copy(src, dst)
    res = run(seed_query, good)
    assert res.failed_expectations == ["input.no_duplicate_files"]
    (f,) = res.failures
    assert f.values[0]["where"].endswith(f"arrival={A1}/part-00001.parquet")
    assert f.values[0]["duplicate_of"].endswith(f"arrival={A0}/part-00000.parquet")


def test_duplicate_of_a_file_landed_before_the_interval(seed_query, good):
    """A file re-landed within the window duplicates one from before the interval."""
    earlier = EPOCH0 - int(CYCLE)
    write_stream_file(good, seed_query, "cu", earlier, 30, seed=99)
    shutil.copy(good.stream_file("customer", earlier, 0), good.stream_file("customer", A1, 1))
    res = run(seed_query, good, config=GateConfig(late_fraction_max=1.0))
    assert res.failed_expectations == ["input.no_duplicate_files"]
    # with no lookback, only the interval is compared
    res = run(seed_query, good, config=GateConfig(late_fraction_max=1.0, duplicate_lookback=0.0))
    assert res.status == "passed"


def test_empty_expected_stream(seed_query, good):
    shutil.rmtree(good.arrival_dir("catalog_returns", A1))
    res = run(seed_query, good)
    assert res.failed_expectations == ["input.stream_flows_when_expected"]
    assert res.failures[0].rendered == [f"cr@{'2026-01-01T00:01:00Z'}: 0 rows, expected >= 1"]
    # a stream that is not expected to flow may be silent
    assert run(seed_query, good, config=GateConfig(quiet_streams=("cr",))).status == "passed"
    # without a cycle the whole interval counts: cr still delivered rows in its first cycle
    assert run(seed_query, good, cycle=None).status == "passed"


def test_stream_that_never_landed(seed_query, good):
    shutil.rmtree(good.streams("customer"))
    res = run(seed_query, good, config=GateConfig(min_rows_per_cycle=10))
    assert res.failed_expectations == ["input.stream_flows_when_expected"]
    assert res.failures[0].count == 2


def test_unreadable_file(seed_query, good):
    with open(good.stream_file("store_returns", A1, 3), "wb") as f:
        f.write(b"PAR1 this is not parquet")
    res = run(seed_query, good)
    assert res.failed_expectations == ["input.files_readable"]
    assert "part-00003.parquet" in res.failures[0].rendered[0]


def test_config_errors(seed_query, good):
    with pytest.raises(GateConfigError, match="unknown stream"):
        run(seed_query, good, config=GateConfig(quiet_streams=("nope",)))
    with pytest.raises(GateConfigError, match="empty interval"):
        check_input(seed_query, good, END, START)


def test_any_null_key_counts_once_with_two_keys(two_class_query, lake):
    """cu has two join keys in the two-class query: a row with either key NULL counts once."""
    good_lake(lake, two_class_query)
    n = 40
    cust = pa.array(list(range(n)), pa.int64(), mask=np.array([i < 5 for i in range(n)]))
    addr = pa.array(list(range(n)), pa.int64(), mask=np.array([3 <= i < 10 for i in range(n)]))
    write_stream_file(lake, two_class_query, "cu", A1, n, part=1,
                      overrides={"c_customer_sk": cust, "c_current_addr_sk": addr})
    con = duckdb.connect()
    expected = con.execute(f"SELECT count(*) FILTER (WHERE c_customer_sk IS NULL OR c_current_addr_sk IS NULL) "
                           f"FROM read_parquet('{lake.streams('customer')}/*/*.parquet')").fetchone()[0]
    frames = summarize_input(two_class_query, lake, START, END, cycle=CYCLE)
    cu = frames["streams"].set_index("where").loc["cu"]
    assert cu["null_key_rows"] == expected == 10
    assert run(two_class_query, lake).status == "passed"  # 10 of 140 rows: 7 % < 10 %
    assert run(two_class_query, lake, config=GateConfig(null_key_fraction_max=0.05)).failed_expectations == [
        "input.null_key_fraction_below_max"]


@pytest.mark.parametrize("spec,arrow,ok", [
    ("long", pa.int64(), True), ("long", pa.int32(), True), ("int", pa.int64(), False), ("long", pa.uint64(), False),
    ("long", pa.uint32(), True), ("string", pa.large_string(), True), ("timestamp", pa.timestamp("ms"), True),
    ("timestamp", pa.string(), False), ("double", pa.float32(), True), ("float", pa.float64(), False),
    ("decimal(7,2)", pa.decimal128(7, 2), True), ("decimal(7,2)", pa.decimal128(7, 3), False),
    ("date", pa.date32(), True), ("boolean", pa.int8(), False),
])
def test_type_compatibility(spec, arrow, ok):
    assert (type_problem(spec, arrow) is None) == ok


@pytest.mark.spark
def test_spark_engine_counts_equal_pyarrow(seed_query, good, spark):
    """The Spark scan gives the same per-stream counts and the same verdict as the pyarrow path."""
    write_stream_file(good, seed_query, "sr", A1, 80, part=1, seed=7, null_keys=9, late=3, future=2,
                      interval_end=END, statistics=False)
    write_stream_file(good, seed_query, "wr", A1, 20, part=1, drop=("wr_refunded_addr_sk",))
    arrow = check_input(seed_query, good, START, END, cycle=CYCLE)
    spk = check_input(seed_query, good, START, END, cycle=CYCLE, spark=spark)
    assert spk.details["engine"] == "spark" and arrow.details["engine"] == "pyarrow"
    assert spk.details["streams"] == arrow.details["streams"]
    assert spk.failed_expectations == arrow.failed_expectations == [
        "input.future_fraction_below_max", "input.key_columns_present", "input.late_fraction_below_max"]
