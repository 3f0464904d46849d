"""Statistics of whole cycles counted by the streaming join's own tasks, from the window state they hold.

A stage-1 task of a micro-batch holds, per (attribute class, key bucket), every stream's window state as the
engine keeps it: rows sorted by key with a CSR index (:class:`mjoin.engine.operator.KeyedRows`). Once the
job's watermark has passed a cycle's end, no row at or before that end can still be accepted (later ones are
quarantined as ``late``), and with the cycle's window lead-in kept in the state (:mod:`mjoin.stats.emitted`)
the state holds every row the cycle's statistics need (docs/statistics.md, "Definitions"). This module
counts them there: the partial counts :func:`mjoin.stats.kernel.partials` gives for the same rows (its
``OUT_SCHEMA``, summed on the driver by :func:`mjoin.stats.kernel.reduce_partials` and assembled by
:func:`mjoin.stats.job.assemble_run`), without the kernel's sorts, since the state is sorted by key already.
A key bucket holds every row of its keys, as the kernel's partitions do, so the counts add up over buckets.

Per (class, bucket), stream ``s`` of the class (window ``W``) and emitted cycle ``j`` (``[T_j, e_j)``), all
numpy over the state's arrays:

- ``ROWS``/``NN``: the rows with ``T_j <= ts < e_j`` (every row in the state has its keys: the engine
  quarantines a row with a NULL key, which the driver adds to ``ROWS`` from the tasks' quarantine counts);
- ``WT``: the kernel's range deltas (a row is in the state at the cycle ends ``e`` with ``ts <= e < ts + W``);
- ``KAPPA``: the keys with a row in ``(e_j - W, e_j]``: a max over each key's rows of that mask (the CSR
  offsets), per cycle; a batch that emits more than :data:`KAPPA_LOOP` cycles at once (a backlog) takes the
  kernel's run union (:func:`mjoin.stats.kernel.union_runs`);
- ``EDGE`` ``(l, r)``, for every directed edge of the class, whether the plan probes it or not: each ``l``
  row ``u`` of the cycle looks its key up in ``r``'s state (a binary search among ``r``'s distinct keys, as
  the join's lookup) and counts ``r``'s rows of that key with ``ts_u - W_r < ts <= ts_u``. Per tuple and
  edge: ``log2(kappa_r)`` comparisons plus one time check per row of that key in ``r``'s state, the cost of
  one probe step of the join (Eq. 4, 6, 7);
- ``HIST``/``KEYRANGE``: the per-key rate histogram and each stream's key range of the cycles' rows;
- per-cell statistics (one attribute class): the same per key cell, ``pmod(key, B)`` and ``R`` equal ranges of
  ``[0, span)``; a task reports the span it used (``SPAN``, with the first cycle it counted) and the driver
  merges the tasks' range cells to the largest span (ranges of a power-of-two span nest).

Cycle indices ``j`` in the output are absolute (``cycle start // tau``); the driver makes them relative to
the emission's first cycle.
"""
from __future__ import annotations

import base64
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from mjoin.engine.compiled import key_name
from mjoin.engine.operator import expand
from mjoin.model.keygroups import group_of, num_groups
from mjoin.stats import kernel
from mjoin.stats.kernel import CELL_KIND, EDGE, HIST, KAPPA, KEYRANGE, NN, OUT_SCHEMA, ROWS, WT

#: kind of the one row per task and class that says which range-cell span it used (``v0``) and the first
#: cycle it counted (``v1``, absolute); not a kind of :mod:`mjoin.stats.kernel` (the driver drops it)
SPAN = 7
#: a batch emitting at most this many cycles counts kappa cycle by cycle (one mask over the state each);
#: more (a backlog caught up in one batch): the kernel's run union, one sort of the state
KAPPA_LOOP = 8
#: the reasons of the rows a task quarantines that are counted per cycle (they have an event time and a
#: cycle; ``late`` rows belong to cycles already emitted, ``bad_time`` rows to none)
CYCLE_REASONS = ("bad_type", "null_key")  # sorted


def range_span(max_key: int) -> int:
    """The smallest power of two above ``max_key`` (1 when no key is positive: no ranges)."""
    return 1 << int(max_key).bit_length() if max_key >= 1 else 1


def range_width(span: int, ranges: int) -> int:
    """Width of each of the ``min(ranges, span)`` equal ranges of ``[0, span)`` (the kernel's range cells)."""
    return span // min(int(ranges), span)


def range_rule(attr_class: str, span: int, ranges: int) -> dict:
    """The cell rule of the ranges of ``[0, span)`` (:func:`mjoin.stats.job.cell_rules`' ``ranges``)."""
    r, width = min(int(ranges), span), range_width(span, ranges)
    return {"method": "range", "attr_class": attr_class, "bounds": [width * i for i in range(1, r)]}


@dataclass(frozen=True)
class Emission:
    """What the tasks of one micro-batch count: the cycles ``lo .. hi - 1`` (absolute indices, ``start // tau``)
    of the query's statistics under the running plan's key groups (picklable: it travels to the tasks)."""

    tau_us: int
    lo: int | None  # first cycle to count; None: from the first cycle whose end reaches the state's oldest row
    hi: int | None  # cycles before it are final (their end is below the batch's watermark); None: none is
    streams: tuple  # stream names by sid (the query's order)
    windows_us: tuple  # per sid
    first_class: tuple  # per sid: index of the stream's first attribute class
    classes: tuple  # attribute classes
    class_members: tuple  # per class: the sids in it
    rule: dict | None  # the running plan's key groups
    buckets: int = 1024  # histogram buckets (0: exact keys)
    key_buckets: int = 64  # cells pmod(key, B) (0: none)
    key_ranges: int = 64  # R range cells (0: none)
    span: int = 1  # the range cells' span the job used so far (a power of two; 1: none yet)

    def task(self) -> "TaskCounts":
        """What one stage-1 task of the batch uses to count (:class:`TaskCounts`)."""
        return TaskCounts(self)

    @property
    def counts_cycles(self) -> bool:
        return self.hi is not None and (self.lo is None or self.hi > self.lo)

    def cell_sets(self) -> tuple:
        """``(kind, how)`` of the cell sets counted (one attribute class only), in the kernel's order."""
        if len(self.classes) != 1:
            return ()
        out = []
        if self.key_buckets:
            out.append(("buckets", "mod"))
        if self.key_ranges:
            out.append(("ranges", "range"))
        return tuple(out)

    # ---- in a task ---------------------------------------------------------------------------------
    def counts(self, attr_class: str, states: dict) -> pa.Table | None:
        """The partial counts (:data:`mjoin.stats.kernel.OUT_SCHEMA` plus one :data:`SPAN` row) of the (class,
        bucket)s of one class a task holds, from their streams' states as committed before the batch
        (``states``: stream -> list of :class:`~mjoin.engine.operator.KeyedRows`, one per bucket)."""
        if not self.counts_cycles:
            return None
        ci = self.classes.index(attr_class)
        data = {}
        for sid in self.class_members[ci]:
            parts = [p for p in states.get(self.streams[sid]) or () if p is not None and len(p)]
            if parts:
                data[sid] = _Stacked(parts)
        if not data:
            return None
        tau = self.tau_us
        lo = self.lo
        if lo is None:
            oldest = min(int(r.ts.min()) for r in data.values())
            lo = -((tau - oldest) // tau)  # the first cycle whose end e = (j + 1) tau is at or after it
        n = self.hi - lo
        if n <= 0:
            return None
        return _Counter(self, ci, lo, n, data).run()

    def rejected(self, rej: pa.Table) -> dict:
        """``{stream: {reason: {cycle: rows}}}`` of a task's quarantined rows with an event time, for the
        reasons counted per cycle (:data:`CYCLE_REASONS`)."""
        if rej is None or not rej.num_rows or "_ts" not in rej.column_names:
            return {}
        reason = np.asarray(rej.column("_reason").to_pylist(), dtype=object)
        ts = rej.column("_ts")
        ok = np.asarray(ts.is_valid().to_numpy(zero_copy_only=False), dtype=bool) & np.isin(reason, CYCLE_REASONS)
        if not ok.any():
            return {}
        j = np.asarray(ts.fill_null(0).to_numpy(), dtype=np.int64)[ok] // self.tau_us
        s_idx = np.asarray(rej.column("_s").to_numpy(zero_copy_only=False), dtype=np.int64)[ok]
        r_idx = np.searchsorted(np.asarray(CYCLE_REASONS), reason[ok])  # CYCLE_REASONS is sorted
        keys, n = np.unique(np.stack([s_idx, r_idx, j]), axis=1, return_counts=True)
        out: dict = {}
        for (s, r, c), k in zip(keys.T, n):
            out.setdefault(self.streams[int(s)], {}).setdefault(CYCLE_REASONS[int(r)], {})[str(int(c))] = int(k)
        return out


class _Columns:
    """Rows of :data:`mjoin.stats.kernel.OUT_SCHEMA` collected in few large parts (any column a scalar or an
    array; no NULLs: a task's counts always have a group)."""

    NAMES = tuple(OUT_SCHEMA.names)
    TYPES = tuple(f.type.to_pandas_dtype() for f in OUT_SCHEMA)

    def __init__(self):
        self.parts: list = []

    def add(self, kind, n: int, **cols) -> None:
        if n:
            self.parts.append((n, dict(cols, kind=kind)))

    def table(self) -> pa.Table:
        if not self.parts:
            return OUT_SCHEMA.empty_table()
        sizes = np.array([n for n, _ in self.parts], dtype=np.int64)
        ends = np.cumsum(sizes)
        arrays = []
        for name, dtype in zip(self.NAMES, self.TYPES):
            col = np.empty(int(ends[-1]), dtype=dtype)
            for (n, c), end in zip(self.parts, ends):
                col[end - n:end] = c.get(name, 0)  # a scalar broadcasts, an array is copied
            arrays.append(pa.array(col))
        return pa.Table.from_arrays(arrays, schema=OUT_SCHEMA)


class _Stacked:
    """A stream's state over the key buckets of one class a task holds, as one index: each bucket's rows are
    sorted by key and the buckets' keys are distinct (bucket = pmod(key, buckets)), so the buckets' rows one
    after the other hold every key's rows together; only the distinct keys are not in one sorted order (a
    lookup goes through their argsort)."""

    def __init__(self, parts: list):
        self.parts = parts
        if len(parts) == 1:
            p = parts[0]
            self.ts, self.ukeys, self.offsets = p.ts, p.ukeys, p.offsets
        else:  # the rows' keys are not stacked: a row's key is its distinct key's (ukeys[key index])
            self.ts = np.concatenate([p.ts for p in parts])
            self.ukeys = np.concatenate([p.ukeys for p in parts])
            sizes = np.cumsum([0] + [len(p) for p in parts])
            self.offsets = np.concatenate([p.offsets[:-1] + base for p, base in zip(parts, sizes)] + [sizes[-1:]])
        self.starts = self.offsets[:-1]
        self.counts = np.diff(self.offsets)
        self._sorted = None
        self.order = None

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def nkeys(self) -> int:
        return len(self.ukeys)

    def keys_of(self, column: str) -> np.ndarray:
        return self.parts[0].keys_of(column) if len(self.parts) == 1 else \
            np.concatenate([p.keys_of(column) for p in self.parts])

    def key_index(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each key: its index among the distinct keys, and whether it is there."""
        if self.nkeys == 0 or len(keys) == 0:
            return np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=bool)
        if self._sorted is None:
            if len(self.parts) > 1:
                self.order = np.argsort(self.ukeys, kind="stable")  # each bucket's keys are a sorted run
            self._sorted = self.ukeys if self.order is None else self.ukeys[self.order]
        sorted_keys = self._sorted
        pos = np.minimum(np.searchsorted(sorted_keys, keys), self.nkeys - 1)
        found = sorted_keys[pos] == keys
        return (pos if self.order is None else self.order[pos]), found

    def ranges(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each key: (first row, number of rows) holding it; count 0 when absent."""
        idx, found = self.key_index(keys)
        return self.starts[idx], np.where(found, self.counts[idx], 0)


class _Counter:
    """The counts of the (class, bucket)s one task holds, for the cycles ``lo .. lo + n - 1``.

    Per stream and cycle end ``e``, one pass over the state's event times marks the rows in the window
    ``(e - W, e]`` and a reduction over each key's rows counts them (the CSR offsets): ``window_tuples`` and
    ``kappa`` of every group and cell follow from the per-key counts. Everything else works on the rows of the
    emitted cycles only (a few passes select them)."""

    def __init__(self, em: Emission, ci: int, lo: int, n: int, data: dict):
        self.em, self.ci, self.lo, self.n, self.data = em, ci, lo, n, data
        self.tau = em.tau_us
        self.t0 = lo * self.tau
        self.out = _Columns()
        self.G = num_groups(em.rule)
        # the group is a function of the key in this class: no group check among a key's rows
        self.by_key = em.rule is None or em.rule.get("attr_class") == em.classes[ci]
        self.cells = em.cell_sets() if ci == 0 else ()
        self.span = 1
        if self.cells and em.key_ranges:
            self.span = max(int(em.span), range_span(max(int(r.ukeys.max()) for r in data.values())))
        self.arrays = {sid: self._arrays(r) for sid, r in data.items()}

    def _arrays(self, rows) -> dict:
        em, tau, n = self.em, self.tau, self.n
        ts = rows.ts
        if em.rule is None:
            g_key, g_row = np.zeros(rows.nkeys, dtype=np.int64), None
        elif self.by_key:
            g_key, g_row = group_of(rows.ukeys, em.rule), None
        else:
            g_key, g_row = None, group_of(rows.keys_of(key_name(em.rule["attr_class"])), em.rule)
        labels = []
        for _, how in self.cells:
            labels.append(np.mod(rows.ukeys, int(em.key_buckets)) if how == "mod" else
                          np.clip(rows.ukeys // range_width(self.span, em.key_ranges), 0,
                                  min(int(em.key_ranges), self.span) - 1))
        # the rows of the emitted cycles (probes, tuples, histogram): their cycle, key index, group, cells
        sel = np.flatnonzero((ts - self.t0).view(np.uint64) < np.uint64(n * tau))
        kidx = np.searchsorted(rows.offsets, sel, side="right") - 1
        return {"g_key": g_key, "g_row": g_row, "labels": labels, "sel": sel, "rel": (ts[sel] - self.t0) // tau,
                "kidx": kidx, "g": g_key[kidx] if g_row is None else g_row[sel],
                "cells": [lab[kidx] for lab in labels]}

    def run(self) -> pa.Table:
        em = self.em
        for sid, rows in self.data.items():
            a = self.arrays[sid]
            first = em.first_class[sid] == self.ci
            self._rows(sid, a, first)
            if self.n <= KAPPA_LOOP:
                self._window_and_kappa(sid, rows, a, first)
            else:
                self._window_and_kappa_runs(sid, rows, a, first)
            self._histogram(sid, rows, a)
        members = em.class_members[self.ci]
        for l in members:
            if l in self.data:
                self._edges(l, members)
        self.out.add(SPAN, 1, ci=self.ci, v0=self.span, v1=self.lo)
        return self.out.table()

    # ---- per stream ---------------------------------------------------------------------------------
    def _rows(self, sid, a, first):
        n, lo = self.n, self.lo
        if not len(a["sel"]):
            return
        c, v = kernel._sum_by(a["g"] * n + a["rel"])
        g, j = np.divmod(c, n)
        for kind in ((ROWS, NN) if first else (NN,)):
            self.out.add(kind, len(c), sid=sid, ci=self.ci, g=g, j=j + lo, v0=v)
        for i, lab in enumerate(a["cells"]):
            c, v = kernel._sum_by(lab * n + a["rel"])
            li, j = np.divmod(c, n)
            self.out.add(CELL_KIND * (i + 1) + ROWS, len(c), sid=sid, ci=self.ci, g=li, j=j + lo, v0=v)

    def _window_and_kappa(self, sid, rows, a, first):
        """Per cycle end: the rows in the window, counted per key; ``window_tuples`` (first class) and ``kappa``
        per group and cell from the per-key counts, emitted as the kernel's deltas over the cycles."""
        n, lo, tau, G = self.n, self.lo, self.tau, self.G
        W = int(self.em.windows_us[sid])
        ts = rows.ts
        sets = [(0, a["g_key"], G)] + [(CELL_KIND * (i + 1), lab, int(lab.max()) + 1) for i, lab in enumerate(a["labels"])]
        values = {}  # (kind, set) -> per-cycle values, shape (n, L)
        kidx_row = None
        diff, mask, running = self._buffers(len(ts))  # the passes over the state reuse their memory
        ends = rows.offsets[1:] - 1
        for j in range(n):
            e = self.t0 + (j + 1) * tau
            np.subtract(ts, e - W + 1, out=diff)
            np.less(diff.view(np.uint64), np.uint64(W), out=mask)  # e - W < ts <= e
            np.cumsum(mask, dtype=np.int64, out=running)
            per_key = np.diff(running[ends], prepend=0)  # the window's rows of each key
            m = mask
            held = per_key > 0
            for base, lab, L in sets:
                if lab is not None and L == 1:  # one group: no bincount
                    wt = np.array([per_key.sum()], dtype=np.int64)
                    kap = np.array([np.count_nonzero(held)], dtype=np.int64)
                elif lab is not None:
                    wt = np.bincount(lab, weights=per_key, minlength=L)
                    kap = np.bincount(lab[held], minlength=L)
                else:  # the group is not a function of this class's key: distinct (key, group) pairs
                    if kidx_row is None:
                        kidx_row = np.repeat(np.arange(rows.nkeys, dtype=np.int64), rows.counts)
                    g = a["g_row"][m]
                    wt = np.bincount(g, minlength=L)
                    kap = np.bincount(np.unique(kidx_row[m] * G + g) % G, minlength=L)
                values.setdefault((base + KAPPA, L), []).append(kap)
                if first:
                    values.setdefault((base + WT, L), []).append(wt)
        for (kind, L), per_cycle in values.items():
            v = np.rint(np.stack(per_cycle)).astype(np.int64)  # (n, L)
            d = np.diff(v, axis=0, prepend=0)
            j, g = np.nonzero(d)
            self.out.add(kind, len(j), sid=sid, ci=self.ci, g=g, j=j + lo, v0=d[j, g])

    def _buffers(self, size: int) -> tuple:
        """Three work arrays of ``size`` elements (int64, bool, int64), allocated once per task's class."""
        if getattr(self, "_buf", None) is None or len(self._buf[0]) < size:
            top = max(len(r) for r in self.data.values())
            self._buf = (np.empty(top, np.int64), np.empty(top, bool), np.empty(top, np.int64))
        return tuple(b[:size] for b in self._buf)

    def _window_and_kappa_runs(self, sid, rows, a, first):
        """Many cycles at once (a backlog): the kernel's range deltas and run union over the state's rows."""
        n, lo, tau, W = self.n, self.lo, self.tau, int(self.em.windows_us[sid])
        ts = rows.ts
        kidx = np.repeat(np.arange(rows.nkeys, dtype=np.int64), rows.counts)
        g = a["g_key"][kidx] if a["g_row"] is None else a["g_row"]
        labels = [lab[kidx] for lab in a["labels"]]
        sets = [(0, g, None)] + [(CELL_KIND * (i + 1), lab, lab_k) for i, (lab, lab_k) in
                                 enumerate(zip(labels, a["labels"]))]
        if first:
            ja, jb = kernel._window_cycles(ts, np.int64(W), self.t0, tau)
            ok = (ja < n) & (jb > ja)
            for base, lab, _ in sets:
                c, v = kernel._window_deltas(ja[ok], jb[ok], lab[ok] * n, n)
                gg, j = np.divmod(c, n)
                self.out.add(base + WT, len(c), sid=sid, ci=self.ci, g=gg, j=j + lo, v0=v)
        ja = np.maximum(kernel._cdiv(ts - self.t0 - tau, tau), 0)
        jc = np.minimum((ts + W - 1 - self.t0 - tau) // tau, n - 1)
        ok = ja <= jc
        if not ok.any():
            return
        K = rows.nkeys
        ids, start, end = kernel.union_runs(g[ok] * K + kidx[ok], ja[ok], jc[ok], n)
        for base, _, lab_k in sets:
            key = ids // K if lab_k is None else lab_k[ids % K]
            codes = np.concatenate([key * n + start, key * n + end + 1])
            w = np.concatenate([np.ones(len(start)), -np.ones(len(start))])
            inside = np.concatenate([start, end + 1]) < n
            c, v = kernel._sum_by(codes[inside], w[inside])
            gg, j = np.divmod(c, n)
            self.out.add(base + KAPPA, len(c), sid=sid, ci=self.ci, g=gg, j=j + lo, v0=v)

    def _histogram(self, sid, rows, a):
        lo, sel = self.lo, a["sel"]
        if not len(sel):
            return
        keys, rel = rows.ukeys[a["kidx"]], a["rel"]
        B = int(self.em.buckets)
        if B > 0:
            c, v = kernel._sum_by(rel * B + np.mod(keys, B))
            j, b = np.divmod(c, B)
        else:
            bu, binv = np.unique(keys, return_inverse=True)
            c, v = kernel._sum_by(rel * len(bu) + binv)
            j, bi = np.divmod(c, len(bu))
            b = bu[bi]
        self.out.add(HIST, len(c), sid=sid, ci=self.ci, j=j + lo, x=b, v0=v)
        self.out.add(KEYRANGE, 1, sid=sid, ci=self.ci, v1=int(keys.min()), v2=int(keys.max()))

    # ---- per directed edge ------------------------------------------------------------------------------
    def _edges(self, l, members):
        """``q``, ``m``, ``s`` of every directed edge ``(l, r)`` of the class, per group (and cell) and cycle."""
        n, lo = self.n, self.lo
        rows_l, a = self.data[l], self.arrays[l]
        sel = a["sel"]
        others = [r for r in members if r != l]
        if not len(sel) or not others:
            return
        keys, ts, g, rel = rows_l.ukeys[a["kidx"]], rows_l.ts[sel], a["g"], a["rel"]
        cnt = np.stack([self._matches(keys, ts, g, r) for r in others])  # (edges, probes)
        hit = cnt > 0
        R = len(others)
        per = [(EDGE, g * n + rel)] + [(CELL_KIND * (i + 1) + EDGE, lab * n + rel) for i, lab in enumerate(a["cells"])]
        for kind, code in per:
            c, inv = kernel._dense(code)
            C = len(c)
            q = np.bincount(inv, minlength=C).astype(np.int64)
            flat = (np.arange(R, dtype=np.int64)[:, None] * C + inv[None, :])
            m = np.bincount(flat[hit], minlength=R * C).astype(np.int64)
            s = np.rint(np.bincount(flat.ravel(), weights=cnt.ravel(), minlength=R * C)).astype(np.int64)
            gg, j = np.divmod(c, n)
            self.out.add(kind, R * C, sid=l, r=np.repeat(np.asarray(others, dtype=np.int64), C), ci=self.ci,
                         g=np.tile(gg, R), j=np.tile(j + lo, R), v0=np.tile(q, R), v1=m, v2=s)

    def _matches(self, keys, ts, g, r) -> np.ndarray:
        """Per probe, ``r``'s rows with its key (and group) and ``ts_u - W_r < ts <= ts_u`` (Eq. 18)."""
        rows_r = self.data.get(r)
        if rows_r is None:
            return np.zeros(len(keys), dtype=np.int64)
        start, count = rows_r.ranges(keys)
        if not count.any():
            return count
        rep = np.repeat(np.arange(len(keys), dtype=np.int64), count)
        cand = expand(start, count)
        tc = rows_r.ts[cand]
        ok = (tc <= ts[rep]) & (tc > ts[rep] - int(self.em.windows_us[r]))
        if not self.by_key:
            ok &= self.arrays[r]["g_row"][cand] == g[rep]
        return np.bincount(rep[ok], minlength=len(keys))


def merge_spans(tables: list, emission: Emission) -> tuple[pa.Table, int, int | None]:
    """The counts of several (class, bucket)s or tasks as one table: their range cells brought to the largest
    span any used (cells of a power-of-two span nest), the ``SPAN`` rows replaced by one; ``(table, span, first
    cycle counted or None)``."""
    tables = [t for t in tables if t is not None and t.num_rows]
    if not tables:
        return kernel.OUT_SCHEMA.empty_table(), 1, None
    sets = [kind for kind, _ in emission.cell_sets()]
    ri = sets.index("ranges") if "ranges" in sets else None
    spans, los, parts = [], [], []
    for t in tables:
        kind = t.column("kind").to_numpy()
        sp = np.flatnonzero(kind == SPAN)
        span = int(max(t.column("v0").to_numpy()[sp])) if len(sp) else 1
        if len(sp):
            los.append(int(min(t.column("v1").to_numpy()[sp])))
        spans.append(span)
        parts.append((t.filter(pa.array(kind != SPAN)), span))
    top = max(spans + [int(emission.span)])
    out = []
    for t, span in parts:
        if ri is not None and span != top and emission.key_ranges:
            out.append(_coarsen(t, kernel.CELL_KIND * (ri + 1), range_width(span, emission.key_ranges),
                                range_width(top, emission.key_ranges)))
        else:
            out.append(t)
    merged = pa.concat_tables(out) if len(out) > 1 else out[0]
    span_row = pa.table({"kind": pa.array([SPAN], pa.int8()), "sid": pa.array([0], pa.int32()),
                         "r": pa.array([0], pa.int32()), "ci": pa.array([0], pa.int32()),
                         "g": pa.array([0], pa.int64()), "j": pa.array([0], pa.int64()), "x": pa.array([0], pa.int64()),
                         "v0": pa.array([top], pa.int64()), "v1": pa.array([min(los) if los else 0], pa.int64()),
                         "v2": pa.array([0], pa.int64())}, schema=kernel.OUT_SCHEMA)
    return pa.concat_tables([merged, span_row]), top, (min(los) if los else None)


def _coarsen(t: pa.Table, base: int, width_from: int, width_to: int) -> pa.Table:
    """Range cells of ``width_from`` (kinds ``base + ROWS .. base + EDGE``) as cells of ``width_to``."""
    kind = t.column("kind").to_numpy()
    sel = (kind >= base) & (kind < base + kernel.CELL_KIND)
    if not sel.any():
        return t
    g = t.column("g").fill_null(0).to_numpy().copy()
    g[sel] = (g[sel] * width_from) // width_to
    return t.set_column(t.schema.get_field_index("g"), "g", pa.array(g, pa.int64(), mask=~np.asarray(
        t.column("g").is_valid().to_numpy(zero_copy_only=False), dtype=bool)))



def task_doc(parts: list, emission: Emission, cpu_seconds: float, error: str | None = None) -> dict:
    """What a task reports of its counts: one Arrow IPC stream (base64) of all its (class, bucket) counts
    (:func:`merge_spans`: with one range-cell span)."""
    doc = {"jobstats": "", "cpu_seconds": cpu_seconds}
    if error:
        doc["error"] = error
    tables = [t for t in parts if t is not None and t.num_rows]
    if tables:
        sink = pa.BufferOutputStream()
        table = merge_spans(tables, emission)[0]
        big = table.num_rows > 20_000  # compressing a small table costs more than its bytes do
        with pa.ipc.new_stream(sink, table.schema,
                               options=pa.ipc.IpcWriteOptions(compression="lz4" if big else None)) as w:
            w.write_table(table)
        doc["jobstats"] = base64.b64encode(sink.getvalue().to_pybytes()).decode("ascii")
    return doc


def read_doc(doc: dict) -> pa.Table:
    """The counts a task reported (:func:`task_doc`)."""
    if not doc.get("jobstats"):
        return OUT_SCHEMA.empty_table()
    with pa.ipc.open_stream(pa.py_buffer(base64.b64decode(doc["jobstats"]))) as reader:
        return reader.read_all()


class TaskCounts:
    """One stage-1 task's statistics: what the engine's task calls (:func:`mjoin.engine.batch._stage_task`):
    the states each bucket loaded (:meth:`loader`, :meth:`bucket`), the quarantined rows per cycle
    (:meth:`rejected`), and at the task's end its counts over all its buckets at once (:meth:`doc`: a few numpy
    passes per stream and class, not per bucket). A failure here never fails the join: it is reported, and the
    driver writes none of the batch's cycles."""

    def __init__(self, emission: Emission):
        self.emission = emission
        self.loaded: dict = {}
        self.states: dict = {}  # class -> stream -> [KeyedRows per bucket]
        self.cpu = 0.0
        self.error: str | None = None

    def loader(self, load):
        """``load`` (the task's state loader) remembering the member states it returns."""
        def wrapped(attr_class, stream, bucket):
            rows = load(attr_class, stream, bucket)
            self.loaded[stream] = rows
            return rows

        return wrapped

    def bucket(self, attr_class: str) -> None:
        """Keep the states of the (class, bucket) just run (no copy: the task's cached state)."""
        if self.emission.counts_cycles:
            per = self.states.setdefault(attr_class, {})
            for stream, rows in self.loaded.items():
                if rows is not None and len(rows) and stream in self.emission.streams:
                    per.setdefault(stream, []).append(rows)
        self.loaded = {}

    def rejected(self, rej: pa.Table) -> dict:
        try:
            return self.emission.rejected(rej)
        except Exception as exc:  # noqa: BLE001 - reported, never fails the join
            self.error = self.error or f"{type(exc).__name__}: {exc}"
            return {}

    def doc(self, task_started: float | None = None) -> dict:
        """The task's report; ``task_started``: the thread time the task began at (the join's own CPU is the
        task's until now: the statistics are counted here, after it)."""
        c0 = time.thread_time()
        parts = []
        if self.error is None:
            try:
                parts = [self.emission.counts(cls, states) for cls, states in self.states.items()]
            except Exception as exc:  # noqa: BLE001 - reported, never fails the join
                self.error = f"{type(exc).__name__}: {exc}"
                parts = []
        self.states = {}
        doc = task_doc(parts, self.emission, 0.0, self.error)
        doc["cpu_seconds"] = self.cpu + time.thread_time() - c0
        if task_started is not None:
            doc["join_cpu_seconds"] = max(0.0, c0 - task_started - self.cpu)
        return doc
