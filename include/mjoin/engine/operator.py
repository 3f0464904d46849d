"""The per-bucket multi-way window join operator: vectorised index nested loops (numpy + pyarrow).

No Spark here: a Spark task hands one key bucket's rows to :func:`process_bucket`
and persists what it returns. Everything is a whole-array numpy operation per
bucket, never a Python loop per key or per tuple (per-key Python cost ~2 ms per
key group in the trial, see docs/engine.md).

State: per (attribute class, stream, bucket) a :class:`KeyedRows`, rows sorted by key
(stable: arrival order within a key) with a CSR index (unique keys + offsets): a
sorted-array state, so a lookup costs ``log(kappa)`` (docs/algorithms.md Eq. 6). Adding a
batch's rows merges two sorted runs (numpy's stable sort is a timsort: linear here).

Probing within one attribute class is factorised (the paper's model, rho = 1):
a *group* is a delta tuple (or, after a class change, one materialised partial
result). At each step every surviving group looks its key up once in the next
state (``q`` lookups), gathers the key's tuples and keeps those compatible in
time with the group (``s`` matches; groups with >= 1 match are the ``m`` hits,
Eq. 9-11); groups without a match die. Only after the segment's last step are
the surviving groups' cross products materialised, with the exact pairwise
window check. So the probing cost follows the order (q f(kappa) + s per step)
and the materialisation is the same work for every order.

Timing: every step, chain and bucket reports wall time (``seconds``) and the thread's CPU
time (``cpu_seconds``; a chain's include its setup: selecting its key group's tuples and
building their groups, the fixed cost a key group adds); on a shared machine the CPU time is the stable measure of the
work (other processes inflate wall time, not CPU time), which calibration uses.

Time: a partial result keeps ``lo = max ts`` and ``hi = min(ts_i + W_i)`` of its
members; a tuple ``r`` may join iff ``ts_r > lo - W_r`` and ``ts_r < hi``. That
is exactly ``max(ts) - ts_i < W_i`` for every member (docs/algorithms.md, "Notation").
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mjoin.engine.compiled import CompiledPlan, EngineQuery, key_name
from mjoin.engine.frame import delta_columns
from mjoin.model.keygroups import group_of
from mjoin.model.punctuation import covered, merged_ranges

EMPTY = np.zeros(0, dtype=np.int64)
KIND_TICK, KIND_DELTA, KIND_PARTIAL, KIND_REJECT, KIND_PUNCT, KIND_PROBE = 0, 1, 2, 3, 4, 5
#: KIND_PROBE: in a band class (PSP), a new tuple's copy in a time slice other than its own: it probes the
#: slice's state and is not kept there (each tuple is kept in one slice, visits every slice)
PROMISES = "__promises"  # suffix of a stream's promise state (its punctuations) in a (class, bucket)


def expand(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Concatenation of ``range(start[i], start[i] + count[i])`` for all i, vectorised."""
    total = int(count.sum()) if len(count) else 0
    if total == 0:
        return EMPTY
    ends = np.cumsum(count)
    return np.arange(total, dtype=np.int64) - np.repeat(ends - count, count) + np.repeat(start, count)


def int_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """An int64 column as numpy plus its validity mask (None when it has no nulls)."""
    col = table.column(name)
    if col.null_count == 0:
        return np.asarray(col.to_numpy(), dtype=np.int64), None
    valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return np.asarray(col.fill_null(0).to_numpy(), dtype=np.int64), valid


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """Unique values of an already sorted array (cheaper than np.unique)."""
    if len(a) == 0:
        return a
    keep = np.empty(len(a), dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


class KeyedRows:
    """Rows of one stream in one (class, bucket), sorted by key (stable), indexed by key (CSR).

    (Keeping the rows in arrival order with a sorting permutation, so that a batch merges int64 keys
    instead of copying the payload, was measured: no faster at 14 k or 155 k rows per stream, because
    gathering from the chunked rows costs what the copies saved; the plain sorted table stays.)"""

    __slots__ = ("table", "key_col", "key", "ts", "ukeys", "offsets", "_keys")

    def __init__(self, table: pa.Table, key_col: str, presorted: bool = False):
        if any(c.num_chunks > 1 for c in table.columns):
            table = table.combine_chunks()
        key, _ = int_column(table, key_col)
        ts, _ = int_column(table, "_ts")
        if not presorted and len(key) > 1 and not bool((key[1:] >= key[:-1]).all()):
            order = np.argsort(key, kind="stable")
            table = table.take(order)
            key, ts = key[order], ts[order]
        self._init(table, key_col, key, ts)

    def _init(self, table: pa.Table, key_col: str, key: np.ndarray, ts: np.ndarray, keys: dict | None = None) -> None:
        self.table = table
        self.key_col = key_col
        self.key = key
        self.ts = ts
        if len(key):
            bounds = np.flatnonzero(key[1:] != key[:-1]) + 1
            self.ukeys = key[np.concatenate(([0], bounds))]
            self.offsets = np.concatenate(([0], bounds, [len(key)])).astype(np.int64)
        else:
            self.ukeys = EMPTY
            self.offsets = np.zeros(1, dtype=np.int64)
        self._keys = dict(keys or {})
        self._keys[key_col] = key

    @classmethod
    def _sorted(cls, table: pa.Table, key_col: str, key: np.ndarray, ts: np.ndarray,
                keys: dict | None = None) -> "KeyedRows":
        """From rows already sorted by key, with their key and time arrays (and other key columns already
        extracted: ``keys``), no re-extraction."""
        out = cls.__new__(cls)
        out._init(table, key_col, key, ts, keys)
        return out

    @classmethod
    def empty(cls, schema: pa.Schema, key_col: str) -> "KeyedRows":
        return cls(schema.empty_table(), key_col, presorted=True)

    def __len__(self) -> int:
        return len(self.key)

    def gather(self, column: str, idx: np.ndarray):
        """Column ``column`` of the rows ``idx``."""
        return self.table.column(column).take(pa.array(idx))

    def take_rows(self, idx: np.ndarray, columns=None) -> pa.Table:
        """The rows ``idx`` (all columns, or ``columns``), in one take."""
        return (self.table if columns is None else self.table.select(columns)).take(pa.array(idx))

    def subset(self, idx: np.ndarray) -> "KeyedRows":
        """The rows ``idx`` (increasing), still sorted."""
        idx = np.asarray(idx, dtype=np.int64)
        return KeyedRows._sorted(self.table.take(pa.array(idx)), self.key_col, self.key[idx], self.ts[idx],
                                 {c: v[idx] for c, v in self._keys.items()})

    @property
    def nkeys(self) -> int:
        return len(self.ukeys)

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes + self.key.nbytes + self.ts.nbytes + self.ukeys.nbytes + self.offsets.nbytes)

    def keys_of(self, column: str) -> np.ndarray:
        """Another int64 key column (a stream's key in another attribute class)."""
        if column not in self._keys:
            self._keys[column] = int_column(self.table, column)[0]
        return self._keys[column]

    def ranges(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each key: (first row, number of rows) holding it; count 0 when absent."""
        if self.nkeys == 0 or len(keys) == 0:
            return np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=np.int64)
        pos = np.searchsorted(self.ukeys, keys)
        pos = np.minimum(pos, self.nkeys - 1)
        found = self.ukeys[pos] == keys
        start = np.where(found, self.offsets[pos], 0)
        count = np.where(found, self.offsets[pos + 1] - self.offsets[pos], 0)
        return start, count

    def band_ranges(self, keys: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """For each key: (first row, number of rows) with a key in ``[key - width, key + width]``: the rows are
        sorted by key, so a band lookup is two binary searches."""
        if len(self) == 0 or len(keys) == 0:
            return np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=np.int64)
        lo = np.searchsorted(self.key, keys - width, side="left")
        hi = np.searchsorted(self.key, keys + width, side="right")
        return lo.astype(np.int64), (hi - lo).astype(np.int64)

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self.ranges(keys)[1] > 0

    def concat(self, other: "KeyedRows") -> "KeyedRows":
        """This state plus new rows (``other``), merged by key; ``self`` if there is nothing new.
        The stable sort of two sorted runs is a linear merge (timsort); old rows stay first."""
        if len(other) == 0:
            return self
        if len(self) == 0:
            return other
        add = other.table
        if add.schema != self.table.schema:
            add = add.select(self.table.column_names).cast(self.table.schema)
        key = np.concatenate([self.key, other.key])
        order = np.argsort(key, kind="stable")
        keys = {c: np.concatenate([v, other.keys_of(c)])[order] for c, v in self._keys.items() if c != self.key_col}
        return KeyedRows._sorted(pa.concat_tables([self.table, add]).take(order), self.key_col, key[order],
                                 np.concatenate([self.ts, other.ts])[order], keys)

    def purge(self, threshold: int | None) -> "KeyedRows":
        """Drop rows with ``ts <= threshold`` (they can join no future tuple); ``self`` if none."""
        if threshold is None or len(self) == 0:
            return self
        keep = self.ts > threshold
        if keep.all():
            return self
        return self.subset(np.flatnonzero(keep))


# ---- groups and segments -------------------------------------------------------------


@dataclass
class Groups:
    """Partial results entering a segment: delta tuples (stage 1) or materialised partials."""

    key: np.ndarray  # lookup key in the segment's class
    lo: np.ndarray  # max ts of the members
    hi: np.ndarray  # min(ts + W) of the members
    bound: dict  # key column -> (values, known mask): keys fixed by the members so far
    payload: pa.Table  # payload columns of the members so far

    def __len__(self) -> int:
        return len(self.key)

    def subset(self, idx: np.ndarray) -> "Groups":
        return Groups(self.key[idx], self.lo[idx], self.hi[idx],
                      {k: (v[idx], m[idx]) for k, (v, m) in self.bound.items()}, self.payload.take(idx))


@dataclass
class StepStats:
    left: str
    right: str
    lookups: int = 0
    found: int = 0  # lookups whose key is in the state
    hits: int = 0  # lookups with >= 1 time-compatible match (m)
    matches: int = 0  # time-compatible matching tuples (s)
    seconds: float = 0.0  # wall time
    cpu_seconds: float = 0.0  # CPU time of the thread (not inflated by other processes)
    calls: int = 0  # vectorised lookups issued (one per bucket and chain with groups alive)

    def to_json(self) -> dict:
        return {"left": self.left, "right": self.right, "lookups": self.lookups, "found": self.found,
                "hits": self.hits, "matches": self.matches, "seconds": self.seconds,
                "cpu_seconds": self.cpu_seconds, "calls": self.calls}


@dataclass
class SegmentRun:
    alive: np.ndarray  # groups that matched at every step
    matches: list  # per step: (group ids, candidate rows), sorted by group
    stats: list  # StepStats per step


def within_band(a, b, width: float) -> np.ndarray:
    """``|a - b| <= width`` per row of two Arrow arrays (NULL: False), in the columns' own arithmetic:
    exact for integers and decimals (as the SQL reference), floating point for doubles."""
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if isinstance(b, pa.ChunkedArray):
        b = b.combine_chunks()
    if pa.types.is_floating(a.type) or pa.types.is_floating(b.type):
        a, b = pc.cast(a, pa.float64()), pc.cast(b, pa.float64())
        w = pa.scalar(float(width))
    elif pa.types.is_decimal(a.type) or pa.types.is_decimal(b.type):
        w = pa.scalar(Decimal(repr(float(width))))
    else:
        a, b = pc.cast(a, pa.int64()), pc.cast(b, pa.int64())
        w = pa.scalar(float(width))
    d = pc.abs(pc.subtract(a, b))
    if pa.types.is_integer(d.type):
        d = pc.cast(d, pa.float64())
    return np.asarray(pc.less_equal(d, w).fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _bands_into(eq: EngineQuery, right: str):
    """The bands that ``right`` takes part in: (other stream, other column, right's column, width)."""
    for l, lc, r, rc, w in eq.bands:
        if r == right:
            yield l, lc, rc, w
        elif l == right:
            yield r, rc, lc, w


def probe(groups: Groups, steps, views: dict, window_us: dict, eq: EngineQuery | None = None,
          held: frozenset = frozenset(), band_width: int | None = None) -> SegmentRun:
    """Factorised probing of one same-class segment: per step one lookup per surviving group; a band
    predicate between the step's stream and a member the groups already hold (the chain's first tuple,
    or a partial result's members: ``held``) filters the matches here, the others in :func:`materialise`."""
    alive = np.arange(len(groups), dtype=np.int64)
    matches, stats = [], []
    for left, right in steps:
        st = StepStats(left, right)
        t0, c0 = time.perf_counter(), time.thread_time()
        if len(alive):
            view = views[right]
            start, count = (view.ranges(groups.key[alive]) if band_width is None
                            else view.band_ranges(groups.key[alive], band_width))
            st.lookups = len(alive)
            st.calls = 1
            st.found = int(np.count_nonzero(count))
            grp = np.repeat(alive, count)
            cand = expand(start, count)
            tsc = view.ts[cand]
            ok = (tsc > groups.lo[grp] - window_us[right]) & (tsc < groups.hi[grp])
            grp, cand = grp[ok], cand[ok]
            if eq is not None and eq.bands:
                for other, ocol, rcol, width in _bands_into(eq, right):
                    if other in held and len(grp):
                        keep = within_band(groups.payload.column(ocol).take(pa.array(grp)),
                                           view.gather(rcol, cand), width)
                        grp, cand = grp[keep], cand[keep]
            alive = _sorted_unique(grp)
            st.hits, st.matches = len(alive), len(grp)
        else:
            grp = cand = EMPTY
        st.seconds = time.perf_counter() - t0
        st.cpu_seconds = time.thread_time() - c0
        matches.append((grp, cand))
        stats.append(st)
    return SegmentRun(alive, matches, stats)


@dataclass
class Materialised:
    grp: np.ndarray  # row -> group it extends
    idx: dict  # stream joined in this segment -> row in its view
    lo: np.ndarray
    hi: np.ndarray
    bound: dict  # key column -> (values, known)

    def __len__(self) -> int:
        return len(self.grp)


def materialise(groups: Groups, run: SegmentRun, steps, views: dict, eq: EngineQuery,
                lookup_col: str | None = None, held: frozenset = frozenset()) -> Materialised:
    """Cross products of the surviving groups' matches, with the exact pairwise window check
    and residual equality on keys of other classes (cyclic graphs across classes). The
    segment's own key (``lookup_col``) is equal by construction: not re-checked."""
    rows = run.alive
    lo, hi = groups.lo[rows], groups.hi[rows]
    bound = {k: (v[rows], m[rows]) for k, (v, m) in groups.bound.items()}
    idx: dict = {}
    for (left, right), (grp_k, cand_k) in zip(steps, run.matches):
        if len(rows) == 0:
            idx[right] = EMPTY
            continue
        view = views[right]
        first = np.searchsorted(grp_k, rows, side="left")
        last = np.searchsorted(grp_k, rows, side="right")
        count = last - first
        rep = np.repeat(np.arange(len(rows), dtype=np.int64), count)
        cand = cand_k[expand(first, count)]
        tsc = view.ts[cand]
        w = eq.window_us[right]
        ok = (tsc > lo[rep] - w) & (tsc < hi[rep])
        new_bound = {}
        for cls in eq.stream_classes[right]:
            col = key_name(cls)
            if col == lookup_col and col in bound:
                continue  # the candidates were fetched by this key
            kv = view.keys_of(col)[cand]
            if col in bound:
                vals, known = bound[col][0][rep], bound[col][1][rep]
                ok &= ~known | (vals == kv)
                new_bound[col] = (np.where(known, vals, kv), np.ones(len(rep), dtype=bool))
            else:
                new_bound[col] = (kv, np.ones(len(rep), dtype=bool))
        for other, ocol, rcol, width in _bands_into(eq, right):  # bands with a member joined before
            if not len(rep):
                break
            if other in idx:
                ovals = views[other].gather(ocol, idx[other][rep])
            elif other in held:
                ovals = groups.payload.column(ocol).take(pa.array(rows[rep]))
            else:
                continue  # joined later: checked then
            ok &= within_band(ovals, view.gather(rcol, cand), width)
        sel = np.flatnonzero(ok)
        rep, cand = rep[sel], cand[sel]
        rows = rows[rep]
        tsc = tsc[sel]
        lo = np.maximum(lo[rep], tsc)
        hi = np.minimum(hi[rep], tsc + w)
        bound = {k: (v[rep], m[rep]) for k, (v, m) in bound.items()}
        bound.update({k: (v[sel], m[sel]) for k, (v, m) in new_bound.items()})
        idx = {s: a[rep] for s, a in idx.items()}
        idx[right] = cand
    return Materialised(rows, idx, lo, hi, bound)


def gather_payload(eq: EngineQuery, groups: Groups, mat: Materialised, views: dict, schema: pa.Schema) -> dict:
    """Every payload column for the materialised rows (null for streams not joined yet): one take per
    stream (all of its payload columns at once), not one per column."""
    out = {}
    n = len(mat)
    held = None
    for s in eq.streams:
        cols = eq.payload_columns(s)
        if s in mat.idx:
            t = views[s].take_rows(mat.idx[s], cols)
            out.update(zip(cols, t.columns))
            continue
        for p in cols:
            if p in groups.payload.column_names:
                if held is None:
                    held = groups.payload.take(pa.array(mat.grp))
                out[p] = held.column(p)
            else:
                out[p] = pa.nulls(n, schema.field(p).type)
    return out


def result_table(eq: EngineQuery, payload: dict, result_schema: pa.Schema) -> pa.Table:
    return pa.table([payload[p] for _, p in eq.output], schema=result_schema)


# ---- one bucket of one stage -----------------------------------------------------------


@dataclass
class BucketContext:
    """What every task of one stage of one batch needs (pickled into the Spark closure)."""

    eq: EngineQuery
    plan: CompiledPlan
    frame_schema: pa.Schema
    result_schema: pa.Schema
    batch_id: int
    stage: int
    buckets: int
    emit: bool = True  # False: warm-up (only build state)
    psp_slices: int = 4  # time slices of a band class's state (PSP)
    purge_bound: int | None = None  # every future row has ts >= this (micros)
    prefilter_accounting: bool = True
    #: compute the bucket's next state in stages after the first too (pipelined interval runs
    #: replay the state of a class while probing the partial results routed to it)
    track_state: bool = False
    #: punctuations (PJoin): "eager" purges the tuples a punctuation makes useless every batch, "lazy"
    #: once they number at least ``punctuation_threshold`` in the bucket, "off" ignores punctuations
    punctuation: str = "eager"
    punctuation_threshold: int = 1000

    def state_schema(self, stream: str) -> pa.Schema:
        return pa.schema([self.frame_schema.field(c) for c in self.eq.state_columns(stream)])


@dataclass
class StateUpdate:
    """A (class, stream, bucket) state after a batch: the rows kept, the batch's new rows, and the
    purge threshold (rows with ts <= it are gone)."""

    rows: KeyedRows
    delta: KeyedRows
    threshold: int | None
    changed: bool


@dataclass
class BucketOutput:
    doc: dict
    results: list = field(default_factory=list)  # pa.Tables
    partials: list = field(default_factory=list)  # pa.Tables in frame schema
    new_state: dict = field(default_factory=dict)  # stream (or stream + PROMISES) -> StateUpdate
    rejects: list = field(default_factory=list)  # pa.Tables (_s, _reason, _file, _raw): tuples to quarantine


# ---- punctuations (PJoin) ---------------------------------------------------------------------------


def _promise_schema(attr_class: str) -> pa.Schema:
    """A stream's promises in a (class, bucket): the keys ``[key, _hi]`` it will not send again (an exact
    key has ``_hi == key``), ``_ts`` when promised (micros)."""
    return pa.schema([pa.field("_ts", pa.int64()), pa.field(key_name(attr_class), pa.int64()),
                      pa.field("_hi", pa.int64())])


def _intervals(rows: KeyedRows | None):
    if rows is None or len(rows) == 0:
        return EMPTY, EMPTY
    return merged_ranges(rows.key, rows.keys_of("_hi"))


def _dead_mask(keys: np.ndarray, promised: dict, states: dict, exclude: str | None = None) -> np.ndarray:
    """Which ``keys`` no future result can have: promised away by some stream s (``promised``: s ->
    disjoint intervals) that holds no tuple with the key any more (``states``: s -> its state);
    ``exclude``: the stream whose tuples these keys are (its own promise says nothing about its tuples)."""
    out = np.zeros(len(keys), dtype=bool)
    for s, (lo, hi) in promised.items():
        if s == exclude or len(lo) == 0 or len(keys) == 0:
            continue
        out |= covered(keys, lo, hi) & ~states[s].contains(keys)
    return out


def _reject_table(ctx: BucketContext, rows: KeyedRows, stream: str, idx: np.ndarray, reason: str) -> pa.Table:
    """Tuples of the state layout to quarantine (the row as JSON of its time, keys and payload)."""
    part = rows.take_rows(idx).to_pylist()
    raw = [json.dumps({k: (v if not hasattr(v, "isoformat") else v.isoformat()) for k, v in r.items()}, default=str)
           for r in part]
    n = len(idx)
    return pa.table({"_s": pa.array(np.full(n, ctx.eq.index(stream), np.int32)),
                     "_reason": pa.array([reason] * n, pa.string()), "_file": pa.nulls(n, pa.string()),
                     "_raw": pa.array(raw, pa.string())})


def _stream_rows(ctx: BucketContext, rows: pa.Table, kind: np.ndarray, s_idx: np.ndarray, stream: str,
                 attr_class: str, which: int = KIND_DELTA) -> KeyedRows:
    sel = np.flatnonzero((kind == which) & (s_idx == ctx.eq.index(stream)))
    src = delta_columns(ctx.eq, stream)  # a delta's payload is in its stream's slots: renamed, not copied
    if len(sel) and int(sel[-1]) - int(sel[0]) + 1 == len(sel):  # contiguous (input sorted by stream): a view
        table = rows.slice(int(sel[0]), len(sel)).select(src)
    else:
        table = rows.select(src).take(sel)
    table = table.rename_columns(ctx.eq.state_columns(stream))
    schema = ctx.state_schema(stream)
    if not table.schema.equals(schema):
        table = table.cast(schema)
    return KeyedRows(table, key_name(attr_class))


def _groups_from_delta(ctx: BucketContext, rows: KeyedRows, stream: str, attr_class: str, sel=None) -> Groups:
    eq = ctx.eq
    t = rows.table if sel is None else rows.take_rows(sel)
    ts = rows.ts if sel is None else rows.ts[sel]
    bound = {}
    for c in eq.stream_classes[stream]:
        col = key_name(c)
        v = rows.keys_of(col) if sel is None else rows.keys_of(col)[sel]
        bound[col] = (v, np.ones(len(v), dtype=bool))
    return Groups(bound[key_name(attr_class)][0], ts.copy(), ts + eq.window_us[stream], bound,
                  t.select(eq.payload_columns(stream)))


def _groups_from_partials(ctx: BucketContext, part: pa.Table, attr_class: str) -> Groups:
    eq = ctx.eq
    bound = {}
    for c in eq.classes:
        v, valid = int_column(part, key_name(c))
        bound[key_name(c)] = (v, np.ones(len(v), dtype=bool) if valid is None else valid)
    lo, _ = int_column(part, "_lo")
    hi, _ = int_column(part, "_hi")
    return Groups(bound[key_name(attr_class)][0], lo, hi, bound, part.select(eq.all_payload_columns))


def _partial_table(ctx: BucketContext, payload: dict, mat: Materialised, chain_idx: int, group: int,
                   next_step: int, next_class: str) -> pa.Table:
    """Partial results routed to the class of their next step: to the bucket of their key there, or, for a
    band class (PSP), to every time slice (each slice's state is probed; every state tuple is in one)."""
    eq, sch = ctx.eq, ctx.frame_schema
    n = len(mat)
    nk_vals, nk_known = mat.bound[key_name(next_class)]
    assert nk_known.all(), "the next step's key is bound by a member already joined"
    cols = {
        "_kind": pa.array(np.full(n, KIND_PARTIAL, dtype=np.int8)),
        "_c": pa.array(np.full(n, eq.class_index(next_class), dtype=np.int32)),
        "_b": pa.array(np.mod(nk_vals, ctx.buckets).astype(np.int32)),
        "_chain": pa.array(np.full(n, chain_idx, dtype=np.int32)),
        "_grp": pa.array(np.full(n, group, dtype=np.int32)),
        "_step": pa.array(np.full(n, next_step, dtype=np.int32)),
        "_lo": pa.array(mat.lo), "_hi": pa.array(mat.hi),
    }
    for c in eq.classes:
        col = key_name(c)
        if col in mat.bound:
            v, known = mat.bound[col]
            cols[col] = pa.array(v, mask=~known)
    cols.update(payload)
    arrays = [cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in sch]
    table = pa.Table.from_arrays([a.cast(f.type) for a, f in zip(arrays, sch)], schema=sch)
    if eq.is_band(next_class):
        k = ctx.psp_slices
        table = table.take(pa.array(np.repeat(np.arange(n), k)))
        table = table.set_column(sch.get_field_index("_b"), "_b", pa.array(np.tile(np.arange(k, dtype=np.int32), n)))
    return table


def _chain_doc(stream: str, group: int, rows_in: int) -> dict:
    return {"stream": stream, "group": group, "rows_in": rows_in, "steps": {}, "seconds": 0.0, "cpu_seconds": 0.0,
            "materialise_seconds": 0.0, "results": 0, "partials": 0}


def _run_segment(ctx: BucketContext, out: BucketOutput, chain_doc: dict, groups: Groups, chain, seg, views: dict):
    """Probe one segment, materialise, then emit results (chain complete) or partials (class change)."""
    eq = ctx.eq
    steps = [(l, r) for l, r, _ in chain.steps[seg.start:seg.end]]
    t0, c0 = time.perf_counter(), time.thread_time()
    held = frozenset([chain.stream] + [r for _, r, _ in chain.steps[:seg.start]])  # members the groups hold
    run = probe(groups, steps, views, eq.window_us, eq, held, eq.band_width.get(seg.attr_class))
    t1 = time.perf_counter()
    mat = materialise(groups, run, steps, views, eq, key_name(seg.attr_class), held)
    if len(mat):  # most segments of a small batch end empty: nothing to gather
        payload = gather_payload(eq, groups, mat, views, ctx.frame_schema)
        if seg.end == len(chain.steps):
            out.results.append(result_table(eq, payload, ctx.result_schema))
            chain_doc["results"] += len(mat)
        else:
            nxt = chain.steps[seg.end][2]
            out.partials.append(_partial_table(ctx, payload, mat, eq.index(chain.stream), chain.group, seg.end, nxt))
            chain_doc["partials"] += len(mat)
    t2 = time.perf_counter()
    for k, st in enumerate(run.stats):
        chain_doc["steps"][str(seg.start + k)] = st.to_json()
    chain_doc["seconds"] += t2 - t0
    chain_doc["cpu_seconds"] += time.thread_time() - c0
    chain_doc["materialise_seconds"] += t2 - t1


def _views_for(eq: EngineQuery, chain_stream: str, members, old: dict, full: dict) -> dict:
    """Visible state for the chain of ``chain_stream`` (delta decomposition): streams before
    it in canonical order are seen with this batch's new tuples, streams after it without."""
    i = eq.index(chain_stream)
    return {j: (full[j] if eq.index(j) < i else old[j]) for j in members if j != chain_stream}


def _prefilter(ctx: BucketContext, groups: Groups, chain, views: dict, doc: dict) -> Groups:
    """SMJ synopsis filter: drop groups whose key is absent from some other stream's window."""
    t0 = time.perf_counter()
    keep = np.ones(len(groups), dtype=bool)
    for j, view in views.items():
        keep &= view.contains(groups.key)
    doc["seconds"] += time.perf_counter() - t0
    doc["checked"] += len(groups)
    dropped = np.flatnonzero(~keep)
    doc["dropped"] += len(dropped)
    if len(dropped) and ctx.prefilter_accounting:
        # what the dropped tuples would have cost: re-run their probes, outside the timing
        seg = chain.segments[0]
        steps = [(l, r) for l, r, _ in chain.steps[seg.start:seg.end]]
        run = probe(groups.subset(dropped), steps, views, ctx.eq.window_us, ctx.eq, frozenset([chain.stream]))
        doc["lookups_saved"] += sum(st.lookups for st in run.stats)
        doc["matches_saved"] += sum(st.matches for st in run.stats)
    return groups if len(dropped) == 0 else groups.subset(np.flatnonzero(keep))


def _apply_punctuations(ctx: BucketContext, attr_class: str, rows: pa.Table, kind: np.ndarray, s_idx: np.ndarray,
                        members, promises: dict, new: dict, out: BucketOutput, punct: dict | None) -> dict | None:
    """After a batch: add the batch's punctuations to each stream's promises, forget promises older than
    twice the largest window before the purge bound, and purge (eagerly, or lazily once at least
    ``punctuation_threshold`` tuples qualify) every tuple whose key is dead: promised away by a stream that
    holds it no more. Updates ``new`` (stream -> state) and ``out.new_state`` (promise states)."""
    eq = ctx.eq
    kcol = key_name(attr_class)
    sel = np.flatnonzero(kind == KIND_PUNCT)
    fresh = {}
    if len(sel):
        part = rows.take(pa.array(sel))
        idx = s_idx[sel]
        for j in members:
            mine = np.flatnonzero(idx == eq.index(j))
            if len(mine):
                t = part.take(pa.array(mine))
                fresh[j] = KeyedRows(pa.table([t.column("_ts"), t.column(kcol), t.column("_hi")],
                                              schema=_promise_schema(attr_class)), kcol)
    if not promises and not fresh:
        return punct
    punct = punct or {"skipped": 0, "violations": 0}
    horizon = 2 * max(eq.window_us.values())
    forget = None if ctx.purge_bound is None else ctx.purge_bound - horizon
    held = {}
    for j in members:
        before = promises.get(j, KeyedRows.empty(_promise_schema(attr_class), kcol))
        now = before.concat(fresh[j]) if j in fresh else before
        now = now.purge(forget)
        if len(now) or len(before):
            out.new_state[j + PROMISES] = StateUpdate(now, fresh.get(j, KeyedRows.empty(_promise_schema(attr_class),
                                                                                         kcol)),
                                                      forget, changed=now is not before)
        if len(now):
            held[j] = _intervals(now)
    masks = {j: _dead_mask(new[j].key, held, new, exclude=j) for j in members}
    dead_tuples = sum(int(m.sum()) for m in masks.values())
    purged = 0
    if dead_tuples and (ctx.punctuation == "eager" or dead_tuples >= ctx.punctuation_threshold):
        for j, m in masks.items():
            if m.any():
                keep = np.flatnonzero(~m)
                r = new[j]
                new[j] = r.subset(keep)
                purged += int(m.sum())
    punct.update(promised=sum(len(f) for f in fresh.values()), promises_held=sum(len(v[0]) for v in held.values()),
                 dead_tuples=dead_tuples, purged=purged)
    return punct


def process_bucket(ctx: BucketContext, attr_class: str, bucket: int, rows: pa.Table, load_state) -> BucketOutput:
    """Run one stage of one batch for one (attribute class, bucket).

    ``rows`` holds the bucket's frame rows (deltas of the class's streams, partial
    results routed here, a tick); ``load_state(attr_class, stream, bucket)`` returns
    the committed state before this batch as :class:`KeyedRows`. Stage 1 also returns
    the bucket's next state (old + new tuples, purged) in ``new_state``.
    """
    eq, plan = ctx.eq, ctx.plan
    t_start, c_start = time.perf_counter(), time.thread_time()
    members = eq.members(attr_class)
    kcol = key_name(attr_class)
    kind = np.asarray(rows.column("_kind").to_numpy(zero_copy_only=False), dtype=np.int8) if rows.num_rows else np.zeros(0, np.int8)
    s_idx = (np.asarray(rows.column("_s").fill_null(-1).to_numpy(), dtype=np.int64)
             if rows.num_rows else EMPTY)
    old, promises = {}, {}
    t0 = time.perf_counter()
    for j in members:
        st = load_state(attr_class, j, bucket)
        old[j] = st if st is not None else KeyedRows.empty(ctx.state_schema(j), kcol)
        if ctx.punctuation != "off":
            pr = load_state(attr_class, j + PROMISES, bucket)
            if pr is not None and len(pr):
                promises[j] = pr
    load_seconds = time.perf_counter() - t0
    delta = {j: _stream_rows(ctx, rows, kind, s_idx, j, attr_class) for j in members}
    out = BucketOutput(doc={"stage": ctx.stage, "class": attr_class, "bucket": bucket, "chains": [],
                            "load_seconds": load_seconds})
    counted = {j: len(delta[j]) for j in members}  # accepted new tuples (before any punctuation skips them)
    newest = {j: int(delta[j].ts.max()) for j in members if len(delta[j])}
    punct = None
    if promises:  # new tuples whose key no future result can have are neither probed nor kept
        punct = {"skipped": 0, "violations": 0}
        promised = {j: _intervals(pr) for j, pr in promises.items()}
        for j in members:
            d = delta[j]
            if not len(d):
                continue
            drop = _dead_mask(d.key, promised, old, exclude=j)
            if j in promised:  # its own tuples after its promise: counted, joined as they are

                punct["violations"] += int(covered(d.key, *promised[j]).sum())
            if drop.any():
                punct["skipped"] += int(drop.sum())
                by = punct.setdefault("skipped_by_stream", {})
                by[j] = by.get(j, 0) + int(drop.sum())
                keep = np.flatnonzero(~drop)
                delta[j] = d.subset(keep)
    full = {j: old[j].concat(delta[j]) for j in members}
    probing = delta
    if eq.is_band(attr_class):  # a new tuple probes every time slice: here, its copies from the other slices too
        probing = {j: delta[j].concat(_stream_rows(ctx, rows, kind, s_idx, j, attr_class, KIND_PROBE))
                   for j in members}
    pre = {"checked": 0, "dropped": 0, "lookups_saved": 0, "matches_saved": 0, "seconds": 0.0} if plan.prefilter else None
    chains = out.doc["chains"]
    if ctx.emit and ctx.stage == 1:
        for i in members:
            d = probing[i]
            if len(d) == 0:
                continue
            views = _views_for(eq, i, members, old, full)
            grp_of = (group_of(d.keys_of(key_name(plan.partitioning["attr_class"])), plan.partitioning)
                      if plan.partitioning else np.zeros(len(d), dtype=np.int64))
            for g in np.unique(grp_of):
                chain = plan.chain(i, int(g))
                seg = chain.segments[0]
                if seg.attr_class != attr_class:
                    continue  # this chain starts in another class: that class's task runs it
                t0, c0 = time.perf_counter(), time.thread_time()  # the chain's setup counts in its time too
                sel = np.flatnonzero(grp_of == g)
                doc = _chain_doc(i, int(g), len(sel))
                groups = _groups_from_delta(ctx, d, i, attr_class, None if len(sel) == len(d) else sel)
                doc["seconds"], doc["cpu_seconds"] = time.perf_counter() - t0, time.thread_time() - c0
                if pre is not None:
                    groups = _prefilter(ctx, groups, chain, views, pre)
                _run_segment(ctx, out, doc, groups, chain, seg, views)
                chains.append(doc)
    elif ctx.emit:
        psel = np.flatnonzero(kind == KIND_PARTIAL)
        if len(psel):
            part = rows.take(psel)
            chain_idx = np.asarray(part.column("_chain").to_numpy(), dtype=np.int64)
            grp = np.asarray(part.column("_grp").to_numpy(), dtype=np.int64)
            step = np.asarray(part.column("_step").to_numpy(), dtype=np.int64)
            combo = np.stack([chain_idx, grp, step], axis=1)
            for ci, g, k in np.unique(combo, axis=0):
                t0, c0 = time.perf_counter(), time.thread_time()
                sel = np.flatnonzero((chain_idx == ci) & (grp == g) & (step == k))
                i = eq.streams[int(ci)]
                chain = plan.chain(i, int(g))
                seg = chain.segment_at(int(k))
                views = _views_for(eq, i, members, old, full)
                doc = _chain_doc(i, int(g), 0)
                doc["partials_in"] = len(sel)
                groups = _groups_from_partials(ctx, part.take(sel), attr_class)
                doc["seconds"], doc["cpu_seconds"] = time.perf_counter() - t0, time.thread_time() - c0
                _run_segment(ctx, out, doc, groups, chain, seg, views)
                chains.append(doc)
    if ctx.stage == 1 or ctx.track_state:
        new = {}
        for j in members:
            threshold = None if ctx.purge_bound is None else ctx.purge_bound - eq.window_us[j]
            new[j] = full[j].purge(threshold)
        if ctx.punctuation != "off":
            punct = _apply_punctuations(ctx, attr_class, rows, kind, s_idx, members, promises, new, out, punct)
        for j in members:
            out.new_state[j] = StateUpdate(new[j], delta[j], None if ctx.purge_bound is None else
                                           ctx.purge_bound - eq.window_us[j], changed=new[j] is not old[j])
    if ctx.stage == 1:  # the batch's accepted tuples, counted once: in their stream's first class
        firsts = [j for j in members if eq.stream_classes[j][0] == attr_class and counted[j]]
        out.doc["rows_in"] = {j: counted[j] for j in firsts}
        out.doc["max_ts"] = {j: newest[j] for j in firsts}
        out.doc["punctuation"] = punct
    out.doc["prefilter"] = pre
    out.doc["views"] = {j: {"old_keys": old[j].nkeys, "full_keys": full[j].nkeys, "old_tuples": len(old[j]),
                            "full_tuples": len(full[j])} for j in members}
    out.doc["seconds"] = time.perf_counter() - t_start
    out.doc["cpu_seconds"] = time.thread_time() - c_start
    return out
