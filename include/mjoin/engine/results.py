"""Join results: written per batch or per range of batches, read back for committed batches only.

Two layouts under ``<lake>/results/<query>/``, read by one reader (:func:`result_tables`):

- ``batch=<B>/part-*.parquet`` plus ``_SUCCESS`` (``{batch_id, rows, columns, plan_version}``): one batch
  (streaming micro-batches, per-batch interval runs, the spark-native baseline);
- ``batches=<F>-<L>/part-*.parquet`` with a column ``_batch`` (the batch of each row), plus one ``_SUCCESS``
  (``{batches: [F, L], rows: {B: rows}, columns, plan_version}``): every batch of a pipelined interval run
  (:meth:`mjoin.engine.pipelined.run_pipelined`), each task's rows of all its batches in few files
  (:class:`RowFiles`) instead of one file per batch and task.

A batch counts once its folder's ``_SUCCESS`` exists. A batch's own folder wins over a range that holds
it: only a later run of that batch can have written it (a pipelined run first clears the batch folders
and the overlapping ranges of its batches, :func:`clear_batches`). The quarantine's rejected rows
(:mod:`mjoin.engine.quarantine`) use the same two folder names.
"""
from __future__ import annotations

import json
import os
import re
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.lake.layout import Lake
from mjoin.runtime import fsutil

BATCH_DIR = re.compile(r"^batch=(\d+)$")
RANGE_DIR = re.compile(r"^batches=(\d+)-(\d+)$")
#: the batch of each row in a range folder's files
BATCH_COLUMN = "_batch"
#: a task's buffered rows are written as a file once they reach this many (bounds the task's memory)
FLUSH_ROWS = 262_144


def range_name(first: int, last: int) -> str:
    """The folder of batches ``first..last`` (one pipelined run): ``batches=<first>-<last>``."""
    return f"batches={int(first)}-{int(last)}"


def write_parquet(path: str, table: pa.Table, mtime_ms: int | None = None) -> None:
    """Write ``table`` as one Parquet file, atomically (replaces an earlier attempt's file)."""
    with fsutil.atomic_output(path) as sink:  # straight to the file: no copy of the encoded bytes in memory
        pq.write_table(table, sink, compression="zstd")
    if mtime_ms is not None and not fsutil.is_url(path):
        os.utime(fsutil.resolve(path)[1], ns=(0, mtime_ms * 1_000_000))


class RowFiles:
    """A task's rows of consecutive batches in few Parquet files of ``folder``: tables added batch after
    batch (each with its batch column) are buffered and written as ``part-<tag>-<n>.parquet`` once
    ``limit`` rows are buffered, and at :meth:`close`. The names are deterministic (a retried task writes
    the same rows at the same batch boundaries into the same names, replacing its files)."""

    def __init__(self, folder: str, tag: str, limit: int = FLUSH_ROWS):
        self.folder, self.tag, self.limit = folder, tag, limit
        self.buffer: list = []
        self.rows = 0
        self.files = 0

    def add(self, table: pa.Table) -> float:
        """Buffer ``table``; returns the seconds spent writing (a file when the buffer reached the limit)."""
        self.buffer.append(table)
        self.rows += table.num_rows
        return self.flush() if self.rows >= self.limit else 0.0

    def flush(self) -> float:
        if not self.buffer:
            return 0.0
        t0 = time.perf_counter()
        write_parquet(fsutil.join(self.folder, f"part-{self.tag}-{self.files:03d}.parquet"),
                      pa.concat_tables(self.buffer, promote_options="default"))
        self.buffer, self.rows = [], 0
        self.files += 1
        return time.perf_counter() - t0

    close = flush


def with_batch_column(table: pa.Table, batch: int, name: str = BATCH_COLUMN) -> pa.Table:
    """``table`` with a column ``name`` holding ``batch`` (int32) on every row."""
    return table.append_column(pa.field(name, pa.int32()), pa.array(np.full(table.num_rows, batch, np.int32)))


def clear_batches(folder: str, batches) -> None:
    """Remove from ``folder`` (results of a query, or a stream's quarantined rows) the folders of
    ``batches``: ``batch=<B>`` and every ``batches=<F>-<L>`` overlapping them (one listing)."""
    want = set(int(b) for b in batches)
    if not want:
        return
    for name in fsutil.listdir(folder):
        m, r = BATCH_DIR.match(name), RANGE_DIR.match(name)
        if (m and int(m.group(1)) in want) or (r and any(int(r.group(1)) <= b <= int(r.group(2)) for b in want)):
            fsutil.remove(fsutil.join(folder, name))


def batch_folders(folder: str, committed_only: bool = True) -> dict:
    """batch -> (its folder, whether a range folder) in ``folder`` (:func:`clear_batches`' layout), a batch's
    own folder winning over a range; ``committed_only``: only folders with a ``_SUCCESS``."""
    names = fsutil.listdir(folder)
    out = {}
    for name in names:
        r = RANGE_DIR.match(name)
        if r and (not committed_only or fsutil.exists(fsutil.join(folder, name, "_SUCCESS"))):
            for b in range(int(r.group(1)), int(r.group(2)) + 1):
                out[b] = (fsutil.join(folder, name), True)
    for name in names:
        m = BATCH_DIR.match(name)
        if m and (not committed_only or fsutil.exists(fsutil.join(folder, name, "_SUCCESS"))):
            out[int(m.group(1))] = (fsutil.join(folder, name), False)
    return out


def _results_dir(path_or_lake, query) -> str:
    if isinstance(path_or_lake, tuple):
        path_or_lake, query = path_or_lake
    if query is not None:
        lake = path_or_lake if isinstance(path_or_lake, Lake) else Lake(str(path_or_lake))
        return lake.results(query if isinstance(query, str) else query.name)
    return str(path_or_lake)


def committed_batches(path_or_lake_query, query=None) -> list[int]:
    """The batches whose results are committed, both layouts (a results folder, a (lake, query) pair, or a lake
    with ``query``)."""
    return sorted(batch_folders(_results_dir(path_or_lake_query, query)))


def result_tables(path_or_lake_query, query=None, *, batches=None, with_batch: bool = False):
    """The committed result rows (of ``batches``, default all), one table per file, in both layouts: the
    output columns only, plus ``batch_id`` (int64) with ``with_batch``. The one reader of results files
    (:func:`read_results_arrow`, :func:`result_fingerprint`); memory: one file at a time."""
    root = _results_dir(path_or_lake_query, query)
    folders = batch_folders(root)
    want = set(folders) if batches is None else set(folders) & {int(b) for b in batches}
    by_folder: dict = {}
    for b in sorted(want):
        by_folder.setdefault(folders[b], []).append(b)
    for (folder, ranged), bs in by_folder.items():
        for name in fsutil.listdir(folder):
            if not name.endswith(".parquet"):
                continue
            fs, p = fsutil.resolve(fsutil.join(folder, name))
            t = pq.read_table(p, filesystem=fs)
            if ranged:
                # the range's batches wanted and not held by a folder of their own
                t = t.filter(pc.is_in(t.column(BATCH_COLUMN), value_set=pa.array(bs, pa.int32())))
                b_col = t.column(BATCH_COLUMN)
                t = t.drop_columns([BATCH_COLUMN])
                if with_batch:
                    t = t.append_column("batch_id", pc.cast(b_col, pa.int64()))
            elif with_batch:
                t = t.append_column("batch_id", pa.array(np.full(t.num_rows, bs[0], np.int64)))
            yield t


def _columns(root) -> list | None:
    """The output columns a committed batch's ``_SUCCESS`` names (for an empty result), or None."""
    for folder, _ in batch_folders(root).values():
        return json.loads(fsutil.read_text(fsutil.join(folder, "_SUCCESS"))).get("columns")
    return None


def read_results_arrow(path_or_lake_query, query=None, *, with_batch: bool = False,
                       batches=None) -> pa.Table:
    """Results of the committed batches (``batches``: only those) as one Arrow table, in batch order."""
    root = _results_dir(path_or_lake_query, query)
    tables = list(result_tables(root, batches=batches, with_batch=True))
    if not tables:
        names = (_columns(root) or []) + (["batch_id"] if with_batch else [])
        return pa.table({n: pa.array([], pa.null()) for n in names})
    t = pa.concat_tables(tables, promote_options="default")
    t = t.take(pc.sort_indices(t.column("batch_id")))  # stable: within a batch, the files' order
    return t if with_batch else t.drop_columns(["batch_id"])


def read_results(path_or_lake_query, query=None, *, with_batch: bool = False, batches=None):
    """Results of every committed batch as one pandas DataFrame. ``path_or_lake_query``: a results
    folder (``<lake>/results/<query>``), a ``(lake, query)`` pair, or a lake with ``query``."""
    return read_results_arrow(path_or_lake_query, query, with_batch=with_batch, batches=batches).to_pandas()


def result_fingerprint(path_or_lake_query, query=None) -> dict:
    """An order-independent fingerprint of committed result rows over all output columns: the row count
    and the sum (mod 2^64) of per-row hashes (pandas' ``hash_pandas_object``): equal multisets of rows
    give equal fingerprints, whatever the batches, the files, the layout and the order. Read file by file
    (memory: one results file at a time)."""
    return fingerprint_tables(result_tables(path_or_lake_query, query))


def fingerprint_tables(tables) -> dict:
    """:func:`result_fingerprint` of result rows given as tables (e.g. a reference query's, cast to the
    engine's result schema first). Each row is hashed on its own, so any split of the rows into tables
    gives the same sum; integer columns are hashed as float64 (NULL as NaN) whether or not a table has
    a NULL in them (pandas would type them by what each table holds)."""
    rows, total = 0, 0
    for t in tables:
        if not t.num_rows:
            continue
        cols = {}
        for name in sorted(t.column_names):
            c = t.column(name)
            cols[name] = pc.cast(c, pa.float64()) if pa.types.is_integer(c.type) else c
        df = pa.table(cols).to_pandas()
        h = pd.util.hash_pandas_object(df, index=False).to_numpy(dtype=np.uint64)
        total = (total + int(h.sum(dtype=np.uint64))) % (1 << 64)
        rows += len(df)
    return {"rows": rows, "hash_sum": f"{total:016x}"}
