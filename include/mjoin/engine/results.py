"""Reading join results back: only committed batches (those with a ``_SUCCESS`` marker)."""
from __future__ import annotations

import json
import re

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .. import fsutil

BATCH_DIR = re.compile(r"^batch=(\d+)$")


def write_parquet(path: str, table: pa.Table, mtime_ms: int | None = None) -> None:
    """Write ``table`` as one Parquet file, atomically (replaces an earlier attempt's file)."""
    import os

    with fsutil.atomic_output(path) as sink:  # straight to the file: no copy of the encoded bytes in memory
        pq.write_table(table, sink, compression="zstd")
    if mtime_ms is not None and not fsutil.is_url(path):
        os.utime(fsutil.resolve(path)[1], ns=(0, mtime_ms * 1_000_000))


def _results_dir(path_or_lake, query) -> str:
    if isinstance(path_or_lake, tuple):
        path_or_lake, query = path_or_lake
    if query is not None:
        from ..lake import Lake

        lake = path_or_lake if isinstance(path_or_lake, Lake) else Lake(str(path_or_lake))
        return lake.results(query if isinstance(query, str) else query.name)
    return str(path_or_lake)


def committed_batches(path_or_lake_query, query=None) -> list[int]:
    root = _results_dir(path_or_lake_query, query)
    out = []
    for name in fsutil.listdir(root):
        m = BATCH_DIR.match(name)
        if m and fsutil.exists(fsutil.join(root, name, "_SUCCESS")):
            out.append(int(m.group(1)))
    return sorted(out)


def read_results_arrow(path_or_lake_query, query=None, *, with_batch: bool = False,
                       batches=None) -> pa.Table:
    root = _results_dir(path_or_lake_query, query)
    tables, columns = [], None
    for b in committed_batches(root):
        if batches is not None and b not in batches:
            continue
        d = fsutil.join(root, f"batch={b}")
        marker = json.loads(fsutil.read_text(fsutil.join(d, "_SUCCESS")))
        columns = columns or marker.get("columns")
        for name in fsutil.listdir(d):
            if name.endswith(".parquet"):
                fs, p = fsutil.resolve(fsutil.join(d, name))
                t = pq.read_table(p, filesystem=fs)
                if with_batch:
                    t = t.append_column("batch_id", pa.array([b] * t.num_rows, pa.int64()))
                tables.append(t)
    if not tables:
        names = (columns or []) + (["batch_id"] if with_batch else [])
        return pa.table({n: pa.array([], pa.null()) for n in names})
    return pa.concat_tables(tables, promote_options="default")


def read_results(path_or_lake_query, query=None, *, with_batch: bool = False, batches=None) -> pd.DataFrame:
    """Results of every committed batch as one DataFrame. ``path_or_lake_query``: a results
    folder (``<lake>/results/<query>``), a ``(lake, query)`` pair, or a lake with ``query``."""
    return read_results_arrow(path_or_lake_query, query, with_batch=with_batch, batches=batches).to_pandas()


def result_fingerprint(path_or_lake_query, query=None) -> dict:
    """An order-independent fingerprint of committed result rows over all output columns: the row count
    and the sum (mod 2^64) of per-row hashes (pandas' ``hash_pandas_object``): equal multisets of rows
    give equal fingerprints, whatever the batches, the files and the order. Read file by file (memory:
    one results file at a time)."""
    root = _results_dir(path_or_lake_query, query)

    def tables():
        for b in committed_batches(root):
            d = fsutil.join(root, f"batch={b}")
            for name in fsutil.listdir(d):
                if name.endswith(".parquet"):
                    fs, p = fsutil.resolve(fsutil.join(d, name))
                    yield pq.read_table(p, filesystem=fs)

    return fingerprint_tables(tables())


def fingerprint_tables(tables) -> dict:
    """:func:`result_fingerprint` of result rows given as tables (e.g. a reference query's, cast to the
    engine's result schema first). Each row is hashed on its own, so any split of the rows into tables
    gives the same sum; integer columns are hashed as float64 (NULL as NaN) whether or not a table has
    a NULL in them (pandas would type them by what each table holds)."""
    import numpy as np
    import pandas as pd
    import pyarrow.compute as pc

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
