"""The driver's input read once (issue 15): a group of same-schema files is read in one multi-threaded scan and
normalised as one table, exactly as file by file (rows, reasons, each rejected row's file and raw JSON); a file
whose data does not read (or is gone) is quarantined whole as ``unreadable`` while the others are read; and the
contract's footer facts are remembered per (path, size, mtime, inode) and read again when the file changes."""
from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mjoin import contract
from mjoin.engine.compiled import EngineQuery
from mjoin.engine.normalize import inspect_files, normalize_local
from mjoin.query import parse_query

T0 = 1_700_000_000_000_000


def _query():
    streams = [{"name": name, "event_time": "ts", "window": "1m", "keys": ["k"],
                "columns": {"ts": "timestamp", "k": "long", "x": "long", "s": "string"}} for name in ("a", "b")]
    return parse_query({"name": "readonce", "streams": streams, "predicates": ["a.k = b.k"],
                        "output": ["a.x AS ax", "b.s AS bs"]})


def _write(path, seed: int, n: int = 40, null_keys: bool = False) -> None:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 10, n)
    mask = (np.arange(n) % 5 == 0) if null_keys else None
    ts = (T0 + rng.integers(0, 60_000_000, n)).astype("datetime64[us]")
    pq.write_table(pa.table({"ts": pa.array(ts, mask=(np.arange(n) % 7 == 3) if null_keys else None),
                             "k": pa.array(keys, mask=mask),
                             "x": pa.array(rng.integers(0, 1000, n)),
                             "s": pa.array([f"v{i}" for i in rng.integers(0, 99, n)])}),
                   path, compression="none")
    os.utime(path, ns=(time.time_ns() - 60 * 10**9,) * 2)  # settled (contract.SETTLED_NS)


def _lake(tmp_path, n_files: int = 4) -> dict:
    files = {}
    for i, s in enumerate(("a", "b")):
        paths = []
        for j in range(n_files):
            p = tmp_path / s / f"arrival={j}" / "part-00000.parquet"
            p.parent.mkdir(parents=True)
            _write(p, seed=10 * i + j, null_keys=j % 2 == 1)
            paths.append(str(p))
        files[s] = paths
    return files


def test_one_scan_per_group_gives_the_rows_of_a_read_file_by_file(tmp_path):
    q = _query()
    eq = EngineQuery.from_query(q)
    files = _lake(tmp_path)
    whole = normalize_local(q, eq, inspect_files(q, eq, files), late_before=T0 + 30_000_000)
    one_by_one = [normalize_local(q, eq, inspect_files(q, eq, {s: [p]}), late_before=T0 + 30_000_000)
                  for s in ("a", "b") for p in files[s]]
    assert whole.equals(pa.concat_tables(one_by_one))
    reasons = set(whole.column("_reason").drop_null().to_pylist())
    assert {"null_key", "bad_time", "late"} <= reasons
    bad = whole.filter(whole.column("_reason").is_valid())
    # every rejected row names its own file and carries its raw row; valid rows carry neither
    assert all(f.startswith("file://") and f.endswith(".parquet") for f in bad.column("_file").to_pylist())
    assert len(set(bad.column("_file").to_pylist())) == 2 * len(files["a"])
    assert all(r.startswith("{") and r.endswith("}") for r in bad.column("_raw").to_pylist())
    good = whole.filter(whole.column("_reason").is_null())
    assert good.column("_file").null_count == good.num_rows == good.column("_raw").null_count


def test_a_file_whose_data_does_not_read_is_quarantined_and_the_others_are_read(tmp_path):
    q = _query()
    eq = EngineQuery.from_query(q)
    files = _lake(tmp_path)
    broken, gone = files["a"][1], files["a"][2]
    with open(broken, "r+b") as fh:  # the first page header (after the magic) garbled; the footer still reads
        fh.seek(4)
        fh.write(b"\xff" * 24)
    inspected = inspect_files(q, eq, files)
    assert not inspected.rejects  # the footers pass the contract
    rows_before = inspected.rows
    os.remove(gone)  # gone since the contract read its footer
    table = normalize_local(q, eq, inspected)
    assert sorted((r.path, r.reason, r.rule) for r in inspected.rejects) == sorted(
        [(broken, "unreadable", "input.files_readable"), (gone, "unreadable", "input.files_readable")])
    assert all(r.rows == 40 and "not a readable Parquet file" in r.detail for r in inspected.rejects)
    assert inspected.rows == rows_before - 80
    ok = {s: [p for p in files[s] if p not in (broken, gone)] for s in files}
    assert table.equals(normalize_local(q, eq, inspect_files(q, eq, ok)))


def test_footer_facts_are_remembered_until_the_file_changes(tmp_path):
    q = _query()
    stream = q.stream("a")
    path = str(tmp_path / "part-00000.parquet")
    _write(path, seed=1)
    contract.FOOTERS.clear()
    first = contract.inspect_all([(path, stream, None)])[0]
    assert (contract.FOOTERS.hits, contract.FOOTERS.misses) == (0, 1)
    again = contract.inspect_all([(path, stream, None)])[0]
    assert contract.FOOTERS.hits == 1 and again == first and again is not first
    assert contract.inspect_all([(path, stream, None)], cache=False)[0] == first and contract.FOOTERS.hits == 1
    # the same file under other rules (another stream's declared columns) is inspected again
    other = contract.inspect_all([(path, q.stream("b"), None)])[0]
    assert contract.FOOTERS.misses == 2 and other.stream == "b"
    # rewritten (NULL keys now): another mtime, so read again, and the new facts are the file's
    _write(path, seed=1, null_keys=True)
    changed = contract.inspect_all([(path, stream, None)])[0]
    assert contract.FOOTERS.misses == 3
    assert changed.fingerprint != first.fingerprint and "NULL key" in changed.row_rejects and first.row_rejects is None
    # a file modified just now is not remembered (a change within the clock's resolution could keep its mtime)
    fresh = str(tmp_path / "fresh.parquet")
    _write(fresh, seed=2)
    os.utime(fresh)
    for _ in range(2):
        contract.inspect_all([(fresh, stream, None)])
    assert contract.FOOTERS.misses == 5
    # an unreadable file is never remembered
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    os.utime(junk, ns=(time.time_ns() - 60 * 10**9,) * 2)
    assert all(contract.inspect_all([(str(junk), stream, None)])[0].read_error for _ in range(2))
    assert contract.FOOTERS.misses == 7
    contract.FOOTERS.clear()


# ---- the reader: DuckDB's where it reads exactly as pyarrow does, pyarrow's elsewhere -----------------


def _typed_files(tmp_path, n_files: int = 5) -> tuple[list, pa.Schema]:
    """Files of every column type the DuckDB reader takes, NULLs in each column, one empty file, the columns in
    another order and an extra column in every other file."""
    import datetime as dt
    import decimal

    schema = pa.schema([("i64", pa.int64()), ("i32", pa.int32()), ("i16", pa.int16()), ("u8", pa.uint8()),
                        ("f32", pa.float32()), ("f64", pa.float64()), ("b", pa.bool_()), ("s", pa.string()),
                        ("d", pa.date32()), ("ts_us", pa.timestamp("us", tz="UTC")), ("ts_ms", pa.timestamp("ms")),
                        ("ts_s", pa.timestamp("s", tz="America/New_York")), ("dec", pa.decimal128(7, 2)),
                        ("dec38", pa.decimal128(38, 4))])
    paths = []
    for j in range(n_files):
        rng = np.random.default_rng(j)
        n = 0 if j == 2 else int(rng.integers(5, 50))
        mask = rng.random(n) < 0.2
        base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
        cols = {
            "i64": rng.integers(-2**62, 2**62, n), "i32": rng.integers(-2**31, 2**31, n).astype(np.int32),
            "i16": rng.integers(-2**15, 2**15, n).astype(np.int16), "u8": rng.integers(0, 256, n).astype(np.uint8),
            "f32": rng.random(n).astype(np.float32), "f64": rng.standard_normal(n), "b": rng.random(n) < 0.5,
            "s": [f"é{v}" for v in rng.integers(0, 10**6, n)], "d": [dt.date(2026, 1, 1 + int(v)) for v in rng.integers(0, 28, n)],
            "ts_us": [base + dt.timedelta(microseconds=int(v)) for v in rng.integers(0, 10**12, n)],
            "ts_ms": [dt.datetime(2026, 1, 1) + dt.timedelta(milliseconds=int(v)) for v in rng.integers(0, 10**9, n)],
            "ts_s": [base + dt.timedelta(seconds=int(v)) for v in rng.integers(0, 10**7, n)],
            "dec": [decimal.Decimal(int(v)) / 100 for v in rng.integers(-10**6, 10**6, n)],
            "dec38": [decimal.Decimal(int(v)) / 10**4 for v in rng.integers(-10**18, 10**18, n)]}
        arrays = {f.name: pa.array(cols[f.name], f.type, mask=mask) for f in schema}
        names = schema.names if j % 2 == 0 else list(reversed(schema.names)) + ["extra"]
        if j % 2:
            arrays["extra"] = pa.array(np.arange(n))
        p = tmp_path / f"arrival={j}" / "part-00000.parquet"
        p.parent.mkdir(parents=True)
        pq.write_table(pa.table({c: arrays[c] for c in names}), p, row_group_size=7)
        paths.append(str(p))
    return paths, schema


def test_the_duckdb_reader_gives_pyarrows_rows_types_and_file_order(tmp_path, monkeypatch):
    from mjoin.engine import normalize as N

    paths, schema = _typed_files(tmp_path)
    fs, rel = N.fsutil.resolve(paths[0])[0], [N.fsutil.resolve(p)[1] for p in paths]
    assert N._duckdb_can_read(fs, rel, schema)
    order = [paths[3], paths[0], paths[2], paths[4], paths[1]]  # file order is the caller's, not the names'
    duck, duck_owner = N._read_many(order, schema)
    monkeypatch.setenv("MJOIN_DUCKDB_READ", "0")
    assert not N._duckdb_can_read(fs, rel, schema)
    arrow, arrow_owner = N._read_many(order, schema)
    assert duck.num_rows > 50 and duck.schema == arrow.schema == schema
    assert duck.equals(arrow)
    np.testing.assert_array_equal(duck_owner, arrow_owner)
    assert list(dict.fromkeys(duck_owner.tolist())) == [0, 1, 3, 4]  # the empty file (index 2) has no rows


def test_the_reader_falls_back_to_pyarrow_where_duckdb_would_differ(tmp_path):
    from mjoin.engine import normalize as N

    ns = pa.schema([("k", pa.int64()), ("t", pa.timestamp("ns"))])
    named = pa.schema([("k", pa.int64()), ("file_index", pa.int64())])
    for i, schema in enumerate((ns, named)):
        p = tmp_path / f"f{i}[1].parquet"
        pq.write_table(pa.table({"k": [1, 2], schema.names[1]: pa.array([5, 6]).cast(schema.field(1).type)}), p)
        fs, rel = N.fsutil.resolve(str(p))
        assert not N._duckdb_can_read(fs, [rel], schema)
        t, owner = N._read_many([str(p)], schema)
        assert t.schema == schema and t.column(1).cast(pa.int64()).to_pylist() == [5, 6] and owner.tolist() == [0, 0]
    q = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"k": [1]}), q)
    fs, rel = N.fsutil.resolve(str(q))
    assert N._duckdb_can_read(fs, [rel], pa.schema([("k", pa.int64())]))
    assert not N._duckdb_can_read(fs, [rel.replace("plain", "pl*in")], pa.schema([("k", pa.int64())]))
