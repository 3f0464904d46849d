"""The statistics history the statistics and forecast gates check, as a tidy frame (``ROW_COLUMNS``).

Parquet histories written by the stats job (``<lake>/stats/<query>/cycle=<epoch>/``)
are read by the stats job's own reader (``mjoin.stats.history.read_history``);
this module adds statistics JSON snapshots (``Statistics.save``, one file or a
folder of them), handy for hand-made inputs to ``python -m mjoin check``.
"""
from __future__ import annotations

import pandas as pd

from .. import fsutil
from ..statistics import ROW_COLUMNS, Statistics


def read_history(path, query_name: str | None = None) -> pd.DataFrame:
    """Tidy statistics rows from a stats history folder (root or query folder) or JSON snapshots."""
    from ..stats.history import read_history as read_parquet_history

    path = str(path)
    if not fsutil.exists(path):
        raise FileNotFoundError(f"{path}: no statistics history there")
    if path.endswith(".json"):
        return _from_snapshots([path])
    names = fsutil.listdir(path)
    jsons = [fsutil.join(path, n) for n in names if n.endswith(".json") and not n.startswith((".", "_"))]
    if jsons and not any(n.startswith("cycle=") for n in names):
        return _from_snapshots(jsons)
    return read_parquet_history(path, query_name)


def _from_snapshots(paths) -> pd.DataFrame:
    rows = [r for p in sorted(paths) for r in Statistics.load(p).to_rows()]
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))
