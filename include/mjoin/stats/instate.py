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
- ``WT``/``KAPPA`` (the rows and the keys with a row in ``(e_j - W, e_j]``), of every stream of the class at
  once: the state holds that window and little more (about one cycle of lead-in before it, the rows after
  ``e_j``), so each is the state's total per group and cell (from the keys' row counts, one code per key for
  every group and cell set) less what the rows outside the window take away, found by one pass over the event
  times per cycle; a key leaves ``KAPPA`` when all its rows are outside. Key groups that are not a function of
  the class's key: a mask per cycle and a sum over each key's rows. A batch that emits more than
  :data:`KAPPA_LOOP` cycles at once (a backlog) takes the kernel's range deltas and run union
  (:func:`mjoin.stats.kernel.union_runs`);
- ``EDGE`` ``(l, r)``, for every directed edge of the class, whether the plan probes it or not: each ``l``
  row ``u`` of the cycle looks its key up in ``r``'s state, in its own key bucket (one binary search among the
  codes ``(stream, bucket, key)`` of the class's distinct keys, every edge at once) and counts ``r``'s rows of
  that key with ``ts_u - W_r < ts <= ts_u``: one time check per row of the key (about ``mu`` plus the key's rows
  outside the window, the join's own probe work), or, when the keys hold more than :data:`MANY_ROWS` rows per
  probe, two binary searches among ``r``'s rows sorted by (key, group, time) (Eq. 4, 6, 7);
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
#: a key's rows are checked one by one (the join's own probe work) unless the probes' keys hold more than this
#: many rows per probe (plus 4,096): then two binary searches per probe count them (:meth:`_Stacked.by_time`)
MANY_ROWS = 4
#: window_tuples and kappa of a class count every group and cell set with one code per key (stream, group,
#: cells) when there are at most this many codes (and no more than the keys, or 4,096)
JOINT_CODES = 1 << 20
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
        (``states``: stream -> list of :class:`Part`, or of :class:`~mjoin.engine.operator.KeyedRows`, one per
        bucket)."""
        if not self.counts_cycles:
            return None
        ci = self.classes.index(attr_class)
        data = {}
        for sid in self.class_members[ci]:
            parts = [p if isinstance(p, Part) else Part(p, None) for p in states.get(self.streams[sid]) or ()
                     if p is not None]
            parts = [p for p in parts if p.rows is not None and len(p.rows)]
            if parts:
                data[sid] = parts
        if not data:
            return None
        stack = _class_stack(data)
        data = {sid: _Stacked(parts, stack, k) for k, (sid, parts) in enumerate(data.items())}
        tau = self.tau_us
        lo = self.lo
        if lo is None:
            oldest = min(int(r.ts.min()) for r in data.values())
            lo = -((tau - oldest) // tau)  # the first cycle whose end e = (j + 1) tau is at or after it
        n = self.hi - lo
        if n <= 0:
            return None
        return _Counter(self, ci, lo, n, data, stack).run()

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
            vals = [c.get(name, 0) for _, c in self.parts]
            if all(type(v) is int for v in vals):  # noqa: E721 - a scalar per part: one repeat
                col = np.repeat(np.asarray(vals, dtype=dtype), sizes)
            else:
                col = np.zeros(int(ends[-1]), dtype=dtype)
                for n, v, end in zip(sizes.tolist(), vals, ends.tolist()):
                    if not (type(v) is int and v == 0):  # noqa: E721 - zeros are there already
                        col[end - n:end] = v  # a scalar broadcasts, an array is copied
            arrays.append(pa.array(col))
        return pa.Table.from_arrays(arrays, schema=OUT_SCHEMA)


@dataclass(frozen=True)
class Part:
    """One bucket's state of a stream (:class:`~mjoin.engine.operator.KeyedRows`) and the number of the class's
    bucket it is in the task (``seq``: the streams' parts of one bucket share it, increasing in the order the
    task ran its buckets; None: unknown)."""

    rows: object
    seq: int | None


def _class_stack(parts: dict) -> dict:
    """The states of a class's streams (``parts``: stream -> its :class:`Part` s) one after the other, as one
    index: event times, distinct keys, the keys' first rows (``offsets``), row counts and bounds per stream
    (``nr``, ``nk``)."""
    rows = [p.rows for ps in parts.values() for p in ps]
    nrow = np.cumsum([0] + [len(r) for r in rows])
    one = len(rows) == 1
    return {"sids": list(parts),
            "nr": np.cumsum([0] + [sum(len(p.rows) for p in ps) for ps in parts.values()]),
            "nk": np.cumsum([0] + [sum(p.rows.nkeys for p in ps) for ps in parts.values()]),
            "ts": rows[0].ts if one else np.concatenate([r.ts for r in rows]),
            "ukeys": rows[0].ukeys if one else np.concatenate([r.ukeys for r in rows]),
            "offsets": (offsets := rows[0].offsets if one else
                        np.concatenate([r.offsets[:-1] + b for r, b in zip(rows, nrow)] + [nrow[-1:]])),
            "counts": np.diff(offsets)}


def _expand(start: np.ndarray, count: np.ndarray, rep: np.ndarray) -> np.ndarray:
    """:func:`mjoin.engine.operator.expand` given ``rep`` (``np.repeat(arange(len(count)), count)``): one
    gather instead of two repeats."""
    first = np.cumsum(count) - count  # each run's first position
    return np.arange(len(rep), dtype=np.int64) + (start - first)[rep]


#: the largest composite code (bucket number and key, or key index, group and time) the lookups build
_CODE_MAX = 1 << 62


class _Stacked:
    """A stream's state over the key buckets of one class a task holds, as one index: each bucket's rows are
    sorted by key and the buckets' keys are distinct (bucket = pmod(key, buckets)), so the buckets' rows one
    after the other hold every key's rows together; the distinct keys are sorted by (bucket, key), not by key.
    A key is looked up in its bucket (the probe's own: the composite ``bucket * width + key - min``, one binary
    search, no sort), or, when the buckets are unknown or the keys' range too wide, through the distinct keys'
    argsort."""

    def __init__(self, parts: list, stack: dict, k: int):
        """``parts``: the stream's :class:`Part` s; its arrays are views of ``stack`` (:func:`_class_stack`), the
        class's ``k``-th stream (the rows' keys are not stacked: a row's key is its distinct key's, ``ukeys[key
        index]``)."""
        self.parts = [p.rows for p in parts]
        seqs = [p.seq for p in parts]
        self.seqs = None if any(q is None for q in seqs) or any(b <= a for a, b in zip(seqs, seqs[1:])) else \
            np.asarray(seqs, dtype=np.int64)
        rows = self.parts
        (r0, r1), (k0, k1) = stack["nr"][k:k + 2], stack["nk"][k:k + 2]
        self.ts = stack["ts"][r0:r1]
        self.ukeys = stack["ukeys"][k0:k1]
        self.offsets = stack["offsets"][k0:k1 + 1] - r0 if r0 else stack["offsets"][k0:k1 + 1]
        self.row_bounds = np.cumsum([len(p) for p in rows])  # the end row of each part
        self.key_bounds = np.cumsum([p.nkeys for p in rows])  # the end key index of each part
        self.starts = self.offsets[:-1]
        self.counts = stack["counts"][k0:k1]
        self._lookup = None
        self._by_time = {}

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def nkeys(self) -> int:
        return len(self.ukeys)

    def keys_of(self, column: str) -> np.ndarray:
        return self.parts[0].keys_of(column) if len(self.parts) == 1 else \
            np.concatenate([p.keys_of(column) for p in self.parts])

    def part_of_rows(self, idx: np.ndarray) -> np.ndarray:
        """The bucket number (:class:`Part` ``seq``) of rows ``idx``; None when the buckets are unknown."""
        if self.seqs is None:
            return None
        return self.seqs[np.searchsorted(self.row_bounds, idx, side="right")]

    def _index(self):
        if self._lookup is None:
            kmin, kmax = int(self.ukeys.min()), int(self.ukeys.max())
            width = kmax - kmin + 1
            if len(self.parts) == 1:
                self._lookup = ("sorted", self.ukeys)
            elif self.seqs is not None and (int(self.seqs[-1]) + 1) * width < _CODE_MAX:
                seq = np.repeat(self.seqs, np.diff(self.key_bounds, prepend=0))
                self._lookup = ("bucket", seq * width + (self.ukeys - kmin), kmin, kmax, width)
            else:
                order = np.argsort(self.ukeys, kind="stable")  # each bucket's keys are a sorted run
                self._lookup = ("order", self.ukeys[order], order)
        return self._lookup

    def key_index(self, keys: np.ndarray, seqs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """For each key: its index among the distinct keys, and whether it is there (``seqs``: the bucket number
        of each key, :meth:`part_of_rows` of the probing stream's rows; None: unknown)."""
        if self.nkeys == 0 or len(keys) == 0:
            return np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=bool)
        look = self._index()
        if look[0] == "bucket" and seqs is None:
            self._lookup = None
            order = np.argsort(self.ukeys, kind="stable")
            look = self._lookup = ("order", self.ukeys[order], order)
        if look[0] == "bucket":
            _, codes, kmin, kmax, width = look
            inside = (keys >= kmin) & (keys <= kmax)
            probe = seqs * width + (np.clip(keys, kmin, kmax) - kmin)
            pos = np.minimum(np.searchsorted(codes, probe), self.nkeys - 1)
            return pos, (codes[pos] == probe) & inside
        sorted_keys = look[1]
        pos = np.minimum(np.searchsorted(sorted_keys, keys), self.nkeys - 1)
        found = sorted_keys[pos] == keys
        return (pos if look[0] == "sorted" else look[2][pos]), found

    def by_time(self, g_row: np.ndarray | None, G: int):
        """The rows as sorted codes ``(key index, group, time)`` (``g_row``: each row's group when it is not a
        function of the key, else None), for counting a key's rows in a time range with two binary searches:
        ``(codes, ts_base, span, groups)``; None when the codes would not fit in int64. Built once per stream; no
        sort when each key's rows are in time order already (the engine appends a key's new rows after its old
        ones), else one sort of nearly sorted codes."""
        key = g_row is not None
        if key not in self._by_time:
            GG = G if key else 1
            ts = self.ts
            base = int(ts.min())
            span = int(ts.max()) - base + 2  # times as 1 .. span - 1
            if self.nkeys * GG * span >= _CODE_MAX or span >= _CODE_MAX:
                self._by_time[key] = None
            else:
                kidx = np.repeat(np.arange(self.nkeys, dtype=np.int64), self.counts)
                if key:
                    kidx = kidx * GG + g_row
                codes = kidx * span + (ts - (base - 1))
                if len(codes) > 1 and not bool((codes[1:] >= codes[:-1]).all()):
                    codes = np.sort(codes, kind="stable")
                self._by_time[key] = (codes, base, span, GG)
        return self._by_time[key]


class _Counter:
    """The counts of the (class, bucket)s one task holds, for the cycles ``lo .. lo + n - 1``.

    The class's streams' states are stacked (:func:`_class_stack`): ``window_tuples`` and ``kappa`` of every
    stream, group and cell come from a few passes over its keys and one over its event times per cycle
    (:meth:`_window_and_kappa`), the edges from one lookup of every probe in every other stream
    (:meth:`_matches_all`). Everything else works on the rows of the emitted cycles only (a pass selects
    them)."""

    def __init__(self, em: Emission, ci: int, lo: int, n: int, data: dict, stack: dict):
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
        self._stk = stack

    def _stack(self, stream: bool = False) -> dict:
        """The class's stacked state (:func:`_class_stack`); ``stream``: with each key's stream index."""
        st = self._stk
        if stream and "stream" not in st:
            st["stream"] = np.repeat(np.arange(len(st["sids"]), dtype=np.int64), np.diff(st["nk"]))
        return st

    def _key_groups(self, ukeys) -> np.ndarray:
        """The group of each key (groups a function of the key)."""
        return np.zeros(len(ukeys), dtype=np.int64) if self.em.rule is None else group_of(ukeys, self.em.rule)

    def _labels(self, ukeys) -> list:
        """Each key's cell in every cell set (``pmod(key, B)``; the range ``clip(key // width, 0, R - 1)``), by
        bit operations when ``B`` and ``width`` are powers of two (two's complement: the same for negative keys)."""
        out = []
        for L, how in zip(self._cell_sizes(), (how for _, how in self.cells)):
            if how == "mod":
                out.append(ukeys & (L - 1) if L & (L - 1) == 0 else np.mod(ukeys, L))
            else:
                out.append(self._labels_range(ukeys, L))
        return out

    def _joint_code(self, ukeys) -> np.ndarray:
        """Each key's code ``(group, cell of every cell set)`` (mixed radix, the sets' sizes), a new array: the
        labels of :meth:`_key_groups` and :meth:`_labels` built in place, without the range cells' clip when no
        key is negative (every key is below the span: its range is below ``R``)."""
        code = self._key_groups(ukeys) if self.G > 1 else None
        nonneg = None
        for L, (_, how) in zip(self._cell_sizes(), self.cells):
            if L == 1:
                continue
            if how == "mod" and L & (L - 1) == 0:
                lab = np.bitwise_and(ukeys, L - 1, out=None if code is None else np.empty_like(ukeys))
            elif how == "mod":
                lab = np.mod(ukeys, L)
            else:
                w = range_width(self.span, self.em.key_ranges)
                if nonneg is None:
                    nonneg = bool(len(ukeys) == 0 or ukeys.min() >= 0)
                if w & (w - 1) == 0 and nonneg:
                    lab = np.right_shift(ukeys, w.bit_length() - 1)
                else:
                    lab = self._labels_range(ukeys, L)
            if code is None:
                code = lab
            else:
                np.multiply(code, L, out=code)
                np.add(code, lab, out=code)
        return np.zeros(len(ukeys), np.int64) if code is None else code

    def _labels_range(self, ukeys, L) -> np.ndarray:
        """Each key's range cell, ``clip(key // width, 0, L - 1)`` (as :meth:`_labels`), a new array."""
        w = range_width(self.span, self.em.key_ranges)
        x = ukeys >> (w.bit_length() - 1) if w & (w - 1) == 0 else ukeys // w
        np.maximum(x, 0, out=x)
        return np.minimum(x, L - 1, out=x)

    def _cell_sizes(self) -> list:
        """The number of cells of every cell set."""
        em = self.em
        return [int(em.key_buckets) if how == "mod" else min(int(em.key_ranges), self.span) for _, how in self.cells]

    def _per_key(self, rows, a) -> tuple:
        """``(g_key, labels)`` of a stream's distinct keys (the passes that count stream by stream)."""
        if "labels" not in a:
            a["g_key"] = self._key_groups(rows.ukeys) if a["g_row"] is None else None
            a["labels"] = self._labels(rows.ukeys)
        return a["g_key"], a["labels"]

    def _arrays(self, rows) -> dict:
        em, tau, n = self.em, self.tau, self.n
        ts = rows.ts
        g_row = None if self.by_key else group_of(rows.keys_of(key_name(em.rule["attr_class"])), em.rule)
        # the rows of the emitted cycles (probes, tuples, histogram): their cycle, key index, group, cells
        sel = np.flatnonzero((ts - self.t0).view(np.uint64) < np.uint64(n * tau))
        kidx = np.searchsorted(rows.offsets, sel, side="right") - 1
        keys = rows.ukeys[kidx]
        return {"g_row": g_row, "sel": sel, "rel": (ts[sel] - self.t0) // tau, "kidx": kidx, "keys": keys,
                "g": self._key_groups(keys) if g_row is None else g_row[sel], "cells": self._labels(keys)}

    def run(self) -> pa.Table:
        em = self.em
        whole = self.n <= KAPPA_LOOP and self.by_key  # every stream's window and kappa at once
        for sid, rows in self.data.items():
            a = self.arrays[sid]
            first = em.first_class[sid] == self.ci
            self._rows(sid, a, first)
            if self.n > KAPPA_LOOP:
                self._window_and_kappa_runs(sid, rows, a, first)
            elif not whole:
                self._window_and_kappa_scan(sid, rows, a, first)
            self._histogram(sid, rows, a)
        if whole:
            self._window_and_kappa()
        self._edges()
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

    def _window_and_kappa(self):
        """Per cycle end ``e``, of every stream of the class at once (groups a function of the key):
        ``window_tuples`` (the streams of their first class) and ``kappa`` per group and cell, emitted as the
        kernel's deltas over the cycles. A stream's state holds its window ``(e - W, e]`` and little more (about a
        cycle of lead-in before it, the rows after ``e``): the counts are the state's totals (per group and cell,
        from the keys' row counts) less what the rows outside the window take away, found in one pass over the
        event times; a key leaves ``kappa`` when all its rows are outside."""
        st = self._stack()
        sids, nr, ts, offsets, counts = st["sids"], st["nr"], st["ts"], st["offsets"], st["counts"]
        S, n, tau = len(sids), self.n, self.tau
        wins = [int(self.em.windows_us[s]) for s in sids]
        sizes = self._cell_sizes()
        # one code per key for every set at once, (stream, group, cell, ...), when there are few: the counts per
        # (stream, set) are its marginals
        dims = [S, self.G] + sizes
        # (more codes than keys: a bincount per set, over the keys, costs less than the joint codes' marginals)
        joint = int(np.prod(dims, dtype=np.float64)) <= min(JOINT_CODES, max(len(counts), 4096))
        if joint:
            sets = [(0, None, self.G)] + [(CELL_KIND * (i + 1), None, L) for i, L in enumerate(sizes)]
            code = self._joint_code(st["ukeys"])
            per_stream = int(np.prod(dims[1:]))
            for k in range(1, S):  # the stream's index first
                code[st["nk"][k]:st["nk"][k + 1]] += k * per_stream
            codes = [code]
        else:
            sets = [(0, self._key_groups(st["ukeys"]) if self.G > 1 else None, self.G)]
            for i, (lab, L) in enumerate(zip(self._labels(st["ukeys"]), sizes)):
                sets.append((CELL_KIND * (i + 1), lab, L))
            codes = [self._stack(True)["stream"] * L + (0 if lab is None else lab) for _, lab, L in sets]
        size = [int(np.prod(dims))] if joint else [S * L for _, _, L in sets]

        def marginals(per_code):  # per code -> per set: (S * L) values
            if not joint:
                return per_code
            v = per_code[0].reshape(dims)
            return [v.sum(axis=tuple(a for a in range(1, len(dims)) if a != i + 1)).ravel() for i in range(len(sets))]

        rows_in = marginals([np.rint(np.bincount(c, weights=counts, minlength=m)).astype(np.int64)
                             for c, m in zip(codes, size)])
        keys_in = marginals([np.bincount(c, minlength=m) for c, m in zip(codes, size)])
        diff, mask = np.empty(len(ts), np.int64), np.empty(len(ts), bool)
        per_cycle = [([], []) for _ in sets]
        for j in range(n):
            e = self.t0 + (j + 1) * tau
            for k, W in enumerate(wins):
                d = diff[nr[k]:nr[k + 1]]
                np.subtract(ts[nr[k]:nr[k + 1]], e - W + 1, out=d)
                np.greater_equal(d.view(np.uint64), np.uint64(W), out=mask[nr[k]:nr[k + 1]])  # not e - W < ts <= e
            out = np.flatnonzero(mask)
            kidx = np.searchsorted(offsets, out, side="right") - 1  # their keys, in order
            if len(out):
                first_of = np.flatnonzero(np.concatenate(([True], kidx[1:] != kidx[:-1])))
                uk = kidx[first_of]
                gone = uk[np.diff(np.append(first_of, len(out))) == counts[uk]]  # every row outside
            else:
                gone = kidx
            rows_out = marginals([np.bincount(c[kidx], minlength=m) for c, m in zip(codes, size)])
            keys_out = marginals([np.bincount(c[gone], minlength=m) for c, m in zip(codes, size)])
            for i, (wt, kap) in enumerate(per_cycle):
                wt.append(rows_in[i] - rows_out[i])
                kap.append(keys_in[i] - keys_out[i])
        first = np.asarray([self.em.first_class[s] == self.ci for s in sids])
        sid_arr = np.asarray(sids, dtype=np.int64)
        kinds, parts = [], []
        for (base, _, L), (wt, kap) in zip(sets, per_cycle):
            for kind, vals in ((base + KAPPA, kap), (base + WT, wt)):
                v = np.stack(vals)  # (n, S * L)
                d = np.diff(v, axis=0, prepend=0) if n > 1 else v
                j, c = np.nonzero(d)
                k, gg = np.divmod(c, L)
                keep = first[k] if kind == base + WT else slice(None)
                parts.append((kind, sid_arr[k][keep], gg[keep], j[keep], d[j, c][keep]))
        sizes = [len(p[1]) for p in parts]
        self.out.add(np.repeat(np.asarray([p[0] for p in parts], dtype=np.int64), sizes), sum(sizes),
                     sid=np.concatenate([p[1] for p in parts]), ci=self.ci, g=np.concatenate([p[2] for p in parts]),
                     j=np.concatenate([p[3] for p in parts]) + self.lo, v0=np.concatenate([p[4] for p in parts]))

    def _deltas(self, sid, values):
        for (kind, L), per_cycle in values.items():
            v = np.rint(np.stack(per_cycle)).astype(np.int64)  # (n, L)
            d = np.diff(v, axis=0, prepend=0)
            j, g = np.nonzero(d)
            self.out.add(kind, len(j), sid=sid, ci=self.ci, g=g, j=j + self.lo, v0=d[j, g])

    def _window_and_kappa_scan(self, sid, rows, a, first):
        """Per cycle end: the rows in the window, counted per key; ``window_tuples`` (first class) and ``kappa``
        per group and cell from the per-key counts, emitted as the kernel's deltas over the cycles."""
        n, lo, tau, G = self.n, self.lo, self.tau, self.G
        W = int(self.em.windows_us[sid])
        ts = rows.ts
        g_key, labels = self._per_key(rows, a)
        sets = [(0, g_key, G)] + [(CELL_KIND * (i + 1), lab, int(lab.max()) + 1) for i, lab in enumerate(labels)]
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
        self._deltas(sid, values)

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
        g_key, labels_k = self._per_key(rows, a)
        g = g_key[kidx] if a["g_row"] is None else a["g_row"]
        labels = [lab[kidx] for lab in labels_k]
        sets = [(0, g, None)] + [(CELL_KIND * (i + 1), lab, lab_k) for i, (lab, lab_k) in
                                 enumerate(zip(labels, labels_k))]
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
    def _edges(self):
        """``q``, ``m``, ``s`` of every directed edge ``(l, r)`` of the class, per group (and cell) and cycle: per
        ``r``, the rows of the cycles of every other stream probe ``r``'s state at once (:meth:`_matches`)."""
        n, lo = self.n, self.lo
        members = list(self.em.class_members[self.ci])
        R = len(members)
        probing = [l for l in members if l in self.data and len(self.arrays[l]["sel"])]
        if not probing or R < 2:
            return
        arr = [self.arrays[l] for l in probing]
        sizes = [len(a["sel"]) for a in arr]
        bounds = np.cumsum([0] + sizes)
        mi = np.repeat(np.asarray([members.index(l) for l in probing], dtype=np.int64), sizes)  # member index of l
        keys = np.concatenate([a["keys"] for a in arr])
        ts = np.concatenate([self.data[l].ts[a["sel"]] for l, a in zip(probing, arr)])
        g = np.concatenate([a["g"] for a in arr])
        rel = np.concatenate([a["rel"] for a in arr])
        parts = [self.data[l].part_of_rows(a["sel"]) for l, a in zip(probing, arr)]
        seqs = None if any(p is None for p in parts) else np.concatenate(parts)
        cnt = self._matches_all(keys, ts, g, seqs, mi, members)  # (r, probe): 0 where l == r
        by_stream = cnt is None
        if by_stream:
            cnt = np.zeros((R, len(keys)), dtype=np.int64)
        for ri, r in enumerate(members if by_stream else ()):
            if r not in self.data:
                continue
            if r in probing:  # not its own rows
                k = probing.index(r)
                idx = np.concatenate([np.arange(bounds[k], dtype=np.int64),
                                      np.arange(bounds[k + 1], bounds[-1], dtype=np.int64)])
                cnt[ri, idx] = self._matches(keys[idx], ts[idx], g[idx], None if seqs is None else seqs[idx], r)
            else:
                cnt[ri] = self._matches(keys, ts, g, seqs, r)
        member_sid = np.asarray(members, dtype=np.int64)
        per = [(EDGE, g)] + [(CELL_KIND * (i + 1) + EDGE, np.concatenate([a["cells"][i] for a in arr]))
                             for i in range(len(self.cells))]
        # every kind at once: the code (kind, group or cell, cycle) of each (kind, probe)
        K, P = len(per), len(keys)
        sizes = [self.G] + self._cell_sizes()
        base = np.cumsum([0] + [L * n for L in sizes[:-1]])
        c, inv = kernel._dense(np.concatenate([lab * n + rel + b for (_, lab), b in zip(per, base)]))
        C = len(c)
        mi_k = np.tile(mi, K)
        q = np.bincount(mi_k * C + inv, minlength=R * C).astype(np.int64)  # (l, code)
        flat = ((np.arange(R, dtype=np.int64)[:, None] * R + mi_k[None, :]) * C + inv[None, :]).ravel()  # (r, l, code)
        cnt_k = np.tile(cnt, (1, K)).ravel()
        m = np.bincount(flat[cnt_k > 0], minlength=R * R * C).astype(np.int64)
        s = np.rint(np.bincount(flat, weights=cnt_k, minlength=R * R * C)).astype(np.int64)
        nz = np.flatnonzero(q)  # the (l, code)s with probes: a row for every r != l
        rr = np.repeat(np.arange(R, dtype=np.int64), len(nz))
        lc = np.tile(nz, R)
        keep = rr != lc // C
        rr, lc = rr[keep], lc[keep]
        at = rr * (R * C) + lc
        code = c[lc % C]
        k = np.searchsorted(base, code, side="right") - 1
        gg, j = np.divmod(code - base[k], n)
        self.out.add(np.asarray([kind for kind, _ in per], dtype=np.int64)[k], len(at), sid=member_sid[lc // C],
                     r=member_sid[rr], ci=self.ci, g=gg, j=j + lo, v0=q[lc], v1=m[at], v2=s[at])

    def _matches_all(self, keys, ts, g, seqs, mi, members) -> np.ndarray | None:
        """Per member ``r`` and probe (of stream ``members[mi]``), :meth:`_matches` of every ``r`` other than the
        probe's own stream at once, in the class's stacked state (:meth:`_stack`): a key is looked up in its
        bucket of ``r`` (one binary search among the composite codes ``(r, bucket, key)`` of every stream's
        keys), each row of the key checked. None (count stream by stream) when the buckets are unknown, the
        codes would not fit in int64, or the keys hold many rows (:data:`MANY_ROWS`)."""
        if seqs is None or any(self.data[s].seqs is None for s in self.data):
            return None
        st = self._stack()
        sids = st["sids"]
        S, R, P = len(sids), len(members), len(keys)
        ukeys = st["ukeys"]
        if not len(ukeys):
            return None
        kmin, kmax = int(ukeys.min()), int(ukeys.max())
        width = kmax - kmin + 1
        NS = max(int(self.data[s].seqs[-1]) for s in sids) + 1
        if S * NS * width >= _CODE_MAX:
            return None
        # the code of a key: (stream * NS + bucket) * width + key - kmin, a constant added to each part's keys
        shift = np.concatenate([(k * NS + self.data[s].seqs) * width - kmin for k, s in enumerate(sids)])
        sizes = np.concatenate([np.diff(self.data[s].key_bounds, prepend=0) for s in sids])
        codes = ukeys + np.repeat(shift, sizes)  # sorted: stream, bucket, key
        member_of = np.asarray([members.index(s) for s in sids], dtype=np.int64)
        kr = np.repeat(np.arange(S, dtype=np.int64), P)  # (r's stream index, probe) pairs, l != r
        pp = np.tile(np.arange(P, dtype=np.int64), S)
        keep = member_of[kr] != mi[pp]
        kr, pp = kr[keep], pp[keep]
        pk = keys[pp]
        probe = (kr * NS + seqs[pp]) * width + (np.clip(pk, kmin, kmax) - kmin)
        pos = np.minimum(np.searchsorted(codes, probe), len(codes) - 1)
        found = (codes[pos] == probe) & (pk >= kmin) & (pk <= kmax)
        count = np.where(found, st["counts"][pos], 0)
        total = int(count.sum())
        if total > MANY_ROWS * len(pp) + 4096:
            return None
        out = np.zeros((R, P), dtype=np.int64)
        if total:
            rep = np.repeat(np.arange(len(pp), dtype=np.int64), count)
            cand = _expand(st["offsets"][pos], count, rep)
            tc = st["ts"][cand]
            tr = ts[pp][rep]
            ok = (tc <= tr) & (tc > tr - np.asarray([int(self.em.windows_us[s]) for s in sids], np.int64)[kr][rep])
            if not self.by_key:
                g_row = np.concatenate([self.arrays[s]["g_row"] for s in sids])
                ok &= g_row[cand] == g[pp][rep]
            out[member_of[kr], pp] = np.bincount(rep[ok], minlength=len(pp))
        return out

    def _matches(self, keys, ts, g, seqs, r) -> np.ndarray:
        """Per probe, ``r``'s rows with its key (and group) and ``ts_u - W_r < ts <= ts_u`` (Eq. 18): a check of
        each row of the key when they are few (the join's own probe work), else two binary searches per probe in
        ``r``'s rows sorted by (key, group, time) (:meth:`_Stacked.by_time`)."""
        rows_r = self.data.get(r)
        if rows_r is None or not len(keys):
            return np.zeros(len(keys), dtype=np.int64)
        idx, found = rows_r.key_index(keys, seqs)
        count = np.where(found, rows_r.counts[idx], 0)
        total = int(count.sum())
        if total == 0:
            return count
        W = int(self.em.windows_us[r])
        g_row = None if self.by_key else self.arrays[r]["g_row"]
        if total > MANY_ROWS * len(keys) + 4096:  # many rows per key
            bt = rows_r.by_time(g_row, self.G)
            if bt is not None:
                codes, base, span, GG = bt
                k = (idx * GG + (0 if g_row is None else g)) * span
                lo_t = np.clip(ts - W - (base - 1), 0, span - 1)
                hi_t = np.clip(ts - (base - 1), 0, span - 1)
                c = np.searchsorted(codes, k + hi_t, side="right") - np.searchsorted(codes, k + lo_t, side="right")
                return np.where(found, c, 0)
        rep = np.repeat(np.arange(len(keys), dtype=np.int64), count)
        cand = expand(rows_r.starts[idx], count)
        tc = rows_r.ts[cand]
        tr = ts[rep]
        ok = (tc <= tr) & (tc > tr - W)
        if g_row is not None:
            ok &= g_row[cand] == g[rep]
        return np.bincount(rep[ok], minlength=len(keys))


def merge_spans(tables: list, emission: Emission) -> tuple[pa.Table, int, int | None]:
    """The counts of several (class, bucket)s or tasks as one table: their range cells brought to the largest
    span any used (cells of a power-of-two span nest), the ``SPAN`` rows replaced by one; ``(table, span, first
    cycle counted or None)``."""
    tables = [t for t in tables if t is not None and t.num_rows]
    if not tables:
        return kernel.OUT_SCHEMA.empty_table(), 1, None
    if len(tables) == 1:  # one class: its one SPAN row last (a task's counts), already the merged table
        t = tables[0]
        last = {k: t.column(k)[t.num_rows - 1].as_py() for k in ("kind", "sid", "r", "ci", "g", "j", "x", "v0", "v1", "v2")}
        if last["kind"] == SPAN and last["v0"] >= int(emission.span) and not any(
                last[k] for k in ("sid", "r", "ci", "g", "j", "x", "v2")) and \
                np.count_nonzero(t.column("kind").to_numpy() == SPAN) == 1:
            return t, last["v0"], last["v1"]
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
        # lz4 above 1,000 rows: a tenth of the bytes to encode, carry and decode (a task's ~3,300 rows of counts:
        # 270 kB as base64 uncompressed, 24 kB with lz4, in about half the time); tiny tables as they are
        big = table.num_rows > 1_000
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
        self.states: dict = {}  # class -> stream -> [Part per bucket]
        self.seq: dict = {}  # class -> number of its buckets run so far - 1
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
        """Keep the states of the (class, bucket) just run (no copy: the task's cached state), each with the
        number of the class's bucket it is in this task (the streams' parts of one bucket share it)."""
        if self.emission.counts_cycles:
            per = self.states.setdefault(attr_class, {})
            seq = self.seq[attr_class] = self.seq.get(attr_class, -1) + 1
            for stream, rows in self.loaded.items():
                if rows is not None and len(rows) and stream in self.emission.streams:
                    per.setdefault(stream, []).append(Part(rows, seq))
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
