"""The Spark path's input read by its tasks with the driver's reader (the engine-throughput work on the input path, ``normalize.scan_streams``): the
frame equals Spark's file source and SQL projection (``normalize_streams(scan=False)``) and the driver's
``normalize_local`` row for row, column for column; an interval run on the Spark path equals the driver path's
(results fingerprint, counts, quarantine); a file whose data page is corrupt (footer fine) is quarantined
``unreadable`` by the Spark path too, and the other files' rows are joined."""
from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine_helpers import no_leaked_queries, replay_tpcds, write_null_time_copy
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import result_fingerprint
from mjoin.engine.runs import run_interval, run_stream
from mjoin.engine.interval import run_interval_plans
from mjoin.engine.compiled import EngineQuery
from mjoin.engine.frame import arrow_input_schema, payload_slots, to_layout
from mjoin.engine.normalize import (inspect_files, normalize_local, normalize_streams, scan_chunks, scan_ddl,
                                    scan_streams)
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.model.query import parse_query
from test_engine_interval_local import SEED_CFG, _both, _quarantine

pytestmark = pytest.mark.spark
_ = no_leaked_queries

T0 = 1_700_000_000_000_000
LATE = T0 + 30_000_000  # rows before it are late


def _query():
    streams = [{"name": name, "event_time": "ts", "window": "1m", "keys": ["k"],
                "columns": {"ts": "timestamp", "k": "long", "x": "long", "s": "string", "d": "double"}}
               for name in ("a", "b", "c")]
    return parse_query({"name": "sparkscan", "streams": streams, "predicates": ["a.k = b.k", "b.k = c.k"],
                        "output": ["a.x AS ax", "b.s AS bs", "c.d AS cd"]})


def _write(path, seed: int, n: int = 60, nulls: bool = False, narrow: bool = False) -> None:
    """A file of ``n`` rows; ``nulls``: NULL keys (every 5th row) and NULL event times (every 7th from the 3rd);
    ``narrow``: ``x`` as int32 (another schema: a second group of the stream)."""
    rng = np.random.default_rng(seed)
    ts = (T0 + rng.integers(0, 60_000_000, n)).astype("datetime64[us]")  # about half before LATE
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"ts": pa.array(ts, mask=(np.arange(n) % 7 == 3) if nulls else None),
                             "k": pa.array(rng.integers(0, 10, n), mask=(np.arange(n) % 5 == 0) if nulls else None),
                             "x": pa.array(rng.integers(0, 1000, n), pa.int32() if narrow else pa.int64()),
                             "s": pa.array([f"v{i}" for i in rng.integers(0, 99, n)]),
                             "d": pa.array(rng.random(n))}),
                   str(path), compression="none")
    os.utime(path, ns=(time.time_ns() - 60 * 10**9,) * 2)


@pytest.fixture(scope="module")
def small_lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("scan-lake")
    files = {}
    for i, s in enumerate(("a", "b", "c")):
        files[s] = []
        for j in range(7):
            p = root / s / f"arrival={j}" / "part-00000.parquet"
            _write(p, seed=10 * i + j, nulls=j % 2 == 1, narrow=(s == "a" and j >= 4))
            files[s].append(str(p))
    return files


def _sorted(t: pa.Table) -> pa.Table:
    """All columns in name order, nullable (Spark's plans differ in what they know never NULL), rows sorted."""
    t = t.select(sorted(t.column_names))
    t = t.cast(pa.schema([f.with_nullable(True) for f in t.schema]))
    return t.sort_by([(c, "ascending") for c in t.column_names])


def _file_url(t: pa.Table) -> pa.Table:
    """``_file`` spelled as the Arrow paths spell a local file (``file:///abs``; Spark's ``_metadata.file_path``
    writes ``file:/abs``, as on main the SQL path's and the driver path's quarantine rows differed)."""
    if "_file" not in t.column_names:
        return t
    import pyarrow.compute as pc

    fixed = pc.replace_substring_regex(t.column("_file"), "^file:/([^/])", "file:///\\1")
    return t.set_column(t.column_names.index("_file"), "_file", fixed)


def _in_slots(t: pa.Table, eq: EngineQuery) -> pa.Table:
    """Rows with payload by name (``normalize_streams``) in the input layout (payload in slots), as
    ``normalize_local`` gives them."""
    _, of = payload_slots(eq)
    s_col = t.column("_s").to_numpy()
    parts = []
    for si, s in enumerate(eq.streams):
        part = t.filter(pa.array(s_col == si))
        part = part.rename_columns([dict(of[s]).get(c, c) for c in part.column_names])
        parts.append(to_layout(part, arrow_input_schema(eq)))
    return pa.concat_tables(parts)


def test_the_scan_frame_equals_sparks_file_source_and_the_driver(spark, small_lake):
    q = _query()
    eq = EngineQuery.from_query(q)
    inspected = inspect_files(q, eq, small_lake)
    assert len(inspected.groups) == 4  # a's files in two schemas
    sql = normalize_streams(spark, q, eq, inspected, late_before=LATE, scan=False)
    scan = normalize_streams(spark, q, eq, inspected, late_before=LATE)
    assert "MapInArrow" in scan._jdf.queryExecution().executedPlan().toString()
    assert "MapInArrow" not in sql._jdf.queryExecution().executedPlan().toString()
    # the same columns of the same types, and the same rows
    assert sorted((f.name, f.dataType.simpleString()) for f in scan.schema.fields) == \
        sorted((f.name, f.dataType.simpleString()) for f in sql.schema.fields)
    got, want = _sorted(scan.toArrow()), _sorted(_file_url(sql.toArrow()))
    assert got.num_rows == 3 * 7 * 60 and got.equals(want)
    reasons = got.column("_reason").drop_null().to_pylist()
    assert {"null_key", "bad_time", "late"} <= set(reasons)
    # however the files are cut into tasks
    for tasks in (1, 3, 11):
        assert _sorted(scan_streams(spark, q, eq, inspected, LATE, tasks=tasks).toArrow()).equals(want)
    # and the driver's table, payload in its slots
    local = normalize_local(q, eq, inspect_files(q, eq, small_lake), late_before=LATE)
    assert _sorted(_in_slots(got, eq)).equals(_sorted(local))
    assert not inspected.rejects and inspected.collect_unreadable() == []


def test_files_no_row_of_which_can_be_rejected_give_no_reject_columns(spark, tmp_path):
    q = _query()
    eq = EngineQuery.from_query(q)
    files = {}
    for i, s in enumerate(("a", "b")):
        files[s] = [str(tmp_path / s / f"arrival={j}" / "part-00000.parquet") for j in range(3)]
        for j, p in enumerate(files[s]):
            _write(tmp_path / s / f"arrival={j}" / "part-00000.parquet", seed=i * 10 + j)
    inspected = inspect_files(q, eq, files)
    sql = normalize_streams(spark, q, eq, inspected, scan=False)
    scan = normalize_streams(spark, q, eq, inspected)
    assert "_reason" not in scan.columns and "_reason" not in sql.columns
    assert [n for n, _ in scan_ddl(eq, {"a", "b"}, False)] == scan.columns
    assert _sorted(scan.toArrow()).equals(_sorted(_file_url(sql.toArrow())))


def test_chunks_are_contiguous_and_balanced():
    chunks = scan_chunks([[100] * 360, [25] * 360, [50] * 360, [1] * 3], 4)
    # every file of every group exactly once, in order
    for g, n in enumerate((360, 360, 360, 3)):
        spans = [(a, b) for gi, a, b in chunks if gi == g]
        assert spans[0][0] == 0 and spans[-1][1] == n and all(b0 == a1 for (_, b0), (a1, _) in zip(spans, spans[1:]))
    sizes = [(b - a) * [100, 25, 50, 1][g] for g, a, b in chunks]
    assert len(chunks) <= 6 and max(sizes[:-1]) <= 2 * min(sizes[:-1])
    assert scan_chunks([[5, 5, 5]], 10) == [(0, 0, 1), (0, 1, 2), (0, 2, 3)]  # never more chunks than files


def _corrupt_page(path: str, column: str) -> None:
    """The first page header of ``column`` (a column the query reads) garbled; the footer still reads."""
    md = pq.read_metadata(path)
    chunk = md.row_group(0).column(md.schema.to_arrow_schema().get_field_index(column))
    offset = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xff" * 24)


@pytest.fixture(scope="module")
def broken_lake(tmp_path_factory):
    """TPC-DS sf 0.01 with NULL address keys, two NULL event times, and a store-returns file whose first data
    page is corrupt (its footer passes the contract); and the same lake without that file (its intact copy
    next to that lake's folder, ``original.parquet``)."""
    root = tmp_path_factory.mktemp("scan-broken")
    lake = Lake(str(root / "lake"))
    info = replay_tpcds(lake, 0.01, rate=10.0, arrival_cycle=20)
    write_null_time_copy(lake, lake.arrivals("web_returns")[4])
    broken = lake.stream_file("store_returns", lake.arrivals("store_returns")[6])
    clean = Lake(str(root / "clean"))
    import shutil

    shutil.copytree(lake.root, clean.root)
    shutil.move(clean.stream_file("store_returns", lake.arrivals("store_returns")[6]), root / "original.parquet")
    _corrupt_page(broken, "sr_addr_sk")
    return lake, clean, info, broken


def test_a_corrupt_file_is_quarantined_by_the_spark_path_as_on_the_driver(spark, seed_query, broken_lake, tmp_path):
    lake, clean, info, broken = broken_lake
    rows = pq.read_metadata(broken).num_rows
    start, end = info["start"] + 120, info["end"] + 1
    runs = _both(spark, seed_query, None, lake, start, end, 60, tmp_path, **SEED_CFG)
    x = runs["executors"]
    # the Spark path read its files in its own tasks: Spark's input rows are the chunk ids (one a task; plus
    # the ticks' task), not the files' rows
    stages = read_metrics(x.metrics_path)[0]["execution"]["spark_stages"]
    assert stages[0]["kind"] == "input" and 0 < stages[0]["input_rows"] < stages[0]["tasks"] <= 7
    assert x.quarantined["sr"]["unreadable"] == rows and x.quarantined["sr"]["null_key"] > 0
    assert x.quarantined["wr"]["bad_time"] == 2
    files = _quarantine(str(tmp_path / "executors"), seed_query)[1]
    (doc,) = files[("sr", "files-batch=1.json")]
    assert doc["path"] == broken and doc["reason"] == "unreadable" and doc["rule"] == "input.files_readable"
    assert doc["rows"] == rows and "not a readable Parquet file" in doc["detail"]
    # the other files' rows are joined: the results of the lake without the broken file
    ref = run_interval(spark, seed_query, None, clean, start, end, 60, str(tmp_path / "clean"),
                       config=EngineConfig(driver_rows=0, **SEED_CFG))
    assert x.result_rows == ref.result_rows > 200
    assert result_fingerprint(x.results_path) == result_fingerprint(ref.results_path)
    assert x.rows_in == ref.rows_in
    assert x.quarantined["sr"]["null_key"] == ref.quarantined["sr"]["null_key"]


def test_the_sql_path_is_kept_for_string_event_times(spark, tmp_path):
    """A stream whose event time is a string pattern is Spark's to parse: no scan."""
    spec = {"name": "strts", "streams": [
        {"name": "a", "event_time": {"column": "t", "format": "yyyy-MM-dd HH:mm:ss"}, "window": "1m", "keys": ["k"],
         "columns": {"t": "string", "k": "long"}},
        {"name": "b", "event_time": "ts", "window": "1m", "keys": ["k"], "columns": {"ts": "timestamp", "k": "long"}}],
        "predicates": ["a.k = b.k"], "output": ["a.k AS k"]}
    q = parse_query(spec)
    eq = EngineQuery.from_query(q)
    pa_path = tmp_path / "a" / "part-0.parquet"
    pa_path.parent.mkdir()
    pq.write_table(pa.table({"t": ["2024-01-01 00:00:01", "nope"], "k": pa.array([1, 2], pa.int64())}), str(pa_path))
    frame = normalize_streams(spark, q, eq, inspect_files(q, eq, {"a": [str(pa_path)]}))
    assert "MapInArrow" not in frame._jdf.queryExecution().executedPlan().toString()
    assert sorted(r["_reason"] or "" for r in frame.collect()) == ["", "bad_time"]


def test_a_corrupt_file_is_quarantined_when_several_plans_share_the_input(spark, seed_query, broken_lake, tmp_path):
    """``run_interval_plans`` routes the input once (``prepare_interval``): the file the tasks could not read is
    counted in every plan's batch 1 and listed in the rejected files."""
    lake, clean, info, broken = broken_lake
    rows = pq.read_metadata(broken).num_rows
    q = seed_query
    plans = {"p1": make_plan(q, orders_from_permutation(q, ["cu", "sr", "wr", "cr"]), "fixedOrder"),
             "p2": make_plan(q, orders_from_permutation(q, ["wr", "cr", "sr", "cu"]), "fixedOrder")}
    start, end = info["start"] + 120, info["end"] + 1
    runs = run_interval_plans(spark, q, plans, lake, start, end, 60, str(tmp_path / "out"),
                              config=EngineConfig(driver_rows=0, buckets=4))
    ref = run_interval(spark, q, plans["p1"], clean, start, end, 60, str(tmp_path / "clean"),
                       config=EngineConfig(driver_rows=0, buckets=4))
    for s in runs.values():
        assert s.quarantined["sr"]["unreadable"] == rows
        assert read_metrics(s.metrics_path)[0]["quarantined_files"][0]["path"] == broken
        assert s.result_rows == ref.result_rows and result_fingerprint(s.results_path) == result_fingerprint(ref.results_path)
    files = _quarantine(str(tmp_path / "out"), q)[1]
    assert [d["path"] for d in files[("sr", "files-batch=1.json")]] == [broken]


def test_a_corrupt_file_is_quarantined_by_a_streaming_batch_on_spark(spark, seed_query, broken_lake, tmp_path):
    """A micro-batch on Spark (``driver_rows=0``) quarantines the file its tasks could not read in that batch's
    counts and rejected files, as a batch on the driver does, and joins the rest the same; a repaired copy of the
    file (the same footer) landing next is read, not rejected as a duplicate of it (the file is not remembered)."""
    import shutil

    _, clean, _, _ = broken_lake
    last = clean.arrivals("store_returns")[-1]
    got = {}
    for where, rows in (("driver", 10**6), ("executors", 0)):
        copy = Lake(str(tmp_path / where))
        shutil.copytree(os.path.join(clean.root, "streams"), os.path.join(copy.root, "streams"))
        broken = copy.stream_file("store_returns", last)  # the newest: still remembered after the run
        _corrupt_page(broken, "sr_addr_sk")
        s = run_stream(spark, seed_query, copy, config=EngineConfig(buckets=4, driver_rows=rows,
                                                                    max_files_per_trigger=200))
        recs = read_metrics(copy, seed_query.name)
        assert {r["execution"]["where"] for r in recs} == {where}
        got[where] = (s.batches, [(r["rows_in"], r["quarantined"], r["result_rows"],
                                   [(os.path.basename(os.path.dirname(f["path"])), f["reason"], f["rows"])
                                    for f in r["quarantined_files"]]) for r in recs],
                      result_fingerprint(copy.results(seed_query.name)))
        files = [f for r in got[where][1] for f in r[3]]
        rows_broken = pq.read_metadata(broken).num_rows
        assert files == [(f"arrival={last}", "unreadable", rows_broken)], where
        # the repaired copy lands in a later arrival folder
        target = copy.stream_file("store_returns", last + 10)
        os.makedirs(os.path.dirname(target))
        shutil.copy(clean.stream_file("store_returns", last), target)
        os.utime(target, ns=(time.time_ns() - 60 * 10**9,) * 2)
        run_stream(spark, seed_query, copy, config=EngineConfig(buckets=4, driver_rows=rows))
        rec = read_metrics(copy, seed_query.name)[-1]
        assert rec["quarantined_files"] == [] and rec["quarantined"]["sr"]["duplicate_file"] == 0, where
        assert rec["rows_in"]["sr"] + sum(rec["quarantined"]["sr"].values()) == rows_broken, where
    assert got["driver"] == got["executors"]
