"""The two layouts of results and quarantined rows (a batch's folder, a pipelined run's range folder with a
batch column) read by one reader each: committed batches only, a batch's own folder winning over a range,
subsets of batches, clearing a run's batches; a task's row files (few, deterministic names). No Spark."""
from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from mjoin.runtime import fsutil
from mjoin.engine import quarantine
from mjoin.engine.results import (BATCH_COLUMN, RowFiles, clear_batches, committed_batches, range_name,
                                  read_results_arrow, result_fingerprint, with_batch_column)
from mjoin.lake.layout import Lake


def _rows(batch: int, n: int, base: int = 0) -> pa.Table:
    return pa.table({"k": pa.array(range(base, base + n), pa.int64()), "v": pa.array([f"b{batch}"] * n)})


def _commit(folder, doc=None):
    fsutil.atomic_write_text(os.path.join(folder, "_SUCCESS"), json.dumps(doc or {"columns": ["k", "v"]}))


def test_row_files_write_few_files_with_deterministic_names(tmp_path):
    out = RowFiles(str(tmp_path / "r"), "s1-p00002", limit=5)
    for b in range(1, 6):  # 3 rows a batch: a file once 5 are buffered (after batches 2 and 4), the rest at close
        out.add(with_batch_column(_rows(b, 3, 10 * b), b))
    out.close()
    names = sorted(os.listdir(tmp_path / "r"))
    assert names == ["part-s1-p00002-000.parquet", "part-s1-p00002-001.parquet", "part-s1-p00002-002.parquet"]
    got = [pq.read_table(tmp_path / "r" / n).column(BATCH_COLUMN).to_pylist() for n in names]
    assert got == [[1, 1, 1, 2, 2, 2], [3, 3, 3, 4, 4, 4], [5, 5, 5]]
    assert out.flush() == 0.0 and sorted(os.listdir(tmp_path / "r")) == names  # nothing buffered: no file


def test_results_of_both_layouts_read_alike(tmp_path):
    root = tmp_path / "results"
    rng = root / range_name(1, 4)
    out = RowFiles(str(rng), "s1-p00000")
    for b in (1, 2, 4):  # batch 3 has no result
        out.add(with_batch_column(_rows(b, b), b))
    out.close()
    RowFiles(str(rng), "s2-p00001").close()  # a task without rows writes no file
    assert committed_batches(str(root)) == [] and read_results_arrow(str(root)).num_rows == 0  # not committed
    _commit(str(rng), {"batches": [1, 4], "rows": {"1": 1, "2": 2, "3": 0, "4": 4}, "columns": ["k", "v"]})
    assert committed_batches(str(root)) == [1, 2, 3, 4]
    t = read_results_arrow(str(root), with_batch=True)
    assert t.column_names == ["k", "v", "batch_id"] and t.column("batch_id").to_pylist() == [1, 2, 2, 4, 4, 4, 4]
    assert read_results_arrow(str(root), batches=[2, 3]).to_pylist() == _rows(2, 2).to_pylist()
    whole = result_fingerprint(str(root))
    assert whole["rows"] == 7
    # a later per-batch run of batch 2 (its own folder) wins over the range; an uncommitted one does not
    os.makedirs(root / "batch=2")
    pq.write_table(_rows(2, 5, 100), root / "batch=2" / "part-x.parquet")
    os.makedirs(root / "batch=5")
    pq.write_table(_rows(5, 1), root / "batch=5" / "part-x.parquet")
    assert committed_batches(str(root)) == [1, 2, 3, 4]
    _commit(str(root / "batch=2"))
    t = read_results_arrow(str(root), with_batch=True)
    assert [(r["batch_id"], r["k"]) for r in t.to_pylist() if r["batch_id"] == 2] == [(2, k) for k in range(100, 105)]
    assert result_fingerprint(str(root))["rows"] == 10 and read_results_arrow(str(root), batches=[4]).num_rows == 4
    # clearing batches 4..6 (a re-run from 4): the overlapping range goes, other batches' folders stay
    clear_batches(str(root), [4, 5, 6])
    assert sorted(os.listdir(root)) == ["batch=2"]
    clear_batches(str(root), [2])
    assert os.listdir(root) == [] and committed_batches(str(root)) == []


def test_quarantined_rows_of_both_layouts(tmp_path, seed_query):
    lake = Lake(str(tmp_path / "lake"))
    rows_dir = fsutil.join(lake.quarantine(seed_query.name, "sr"), "rows")

    def rejected(n, reason, tag):
        return pa.table({"reason": [reason] * n, "file": [f"/in/{tag}.parquet"] * n,
                         "row": [json.dumps({"ts": f"2026-01-01 00:00:0{i}.5", "sr_item_sk": str(i)}) for i in range(n)]})

    out = RowFiles(fsutil.join(rows_dir, range_name(0, 3)), "p00001")
    out.add(with_batch_column(rejected(2, "null_key", "a"), 1, "batch"))
    out.add(with_batch_column(pa.concat_tables([rejected(3, "null_key", "b"), rejected(1, "bad_type", "b")]), 3, "batch"))
    out.close()
    write = fsutil.join(rows_dir, "batch=5", "part-p00000.parquet")
    os.makedirs(os.path.dirname(write))
    pq.write_table(rejected(4, "late", "c"), write)
    got = quarantine.rejected_rows(lake, seed_query.name, "sr")
    assert got.column_names == ["batch", "reason", "file", "row"]
    assert sorted((r["batch"], r["reason"]) for r in got.to_pylist()) == \
        [(1, "null_key")] * 2 + [(3, "bad_type")] + [(3, "null_key")] * 3 + [(5, "late")] * 4
    listed = [(e.id, e.batch, e.reason, e.rows) for e in quarantine.entries(lake, seed_query) if e.kind == "rows"]
    assert listed == [("r-sr-1-null_key", 1, "null_key", 2), ("r-sr-3-bad_type", 3, "bad_type", 1),
                      ("r-sr-3-null_key", 3, "null_key", 3), ("r-sr-5-late", 5, "late", 4)]
    e = quarantine.find(lake, seed_query, "r-sr-3-null_key")
    got = quarantine.rows_of(e, seed_query)
    assert got.column("sr_item_sk").to_pylist() == [0, 1, 2] and got.column("sr_addr_sk").null_count == 3
    # the event time as Spark writes it (UTC, no zone): kept, so that a replay of the rows can be joined
    assert got.column("ts").type == pa.timestamp("us", tz="UTC")
    assert [t.isoformat() for t in got.column("ts").to_pylist()] == [f"2026-01-01T00:00:0{i}.500000+00:00" for i in range(3)]
    # a batch's own folder (a later per-batch run of batch 3) wins over the range
    write = fsutil.join(rows_dir, "batch=3", "part-p00000.parquet")
    os.makedirs(os.path.dirname(write))
    pq.write_table(rejected(1, "null_key", "d"), write)
    listed = [(e.id, e.rows, os.path.basename(e.path)) for e in quarantine.entries(lake, seed_query) if e.batch == 3]
    assert listed == [("r-sr-3-null_key", 1, "batch=3")]
    assert quarantine.rows_of(quarantine.find(lake, seed_query, "r-sr-3-null_key"), seed_query).num_rows == 1
