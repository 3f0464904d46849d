"""TPC-DS workloads at sf=0.01: stream files against DuckDB's own tables, determinism, replay clocks."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest

from mjoin.model.timeutil import to_micros
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.tpcds_replay import generate_tpcds
from mjoin.workloads.manifest import load_manifest
from mjoin.workloads.tpcds_cache import STREAM_TABLES, ensure_tables

SF = 0.01
CYCLE = "60s"  # 60 cycles over the default 1 h replay: fewer tiny files keep the tests fast
START = "2026-01-01T00:00:00Z"
KEYS = {"customer": ["c_customer_sk", "c_current_addr_sk"], "store_returns": ["sr_addr_sk", "sr_customer_sk"],
        "web_returns": ["wr_refunded_addr_sk"], "catalog_returns": ["cr_refunded_addr_sk"]}
PK = {"customer": "c_customer_sk", "store_returns": "sr_item_sk, sr_ticket_number",
      "web_returns": "wr_item_sk, wr_order_number", "catalog_returns": "cr_item_sk, cr_order_number"}


@pytest.fixture(scope="session")
def dsdgen():
    """DuckDB's own TPC-DS tables, generated here independently of the workload cache."""
    import duckdb_extension_tpcds

    ext = os.path.join(os.path.dirname(duckdb_extension_tpcds.__file__), "extensions/v1.5.5/tpcds.duckdb_extension")
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                                 "allow_unsigned_extensions": True})
    con.execute(f"LOAD '{ext}'")
    con.execute(f"CALL dsdgen(sf={SF})")
    yield con
    con.close()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One dsdgen cache per test session, shared by every workloads test module (fixed folder name)."""
    root = tmp_path_factory.getbasetemp() / "tpcds-cache"
    ensure_tables(SF, root)
    return root


@pytest.fixture(scope="session")
def paper(tmp_path_factory, cache_dir):
    return generate_tpcds(tmp_path_factory.mktemp("wl") / "paper", sf=SF, cache_dir=cache_dir, seed=7, cycle=CYCLE)


@pytest.fixture(scope="session")
def event_time(tmp_path_factory, cache_dir):
    return generate_tpcds(tmp_path_factory.mktemp("wl") / "event", sf=SF, cache_dir=cache_dir, replay="event-time", seed=7,
                         cycle=CYCLE)


def scan(manifest, source):
    """DuckDB table function over every file of a source (arrival= folders not read as a column)."""
    return f"read_parquet('{os.path.join(manifest.root, 'streams', source, '*', '*.parquet')}', hive_partitioning=false)"


def _read_in_order(manifest, source):
    """All rows of a source in arrival order (files by arrival epoch, rows in file order)."""
    import pyarrow as pa

    tables = [pq.read_table(os.path.join(manifest.root, "streams", source, f"arrival={a}", "part-00000.parquet"))
              for a in manifest.arrivals(source)]
    return pa.concat_tables(tables)


def tree_hashes(root):
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ---- content: row counts, NULL keys, every row of every table --------------------

@pytest.mark.parametrize("table", STREAM_TABLES)
def test_paper_stream_rows_equal_source_table(paper, dsdgen, table):
    expected = dsdgen.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    got = duckdb.connect().execute(f"SELECT count(*) FROM {scan(paper, table)}").fetchone()[0]
    assert got == expected == paper.rows(table) == paper.source(table)["source_rows"]
    assert paper.source(table)["rejected"]["rows"] == 0


@pytest.mark.parametrize("table", STREAM_TABLES)
def test_paper_stream_holds_exactly_the_source_rows(paper, dsdgen, table):
    """Multiset equality (EXCEPT ALL both ways) of the stream without ts and DuckDB's table."""
    dsdgen.execute(f"CREATE OR REPLACE TEMP VIEW s AS SELECT * EXCLUDE (ts) FROM {scan(paper, table)}")
    assert dsdgen.execute(f"SELECT count(*) FROM (SELECT * FROM s EXCEPT ALL SELECT * FROM {table})").fetchone()[0] == 0
    assert dsdgen.execute(f"SELECT count(*) FROM (SELECT * FROM {table} EXCEPT ALL SELECT * FROM s)").fetchone()[0] == 0


@pytest.mark.parametrize("table", STREAM_TABLES)
def test_null_key_counts_match_manifest_and_source(paper, event_time, dsdgen, table):
    for col in KEYS[table]:
        in_source = dsdgen.execute(f"SELECT count(*) FROM {table} WHERE {col} IS NULL").fetchone()[0]
        for m in (paper, event_time):
            in_files = duckdb.connect().execute(
                f"SELECT count(*) FROM {scan(m, table)} WHERE {col} IS NULL").fetchone()[0]
            assert m.source(table)["null_keys"][col] == in_files
        assert paper.source(table)["null_keys"][col] == in_source
    if table == "store_returns":
        assert paper.source(table)["null_keys"]["sr_addr_sk"] > 0  # the case is exercised at this scale


# ---- determinism ------------------------------------------------------------------

def test_generation_is_deterministic(tmp_path, paper):
    """A fresh dsdgen cache and a second generation give byte-identical files (manifest included)."""
    again = generate_tpcds(tmp_path / "again", sf=SF, cache_dir=tmp_path / "cache2", seed=7, cycle=CYCLE)
    assert tree_hashes(again.root) == tree_hashes(paper.root)
    other = generate_tpcds(tmp_path / "other", sf=SF, cache_dir=tmp_path / "cache2", seed=8, cycle=CYCLE)
    assert tree_hashes(other.root) != tree_hashes(paper.root)
    assert {s: other.rows(s) for s in other.sources} == {s: paper.rows(s) for s in paper.sources}


def test_dsdgen_cache_is_deterministic(tmp_path, cache_dir):
    ensure_tables(SF, tmp_path)
    for table in STREAM_TABLES + ("date_dim", "time_dim"):
        a = pq.read_table(Path(cache_dir) / "tpcds" / f"sf={SF:g}" / f"{table}.parquet")
        b = pq.read_table(tmp_path / "tpcds" / f"sf={SF:g}" / f"{table}.parquet")
        assert a.equals(b), table


# ---- the paper's replay clock ----------------------------------------------------------

def test_paper_ts_is_the_interleaving_clock(paper):
    """Over all sources, the ts are exactly start + floor(i * 1e6 / rate) for i = 0..N-1."""
    rate = paper.parameters["rate"]
    total = sum(paper.rows(s) for s in paper.sources)
    all_ts = np.sort(np.concatenate([_read_in_order(paper, s).column("ts").cast("int64").to_numpy() for s in paper.sources]))
    expected = to_micros(START) + np.floor(np.arange(total) * (1e6 / rate)).astype(np.int64)
    np.testing.assert_array_equal(all_ts, expected)
    assert abs(total / rate - 3600) < 1e-6  # default: the replay lasts an hour


@pytest.mark.parametrize("fixture", ["paper", "event_time"])
def test_ts_within_range_and_nondecreasing_with_arrival(request, fixture):
    m = request.getfixturevalue(fixture)
    start_us, end_us = to_micros(m.doc["start"]), to_micros(m.doc["end"])
    for s in m.sources:
        prev = None
        for a in m.arrivals(s):
            tbl = pq.read_table(os.path.join(m.root, "streams", s, f"arrival={a}", "part-00000.parquet"))
            ts = tbl.column("ts").cast("int64").to_numpy()
            assert tbl.schema.field("ts").type.tz == "UTC" and tbl.schema.field("ts").type.unit == "us"
            assert len(ts) > 0 and np.all(np.diff(ts) >= 0)
            assert ts.min() >= start_us and ts.max() < end_us
            assert ts.min() >= a * 1_000_000 and ts.max() < (a + m.cycle_seconds) * 1_000_000  # right arrival folder
            assert prev is None or ts[0] >= prev
            prev = ts[-1]


def test_paper_interleaving_mixes_the_sources(paper):
    """Not one table after the other: each source spreads over the horizon, and sources switch
    about as often as in a random sequence (N * (1 - sum p^2))."""
    rows = []
    for s in paper.sources:
        ts = _read_in_order(paper, s).column("ts").cast("int64").to_numpy()
        rows.append(np.stack([ts, np.full(len(ts), paper.sources.index(s))], axis=1))
        first_half = np.mean(ts < to_micros(START) + 1800 * 1_000_000)
        assert 0.42 < first_half < 0.58, s
    seq = np.concatenate(rows)
    seq = seq[np.argsort(seq[:, 0], kind="stable"), 1]
    switches = int(np.sum(seq[1:] != seq[:-1]))
    p = np.bincount(seq) / len(seq)
    expected = (len(seq) - 1) * (1 - np.sum(p ** 2))
    assert abs(switches - expected) < 0.1 * expected


# ---- event-time replay ----------------------------------------------------------------

def test_event_time_sorted_and_consistent_with_date_and_time_dim(event_time, dsdgen):
    replay = event_time.doc["replay"]
    origin = to_micros(replay["calendar_origin"]) // 1_000_000
    speedup = replay["speedup"]
    start_us = to_micros(event_time.doc["start"])
    for table, (dcol, tcol) in {"store_returns": ("sr_returned_date_sk", "sr_return_time_sk"),
                                "web_returns": ("wr_returned_date_sk", "wr_returned_time_sk"),
                                "catalog_returns": ("cr_returned_date_sk", "cr_returned_time_sk")}.items():
        got = _read_in_order(event_time, table)
        ts = got.column("ts").cast("int64").to_numpy()
        assert np.all(np.diff(ts) >= 0)
        dsdgen.register("got", got)
        # the expected simulated time of every streamed row, from DuckDB's own dimensions
        cmp = dsdgen.execute(f"""
            SELECT epoch_us(g.ts) AS ts, epoch(d.d_date::TIMESTAMP)::BIGINT + t.t_time AS ev
            FROM got g JOIN date_dim d ON d.d_date_sk = g.{dcol} JOIN time_dim t ON t.t_time_sk = g.{tcol}""").df()
        assert len(cmp) == got.num_rows  # every streamed row has a date and a time
        expected = start_us + np.floor((cmp["ev"].to_numpy() - origin) * (1e6 / speedup)).astype(np.int64)
        np.testing.assert_array_equal(cmp["ts"].to_numpy(), expected)
        dsdgen.unregister("got")
        no_time = dsdgen.execute(f"""SELECT count(*) FROM {table} r LEFT JOIN date_dim d ON d.d_date_sk = r.{dcol}
            LEFT JOIN time_dim t ON t.t_time_sk = r.{tcol} WHERE d.d_date IS NULL OR t.t_time IS NULL""").fetchone()[0]
        info = event_time.source(table)
        assert info["rejected"]["rows"] == no_time == sum(info["rejected"]["reasons"].values())
        assert info["rows"] + info["rejected"]["rows"] == info["source_rows"]
        if no_time:
            rej = pq.read_table(os.path.join(event_time.root, info["rejected"]["file"]))
            assert rej.num_rows == no_time and "reject_reason" in rej.column_names
    assert event_time.source("store_returns")["rejected"]["rows"] > 0  # exercised at this scale


def test_event_time_customer_uniform_over_horizon(event_time):
    ts = _read_in_order(event_time, "customer").column("ts").cast("int64").to_numpy()
    start_us, end_us = to_micros(event_time.doc["start"]), to_micros(event_time.doc["end"])
    assert len(ts) == event_time.rows("customer") == event_time.source("customer")["source_rows"]
    hist, _ = np.histogram(ts, bins=10, range=(start_us, end_us))
    assert hist.min() >= 0.9 * len(ts) / 10 and hist.max() <= 1.1 * len(ts) / 10


def test_event_time_speedup_and_rate_options(tmp_path, cache_dir, event_time):
    m = generate_tpcds(tmp_path / "fast", sf=SF, cache_dir=cache_dir, replay="event-time", duration="10m", cycle=CYCLE)
    assert m.end_epoch - m.start_epoch == pytest.approx(600, abs=1e-3)
    assert m.doc["replay"]["speedup"] == pytest.approx(event_time.doc["replay"]["speedup"] * 6)
    by_rate = generate_tpcds(tmp_path / "rate", sf=SF, cache_dir=cache_dir, replay="event-time", rate=5, cycle=CYCLE)
    streamed = sum(by_rate.rows(s) for s in by_rate.sources)
    assert by_rate.parameters["rate"] == pytest.approx(5, rel=1e-4)  # the mean total rate
    assert by_rate.end_epoch - by_rate.start_epoch == pytest.approx(streamed / 5, abs=1e-3)
    start = generate_tpcds(tmp_path / "start", sf=SF, cache_dir=cache_dir, replay="event-time",
                           customer_arrival="start", speedup=1e6, cycle="5m")
    ts = _read_in_order(start, "customer").column("ts").cast("int64").to_numpy()
    assert np.all(ts == to_micros(START)) and start.arrivals("customer") == [to_micros(START) // 1_000_000]


# ---- spec compatibility and validation -------------------------------------------------

def test_streams_fit_the_shipped_specs(paper, seed_query, two_class_query):
    from mjoin.workloads.streamfiles import spec_mismatches

    assert set(paper.doc["queries"]) == {seed_query.name, two_class_query.name}
    for q in paper.queries():
        for s in q.streams:
            schema = pq.read_schema(os.path.join(paper.root, "streams", s.source, f"arrival={paper.arrivals(s.source)[0]}",
                                                 "part-00000.parquet"))
            assert spec_mismatches(schema, s) == []
            for k in s.keys:
                assert str(schema.field(k).type) == "int64"


@pytest.mark.spark
def test_spark_reads_keys_as_long_and_ts_as_timestamp(spark, paper, seed_query):
    for s in seed_query.streams:
        df = spark.read.parquet(os.path.join(paper.root, "streams", s.source))
        types = dict(df.dtypes)
        assert types["ts"] == "timestamp" and all(types[k] == "bigint" for k in s.keys)
        assert df.count() == paper.rows(s.source)
        assert sorted(r.arrival for r in df.select("arrival").distinct().collect()) == paper.arrivals(s.source)
    first = spark.read.parquet(os.path.join(paper.root, "streams", "customer")).agg({"ts": "min"}).collect()[0][0]
    assert first.isoformat().startswith("2026-01-01T00:00")


@pytest.mark.parametrize("kwargs, field", [
    ({"sf": 0.001}, "--sf"), ({"sf": "big"}, "--sf"), ({"replay": "random"}, "--replay"),
    ({"rate": 10, "duration": "1h"}, "--duration"), ({"speedup": 100}, "--speedup"), ({"rate": -1}, "--rate"),
    ({"rate": 1e9}, "--rate"), ({"cycle": "2.5s"}, "--cycle"), ({"cycle": "0s"}, "--cycle"), ({"start": "noon"}, "--start"),
    ({"seed": -3}, "--seed"), ({"duration": "forever"}, "--duration"), ({"customer_arrival": "start"}, "--customer-arrival"),
])
def test_bad_parameters_are_rejected_with_the_parameter_named(tmp_path, cache_dir, kwargs, field):
    with pytest.raises(WorkloadError) as exc:
        generate_tpcds(tmp_path / "w", cache_dir=cache_dir, **{"sf": SF, **kwargs})
    assert exc.value.field == field
    assert not (tmp_path / "w").exists()


def test_out_folder_rules(tmp_path, cache_dir, paper):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    with pytest.raises(WorkloadError, match="not a workload"):
        generate_tpcds(junk, sf=SF, cache_dir=cache_dir)
    assert (junk / "notes.txt").read_text() == "mine"
    w = generate_tpcds(tmp_path / "w", sf=SF, cache_dir=cache_dir, rate=100, cycle="5m")
    with pytest.raises(WorkloadError, match="--overwrite"):
        generate_tpcds(tmp_path / "w", sf=SF, cache_dir=cache_dir)
    again = generate_tpcds(tmp_path / "w", sf=SF, cache_dir=cache_dir, rate=50, overwrite=True, cycle="5m")
    assert again.parameters["rate"] == 50 and w.parameters["rate"] == 100
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_manifest_is_validated_on_read(tmp_path, paper):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(paper.root, copy)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["cycle_seconds"] = 0
    (copy / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(WorkloadError, match="cycle_seconds"):
        load_manifest(copy)
    with pytest.raises(WorkloadError, match="not a workload"):
        load_manifest(tmp_path / "nowhere")
