"""Whether a row of a landed file can be rejected, by its footer (mjoin.lake.contract.row_rejects), and the engine's
Spark input path without the reject columns where none can: identical results and quarantine either way."""
from __future__ import annotations

import glob
import os
import shutil
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine_helpers import T0, write_stream_file
from mjoin.lake import contract
from mjoin.lake.contract import cast_can_fail
from mjoin.lake.layout import Lake
from mjoin.model.query import parse_query

SPEC = {
    "spec_version": 1, "name": "facts", "lateness": "0s",
    "streams": [
        {"name": "a", "source": "sa", "event_time": "ts", "window": "60s",
         "columns": {"ts": "timestamp", "ka": "long", "va": "double"}, "keys": ["ka"]},
        {"name": "b", "source": "sb", "event_time": "e", "window": "60s",
         "columns": {"e": "long", "kb": "long", "vb": "decimal(10,2)"}, "keys": ["kb"]},
    ],
    "predicates": ["a.ka = b.kb"], "output": ["a.ka", "a.va", "b.vb"],
}


def _facts(tmp_path, stream: str, table: pa.Table, **write) -> contract.FileFacts:
    q = parse_query(SPEC)
    path = str(tmp_path / f"{stream}-{len(os.listdir(tmp_path))}.parquet")
    pq.write_table(table, path, **write)
    facts = contract.inspect(path, q.stream(stream))
    assert facts.problem() is None, facts.problem()
    return facts


def _a(ts, ka, va=None, ts_type=pa.timestamp("us")):
    n = len(ka)
    return pa.table({"ts": pa.array([None if x is None else int(x) for x in ts], pa.int64()).cast(ts_type), "ka": pa.array(ka, pa.int64()),
                     "va": pa.array(va if va is not None else [0.5] * n, pa.float64())})


def test_footer_facts_keys_event_time_and_statistics(tmp_path):
    us = (T0 + np.arange(4)) * 1_000_000
    clean = _facts(tmp_path, "a", _a(us, [1, 2, 3, 4], [None, 1.0, None, 2.0]))  # payload NULLs never reject
    assert clean.row_rejects is None and clean.rows_can_be_rejected() is None
    assert clean.ts_min_us == T0 * 1_000_000  # exact: the engine's event time of the footer's minimum
    null_key = _facts(tmp_path, "a", _a(us, [1, None, 3, None]))
    assert "ka: 2 NULL key(s)" in null_key.row_rejects
    null_time = _facts(tmp_path, "a", _a([us[0], None, us[2], us[3]], [1, 2, 3, 4]))
    assert "ts: 1 NULL event time(s)" in null_time.row_rejects
    # no statistics: the footer does not tell, so a row can be rejected
    unknown = _facts(tmp_path, "a", _a(us, [1, 2, 3, 4]), write_statistics=False)
    assert "no NULL count" in unknown.row_rejects and unknown.ts_min_us is None
    # statistics for the event time only: the key is unknown
    key_unknown = _facts(tmp_path, "a", _a(us, [1, 2, 3, 4]), write_statistics=["ts"])
    assert key_unknown.row_rejects == "ka: no NULL count in the footer"
    # a file without rows has nothing to reject
    empty = _facts(tmp_path, "a", _a([], []))
    assert empty.rows == 0 and empty.rows_can_be_rejected(late_before=T0 * 10**6) is None
    # nanosecond timestamps (Spark reads them as long, div 1000: truncated): the minimum in micros, truncated
    ns = _facts(tmp_path, "a", _a([T0 * 10**9 + 1999, T0 * 10**9 + 5000], [1, 2], ts_type=pa.timestamp("ns")))
    assert ns.row_rejects is None and ns.ts_min_us == T0 * 10**6 + 1


def test_footer_facts_late_rows_need_a_watermark(tmp_path):
    us = (T0 + np.arange(4)) * 1_000_000
    f = _facts(tmp_path, "a", _a(us, [1, 2, 3, 4]))
    assert f.rows_can_be_rejected(None) is None  # interval runs: nothing is late
    assert f.rows_can_be_rejected(T0 * 10**6 - 2) is None  # every row at or after the watermark
    assert "late" in f.rows_can_be_rejected(T0 * 10**6 + 1)  # the earliest row is before it
    assert "late" in f.rows_can_be_rejected(T0 * 10**6)  # within the 1-us margin: conservative
    unknown = _facts(tmp_path, "a", _a(us, [1, 2, 3, 4]), write_statistics=["ka"])  # no event-time statistics
    assert unknown.row_rejects is not None and unknown.rows_can_be_rejected(0) is not None


def test_footer_facts_epoch_seconds_and_type_combinations(tmp_path):
    def b(e, e_type=pa.int64(), kb_type=pa.int64(), vb_type=pa.decimal128(9, 2)):
        return pa.table({"e": pa.array(e, e_type), "kb": pa.array([1] * len(e), kb_type),
                         "vb": pa.array([Decimal("1.25")] * len(e), vb_type)})

    ok = _facts(tmp_path, "b", b([T0, T0 + 5], kb_type=pa.int32(), vb_type=pa.decimal128(10, 2)))
    assert ok.row_rejects is None and ok.ts_min_us == T0 * 10**6
    narrow = _facts(tmp_path, "b", b([T0, T0 + 5], e_type=pa.uint32(), kb_type=pa.uint16()))  # widened by Spark
    assert narrow.row_rejects is None
    # epoch seconds whose micros do not fit a bigint: bad_time for that row (by the footer's max)
    overflow = _facts(tmp_path, "b", b([T0, 10**13]))
    assert "overflows" in overflow.row_rejects
    # floating epoch seconds: a NaN is not in the statistics
    q = parse_query({**SPEC, "streams": [SPEC["streams"][0], {**SPEC["streams"][1], "columns": {
        "e": "double", "kb": "long", "vb": "decimal(10,2)"}}]})
    path = str(tmp_path / "float-e.parquet")
    pq.write_table(b([float(T0), float("nan")], e_type=pa.float64()), path)
    assert "kind float" in contract.inspect(path, q.stream("b")).row_rejects

    # the casts of accepted files (contract.type_problem) that never fail, and the ones that can
    never = [("long", pa.int32()), ("long", pa.uint32()), ("int", pa.int16()), ("short", pa.uint8()),
             ("string", pa.string()), ("string", pa.large_string()), ("double", pa.float32()), ("double", pa.float64()),
             ("float", pa.float32()), ("boolean", pa.bool_()), ("date", pa.date32()), ("date", pa.date64()),
             ("timestamp", pa.timestamp("ns")), ("timestamp", pa.timestamp("ms", tz="UTC")),
             ("decimal(10,2)", pa.decimal128(9, 2)), ("decimal(10,2)", pa.decimal128(10, 2)),
             ("long", pa.dictionary(pa.int8(), pa.int64()))]
    can = [("long", pa.uint64()), ("int", pa.int64()), ("long", pa.float64()), ("long", pa.string()),
           ("float", pa.float64()), ("decimal(10,2)", pa.decimal128(11, 2)), ("decimal(10,2)", pa.decimal128(9, 3)),
           ("timestamp", pa.int64()), ("date", pa.timestamp("us")), ("string", pa.int64()), ("xml", pa.string())]
    assert [c for c in never if cast_can_fail(*c)] == []
    assert [c for c in can if not cast_can_fail(*c)] == []
    # a band column is scaled to integer units: only integers never fail
    assert not cast_can_fail("long", pa.int32(), band=True)
    assert cast_can_fail("double", pa.float64(), band=True) and cast_can_fail("decimal(10,2)", pa.decimal128(9, 2), band=True)


# ---- the engine: the same results and quarantine with and without the reject columns ---------------------

START, CYCLE = T0 + 60, 60


def _land(lake: Lake, seed: int = 5) -> None:
    """The seed query's four streams, two arrivals of 2 minutes each, ~120 rows per file, no NULL key."""
    rng = np.random.default_rng(seed)
    cols = {"customer": ("c_current_addr_sk", "c_customer_sk", None), "store_returns": ("sr_addr_sk", "sr_ticket_number", "sr_item_sk"),
            "web_returns": ("wr_refunded_addr_sk", "wr_order_number", "wr_item_sk"),
            "catalog_returns": ("cr_refunded_addr_sk", "cr_order_number", "cr_item_sk")}
    for a in (T0, T0 + 120):
        for source, (key, id1, id2) in cols.items():
            n = 120
            t = {"ts": pa.array(np.sort(rng.integers(a * 10**6, (a + 120) * 10**6, n)), pa.timestamp("us")),
                 key: pa.array(rng.integers(0, 25, n), pa.int64()), id1: pa.array(rng.integers(0, 10**6, n), pa.int64())}
            if id2:
                t[id2] = pa.array(rng.integers(0, 10**6, n), pa.int64())
            write_stream_file(lake, source, a, pa.table(t))


def _quarantined_rows(out: str) -> list:
    rows = []
    for f in sorted(glob.glob(os.path.join(out, "quarantine", "**", "rows", "**", "*.parquet"), recursive=True)):
        rows += [(r["reason"], r["file"], r["row"]) for r in pq.read_table(f).to_pylist()]
    return sorted(rows)


@pytest.fixture(scope="module")
def clean_lake(tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("facts") / "lake"))
    _land(lake)
    return lake


def _run(spark, query, lake, out, monkeypatch, force_rejects: bool = False) -> dict:
    """An interval run on the Spark path; ``force_rejects``: as if every file could reject a row (the path
    with the reject columns). Returns the run's result fingerprint, quarantined rows and whether the routed
    rows (what crosses the exchange) had the reject columns."""
    from mjoin.engine.config import EngineConfig
    from mjoin.engine import interval
    from mjoin.engine.results import result_fingerprint
    from mjoin.engine.runs import run_interval
    from mjoin.engine.normalize import Inspected

    seen = []
    route = interval.route_interval

    def spy(runner, data):
        routed = route(runner, data)
        seen.append("_reason" in routed.columns)
        return routed

    with monkeypatch.context() as m:
        m.setattr(interval, "route_interval", spy)
        if force_rejects:
            m.setattr(Inspected, "can_reject", lambda self, stream, paths, late_before=None: True)
        s = run_interval(spark, query, None, lake, START, T0 + 241, CYCLE, str(out),
                         config=EngineConfig(buckets=4, driver_rows=0))
    return {"fingerprint": result_fingerprint(str(out), query.name), "quarantine": _quarantined_rows(str(out)),
            "rejects_on_exchange": seen, "quarantined": s.quarantined, "rows_in": s.rows_in}


@pytest.mark.spark
def test_clean_lake_routes_without_reject_columns_bad_row_keeps_them(spark, seed_query, clean_lake, tmp_path,
                                                                    monkeypatch):
    new = _run(spark, seed_query, clean_lake, tmp_path / "new", monkeypatch)
    old = _run(spark, seed_query, clean_lake, tmp_path / "old", monkeypatch, force_rejects=True)
    assert new["rejects_on_exchange"] == [False] and old["rejects_on_exchange"] == [True]
    assert new["fingerprint"]["rows"] > 100 and new["fingerprint"] == old["fingerprint"]
    assert new["quarantine"] == old["quarantine"] == [] and new["rows_in"] == old["rows_in"]

    # one store_returns file with one NULL key: its group keeps the reject columns, the row is quarantined
    bad = Lake(str(tmp_path / "bad"))
    shutil.copytree(clean_lake.root, bad.root)
    path = bad.stream_files("store_returns")[-1]  # the second arrival: in the interval's cycles
    t = pq.read_table(path)
    row = t.slice(0, 1).set_column(t.schema.get_field_index("sr_addr_sk"), "sr_addr_sk", pa.array([None], pa.int64()))
    pq.write_table(pa.concat_tables([t, row]), path)
    got = _run(spark, seed_query, bad, tmp_path / "bad", monkeypatch)
    assert got["rejects_on_exchange"] == [True]
    assert got["fingerprint"] == new["fingerprint"]  # a NULL key joins nothing
    r = row.to_pylist()[0]
    assert [(q[0], q[1].endswith(path)) for q in got["quarantine"]] == [("null_key", True)]
    assert got["quarantine"][0][2].startswith('{"ts":') and f'"sr_ticket_number":"{r["sr_ticket_number"]}"' in got["quarantine"][0][2]
    assert got["quarantined"]["sr"]["null_key"] == 1 and sum(n for s in got["quarantined"].values() for n in s.values()) == 1
    assert {s: n for s, n in got["rows_in"].items()} == new["rows_in"]


@pytest.mark.spark
def test_stream_batches_without_reject_columns_until_a_late_row(spark, seed_query, clean_lake, tmp_path, monkeypatch):
    """Per micro-batch on the Spark path: clean arrivals go without the reject columns; an arrival with a row
    before the watermark keeps them and quarantines it as late."""
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.results import result_fingerprint
    from mjoin.engine.runs import run_stream
    from mjoin.engine.batch import BatchRunner

    lake = Lake(str(tmp_path / "lake"))
    shutil.copytree(clean_lake.root, lake.root)
    late = pq.read_table(lake.stream_files("web_returns")[0]).slice(0, 1)  # event time at the interval's start
    write_stream_file(lake, "web_returns", T0 + 240, late)
    for i, a in enumerate(sorted({a for s in ("customer", "store_returns", "web_returns", "catalog_returns")
                                  for a in lake.arrivals(s)})):
        for f in glob.glob(os.path.join(lake.root, "streams", "*", f"arrival={a}", "*.parquet")):
            os.utime(f, ns=(0, (a * 1000 + i) * 10**6))
    seen = []
    route = BatchRunner.route_frame

    def spy(self, frame, keep=()):
        routed = route(self, frame, keep)
        seen.append("_reason" in routed.columns)
        return routed

    monkeypatch.setattr(BatchRunner, "route_frame", spy)
    run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, driver_rows=0, max_files_per_trigger=4))
    records = read_metrics(lake, seed_query.name)
    assert [r["batch_id"] for r in records] == [0, 1, 2]
    assert seen == [False, False, True]
    assert [sum(sum(q.values()) for q in r["quarantined"].values()) for r in records] == [0, 0, 1]
    assert records[2]["quarantined"]["wr"]["late"] == 1
    assert result_fingerprint(lake, seed_query.name)["rows"] > 0
