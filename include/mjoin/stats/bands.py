"""The match statistics of the edges a band predicate filters (PSP residuals; docs/algorithms.md Eq. 9-10).

For a directed edge ``(l, r)`` whose streams a band ``|l.x - r.y| <= c`` relates, the engine keeps only
the matches within the band (:func:`mjoin.engine.operator.within_band`), so the optimizer must price
the step with them: per cycle ``j``, ``q`` lookups (the rows of ``l`` in the cycle with a key), ``m``
of them with at least one match, ``s`` matches, where a match is a row ``v`` of ``r`` with the same key,
``ts_u - W_r < ts_v <= ts_u`` and the band true. ``gamma = m / q``, ``mu = s / m``, replacing the
key-only values of those edges in the statistics job's rows.

Computed on the driver with pyarrow and numpy from the landed files (the key, event time and band
columns of the two streams over the cycles and the window before them): a sort per stream and two
binary searches per probe give each probe's candidate rows of the same key in the window; the band
is tested on the candidates (memory: the candidate pairs, not the pairs passing).
"""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.engine.operator import within_band
from mjoin.model import eventtime
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)


#: band-only edges (no key): at most this many candidate pairs are tested per edge; beyond, the probes are
#: sampled and m, s scaled by the sampled share (q stays exact)
MAX_PAIRS = 20_000_000


def _rows(lake, stream, column: str, lo_us: int, hi_us: int, key: str | None) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(key, ts micros, band values) of a stream's rows with a key (``key`` None: every row, key 0) and ts in
    ``[lo_us, hi_us)``."""
    keys, tss, vals = [], [], []
    et = stream.event_time.column
    for path in lake.stream_files(stream.source):
        fs, p = fsutil.resolve(path)
        try:
            with fs.open_input_file(p) as fh:
                t = pq.read_table(fh, columns=list(dict.fromkeys([c for c in (key, et, column) if c])))
        except (OSError, pa.ArrowException, KeyError):
            continue  # the contract's rules reject such a file; the engine quarantines it
        col = t.column(et)  # the engine's rule (mjoin.model.eventtime): the same microsecond as the join puts the row in
        us = eventtime.micros_arrow(col, eventtime.arrow_kind(col.type))
        t_ok = np.asarray(us.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        ts = us.fill_null(-1).to_numpy()
        k = t.column(key) if key else pa.array(np.zeros(t.num_rows, np.int64))
        ok = np.asarray(k.is_valid().to_numpy(zero_copy_only=False), dtype=bool) & t_ok & \
            (ts >= lo_us) & (ts < hi_us)
        idx = np.flatnonzero(ok)
        keys.append(np.asarray(pc.cast(k, pa.int64()).fill_null(0).to_numpy(), dtype=np.int64)[idx])
        tss.append(ts[idx])
        vals.append(t.column(column).combine_chunks().take(pa.array(idx)))
    if not keys:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), pa.array([], pa.float64())
    return np.concatenate(keys), np.concatenate(tss), pa.concat_arrays(vals) if len(vals) > 1 else vals[0]


def band_edge_counts(query, lake, grid, band, left: str, right: str) -> dict:
    """``{cycle j: (q, m, s)}`` of the directed edge ``left -> right`` with ``band`` applied."""
    ls, rs = query.stream(left), query.stream(right)
    w_r = int(round(rs.window * 1e6))
    keyed = query.has_edge(left, right) and query.edge(left, right).attr_class in query.attribute_classes
    lkey = query.edge(left, right).column_of(left) if keyed else None
    rkey = query.edge(left, right).column_of(right) if keyed else None
    lk, lt, lv = _rows(lake, ls, band.column_of(left), grid.t0_us, grid.t1_us, lkey)
    rk, rt, rv = _rows(lake, rs, band.column_of(right), grid.t0_us - w_r, grid.t1_us, rkey)
    out = {}
    if not len(lk):
        return out
    # r sorted by (key, ts); a probe u's candidates: same key, ts in (ts_u - W_r, ts_u]
    if not len(rk):
        return {int(jj): (int(((lt - grid.t0_us) // grid.tau_us == jj).sum()), 0, 0)
                for jj in np.unique((lt - grid.t0_us) // grid.tau_us)}
    order = np.lexsort((rt, rk))
    rk, rt, rv = rk[order], rt[order], rv.take(pa.array(order))
    # one sorted int64 per r row, rank(key) * span + (ts - t_min), so that both binary searches of every
    # probe run vectorised (two np.searchsorted calls, no loop per probe)
    ukeys, rank_r = np.unique(rk, return_inverse=True)
    t_min = min(int(rt.min()) if len(rt) else 0, int(lt.min()) - w_r) - 1
    span = max(int(rt.max()) if len(rt) else 0, int(lt.max())) - t_min + 2
    if len(ukeys) and span * (len(ukeys) + 1) >= (1 << 62):
        raise OverflowError("band statistics: too many keys for the interval's time span")
    comb = rank_r.astype(np.int64) * span + (rt - t_min)
    pos = np.searchsorted(ukeys, lk)
    pos_c = np.minimum(pos, max(len(ukeys) - 1, 0))
    has = (pos < len(ukeys)) & (ukeys[pos_c] == lk) if len(ukeys) else np.zeros(len(lk), bool)
    base = pos_c.astype(np.int64) * span
    lo = np.searchsorted(comb, base + (lt - w_r - t_min), side="right")
    hi = np.searchsorted(comb, base + (lt - t_min), side="right")
    start = np.where(has, lo, 0)
    count = np.where(has, hi - lo, 0)
    j = (lt - grid.t0_us) // grid.tau_us
    weight = np.ones(len(lk))
    total = int(count.sum())
    if total > MAX_PAIRS:  # a band alone over large windows: test a uniform sample of the probes
        share = MAX_PAIRS / total
        keep = np.random.default_rng(0).random(len(lk)) < share
        count = np.where(keep, count, 0)
        weight = np.where(keep, 1.0 / share, 0.0)
        total = int(count.sum())
    probe = np.repeat(np.arange(len(lk)), count)
    cand = (np.arange(total) - np.repeat(np.cumsum(count) - count, count) + np.repeat(start, count)) if total \
        else np.zeros(0, np.int64)
    ok = within_band(lv.take(pa.array(probe)), rv.take(pa.array(cand)), band.width) if total else np.zeros(0, bool)
    s_per = np.bincount(probe[ok], minlength=len(lk)) if total else np.zeros(len(lk), np.int64)
    for jj in np.unique(j):
        sel = j == jj
        out[int(jj)] = (int(sel.sum()), int(round(((s_per[sel] > 0) * weight[sel]).sum())),
                        int(round((s_per[sel] * weight[sel]).sum())))
    return out


def apply_bands(rows, query, lake, grid):
    """The statistics job's tidy rows with the band edges' ``q, m, s, gamma, mu`` as the engine matches
    (group 0; partitioned statistics keep the key-only values, said in the log)."""
    if not getattr(query, "bands", ()) or rows is None or not len(rows):
        return rows
    rows = rows.copy()
    starts = pd.to_datetime(rows["cycle_start"], utc=True)
    added = []
    for band in query.bands:
        for left, right in ((band.left, band.right), (band.right, band.left)):
            counts = band_edge_counts(query, lake, grid, band, left, right)
            for jj in range(grid.n):
                q, m, s = counts.get(jj, (0, 0, 0))
                start = pd.Timestamp(grid.start_epoch(jj), unit="s", tz="UTC")
                values = {"q": q, "m": m, "s": s, "gamma": m / q if q else 0.0, "mu": s / m if m else 1.0}
                sel = (rows["entity"] == "edge") & (rows["stream"] == left) & (rows["right"] == right) & \
                      (rows["group"] == 0) & (starts == start)
                if sel.any():  # a band beside a key: the key-only counts are replaced
                    for k, v in values.items():
                        rows.loc[sel, k] = v
                else:  # a band alone (no key, no kernel row): the edge's row is made here
                    cyc = rows[(starts == start)].iloc[0]
                    added.append({**{c: None for c in rows.columns}, "query": cyc["query"],
                                  "cycle_start": cyc["cycle_start"], "cycle_seconds": cyc["cycle_seconds"], "group": 0,
                                  "entity": "edge", "stream": left, "right": right, **values})
    if added:
        rows = pd.concat([rows, pd.DataFrame(added, columns=rows.columns)], ignore_index=True)
    return rows
