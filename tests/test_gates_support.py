"""Builders of good inputs for the gate tests (no tests here): statistics, forecasts, plans, landed files.

Tests start from these good inputs and break exactly one thing each.
"""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from mjoin.lake.contract import FUTURE_CYCLES
from mjoin.model.statistics import ROW_COLUMNS, EdgeStats, GroupStats, Statistics, StreamStats
from mjoin.model.timeutil import cycles, iso, to_epoch

T0 = "2026-01-01T00:00:00Z"
CYCLE = 60.0
EPOCH0 = int(to_epoch(T0))


def snapshot(query, cycle_start, *, kind="measured", groups=(0,), seed=0, scale=1.0) -> Statistics:
    """Plausible statistics of one cycle: every stream and directed edge, values in range, a little noise."""
    rng = np.random.default_rng(seed)
    out = {}
    for g in groups:
        gs = GroupStats()
        for i, s in enumerate(query.stream_names):
            w = float(round(scale * (1000 + 100 * i) * (1 + 0.02 * rng.standard_normal())))
            gs.streams[s] = StreamStats(lam=float(w / 300), kappa=float(round(w * 0.4)), window_tuples=w,
                                        tuples=float(round(w / 5)))
        for j, (l, r) in enumerate(query.directed_edges):
            gamma = float(np.clip(0.2 + 0.03 * j + 0.01 * rng.standard_normal(), 0.01, 0.99))
            mu = float(1.2 + 0.1 * j + 0.02 * abs(rng.standard_normal()))
            gs.edges[(l, r)] = EdgeStats(gamma=gamma, mu=mu)
        out[g] = gs
    return Statistics(query=query.name, groups=out, kind=kind, cycle_start=iso(cycle_start), cycle_seconds=CYCLE)


def history(query, n_cycles: int, *, start=T0, groups=(0,)) -> pd.DataFrame:
    """Tidy rows (ROW_COLUMNS) of ``n_cycles`` consecutive good cycles from ``start``."""
    starts = cycles(start, to_epoch(start) + n_cycles * CYCLE, CYCLE)
    rows = [r for i, c in enumerate(starts) for r in snapshot(query, c, groups=groups, seed=i).to_rows()]
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))


def cycle_iso(k: int) -> str:
    """Start of cycle k after T0."""
    return iso(EPOCH0 + k * CYCLE)


def select(frame: pd.DataFrame, *, entity=None, stream=None, right=None, cycle=None):
    """Boolean mask of the rows of one stream / edge (and cycle)."""
    m = pd.Series(True, index=frame.index)
    if entity is not None:
        m &= frame["entity"] == entity
    if stream is not None:
        m &= frame["stream"] == stream
    if right is not None:
        m &= frame["right"] == right
    if cycle is not None:
        m &= frame["cycle_start"] == cycle
    return m


# ---- landed files ----------------------------------------------------------------------------

def write_stream_file(lake, query, stream: str, arrival: int, n: int, *, part: int = 0, seed: int = 0,
                      null_keys: int = 0, late: int = 0, future: int = 0, late_by: float = 3600.0,
                      overrides: dict | None = None, drop: tuple = (),
                      statistics: bool = True, cycle: float = CYCLE) -> str:
    """A Parquet file of ``n`` rows for ``stream`` in arrival cycle ``arrival``: the declared columns
    (int64 keys, UTC timestamps inside the arrival cycle) plus an extra column, with the first
    ``null_keys`` keys NULL, ``late`` rows ``late_by`` seconds before ``arrival`` and ``future``
    rows 30 s after the landing contract's future bound (``arrival`` + two arrival cycles: the lake's
    cycle is ``cycle``)."""
    rng = np.random.default_rng(seed)
    s = query.stream(stream)
    cols = {}
    for c, t in s.columns.items():
        if c in drop:
            continue
        if overrides and c in overrides:
            cols[c] = overrides[c]
            continue
        if t == "timestamp":
            ts = arrival + rng.uniform(0, cycle - 1, n)
            ts[:late] = arrival - late_by
            if future:
                ts[late:late + future] = arrival + FUTURE_CYCLES * cycle + 30
            cols[c] = pa.array((ts * 1e6).astype("int64"), pa.timestamp("us", tz="UTC"))
        else:
            mask = np.zeros(n, bool)
            if c in s.keys:
                mask[:null_keys] = True
            cols[c] = pa.array(rng.integers(1, 500, n).astype("int64"), pa.int64(), mask=mask)
    cols["extra_payload"] = pa.array([f"row{i}" for i in range(n)])
    path = lake.stream_file(s.source, arrival, part)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table(cols), path, write_statistics=statistics)
    return path


def good_lake(lake, query, n_cycles: int = 2, rows: int = 50, first: int = 0) -> None:
    """Every stream lands one good file in each of ``n_cycles`` cycles from cycle ``first`` after T0
    (negative: before T0, e.g. the streams' history before an interval starting at T0)."""
    for k in range(first, first + n_cycles):
        for i, s in enumerate(query.stream_names):
            write_stream_file(lake, query, s, EPOCH0 + int(k * CYCLE), rows, seed=(10 * k + i) % 2**31)


def write_history(frame: pd.DataFrame, root, meta: dict | None = None) -> "Path":
    """Write tidy rows as the stats job does (``mjoin.stats.history.write_cycle``): ``root/<query>/cycle=<epoch>/``,
    with ``meta`` as every cycle's ``_cycle.json`` (e.g. ``{"partitioning": rule}``)."""
    from pathlib import Path

    from mjoin.stats.history import write_cycle

    frame = frame.copy()
    frame["cycle_start"] = pd.to_datetime(frame["cycle_start"], utc=True)
    for c, part in frame.groupby("cycle_start"):
        write_cycle(str(root), str(part["query"].iloc[0]), c, part, meta=meta)
    return Path(root)
