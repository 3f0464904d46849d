"""Reading a statistics history into the tidy frame the statistics and forecast gates check.

The stats job writes ``<lake>/stats/<query>/cycle=<epoch>/*.parquet`` (tidy rows,
``mjoin.statistics.ROW_COLUMNS``). Until its own reader is merged, this one reads
that layout with pyarrow datasets, and also a folder or list of statistics JSON
snapshots (``Statistics.save``), which is handy for hand-made test inputs.
"""
from __future__ import annotations

import pandas as pd

from .. import fsutil
from ..statistics import ROW_COLUMNS, Statistics


def read_history(path) -> pd.DataFrame:
    """Tidy statistics rows from a Parquet file or folder (hive ``cycle=`` partitions) or JSON snapshots."""
    import pyarrow.dataset as ds

    path = str(path)
    if not fsutil.exists(path):
        raise FileNotFoundError(f"{path}: no statistics history there")
    if fsutil.is_dir(path):
        names = _walk(path)
        parquet = [n for n in names if n.endswith(".parquet")]
        jsons = [n for n in names if n.endswith(".json")]
        if parquet:
            fs, p = fsutil.resolve(path)
            table = ds.dataset(p, filesystem=fs, format="parquet", partitioning="hive").to_table()
            return _normalize(table.to_pandas())
        if jsons:
            return _from_snapshots(jsons)
        return pd.DataFrame(columns=list(ROW_COLUMNS))
    if path.endswith(".json"):
        return _from_snapshots([path])
    fs, p = fsutil.resolve(path)
    return _normalize(ds.dataset(p, filesystem=fs, format="parquet").to_table().to_pandas())


def _walk(path: str) -> list[str]:
    out = []
    for name in fsutil.listdir(path):
        full = fsutil.join(path, name)
        if name.startswith((".", "_")):
            continue
        if fsutil.is_dir(full):
            out += _walk(full)
        else:
            out.append(full)
    return sorted(out)


def _from_snapshots(paths) -> pd.DataFrame:
    rows = [r for p in paths for r in Statistics.load(p).to_rows()]
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


def _normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Keep the tidy columns in their order (the hive partition column ``cycle`` is dropped)."""
    keep = [c for c in ROW_COLUMNS if c in df.columns]
    extra = [c for c in df.columns if c not in ROW_COLUMNS and c != "cycle"]
    out = df[keep + extra].copy()
    for c in ("entity", "stream", "right", "query"):
        if c in out and isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype(object)
    return out
