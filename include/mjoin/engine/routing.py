"""Routing a batch's rows to (attribute class, key bucket) on the driver, and cutting a task's rows into
its (class, bucket) groups: the numpy counterpart of :meth:`mjoin.engine.batch.BatchRunner.route_frame`."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from mjoin.engine.compiled import key_name
from mjoin.engine.operator import KIND_DELTA, KIND_PROBE, KIND_REJECT


def buckets_of(t: pa.Table):
    """``(class index, bucket, rows)`` for each (class, bucket) of a stage's rows."""
    c_arr = np.asarray(t.column("_c").to_numpy(), dtype=np.int64)
    b_arr = np.asarray(t.column("_b").to_numpy(), dtype=np.int64)
    cb = c_arr * (int(b_arr.max()) + 1) + b_arr if len(b_arr) else b_arr
    if (np.diff(cb) < 0).any():  # not already sorted by (class, bucket)
        order = np.argsort(cb, kind="stable")
        c_arr, b_arr = c_arr[order], b_arr[order]
        t = t.take(order)
    cuts = np.flatnonzero((np.diff(c_arr) != 0) | (np.diff(b_arr) != 0)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(c_arr)]))
    for s, e in zip(starts, ends):
        yield int(c_arr[s]), int(b_arr[s]), t.slice(int(s), int(e - s))


def task_groups(t: pa.Table, merged: frozenset):
    """``(class index, buckets, rows)`` of a stage's rows: the buckets of a class in ``merged`` together (one
    operator call for all of the task's buckets of that class), every other (class, bucket) alone."""
    run = None  # (ci, [buckets], [slices]) of a merged class being collected
    for ci, bucket, rows in buckets_of(t):
        if ci not in merged:
            if run is not None:
                yield run[0], tuple(run[1]), pa.concat_tables(run[2])
                run = None
            yield ci, (bucket,), rows
            continue
        if run is not None and run[0] != ci:
            yield run[0], tuple(run[1]), pa.concat_tables(run[2])
            run = None
        if run is None:
            run = (ci, [], [])
        run[1].append(bucket)
        run[2].append(rows)
    if run is not None:
        yield run[0], tuple(run[1]), pa.concat_tables(run[2])


def slice_of(ts: np.ndarray, key: np.ndarray, slices: int) -> np.ndarray:
    """A band-class tuple's own time slice on the driver: a hash of its event time and band value, so the
    slices hold equal counts whatever the rates (where a tuple is kept does not have to agree with the
    executors' hash: it is probed in every slice, and purged by its own event time)."""
    h = (ts.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (key.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
    return ((h >> np.uint64(33)) % np.uint64(slices)).astype(np.int64)


def route_local(table: pa.Table | None, eq, buckets: int, schema: pa.Schema, slices: int = 4,
                batches: list | None = None) -> pa.Table:
    """:meth:`BatchRunner.route_frame` plus the ticks on the driver (numpy): an accepted row once per
    attribute class of its stream with its key's bucket (in a band class: in every time slice, kept in its
    own), a rejected row once (``_kind`` 3), one tick row per (class, bucket). ``table``: rows in the input
    layout (:func:`mjoin.engine.normalize.normalize_local`); ``schema``: the Arrow input schema.
    ``batches``: an interval's batch ids (:meth:`BatchRunner.ticks`): ``table`` has a column ``_batch``
    (int32, kept), and the ticks are one row per (class, bucket) per batch."""
    parts = []
    if table is not None and table.num_rows:
        ok = np.asarray(table.column("_reason").is_null().to_numpy(zero_copy_only=False), dtype=bool)
        for ci, c in enumerate(eq.classes):
            k = table.column(key_name(c))
            sel = np.flatnonzero(ok & np.asarray(k.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
            if not len(sel):
                continue
            part = table.take(pa.array(sel))
            n = len(sel)
            if eq.is_band(c):
                home = slice_of(np.asarray(part.column("_ts").to_numpy(), dtype=np.int64),
                                np.asarray(part.column(key_name(c)).to_numpy(), dtype=np.int64), slices)
                part = part.take(pa.array(np.repeat(np.arange(n), slices)))
                b = np.tile(np.arange(slices), n)
                kind = np.where(b == np.repeat(home, slices), KIND_DELTA, KIND_PROBE).astype(np.int8)
                part = part.set_column(schema.get_field_index("_kind"), "_kind", pa.array(kind))
                n *= slices
            else:
                b = np.mod(np.asarray(part.column(key_name(c)).to_numpy(), dtype=np.int64), buckets)
            part = part.set_column(schema.get_field_index("_c"), "_c", pa.array(np.full(n, ci, np.int32)))
            parts.append(part.set_column(schema.get_field_index("_b"), "_b", pa.array(b.astype(np.int32))))
        bad = np.flatnonzero(~ok)
        if len(bad):
            part = table.take(pa.array(bad))
            s_idx = np.asarray(part.column("_s").to_numpy(), dtype=np.int64)
            part = part.set_column(schema.get_field_index("_kind"), "_kind",
                                   pa.array(np.full(len(bad), KIND_REJECT, np.int8)))
            part = part.set_column(schema.get_field_index("_c"), "_c", pa.array(np.zeros(len(bad), np.int32)))
            part = part.set_column(schema.get_field_index("_b"), "_b", pa.array(np.mod(s_idx, buckets).astype(np.int32)))
            parts.append(part)
    pairs = np.array([(ci, b) for ci, c in enumerate(eq.classes) for b in range(slices if eq.is_band(c) else buckets)],
                     dtype=np.int32).reshape(-1, 2)
    if batches is not None:
        bids = np.repeat(np.asarray(batches, dtype=np.int32), len(pairs))
        pairs = np.tile(pairs, (len(batches), 1))
    n = len(pairs)
    tick = {"_kind": pa.array(np.zeros(n, np.int8)), "_c": pa.array(pairs[:, 0]), "_b": pa.array(pairs[:, 1])}
    ticks = pa.table([tick[f.name] if f.name in tick else pa.nulls(n, f.type) for f in schema], schema=schema)
    if batches is not None:
        ticks = ticks.append_column(pa.field("_batch", pa.int32()), pa.array(bids))
    return pa.concat_tables(parts + [ticks])
