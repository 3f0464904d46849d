"""The driver's input read once: a group of same-schema files is read in one multi-threaded scan and
normalised as one table, exactly as file by file (rows, reasons, each rejected row's file and raw JSON); a file
whose data does not read (or is gone) is quarantined whole as ``unreadable`` while the others are read; and the
contract's footer facts are remembered per (path, size, mtime, inode) and read again when the file changes."""
from __future__ import annotations

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mjoin.lake import contract
from mjoin.engine.compiled import EngineQuery
from mjoin.engine.normalize import inspect_files, normalize_local
from mjoin.model.query import parse_query

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


def test_a_group_reads_each_files_declared_columns_whatever_their_order_or_nullability(tmp_path):
    """``read_group`` reads each file on its own: a file with its columns in another order, an extra column or a
    NOT NULL field gives its rows as the group's schema, in the order of the paths, with each row's file."""
    from mjoin.engine.normalize import read_group

    schema = pa.schema([("ts", pa.timestamp("us")), ("k", pa.int64()), ("s", pa.string())])
    plain = pa.table({"ts": pa.array([1, 2], pa.timestamp("us")), "k": [1, 2], "s": ["a", None]})
    other = pa.table({"s": ["x", "y", "z"], "extra": [0.5, 1.5, 2.5], "k": [7, 8, 9],
                      "ts": pa.array([3, 4, 5], pa.timestamp("us"))})
    strict = pa.table([pa.array([6], pa.timestamp("us")), pa.array([5]), pa.array(["q"])],
                      schema=pa.schema([pa.field(f.name, f.type, nullable=False) for f in schema]))
    paths = []
    for i, t in enumerate((other, plain, strict, plain.slice(0, 0))):
        paths.append(str(tmp_path / f"{i}.parquet"))
        pq.write_table(t, paths[-1])
    table, owner, failed = read_group(paths, schema)
    assert failed == [] and table.schema == schema
    assert table.column("k").to_pylist() == [7, 8, 9, 1, 2, 5]
    assert table.column("s").to_pylist() == ["x", "y", "z", "a", None, "q"]
    assert owner.tolist() == [0, 0, 0, 1, 1, 2]
