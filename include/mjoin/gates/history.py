"""The statistics history the statistics and forecast gates check, as a tidy frame (``ROW_COLUMNS``).

Parquet histories written by the stats job (``<lake>/stats/<query>/cycle=<epoch>/``)
are read by the stats job's own reader (``mjoin.stats.history.read_history``);
this module adds statistics JSON snapshots (``Statistics.save``, one file or a
folder of them), handy for hand-made inputs to ``python -m mjoin check``.
"""
from __future__ import annotations

import pandas as pd

from mjoin.model.statistics import ROW_COLUMNS, Statistics
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil
from mjoin.stats.history import read_history as read_parquet_history


def read_history(path, query_name: str | None = None) -> pd.DataFrame:
    """Tidy statistics rows from a stats history folder (root or query folder) or JSON snapshots.

    A Parquet history comes with its cycles' metadata in ``attrs["cycles"]`` (the partitioning each
    cycle was computed with: the statistics and forecast gates expect its key groups); JSON
    snapshots that name a partitioning record it the same way."""
    path = str(path)
    if not fsutil.exists(path):
        raise FileNotFoundError(f"{path}: no statistics history there")
    if path.endswith(".json"):
        return _from_snapshots([path])
    names = fsutil.listdir(path)
    jsons = [fsutil.join(path, n) for n in names if n.endswith(".json") and not n.startswith((".", "_"))]
    if jsons and not any(n.startswith("cycle=") for n in names):
        return _from_snapshots(jsons)
    return read_parquet_history(path, query_name, meta=True)


def _from_snapshots(paths) -> pd.DataFrame:
    snaps = [Statistics.load(p) for p in sorted(paths)]
    frame = pd.DataFrame([r for s in snaps for r in s.to_rows()], columns=list(ROW_COLUMNS))
    # a snapshot's partitioning None may mean "none" or "not said" (hand-made): recorded only when set
    frame.attrs["cycles"] = {iso(s.cycle_start): {"partitioning": s.partitioning} for s in snaps
                             if s.cycle_start and s.partitioning is not None}
    return frame
