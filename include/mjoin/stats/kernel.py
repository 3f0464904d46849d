"""Exact statistics of an interval, one vectorised pass per key partition (numpy + pyarrow, no Spark).

The statistics job routes every row of every stream once per attribute class of its
stream, by key, to a partition (:func:`mjoin.stats.exact.one_pass`); :func:`partials`
computes, for the rows of one partition, every per-cycle partial count the job needs,
and :func:`reduce_partials` sums the partitions' outputs on the driver. All rows of a
``(class, key)`` are in one partition, so per-key work (kappa, edge matches) is local;
the outputs are additive across partitions.

Inputs per row: ``ci`` (the class of this copy), ``sid``, ``t`` (event time in epoch
microseconds, NULL: unusable), ``g`` (key group, NULL: NULL partitioning key), ``key``
(the row's key in class ``ci``, NULL: NULL key). Definitions are those of
docs/statistics.md (cycle ``j`` is ``[T_j, T_j + tau)``, ``e_j = T_j + tau``, window state
of ``s`` at ``t``: rows with ``t - W_s < ts <= t``):

- ``ROWS`` (copy of the stream's first class only, so each row counts once):
  rows per ``(sid, g, j)``, ``j = -2`` NULL event time, ``-1`` lead-in, ``n`` at T1;
- ``NN``: rows with a non-NULL key per ``(sid, ci, g, j)`` (NULL keys = ROWS - NN; the readers give a
  row with a NULL in any of its stream's keys a NULL key in every class, as the engine quarantines it
  whole: ``tuples`` is the first class's ``NN``);
- ``WT``: window_tuples deltas of the rows with a key: a row is in the state at the cycle ends ``ja..jb-1``
  (+1 at ``ja``, -1 at ``jb``); prefix sums on the driver;
- ``KAPPA``: distinct-key deltas: per ``(sid, g, key)`` the union of its rows' ranges
  ``[ja, jc]`` of cycle ends (rows sorted by time: ranges grow monotonically, so the
  part a row adds starts after the previous row's end);
- ``EDGE``: per directed edge ``(l, r)`` of the class and ``(g, j)`` of the probe:
  ``q`` lookups (``l`` rows of the cycle with a key), ``m`` of them with a match and
  ``s`` matches, the ``r`` rows of the same group and key with ``ts_u - W_r < ts_v <= ts_u``
  (Eq. 9-10), counted with two binary searches per probe in ``r``'s rows sorted by
  ``(group, key, ts)``;
- ``HIST``: rows per ``(sid, ci, j, bucket)``, ``bucket = pmod(key, B)`` (``B = 0``: the key);
  ``KEYRANGE``: min and max key per ``(sid, ci)`` (are the buckets the keys themselves?).
- per-cell statistics (``Params.cells``, queries on one attribute class only): the same ``ROWS``,
  ``WT``, ``KAPPA`` and ``EDGE`` counts per key *cell* instead of per key group, for each cell set
  (``("mod", B)``: ``pmod(key, B)``; ``("range", bounds)``: the number of bounds ``<= key``), as kinds
  ``CELL_KIND * (i + 1) + kind``. A cell is a function of the key, so matches (same key) stay within
  a cell and the per-probe counts of ``EDGE`` are only aggregated once more; rows with a NULL key
  have no cell. What the optimizer needs to price key-to-group rules it has not run (PMJoin).

The work is a few sorts and binary searches of the partition's rows: no band join, no
per-key Python loop.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

ROWS, NN, WT, KAPPA, EDGE, HIST, KEYRANGE = range(7)
#: kinds of cell set ``i``: ``CELL_KIND * (i + 1) + ROWS / WT / KAPPA / EDGE``
CELL_KIND = 8
#: the output of :func:`partials`: one row per nonzero partial count
OUT_SCHEMA = pa.schema([
    ("kind", pa.int8()), ("sid", pa.int32()), ("r", pa.int32()), ("ci", pa.int32()), ("g", pa.int64()),
    ("j", pa.int64()), ("x", pa.int64()), ("v0", pa.int64()), ("v1", pa.int64()), ("v2", pa.int64()),
])
OUT_DDL = "kind tinyint, sid int, r int, ci int, g bigint, j bigint, x bigint, v0 bigint, v1 bigint, v2 bigint"
_I64_MAX = np.iinfo(np.int64).max // 4


@dataclass(frozen=True)
class Params:
    """What a partition needs to know about the interval and the query (picklable)."""

    t0_us: int
    t1_us: int
    tau_us: int
    windows_us: tuple  # per sid
    first_class: tuple  # per sid: index of the stream's first attribute class
    class_members: tuple  # per ci: the sids in the class
    buckets: int  # histogram buckets B (0: exact keys)
    cells: tuple = ()  # cell sets: ("mod", B) or ("range", (b1, ..., b_{R-1})); one attribute class only

    @property
    def n(self) -> int:
        return (self.t1_us - self.t0_us) // self.tau_us

    def cell_of(self, i: int, keys: np.ndarray) -> np.ndarray:
        """Cell of every key in cell set ``i`` (``partition.group_of`` of the cell rule)."""
        how, arg = self.cells[i]
        if how == "mod":
            return np.mod(keys, int(arg))
        return np.searchsorted(np.asarray(arg, dtype=np.int64), keys, side="right").astype(np.int64)


def _cdiv(a: np.ndarray, b: int) -> np.ndarray:
    return -((-a) // b)


def _sum_by(code: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct codes, sum of weights per code)`` (counts without weights), codes >= 0."""
    if len(code) == 0:
        return code.astype(np.int64), np.zeros(0, dtype=np.int64)
    top = int(code.max()) + 1
    if top <= 4 * len(code) + 65536:
        sums = np.bincount(code, weights=weights, minlength=top)
        if weights is not None:
            sums = np.rint(sums).astype(np.int64)
        keep = np.flatnonzero(sums) if weights is not None else np.flatnonzero(sums > 0)
        return keep.astype(np.int64), sums[keep].astype(np.int64)
    uniq, inv = np.unique(code, return_inverse=True)
    sums = np.bincount(inv, weights=weights, minlength=len(uniq))
    if weights is not None:
        sums = np.rint(sums).astype(np.int64)
        keep = np.flatnonzero(sums)
        return uniq[keep], sums[keep]
    return uniq, sums.astype(np.int64)


def _dense(code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct codes, index of each code among them)``, like ``np.unique(return_inverse=True)``."""
    top = int(code.max()) + 1 if len(code) else 0
    if top <= 4 * len(code) + 65536:
        present = np.zeros(top, dtype=bool)
        present[code] = True
        return np.flatnonzero(present).astype(np.int64), (np.cumsum(present) - 1)[code]
    return np.unique(code, return_inverse=True)


def _window_cycles(t: np.ndarray, W: np.ndarray, T0: int, tau: int) -> tuple[np.ndarray, np.ndarray]:
    """The first cycle whose end a tuple at ``t`` is in the window state at, and the first it is no longer."""
    return np.maximum(_cdiv(t - T0 - tau, tau), 0), np.maximum(_cdiv(t + W - T0 - tau, tau), 0)


def _window_deltas(ja: np.ndarray, jb: np.ndarray, base: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """window_tuples deltas summed per code ``base + j`` (j < n): +1 at cycle ``ja``, -1 at cycle ``jb``."""
    codes = np.concatenate([base + ja, base + jb])
    w = np.concatenate([np.ones(len(ja)), -np.ones(len(jb))])
    inside = np.concatenate([ja, jb]) < n
    return _sum_by(codes[inside], w[inside])


def _rank(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for any int64 values, by counting when the range is small."""
    if len(values) == 0:
        return values, values
    lo = int(values.min())
    if int(values.max()) - lo <= 4 * len(values) + 65536:
        u, inv = _dense(values - lo)
        return u + lo, inv
    return np.unique(values, return_inverse=True)


def union_runs(gkey: np.ndarray, a_: np.ndarray, c_: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct-key runs (Eq. 11): each row of id ``gkey`` is in the state at the cycle ends ``[a_, c_]``
    (``0 <= a_ <= c_ < n``); per id, the union of its rows' ranges as the parts ``(id, start, end)`` that each
    row adds to the ranges of the rows before it. Sorted by ``(id, a_, c_)``: rows of one id sorted by time have
    non-decreasing ``(a_, c_)``, so a row adds ``[max(a_, previous end + 1), c_]`` when that is not empty."""
    if len(gkey) and int(gkey.max()) < _I64_MAX // max(n * n, 1):
        srt = np.sort(gkey * (n * n) + a_ * n + c_)
        gkey, a_ = np.divmod(srt, n * n)
        a_, c_ = np.divmod(a_, n)
    else:
        order = np.lexsort((c_, a_, gkey))
        gkey, a_, c_ = gkey[order], a_[order], c_[order]
    prev = np.full(len(gkey), -1, dtype=np.int64)
    if len(gkey) > 1:
        prev[1:] = np.where(gkey[1:] == gkey[:-1], c_[:-1], -1)
    start = np.maximum(a_, prev + 1)
    grow = start <= c_
    return gkey[grow], start[grow], c_[grow]


def _col(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """An integer column as int64 numpy (NULL -> 0) and its validity mask."""
    c = table.column(name)
    valid = (np.ones(len(c), dtype=bool) if c.null_count == 0
             else np.asarray(c.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
    vals = np.asarray(c.fill_null(0).to_numpy(zero_copy_only=False) if c.null_count else c.to_numpy(), dtype=np.int64)
    return vals, valid


class _Out:
    """Collects output columns of several kinds."""

    def __init__(self):
        self.parts = []

    def add(self, kind, n, **cols):
        if n == 0:
            return
        full = {}
        for name in OUT_SCHEMA.names:
            if name == "kind":
                full[name] = np.full(n, kind, dtype=np.int8)
            elif name in cols:
                v = cols[name]
                full[name] = v if isinstance(v, tuple) else np.broadcast_to(np.asarray(v, dtype=np.int64), (n,))
            else:
                full[name] = np.zeros(n, dtype=np.int64)
        self.parts.append(full)

    def table(self) -> pa.Table:
        if not self.parts:
            return OUT_SCHEMA.empty_table()
        arrays = []
        for f in OUT_SCHEMA:
            vals, masks = [], []
            for p in self.parts:
                v = p[f.name]
                if isinstance(v, tuple):  # (values, valid mask)
                    vals.append(v[0])
                    masks.append(~v[1])
                else:
                    vals.append(v)
                    masks.append(np.zeros(len(v), dtype=bool))
            mask = np.concatenate(masks)
            arrays.append(pa.array(np.concatenate(vals).astype(f.type.to_pandas_dtype()),
                                   type=f.type, mask=mask if mask.any() else None))
        return pa.Table.from_arrays(arrays, schema=OUT_SCHEMA)


def partials(table: pa.Table, p: Params) -> pa.Table:
    """Every partial count of one partition's rows (columns ``ci, sid, t, g, key``), as :data:`OUT_SCHEMA`."""
    out = _Out()
    if table.num_rows == 0:
        return out.table()
    ci_all, _ = _col(table, "ci")
    sid_all, _ = _col(table, "sid")
    t_all, t_ok_all = _col(table, "t")
    g_all, g_ok_all = _col(table, "g")
    k_all, k_ok_all = _col(table, "key")
    for ci in np.unique(ci_all):
        sel = ci_all == ci
        _class_partials(out, int(ci), sid_all[sel], t_all[sel], t_ok_all[sel], g_all[sel], g_ok_all[sel],
                        k_all[sel], k_ok_all[sel], p)
    return out.table()


def _class_partials(out: _Out, ci, sid, t, t_ok, g, g_ok, key, k_ok, p: Params) -> None:
    n, T0, T1, tau = p.n, p.t0_us, p.t1_us, p.tau_us
    nsid = len(p.windows_us)
    W = np.asarray(p.windows_us, dtype=np.int64)[sid]
    # cycle of each row: -2 NULL time, -1 lead-in, n exactly at T1
    j = np.where(~t_ok, -2, np.where(t < T0, -1, np.where(t >= T1, n, (t - T0) // tau)))
    # group dense ids (NULL group -> 0, real groups 1..G) so codes stay small
    gu, ginv = _rank(np.where(g_ok, g, 0))
    gid = np.where(g_ok, ginv + 1, 0).astype(np.int64)
    G = len(gu) + 1

    def g_out(ids):  # group ids back to (values, valid)
        return (gu[np.maximum(ids - 1, 0)], ids > 0)

    # ---- ROWS and NN: counts per (sid, g, j) ----------------------------------------------------
    jj = j + 2  # 0..n+2
    first = np.asarray(p.first_class, dtype=np.int64)[sid] == ci
    code = (sid * G + gid) * (n + 3) + jj
    for kind, mask in ((ROWS, first), (NN, k_ok)):
        c, v = _sum_by(code[mask])
        sg, jr = np.divmod(c, n + 3)
        s_, gi = np.divmod(sg, G)
        out.add(kind, len(c), sid=s_, ci=ci, g=g_out(gi), j=jr - 2, v0=v)

    live = t_ok & g_ok  # rows that are in some window state
    # ---- WT: window_tuples deltas (first-class copy; a row with a NULL key is not in the join's state) -----
    m = live & first & k_ok
    if m.any():
        c, v = _window_deltas(*_window_cycles(t[m], W[m], T0, tau), (sid[m] * G + gid[m]) * n, n)
        sg, jr = np.divmod(c, n)
        s_, gi = np.divmod(sg, G)
        out.add(WT, len(c), sid=s_, ci=ci, g=g_out(gi), j=jr, v0=v)

    keyed = live & k_ok
    if not keyed.any():
        return
    ks, kt, kg, kk, kW = sid[keyed], t[keyed], gid[keyed], key[keyed], W[keyed]
    kj = j[keyed]
    kuniq, kinv = _rank(kk)
    K = len(kuniq)
    # per-cell statistics: the cell of every distinct key, then ROWS and WT per (sid, cell, j)
    cell_labels = [p.cell_of(i, kuniq) for i in range(len(p.cells))] if ci == 0 else []
    if cell_labels:
        kja, kjb = _window_cycles(kt, kW, T0, tau)
    for i, lab_k in enumerate(cell_labels):
        L = int(lab_k.max()) + 1
        lab = lab_k[kinv]
        c, v = _sum_by((ks * L + lab) * (n + 3) + kj + 2)
        sl, jr = np.divmod(c, n + 3)
        s_, li = np.divmod(sl, L)
        out.add(CELL_KIND * (i + 1) + ROWS, len(c), sid=s_, ci=ci, g=li, j=jr - 2, v0=v)
        c, v = _window_deltas(kja, kjb, (ks * L + lab) * n, n)
        sl, jr = np.divmod(c, n)
        s_, li = np.divmod(sl, L)
        out.add(CELL_KIND * (i + 1) + WT, len(c), sid=s_, ci=ci, g=li, j=jr, v0=v)
    # ---- KAPPA: distinct keys in the state at each cycle end --------------------------------------
    ja = np.maximum(_cdiv(kt - T0 - tau, tau), 0)
    jc = np.minimum((kt + kW - 1 - T0 - tau) // tau, n - 1)
    ok = ja <= jc
    if ok.any():
        gkey = (ks[ok] * G + kg[ok]) * K + kinv[ok]  # one id per (sid, g, key)
        gkey, start, end = union_runs(gkey, ja[ok], jc[ok], n)
        sg = gkey // K
        codes = np.concatenate([sg * n + start, sg * n + end + 1])
        w = np.concatenate([np.ones(len(start)), -np.ones(len(start))])
        inside = np.concatenate([start, end + 1]) < n
        c, v = _sum_by(codes[inside], w[inside])
        sg2, jr = np.divmod(c, n)
        s_, gi = np.divmod(sg2, G)
        out.add(KAPPA, len(c), sid=s_, ci=ci, g=g_out(gi), j=jr, v0=v)
        for i, lab_k in enumerate(cell_labels):  # the same runs, per (sid, cell of the key)
            L = int(lab_k.max()) + 1 if len(lab_k) else 1
            sl = (sg // G) * L + lab_k[gkey % K]
            codes = np.concatenate([sl * n + start, sl * n + end + 1])
            c, v = _sum_by(codes[inside], w[inside])
            sl2, jr = np.divmod(c, n)
            s_, li = np.divmod(sl2, L)
            out.add(CELL_KIND * (i + 1) + KAPPA, len(c), sid=s_, ci=ci, g=li, j=jr, v0=v)

    # ---- HIST: rows per (sid, j, bucket) of the interval's cycles; key range per stream -----------
    hm_all = t_ok & k_ok & (j >= 0) & (j < n)  # the histogram does not need a key group
    hs, hj, hk = sid[hm_all], j[hm_all], key[hm_all]
    if len(hk):
        B = int(p.buckets)
        if B > 0:
            b = np.mod(hk, B)
            c, v = _sum_by((hs * n + hj) * B + b)
            sj, bb = np.divmod(c, B)
        else:
            bu, binv = np.unique(hk, return_inverse=True)
            c, v = _sum_by((hs * n + hj) * len(bu) + binv)
            sj, bi = np.divmod(c, len(bu))
            bb = bu[bi]
        s_, jr = np.divmod(sj, n)
        out.add(HIST, len(c), sid=s_, ci=ci, j=jr, x=bb, v0=v)
        for s in np.unique(hs):
            ks_ = hk[hs == s]
            out.add(KEYRANGE, 1, sid=int(s), ci=ci, v1=int(ks_.min()), v2=int(ks_.max()))

    # ---- EDGE: q, m, s per directed edge (l, r) of the class, per (g, j) of the probe -------------
    members = [s for s in p.class_members[ci]]
    if len(members) < 2:
        return
    tmin, tmax = int(kt.min()), int(kt.max())
    span = tmax - tmin + int(max(p.windows_us)) + 1
    grp = kg * K + kinv  # (group, key): matches only within the same group and key
    ngrp = int(grp.max()) + 1
    chunk = max(1, _I64_MAX // span)  # (group, key) ids per chunk so that the codes fit in int64
    acc, cell_acc = {}, {}
    for lo in range(0, ngrp, chunk):
        inc = (grp >= lo) & (grp < lo + chunk) if ngrp > chunk else np.ones(len(grp), dtype=bool)
        code = (grp - lo) * span + (kt - tmin)
        by_sid = {}
        for s in members:
            ms = inc & (ks == s)
            srt = np.sort(code[ms])
            by_sid[s] = srt
        for l in members:
            srt = by_sid[l]
            tl = srt % span + tmin  # the probes: l's rows of the interval's cycles, already sorted
            inside = (tl >= T0) & (tl < T1)
            if not inside.any():
                continue
            pc = srt[inside]
            cyc = (tl[inside] - T0) // tau
            pcode = ((pc // span + lo) // K) * n + cyc  # (group id, cycle) of each probe
            c, inv = _dense(pcode)
            q = np.bincount(inv, minlength=len(c)).astype(np.int64)
            # the same probes per (cell, cycle), for every cell set
            cells = []
            for i, lab_k in enumerate(cell_labels):
                cc, cinv = _dense(lab_k[(pc // span + lo) % K] * n + cyc)
                cells.append((i, cc, cinv, np.bincount(cinv, minlength=len(cc)).astype(np.int64)))
            for r in members:
                if r == l:
                    continue
                rc = by_sid[r]
                cnt = (np.searchsorted(rc, pc, side="right")
                       - np.searchsorted(rc, pc - int(p.windows_us[r]), side="right"))
                mm = np.bincount(inv, weights=cnt > 0, minlength=len(c))
                ss = np.bincount(inv, weights=cnt, minlength=len(c))
                acc.setdefault((l, r), []).append((c, q, np.rint(mm).astype(np.int64), np.rint(ss).astype(np.int64)))
                for i, cc, cinv, cq in cells:
                    mm = np.bincount(cinv, weights=cnt > 0, minlength=len(cc))
                    ss = np.bincount(cinv, weights=cnt, minlength=len(cc))
                    cell_acc.setdefault((i, l, r), []).append((cc, cq, np.rint(mm).astype(np.int64),
                                                               np.rint(ss).astype(np.int64)))
    for key_, parts in list(acc.items()) + list(cell_acc.items()):
        c = np.concatenate([x[0] for x in parts])
        vals = [np.concatenate([x[i] for x in parts]) for i in (1, 2, 3)]
        if len(parts) > 1:  # several chunks: sum per (group or cell, cycle)
            u, inv = np.unique(c, return_inverse=True)
            vals = [np.bincount(inv, weights=v, minlength=len(u)).astype(np.int64) for v in vals]
            c = u
        gi, jr = np.divmod(c, n)
        if len(key_) == 2:
            l, r = key_
            out.add(EDGE, len(c), sid=l, r=r, ci=ci, g=g_out(gi), j=jr, v0=vals[0], v1=vals[1], v2=vals[2])
        else:
            i, l, r = key_
            out.add(CELL_KIND * (i + 1) + EDGE, len(c), sid=l, r=r, ci=ci, g=gi, j=jr, v0=vals[0], v1=vals[1],
                    v2=vals[2])


# ---- driver side -------------------------------------------------------------------------------

def reduce_partials(table: pa.Table, p: Params, nclasses: int) -> dict:
    """Sum the partitions' outputs into the frames :mod:`mjoin.stats.job` assembles:

    ``counts`` (sid, g, j, rows, nn0..), ``window_tuples`` (sid, g, j, window_tuples),
    ``kappa`` (sid, ci, g, j, kappa), ``edges`` (ci, g, j, l, r, q, m, s),
    ``histogram`` (sid, ci, j, bucket, tuples) and ``key_range`` {(sid, ci): (min, max)}.

    Group sums in numpy (a code per key combination, one ``bincount`` per value): the driver sums them for
    every run of the statistics job and every cycle the join job emits, where pandas' groupby and merges
    were most of the driver's time."""
    import pandas as pd  # driver only: the Python workers never import pandas for this
    n = p.n
    cols = {name: _col(table, name) for name in ("kind", "sid", "r", "ci", "g", "j", "x", "v0", "v1", "v2")}
    kind = cols["kind"][0]

    def agg(kinds, keys, values, rename=None):  # noqa: E306
        sel = np.isin(kind, kinds) if isinstance(kinds, tuple) else kind == kinds
        return _group_sum({k: (cols[k][0][sel], None if k != "g" else cols[k][1][sel]) for k in keys},
                          {v: cols[v][0][sel] for v in values}, rename or {})

    counts = agg(ROWS, ["sid", "g", "j"], ["v0"], {"v0": "rows"})
    nn = agg(NN, ["sid", "ci", "g", "j"], ["v0"])
    for ci in range(nclasses):
        counts[f"nn{ci}"] = _lookup(counts, nn[nn["ci"] == ci], ["sid", "g", "j"], "v0")
    wt = _prefix(agg(WT, ["sid", "g", "j"], ["v0"]), ["sid", "g"], n, "window_tuples")
    kap = _prefix(agg(KAPPA, ["sid", "ci", "g", "j"], ["v0"]), ["sid", "ci", "g"], n, "kappa")
    edges = agg(EDGE, ["ci", "g", "j", "sid", "r"], ["v0", "v1", "v2"],
                {"sid": "l", "v0": "q", "v1": "m", "v2": "s"})
    hist = agg(HIST, ["sid", "ci", "j", "x"], ["v0"], {"x": "bucket", "v0": "tuples"})
    key_range = {}
    sel = kind == KEYRANGE
    if sel.any():
        sc = cols["sid"][0][sel] * (nclasses + 1) + cols["ci"][0][sel]
        for code in np.unique(sc):
            m = sc == code
            key_range[(int(code // (nclasses + 1)), int(code % (nclasses + 1)))] = (
                int(cols["v1"][0][sel][m].min()), int(cols["v2"][0][sel][m].max()))
    cells = []
    for i in range(len(p.cells)):
        base_kind = CELL_KIND * (i + 1)
        rows_c = agg(base_kind + ROWS, ["sid", "g", "j"], ["v0"], {"v0": "rows"})
        rows_c["nn0"] = rows_c["rows"]
        cells.append({
            "counts": rows_c,
            "window_tuples": _prefix(agg(base_kind + WT, ["sid", "g", "j"], ["v0"]), ["sid", "g"], n,
                                     "window_tuples"),
            "kappa": _prefix(agg(base_kind + KAPPA, ["sid", "ci", "g", "j"], ["v0"]), ["sid", "ci", "g"], n, "kappa"),
            "edges": agg(base_kind + EDGE, ["ci", "g", "j", "sid", "r"], ["v0", "v1", "v2"],
                         {"sid": "l", "v0": "q", "v1": "m", "v2": "s"}),
        })
    return {"counts": counts, "window_tuples": wt, "kappa": kap, "edges": edges, "histogram": hist,
            "key_range": key_range, "cells": cells}


def _group_code(keys: dict) -> tuple[np.ndarray, list]:
    """One int64 code per row for the key columns ``{name: (values, valid or None)}``, and per column what
    decodes it: ``(name, distinct values, nullable)`` (rank 0 is NULL in a nullable column)."""
    code = np.zeros(len(next(iter(keys.values()))[0]), dtype=np.int64)
    parts = []
    for name, (vals, valid) in keys.items():
        u, inv = _rank(vals)
        nullable = valid is not None and not valid.all()
        if nullable:
            inv = np.where(valid, inv + 1, 0)
        code = code * (len(u) + int(nullable)) + inv
        parts.append((name, u, nullable))
    return code, parts


def _group_sum(keys: dict, values: dict, rename: dict):
    """``keys`` and the sums of ``values`` per distinct key combination, sorted by the keys (NULL first), as a
    frame (a nullable key column as float with NaN, as pandas' groupby with ``dropna=False`` gives it)."""
    names = list(keys) + list(values)
    if not len(next(iter(keys.values()))[0]):
        return pd.DataFrame(columns=[rename.get(c, c) for c in names])
    code, parts = _group_code(keys)
    u, inv = np.unique(code, return_inverse=True)
    out = {}
    rest = u.copy()
    for name, distinct, nullable in reversed(parts):
        size = len(distinct) + int(nullable)
        rest, digit = np.divmod(rest, size)
        if nullable:
            out[name] = np.where(digit > 0, distinct[np.maximum(digit - 1, 0)].astype(np.float64), np.nan)
        else:
            out[name] = distinct[digit]
    for name, vals in values.items():
        out[name] = np.rint(np.bincount(inv, weights=vals.astype(np.float64), minlength=len(u))).astype(np.int64)
    return pd.DataFrame({rename.get(c, c): out[c] for c in names})


def _lookup(frame, other, keys: list[str], value: str) -> np.ndarray:
    """``other``'s ``value`` at each row of ``frame`` with the same ``keys`` (0 where it has none)."""
    if not len(frame):
        return np.zeros(0, dtype=np.int64)
    if not len(other):
        return np.zeros(len(frame), dtype=np.int64)
    both = {k: np.concatenate([frame[k].to_numpy(dtype=np.float64), other[k].to_numpy(dtype=np.float64)])
            for k in keys}
    nulls = {k: ~np.isnan(v) for k, v in both.items()}
    code, _ = _group_code({k: (np.nan_to_num(v, nan=0).astype(np.int64), nulls[k]) for k, v in both.items()})
    mine, theirs = code[:len(frame)], code[len(frame):]
    order = np.argsort(theirs, kind="stable")
    pos = np.minimum(np.searchsorted(theirs[order], mine), len(theirs) - 1)
    hit = theirs[order][pos] == mine
    vals = other[value].to_numpy(dtype=np.int64)[order][pos]
    return np.where(hit, vals, 0).astype(np.int64)


def _prefix(deltas, keys: list[str], n: int, name: str):
    """``(keys..., j, v0)`` deltas -> ``(keys..., j, name)`` prefix sums over ``j = 0..n-1`` (every j)."""
    if deltas.empty or n <= 0:
        return pd.DataFrame(columns=keys + ["j", name])
    arrays = {k: deltas[k].to_numpy(dtype=np.float64) for k in keys}
    code, _ = _group_code({k: (np.nan_to_num(v, nan=0).astype(np.int64), ~np.isnan(v)) for k, v in arrays.items()})
    u, first, inv = np.unique(code, return_index=True, return_inverse=True)
    grid = np.zeros((len(u), n), dtype=np.int64)
    np.add.at(grid, (inv, deltas["j"].to_numpy(dtype=np.int64)), deltas["v0"].to_numpy(dtype=np.int64))
    vals = np.cumsum(grid, axis=1)
    out = pd.DataFrame({k: np.repeat(deltas[k].to_numpy()[first], n) for k in keys})
    out["j"] = np.tile(np.arange(n), len(u))
    out[name] = vals.ravel()
    return out
