"""One micro-batch on Spark: shuffle the new tuples once by key bucket, run every chain per bucket
in a ``mapInArrow`` task against the bucket's state, commit. The same function serves streaming
and interval evaluation.

Stage 1 routes each delta row to (class, bucket) for every attribute class its stream
is in, plus one tick row per bucket. Each task runs, for the buckets it got, the first
segment of every chain (:func:`mjoin.engine.operator.process_bucket`), writes the
bucket's results and its next state version, and returns only a small metrics
document. No Spark join, no state shuffle: the state stays in per-bucket files and in
the Python workers' memory. When a chain changes attribute class (second query),
its partial results are written by the task and a further stage re-buckets them
(with the deltas of the new class, for visibility) by the new class key.

Commit (exactly-once): results go to ``results/<query>/batch=<B>/`` (cleared first,
deterministic file names: one file per task and stage), state to version B; then the
driver writes the state manifest (the commit point), the results' ``_SUCCESS`` and the
metrics record.

Pipelined interval runs (:meth:`BatchRunner.run_pipelined`): interval evaluation has the
whole interval routed to key buckets up front, so one Spark job per *stage* runs every
batch of the interval: each task takes its buckets' rows sorted by batch and runs
:func:`~mjoin.engine.operator.process_bucket` batch after batch, the state staying in
the task's memory. Same operator, same results and per-batch metrics, but no per-batch
Spark job (in the trial and in the first benchmark, the per-batch job overhead was most
of the batch time and hid the order). Only the final state is made durable (an interval
run is a pure function of the lake: it is re-run, never resumed). Its outputs are written per
run, not per batch: each task's results of all its batches in few files of one range folder
``results/<query>/batches=<first>-<last>/`` (a ``_batch`` column) under one ``_SUCCESS``, its
rejected rows likewise per stream, the metrics records as one ``metrics.jsonl``
(:mod:`mjoin.engine.results` and :mod:`mjoin.lake.quarantine` read both layouts).
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mjoin.lake import fsutil
from mjoin.runtime.pools import shared_pool
from mjoin.model.timeutil import iso
from mjoin.engine.compiled import CompiledPlan, EngineQuery, key_name
from mjoin.engine.config import EngineConfig, EngineError
from mjoin.engine.frame import (arrow_frame_schema, arrow_input_schema, arrow_result_schema, frame_ddl, input_ddl,
                    spark_frame_schema, spark_input_schema, spark_slot_exprs, to_layout)
from mjoin.engine.metrics import shuffle_bytes, stage_times, write_jsonl, write_record
from mjoin.engine.normalize import REASONS, write_file_rejects
from mjoin.engine.operator import KIND_DELTA, KIND_PROBE, KIND_REJECT, PROMISES, BucketContext, process_bucket
from mjoin.engine.results import RowFiles, clear_batches, range_name, with_batch_column, write_parquet
from mjoin.engine.state import StateStore, StateWriter, file_key, load_state

log = logging.getLogger(__name__)

#: session settings every engine job runs with: a fixed physical plan per batch (no AQE
#: re-planning, which in the trial decided which state escaped a shuffle and inverted the
#: optimizer's ranking), no join reordering, and nanosecond Parquet timestamps readable.
ENGINE_CONF = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.cbo.enabled": "false",
    "spark.sql.cbo.joinReorder.enabled": "false",
    "spark.sql.legacy.parquet.nanosAsLong": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # the engine reads lists of files it has listed and judged itself: above this many paths Spark lists
    # them again in a distributed job per read (one per stream and schema: 4 jobs, 4.5 s of a 6.6 s read
    # of 720 files at sf 0.1); the driver's file status calls cost a few ms
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1000000",
}


def apply_engine_conf(spark) -> dict:
    """Set :data:`ENGINE_CONF` on the session; returns the previous values (for :func:`restore_conf`)."""
    before = {}
    for k, v in ENGINE_CONF.items():
        before[k] = spark.conf.get(k, None)
        spark.conf.set(k, v)
    return before


def restore_conf(spark, before: dict) -> None:
    for k, v in before.items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)


def conf_in_effect(spark) -> dict:
    """The settings that decide the physical plan, as the session has them now (recorded per batch)."""
    out = {k: spark.conf.get(k, None) for k in ENGINE_CONF}
    out["spark.sql.shuffle.partitions"] = spark.conf.get("spark.sql.shuffle.partitions", None)
    out["spark.python.worker.reuse"] = spark.sparkContext.getConf().get("spark.python.worker.reuse", "true")
    return out


_NODE = re.compile(r"^[\s:|+\-]*(?:\*\(\d+\)\s*)?([A-Za-z]\w*)")
_EXCHANGE = re.compile(r"Exchange (\w+\([^)]*\))")


def physical_info(df) -> dict:
    """What Spark will execute for ``df``, read from its executed physical plan (the same plan
    ``collect`` then runs): operator names, join nodes (none: the probes run in the Python
    tasks), exchanges with their partitioning, and whether adaptive execution wraps it."""
    try:
        text = df._jdf.queryExecution().executedPlan().toString()
    except Exception as exc:  # informative only; never fails a batch
        return {"error": f"{type(exc).__name__}: {exc}"}
    nodes = [m.group(1) for line in text.splitlines() if (m := _NODE.match(line))]
    return {"nodes": nodes, "joins": [n for n in nodes if "Join" in n],
            "exchanges": [re.sub(r"#\d+", "", e) for e in _EXCHANGE.findall(text)],
            "python_operator": next((n for n in nodes if "Arrow" in n or "Python" in n or "Pandas" in n), None),
            "adaptive": "AdaptiveSparkPlan" in text}


def _buckets_of(t: pa.Table):
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


def _task_groups(t: pa.Table, merged: frozenset):
    """``(class index, buckets, rows)`` of a stage's rows: the buckets of a class in ``merged`` together (one
    operator call for all of the task's buckets of that class), every other (class, bucket) alone."""
    run = None  # (ci, [buckets], [slices]) of a merged class being collected
    for ci, bucket, rows in _buckets_of(t):
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


#: a pipelined run on the driver uses more than one thread only when its batches average this many stage-1 rows
#: (sf 1 seed query, 604 k rows: one thread ran the operator in 4.4-5.0 s against 5.8-6.2 s on two at 360
#: batches of 10 s, 0.7-0.9 s against 1.3-1.4 s at 60 batches of 60 s, ~10 k rows a batch)
PIPELINED_ROWS_PER_THREAD = 50_000

#: the "partition" a thread of a batch run on the driver plays (``_run_task``); None: not such a thread
_DRIVER_TASK = threading.local()


def _partition_id() -> int:
    part = getattr(_DRIVER_TASK, "part", None)
    if part is not None:
        return part
    from pyspark import TaskContext

    tc = TaskContext.get()
    return tc.partitionId() if tc is not None else 0


@dataclass
class BatchInput:
    """The new tuples of one batch and what was rejected before them.

    One of: ``frame``, the normalised rows of the batch's files with ``_reason`` (:func:`mjoin.engine.
    normalize.normalize_streams`: accepted rows and rejected ones, which the tasks write to the
    quarantine); ``deltas``, accepted rows only; ``routed``, the stage-1 input already routed to
    (class, bucket) with its ticks and partitioned by (_c, _b) (interval runs route the whole interval
    once). ``rows_in``, ``max_ts`` and the row-level ``quarantined`` counts are filled in from the
    tasks' reports when the batch has run; ``quarantined`` holds the file-level ones from the start."""

    deltas: object = None
    routed: object = None
    frame: object = None
    #: or the batch's normalised rows as an Arrow table (:func:`mjoin.engine.normalize.normalize_local`):
    #: the batch runs on the driver, no Spark job (small batches of a small state)
    local: object = None
    #: the batch's punctuations as routed frame rows (an Arrow table, ``_kind`` 4), or None
    punctuations: object = None
    rows_in: dict = field(default_factory=dict)  # stream -> valid rows
    quarantined: dict = field(default_factory=dict)  # stream -> reason -> rows
    max_ts: int | None = None  # max event time among the valid rows
    max_ts_by_stream: dict = field(default_factory=dict)  # stream -> max event time of its valid rows
    quarantined_files: list = field(default_factory=list)
    files: int = 0
    #: ``() -> [FileReject]``: the files the input's tasks found unreadable since the last call
    #: (:meth:`mjoin.engine.normalize.Inspected.collect_unreadable`), asked after each stage's job
    late_rejects: object = None

    def add_late_rejects(self) -> bool:
        """Fold the files the tasks found unreadable (:attr:`late_rejects`) into the file-level counts and
        ``quarantined_files``; whether there were any."""
        from mjoin.engine.normalize import add_counts

        new = self.late_rejects() if self.late_rejects is not None else []
        for rej in new:
            add_counts(self.quarantined, {rej.stream: {rej.reason: rej.rows or 0}})
            self.quarantined_files.append(rej.to_json())
        return bool(new)

    def add_reports(self, docs) -> "BatchInput":
        """Fold the tasks' counts (stage-1 ``rows_in``/``max_ts``, ``rejects``) into this input."""
        from mjoin.engine.normalize import add_counts

        for d in docs:
            if "rejects" in d:
                add_counts(self.quarantined, d["rejects"])
            elif d.get("stage") == 1 and "rows_in" in d:
                for s, n in d["rows_in"].items():
                    self.rows_in[s] = self.rows_in.get(s, 0) + n
                for s, v in d["max_ts"].items():
                    self.max_ts_by_stream[s] = max(v, self.max_ts_by_stream.get(s, v))
        if self.max_ts_by_stream:
            self.max_ts = max(self.max_ts_by_stream.values())
        return self


def _split_rejects(t: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """A task's rows without the rejected ones, and the rejected ones (None if there are none)."""
    kind = np.asarray(t.column("_kind").to_numpy(zero_copy_only=False), dtype=np.int8)
    bad = kind == KIND_REJECT
    if not bad.any():
        return t, None
    return t.filter(pa.array(~bad)), t.filter(pa.array(bad))


def _rejects_by_stream(rej: pa.Table, streams: tuple):
    """``(stream, rows, reason -> count)`` per stream of a task's rejected rows; ``rows``: the quarantine's
    columns (reason, file, row = the row as JSON)."""
    s_idx = np.asarray(rej.column("_s").to_numpy(zero_copy_only=False), dtype=np.int64)
    uniq = np.unique(s_idx)
    for si in uniq:
        part = rej if len(uniq) == 1 else rej.filter(pa.array(s_idx == si))
        counts = pc.value_counts(part.column("_reason"))
        yield (streams[int(si)],
               pa.table({"reason": part.column("_reason"), "file": part.column("_file"), "row": part.column("_raw")}),
               {str(r): int(c) for r, c in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())})


def _write_rejects(rej: pa.Table, quarantine_root: str, streams: tuple, batch: int, tag: str) -> dict:
    """Rejected rows of one batch to ``<quarantine>/<stream>/rows/batch=<B>/part-<tag>.parquet`` (reason, file,
    row); returns stream -> reason -> rows."""
    counts: dict = {}
    for stream, rows, c in _rejects_by_stream(rej, streams):
        write_parquet(fsutil.join(quarantine_root, stream, "rows", f"batch={batch}", f"part-{tag}.parquet"), rows)
        counts[stream] = c
    return counts


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


def _run_task(fn, table: pa.Table, threads: int = 1) -> list[dict]:
    """Run a stage's task function on the driver over ``table``: its (class, bucket) groups split over
    ``threads`` "partitions" by bucket, each run on a thread of its own as Spark runs its tasks (the
    operator's work is mostly Arrow and numpy, which release the GIL, and file writes)."""
    if threads <= 1 or table.num_rows == 0:
        return _run_partition(fn, table, 0)
    part = np.mod(np.asarray(table.column("_b").fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64), threads)
    parts = [table.filter(pa.array(part == i)) for i in range(threads)]
    docs = list(shared_pool("driver-task", threads).map(lambda i: _run_partition(fn, parts[i], i), range(threads)))
    return [d for part_docs in docs for d in part_docs]


def _spark_stage(fn, df) -> tuple[list[dict], dict]:
    """A stage as one Spark job: the task function ``fn`` mapped over ``df``'s partitions; (its documents,
    the physical plan)."""
    mapped = df.mapInArrow(fn, "doc string")
    plan = physical_info(mapped)
    return [json.loads(r.doc) for r in mapped.collect()], plan


def _driver_stage(threads: int):
    """``run_stage(fn, table)`` of a stage on the driver (:func:`_run_task`), the counterpart of :func:`_spark_stage`."""
    def run_stage(fn, table: pa.Table) -> tuple[list[dict], dict]:
        return _run_task(fn, table, threads), {"where": "driver", "threads": threads}

    return run_stage


def _read_parts(folder: str) -> list[pa.Table]:
    """Every Parquet file in ``folder`` (a stage's partial results), in name order."""
    import pyarrow.parquet as pq

    parts = []
    for name in fsutil.listdir(folder):
        fs, p = fsutil.resolve(fsutil.join(folder, name))
        with fs.open_input_file(p) as fh:
            parts.append(pq.read_table(fh))
    return parts


def _run_partition(fn, table: pa.Table, part: int) -> list[dict]:
    _DRIVER_TASK.part = part
    try:
        return [json.loads(d) for rb in fn(iter(table.to_batches())) for d in rb.column(0).to_pylist()]
    finally:
        _DRIVER_TASK.part = None


def _fault_pause_in_task(marker: str, batch_id: int, seconds: float) -> None:
    """Fault injection (``pause_in_task``): the first attempt of partition 0's task records where it runs and
    sleeps, so a test can kill that worker mid-batch; a retry (the marker exists) does not pause."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    # once per batch: a retried attempt, or the task of a retried stage, finds the marker and goes on
    if _partition_id() != 0 or (tc is not None and tc.attemptNumber()) or fsutil.exists(marker):
        return
    import socket

    fsutil.atomic_write_text(marker, json.dumps({"batch_id": batch_id, "pid": os.getpid(), "pgid": os.getpgid(0),
                                                 "host": socket.gethostname()}))
    log.error("fault injection: task of batch %d pausing %ss in process %d", batch_id, seconds, os.getpid())
    time.sleep(seconds)


def _stage_task(ctx: BucketContext, state_root: str, prev_files: dict, results_dir: str, partials_dir: str,
                cache_bytes: int, classes: tuple, quarantine_root: str, pause: tuple | None = None):
    """The mapInArrow function of one stage of one batch (runs in Python workers). ``pause``: (marker path,
    seconds) of the ``pause_in_task`` fault injection."""

    def run(batches):
        if pause:
            _fault_pause_in_task(pause[0], ctx.batch_id, pause[1])
        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not tables:
            return
        t = pa.concat_tables(tables).combine_chunks()
        part = _partition_id()
        t, rejected = _split_rejects(t)
        if rejected is not None:
            counts = _write_rejects(rejected, quarantine_root, ctx.eq.streams, ctx.batch_id, f"p{part:05d}")
            yield pa.RecordBatch.from_pydict({"doc": [json.dumps({"rejects": counts, "batch_id": ctx.batch_id})]})
        if not t.num_rows:
            return
        results, partials, docs = [], [], []
        writer = StateWriter(state_root, ctx.batch_id, f"s{ctx.stage}-p{part:05d}", cache_bytes)
        for ci, bucket, rows in _buckets_of(t):
            cls = classes[ci]
            sources = {}

            def load(attr_class, stream, b):
                rows, sources[stream] = load_state(state_root, prev_files.get(file_key(attr_class, stream, b)),
                                                   key_name(attr_class), cache_bytes)
                return rows

            out = process_bucket(ctx, cls, bucket, rows, load)
            t0 = time.perf_counter()
            results += out.results
            partials += out.partials
            state = []
            for stream, update in out.new_state.items():
                prev = prev_files.get(file_key(cls, stream, bucket))
                entry = writer.persist(prev, update) if update.changed else prev
                state.append({"stream": stream, "entry": entry, "tuples": len(update.rows),
                              "keys": update.rows.nkeys, "changed": update.changed})
            out.doc["state_sources"] = sources
            out.doc["state"] = state
            out.doc["write_seconds"] = time.perf_counter() - t0
            docs.append(out.doc)
        t0 = time.perf_counter()
        writer.flush()  # the task's state pieces as one file; completes the entries in ``docs``
        tag = f"s{ctx.stage}-p{part:05d}"
        if results:  # one file per task (not per bucket): fewer, larger files
            write_parquet(fsutil.join(results_dir, f"part-{tag}.parquet"), pa.concat_tables(results))
        if partials:
            write_parquet(fsutil.join(partials_dir, f"stage={ctx.stage}", f"part-{tag}.parquet"), pa.concat_tables(partials))
        docs[-1]["write_seconds"] += time.perf_counter() - t0
        pid = os.getpid()
        for d in docs:
            d["pid"] = pid
            yield pa.RecordBatch.from_pydict({"doc": [json.dumps(d)]})

    return run


def _pipelined_task(ctx: BucketContext, state_root: str, prev_files: dict, results_dir: str, partials_dir: str,
                    cache_bytes: int, classes: tuple, purge_bounds: dict, final_version: int | None,
                    quarantine_root: str, rows_folder: str, warmup: int | None = None,
                    merged: frozenset = frozenset()):
    """The mapInArrow function of one stage of a pipelined interval run: the task's rows of every
    batch arrive sorted by ``_batch``; each complete batch is run bucket by bucket against the
    state the task keeps in memory (loaded once from the committed state before the first batch).
    The task's results of all its batches go to few files in ``results_dir`` (the run's range folder,
    :class:`mjoin.engine.results.RowFiles`, column ``_batch``), its rejected rows likewise to
    ``<quarantine>/<stream>/rows/<rows_folder>/`` (column ``batch``). Stage 1 finally makes the last
    state durable (version ``final_version``).

    ``merged``: classes whose buckets of this task run as one (one :func:`process_bucket` call per batch
    for all of them, the state of all of them in one :class:`KeyedRows` per stream, split by bucket again
    when it is made durable). A key lies in one bucket, so the lookups and results are the same; the
    fixed cost of an operator call is paid once per class instead of once per bucket, which is most of
    a small batch's time. Not for band classes (a tuple visits every time slice) nor with punctuations
    (a promise's rows are per bucket): :meth:`BatchRunner.run_pipelined` decides."""
    from mjoin.engine.operator import StateUpdate

    def run(batches):
        part = _partition_id()
        pid = os.getpid()
        tag = f"s{ctx.stage}-p{part:05d}"
        state: dict = {}  # (class index, bucket or None = merged) -> {stream: KeyedRows}
        thresholds: dict = {}  # (class index, bucket or None, stream) -> purge threshold of the last batch
        loaded: dict = {}  # merged class index -> buckets whose committed state is in its merged state
        partials: list = []
        results_out = RowFiles(results_dir, tag)
        rejects_out: dict = {}  # stream -> RowFiles of its rejected rows

        def one_batch(b: int, t: pa.Table):
            bctx = replace(ctx, batch_id=b, purge_bound=purge_bounds[b], emit=b != warmup)
            t, rejected = _split_rejects(t)
            if rejected is not None:
                counts = {}
                for stream, rows, c in _rejects_by_stream(rejected, ctx.eq.streams):
                    if stream not in rejects_out:
                        rejects_out[stream] = RowFiles(fsutil.join(quarantine_root, stream, "rows", rows_folder),
                                                       f"p{part:05d}")
                    rejects_out[stream].add(with_batch_column(rows, b, "batch"))
                    counts[stream] = c
                yield pa.RecordBatch.from_pydict({"doc": [json.dumps({"rejects": counts, "batch_id": b})]})
            if not t.num_rows:
                return
            results, docs = [], []
            for ci, bks, rows in _task_groups(t, merged):
                cls = classes[ci]
                skey = (ci, None) if ci in merged else (ci, bks[0])
                cur = state.get(skey)
                if ci in merged:  # the buckets whose committed state is not in the class's merged state yet
                    fresh = [bk for bk in bks if bk not in loaded.setdefault(ci, set())]
                else:
                    fresh = [] if cur is not None else list(bks)
                sources: dict = {}

                def load(attr_class, stream, _bk, cur=cur, fresh=fresh, sources=sources):
                    got = cur.get(stream) if cur is not None else None
                    sources[stream] = "memory"
                    for bk in fresh:  # buckets seen for the first time: their committed state
                        piece, sources[stream] = load_state(state_root, prev_files.get(file_key(attr_class, stream, bk)),
                                                            key_name(attr_class), cache_bytes)
                        if piece is not None:
                            got = piece if got is None else got.concat(piece)
                    return got

                out = process_bucket(bctx, cls, bks[0] if len(bks) == 1 else -1, rows, load)
                if ci in merged:
                    loaded[ci].update(bks)
                    out.doc["buckets"] = list(bks)
                state[skey] = {s: u.rows for s, u in out.new_state.items()}
                for s, u in out.new_state.items():
                    thresholds[(*skey, s)] = u.threshold
                results += out.results
                if out.partials:
                    p = pa.concat_tables(out.partials)
                    partials.append(p.append_column("_batch", pa.array(np.full(p.num_rows, b, dtype=np.int32))))
                out.doc["batch_id"] = b
                out.doc["state_sources"] = sources
                out.doc["state"] = [{"stream": s, "tuples": len(u.rows), "keys": u.rows.nkeys}
                                    for s, u in out.new_state.items()] if ctx.stage == 1 else []
                out.doc["write_seconds"] = 0.0
                out.doc["pid"] = pid
                docs.append(out.doc)
            if results and docs:  # buffered; written when the task's buffer is full (then timed here) or at its end
                docs[-1]["write_seconds"] = results_out.add(with_batch_column(pa.concat_tables(results), b))
            for d in docs:
                yield pa.RecordBatch.from_pydict({"doc": [json.dumps(d)]})

        def complete(tables):
            t = pa.concat_tables(tables).combine_chunks()
            bcol = np.asarray(t.column("_batch").to_numpy(), dtype=np.int64)
            cuts = np.flatnonzero(np.diff(bcol)) + 1
            for s, e in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [len(bcol)]))):
                yield from one_batch(int(bcol[s]), t.slice(int(s), int(e - s)).drop_columns(["_batch"]))

        pending, pending_batch = [], None
        for rb in batches:
            if not rb.num_rows:
                continue
            bcol = np.asarray(rb.column(rb.schema.get_field_index("_batch")).to_numpy(), dtype=np.int64)
            if (pending_batch is not None and bcol[0] < pending_batch) or (np.diff(bcol) < 0).any():
                raise RuntimeError("pipelined stage input is not sorted by _batch within the partition")
            t = pa.Table.from_batches([rb])
            if pending_batch is not None and bcol[-1] == pending_batch:
                pending.append(t)
                continue
            # rows of batches before the last one seen here are complete
            last = int(bcol[-1])
            cut = int(np.searchsorted(bcol, last, side="left"))
            done = pending + ([t.slice(0, cut)] if cut else [])
            if done:
                yield from complete(done)
            pending, pending_batch = [t.slice(cut)], last
        if pending:
            yield from complete(pending)
        t0 = time.perf_counter()
        results_out.close()
        for out in rejects_out.values():
            out.close()
        yield pa.RecordBatch.from_pydict({"doc": [json.dumps({"files_seconds": time.perf_counter() - t0, "pid": pid})]})
        if partials:
            write_parquet(fsutil.join(partials_dir, f"stage={ctx.stage}", f"part-{tag}.parquet"), pa.concat_tables(partials))
        if final_version is not None and state:
            t0 = time.perf_counter()
            final = []
            writer = StateWriter(state_root, final_version, f"{tag}-final", cache_bytes)
            for (ci, bucket), streams in state.items():
                for stream, rows in streams.items():
                    thr = thresholds.get((ci, bucket, stream))
                    if bucket is None:  # a merged class: its state split by bucket again (key mod buckets)
                        of = np.mod(rows.key, ctx.buckets)
                        pieces = [(bk, rows.subset(np.flatnonzero(of == bk))) for bk in sorted(loaded[ci])]
                    else:
                        pieces = [(bucket, rows)]
                    for bk, piece in pieces:
                        entry = writer.persist(None, StateUpdate(piece, piece, thr, True))
                        final.append({"class": classes[ci], "stream": stream, "bucket": bk, "entry": entry})
            writer.flush()
            yield pa.RecordBatch.from_pydict({"doc": [json.dumps({"final_state": final, "pid": pid,
                                                                  "write_seconds": time.perf_counter() - t0})]})

    return run


class BatchRunner:
    """Runs batches of one query into one output lake (results, state, metrics, quarantine)."""

    def __init__(self, spark, query, out_lake, config: EngineConfig, mode: str):
        self.spark = spark
        self.query = query
        self.eq = EngineQuery.from_query(query)
        self.lake = out_lake
        self.config = config
        self.mode = mode
        self.store = StateStore(out_lake.state(query.name))
        self.results_root = out_lake.results(query.name)
        self.metrics_dir = out_lake.metrics(query.name)
        self.quarantine_root = out_lake.quarantine(query.name)
        self.frame_schema = spark_frame_schema(self.eq)
        self.arrow_schema = arrow_frame_schema(self.eq)
        #: stage 1's rows (what crosses the input shuffle), without the partial results' columns (frame.input_ddl)
        self.input_schema = spark_input_schema(self.eq)
        self.arrow_input_schema = arrow_input_schema(self.eq)
        self.result_schema = arrow_result_schema(self.eq)
        self.partitions = config.shuffle_partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
        self.store.check_compatible(config.buckets, self.eq.fingerprint,
                                    config.psp_slices if self.eq.band_width else None)
        self._conf = None  # the session's settings, read from Spark once per runner (engine.batch.conf_in_effect)
        self._lean = None  # input_layout(rejects=False), made when first needed

    def conf(self) -> dict:
        """:func:`conf_in_effect`, read once per runner: the engine's settings are applied for the whole run
        (``apply_engine_conf``) and reading the SparkConf through py4j cost ~10-40 ms per micro-batch."""
        if self._conf is None:
            self._conf = conf_in_effect(self.spark)
        return dict(self._conf)

    # ---- stage inputs ---------------------------------------------------------------------
    def route(self, deltas, keep=()):
        """Accepted delta rows routed for stage 1 (:meth:`route_frame` of rows without a ``_reason``)."""
        return self.route_frame(deltas, keep)

    def route_frame(self, frame, keep=()):
        """Normalised rows (accepted and rejected) routed for stage 1 (without ticks), in the input layout
        (:func:`mjoin.engine.frame.input_ddl`: payload in its stream's slots), in one projection over one scan
        of the files: an accepted row once per attribute class of its stream (``_kind`` 1, its key's bucket),
        a rejected row once (``_kind`` 3, one bucket per stream). In a band class (PSP) an accepted row goes
        to every time slice: kept in its own (``_kind`` 1, the slice of its event time), probing the others
        (``_kind`` 5). A union of filters would read every file twice. (Built as SQL text: a handful of py4j
        calls instead of several per column.) Rows without ``_reason`` (no row of their files can be rejected:
        :func:`mjoin.engine.normalize.normalize_streams`) are all accepted and routed without the reject columns
        (``input_ddl(eq, rejects=False)``): they do not cross the exchange."""
        eq = self.eq
        have = set(frame.columns)
        rejects = "_reason" in have
        names = [n for n, _ in input_ddl(eq, rejects)] + [k for k in keep if k in have]
        frame = self.conform(frame, keep, rejects=rejects)
        nb, ns = self.config.buckets, self.config.psp_slices
        ok = "_reason IS NULL" if rejects else "TRUE"
        bands = [ci for ci, c in enumerate(eq.classes) if eq.is_band(c)]

        def project(df, exprs: dict):
            """``df`` with the columns of ``exprs`` replaced in place (``withColumn``), in one select."""
            return df.selectExpr(*[f"{exprs[n]} AS `{n}`" if n in exprs else f"`{n}`" for n in names])

        if len(eq.classes) == 1 and not bands:
            return project(frame, {"_kind": f"CAST(CASE WHEN {ok} THEN 1 ELSE {KIND_REJECT} END AS TINYINT)",
                                   "_c": "CAST(0 AS INT)",
                                   "_b": f"CAST(CASE WHEN {ok} THEN pmod({key_name(eq.classes[0])}, {nb}) "
                                         f"ELSE pmod(_s, {nb}) END AS INT)"})
        classes = "array(" + ", ".join(f"CASE WHEN {ok} AND {key_name(cl)} IS NOT NULL THEN {ci} END"
                                       for ci, cl in enumerate(eq.classes)) + ")"
        frame = project(frame, {"_c": f"explode(CASE WHEN {ok} THEN {classes} ELSE array(0) END)"}).where("_c IS NOT NULL")
        k = "CASE _c " + " ".join(f"WHEN {i} THEN {key_name(cl)}" for i, cl in enumerate(eq.classes)) + " END"
        kind = f"CASE WHEN {ok} THEN 1 ELSE {KIND_REJECT} END"
        bucket = f"CASE WHEN {ok} THEN pmod({k}, {nb}) ELSE pmod(_s, {nb}) END"
        if bands:
            in_band = f"({ok} AND _c IN ({', '.join(map(str, bands))}))"
            home = f"pmod(xxhash64(_ts, {k}, _s), {ns})"  # a tuple's own slice: by count, not by time
            frame = frame.selectExpr("*", f"explode(CASE WHEN {in_band} THEN sequence(0, {ns - 1}) ELSE array(-1) END)"
                                          " AS _slice")
            kind = f"CASE WHEN {in_band} AND _slice != {home} THEN {KIND_PROBE} ELSE {kind} END"
            bucket = f"CASE WHEN {in_band} THEN _slice ELSE {bucket} END"
        return project(frame, {"_kind": f"CAST({kind} AS TINYINT)", "_b": f"CAST({bucket} AS INT)"})

    def clear_quarantined_rows(self, batches) -> None:
        """Remove the quarantined rows of ``batches`` (a re-run writes them again, never twice)."""
        for stream in self.eq.streams:
            for b in batches:
                fsutil.remove(fsutil.join(self.quarantine_root, stream, "rows", f"batch={b}"))

    def ticks(self, batches=None, rejects: bool = True):
        """One tick row per (class, bucket) (a band class's buckets are its time slices), per batch in
        ``batches`` (consecutive; as column ``_batch``): generated by Spark (no rows shipped from the
        driver: ``createDataFrame`` of them cost ~0.1-0.2 s a run). ``rejects``: in the input layout with the
        reject columns (:meth:`input_layout`)."""
        sizes = [self.config.psp_slices if self.eq.is_band(c) else self.config.buckets for c in self.eq.classes]
        n = sum(sizes)
        ends = list(np.cumsum(sizes))
        k = f"(id % {n})"  # the (class, bucket) pair's index; class ci holds pairs [ends[ci] - sizes[ci], ends[ci])
        c, start = "0", "0"
        if len(sizes) > 1:
            c = "CASE " + " ".join(f"WHEN {k} < {e} THEN {ci}" for ci, e in enumerate(ends[:-1])) + f" ELSE {len(sizes) - 1} END"
            start = ("CASE " + " ".join(f"WHEN {k} < {e} THEN {e - m}" for e, m in zip(ends[:-1], sizes))
                     + f" ELSE {ends[-1] - sizes[-1]} END")
        exprs = {"_kind": "CAST(0 AS TINYINT)", "_c": f"CAST({c} AS INT)", "_b": f"CAST({k} - {start} AS INT)"}
        cols = [f"{exprs[name]} AS {name}" if name in exprs else f"CAST(NULL AS {t}) AS `{name}`"
                for name, t in input_ddl(self.eq, rejects)]
        if batches:
            cols.append(f"CAST({batches[0]} + id div {n} AS INT) AS _batch")
        # a generated local relation, not spark.range: ticks are not read, so not counted as the stage's input rows
        ids = self.spark.sql(f"SELECT explode(sequence(0, {n * (len(batches) if batches else 1) - 1})) AS id")
        return ids.selectExpr(*cols)

    def conform(self, df, keep=(), full: bool = False, rejects: bool = True):
        """The input layout's columns (``full``: the whole frame's; ``rejects`` False: the input layout without
        the reject columns), in order, then ``keep``: missing ones as typed nulls; a stream's payload, where
        ``df`` has it by name (normalised rows), in its slots."""
        have = set(df.columns)
        slots = spark_slot_exprs(self.eq, have)
        ddl = frame_ddl(self.eq) if full else input_ddl(self.eq, rejects)
        cols = [f"CAST(`{n}` AS {t}) AS `{n}`" if n in have else f"{slots[n]} AS `{n}`" if n in slots
                else f"CAST(NULL AS {t}) AS `{n}`" for n, t in ddl]
        return df.selectExpr(*cols, *[f"`{k}`" for k in keep if k in have])

    def partitioned(self, df):
        return df.repartition(self.partitions, "_c", "_b")

    def input_layout(self, rejects: bool = True):
        """(Spark, Arrow) schema of stage 1's rows, with or without the reject columns (:func:`frame.input_ddl`)."""
        if rejects:
            return self.input_schema, self.arrow_input_schema
        if self._lean is None:
            self._lean = (spark_input_schema(self.eq, False), arrow_input_schema(self.eq, False))
        return self._lean

    # ---- one batch ----------------------------------------------------------------------------
    def run(self, batch_id: int, binput: BatchInput, plan: CompiledPlan, *, purge_bound: int | None,
            emit: bool = True, extra: dict | None = None, write_metrics: bool = True,
            after_tasks=None) -> dict:
        """Run one batch and commit it. ``purge_bound``: every row of this and later batches has
        ``ts >= purge_bound`` (state tuples that can join none of them go after the batch);
        ``after_tasks(binput) -> (manifest fields, record fields)``: called when the tasks are done, with
        the batch's input holding their counts (:meth:`BatchInput.add_reports`), before the commit: what
        the streaming job keeps with the state from batch to batch (``event_time``: its watermarks,
        :class:`mjoin.engine.watermark.Watermarks`; ``seen_files``: the files it accepted,
        :class:`mjoin.lake.contract.Seen`) and what it adds to the batch's metrics."""
        spark, eq, cfg = self.spark, self.eq, self.config
        started = datetime.now(timezone.utc)
        t_batch = time.perf_counter()
        group = f"mjoin-{eq.name}-{self.mode}-{batch_id}-{time.time_ns()}"
        spark.sparkContext.setJobGroup(group, f"mjoin {eq.name} batch {batch_id}", interruptOnCancel=False)
        latest = self.store.latest()
        if latest is not None and latest["version"] > batch_id:
            raise EngineError(
                f"the state of {eq.name} is at batch {latest['version']}, ahead of batch {batch_id}: the checkpoint "
                f"and the state ({self.store.root}) do not belong together; restore the checkpoint or remove both")
        prev = self.store.latest_before(batch_id)
        prev_files = dict(prev["files"]) if prev else {}
        results_dir = fsutil.join(self.results_root, f"batch={batch_id}")
        tmp = self.store.tmp_dir(batch_id)
        fsutil.remove(results_dir)
        fsutil.remove(tmp)
        cache_bytes = cfg.state_cache_mb * 1024 * 1024
        ctx = BucketContext(eq=eq, plan=plan, frame_schema=self.arrow_schema, result_schema=self.result_schema,
                            batch_id=batch_id, stage=1, buckets=cfg.buckets, emit=emit, purge_bound=purge_bound,
                            prefilter_accounting=cfg.prefilter_accounting, punctuation=plan.punctuation,
                            punctuation_threshold=plan.punctuation_threshold, psp_slices=cfg.psp_slices)
        self.clear_quarantined_rows([batch_id])
        if binput.local is not None:
            docs, stage_seconds, physical, stage = self._run_local(ctx, binput, prev_files, results_dir, tmp,
                                                                   cache_bytes)
            where = "driver"
        else:
            docs, stage_seconds, physical, stage = self._run_spark(ctx, binput, prev_files, results_dir, tmp,
                                                                   cache_bytes)
            where = "executors"
        conf = self.conf()

        t0 = time.perf_counter()
        if f"crash_before_commit:{batch_id}" in cfg.faults():
            log.error("fault injection: ending the process before the commit of batch %s", batch_id)
            os._exit(17)
        files = dict(prev_files)
        for d in docs:
            if d["stage"] != 1:
                continue
            for st in d["state"]:
                key = file_key(d["class"], st["stream"], d["bucket"])
                if st["entry"]:
                    files[key] = st["entry"]
                else:
                    files.pop(key, None)
        max_ts = max([v for v in ((prev or {}).get("max_ts"), binput.max_ts) if v is not None], default=None)
        manifest = {"version": batch_id, "batch_id": batch_id, "query": eq.name, "query_fingerprint": eq.fingerprint,
                    "buckets": cfg.buckets, "psp_slices": cfg.psp_slices, "max_ts": max_ts,
                    "watermark": None if max_ts is None else max_ts - eq.lateness_us,
                    "plan_version": plan.version, "plan_source": plan.source, "files": files,
                    "mode": self.mode}
        more_manifest, more_record = after_tasks(binput) if after_tasks is not None else ({}, {})
        manifest.update(more_manifest)
        if "event_time" in manifest:
            manifest["watermark"] = manifest["event_time"].get("watermark")
        record = self._record(batch_id, binput, plan, docs, started, {**(extra or {}), **more_record})
        manifest["tuples"] = record["state_tuples"]
        manifest["keys"] = record["state_keys"]
        self.store.commit(manifest)
        fsutil.atomic_write_text(fsutil.join(results_dir, "_SUCCESS"), json.dumps(
            {"batch_id": batch_id, "rows": record["result_rows"], "columns": [f.name for f in self.result_schema],
             "plan_version": plan.version}))
        self.store.gc(cfg.state_versions_kept)
        fsutil.remove(tmp)
        stage_seconds["commit"] = time.perf_counter() - t0
        record["stage_seconds"] = stage_seconds
        record["stages"] = stage
        record["spark_conf"] = conf
        record["spark_plan"] = physical
        record["spark_strategies"] = _strategies(physical)
        record["execution"] = {"mode": "per-batch", "jobs": stage if where == "executors" else 0, "where": where}
        # a batch on the driver ran no Spark job: nothing to ask Spark's status store
        record["shuffle_bytes"] = shuffle_bytes(spark, group) if where == "executors" else \
            {"read": 0, "written": 0, "stages": 0}
        record["wall_seconds"] = time.perf_counter() - t_batch
        if write_metrics:
            write_record(self.metrics_dir, record)
        return record

    def _stages(self, ctx: BucketContext, binput: BatchInput, prev_files: dict, results_dir: str, tmp: str,
                cache_bytes: int, stage_input, run_stage, next_input):
        """Run a batch stage by stage until no partial result is pending: ``run_stage(fn, input)`` runs the
        task function ``fn`` over a stage's input (docs, physical plan), ``next_input(folder)`` is the next
        stage's input from the partial results written there. Returns (docs, stage seconds, physical
        plans, stages)."""
        eq = self.eq
        docs, stage_seconds, physical = [], {}, {}
        stage = 1
        while True:
            t0 = time.perf_counter()
            pause = self.config.pause_at("in_task", ctx.batch_id) if stage == 1 else 0.0
            marker = fsutil.join(self.lake.checkpoints(eq.name), "_control", f"fault_in_task-{ctx.batch_id}.json")
            fn = _stage_task(replace(ctx, stage=stage), self.store.root, prev_files, results_dir, tmp, cache_bytes,
                             eq.classes, self.quarantine_root, (marker, pause) if pause else None)
            stage_docs, physical[f"stage{stage}"] = run_stage(fn, stage_input)
            self._late_rejects({ctx.batch_id: binput})
            binput.add_reports([d for d in stage_docs if "rejects" in d or stage == 1])
            stage_docs = [d for d in stage_docs if "rejects" not in d]
            docs += stage_docs
            stage_seconds[f"stage{stage}"] = time.perf_counter() - t0
            if not sum(c["partials"] for d in stage_docs for c in d["chains"]):
                return docs, stage_seconds, physical, stage
            stage += 1
            if stage > len(eq.streams):
                raise RuntimeError("partial results still pending after n stages: plan segments are inconsistent")
            stage_input = next_input(fsutil.join(tmp, f"stage={stage - 1}"))

    def _late_rejects(self, inputs: dict) -> None:
        """After a stage's job: the files its input tasks found unreadable (:meth:`BatchInput.add_late_rejects`)
        counted in their batch's input, and that batch's rejected files written again with them
        (``files-batch=<B>.json``, as :func:`mjoin.engine.normalize.write_quarantine` wrote them before)."""
        for b, binput in inputs.items():
            if binput.add_late_rejects():
                write_file_rejects(self.quarantine_root, binput.quarantined_files, b)

    def _run_spark(self, ctx: BucketContext, binput: BatchInput, prev_files: dict, results_dir: str, tmp: str,
                   cache_bytes: int):
        """The batch's stages as Spark jobs (one per stage)."""
        if binput.routed is not None:
            stage_input = binput.routed
            routed = binput.routed.where("_kind = 1")
        else:
            if binput.frame is not None:
                first = self.route_frame(binput.frame)
                routed = first.where("_kind = 1")
            else:
                deltas = binput.deltas if binput.deltas is not None else self.spark.createDataFrame([], self.input_schema)
                first = routed = self.route(deltas)
            rejects = "_reason" in first.columns  # else no row of the batch can be rejected (route_frame)
            stage_input = self.partitioned(self._with_punctuations(first.unionByName(self.ticks(rejects=rejects)),
                                                                   binput, rejects))

        def next_input(folder):  # partial results (whole frame) and the deltas replayed into their class
            return self.partitioned(self.spark.read.schema(self.frame_schema).parquet(folder)
                                    .unionByName(self.conform(routed, full=True)))

        return self._stages(ctx, binput, prev_files, results_dir, tmp, cache_bytes, stage_input, _spark_stage, next_input)

    def _with_punctuations(self, df, binput: BatchInput, rejects: bool = True):
        if binput.punctuations is None or not binput.punctuations.num_rows:
            return df
        return df.unionByName(self.spark.createDataFrame(to_layout(binput.punctuations, self.input_layout(rejects)[1])))

    def _run_local(self, ctx: BucketContext, binput: BatchInput, prev_files: dict, results_dir: str, tmp: str,
                   cache_bytes: int):
        """The batch's stages on the driver, with the same task function Spark would run (one "task"
        holding every bucket): no Spark job. For small batches of a small state, where Spark's fixed
        cost per job (~0.3-0.5 s here) is most of a micro-batch."""
        import pyarrow.compute as pc

        first = route_local(binput.local, self.eq, self.config.buckets, self.arrow_input_schema, self.config.psp_slices)
        deltas = first.filter(pc.equal(first.column("_kind"), 1))
        if binput.punctuations is not None and binput.punctuations.num_rows:
            first = pa.concat_tables([first, to_layout(binput.punctuations, self.arrow_input_schema)])

        def next_input(folder):
            parts = [t.cast(self.arrow_schema) for t in _read_parts(folder)]
            return pa.concat_tables(parts + [to_layout(deltas, self.arrow_schema)])

        return self._stages(ctx, binput, prev_files, results_dir, tmp, cache_bytes, first,
                            _driver_stage(self.config.threads_on_driver()), next_input)

    # ---- every batch of an interval: one Spark job per stage, or on the driver ------------------------
    def run_pipelined(self, batches: list, routed, inputs: dict, plan: CompiledPlan, purge_bounds: dict,
                      extras: dict | None = None, write_metrics: bool = False, warmup: int | None = None,
                      punctuations: bool = True) -> list:
        """Run ``batches`` (consecutive ids after the committed state) in one Spark job per stage, or on
        the driver.

        ``routed``: their stage-1 rows with column ``_batch``: a Spark DataFrame partitioned by ``(_c, _b)``
        and sorted by ``_batch`` within partitions (what :func:`mjoin.engine.interval.prepare_interval`
        caches), or an Arrow table sorted by ``_batch`` (:func:`mjoin.engine.interval.route_interval` on the
        driver): then every stage runs on the driver with the same task function, no Spark job
        (:meth:`_pipelined_local`, as :meth:`run` picks :meth:`_run_local`);
        ``inputs``: batch -> :class:`BatchInput` (counts); ``purge_bounds``: batch -> purge bound.
        Returns one metrics record per batch, as :meth:`run` would, except that the time is measured per
        stage: each batch's ``wall_seconds`` (and stage times) is the run's wall time apportioned by the
        batch's share of the task time (``execution`` holds the exact totals).
        ``warmup``: a batch that only builds the state (emits nothing, not in the metrics; its record is
        returned first). ``write_metrics``: also write the records (without the warm-up's) as the metrics
        folder's ``metrics.jsonl``, one file (interval runs write it themselves).
        ``punctuations``: whether the batches may hold punctuations (False: the caller knows they do not; then
        each task runs all of its buckets of a class in one operator call, see :func:`_pipelined_task`).
        Outputs: the results of all the batches in one range folder ``results/<query>/batches=<first>-<last>/``
        with one ``_SUCCESS`` (:mod:`mjoin.engine.results`), the rejected rows in
        ``quarantine/<query>/<stream>/rows/batches=<first>-<last>/`` (:mod:`mjoin.lake.quarantine`)."""
        spark, eq, cfg = self.spark, self.eq, self.config
        extras = extras or {}
        batches = sorted(batches)
        first, last = batches[0], batches[-1]
        if batches != list(range(first, last + 1)):
            raise ValueError(f"pipelined batches must be consecutive, got {batches}")
        started = datetime.now(timezone.utc)
        t_run = time.perf_counter()
        local = isinstance(routed, pa.Table)
        group = f"mjoin-{eq.name}-{self.mode}-{first}-{last}-{time.time_ns()}"
        if not local:
            spark.sparkContext.setJobGroup(group, f"mjoin {eq.name} batches {first}..{last}", interruptOnCancel=False)
        latest = self.store.latest()
        if latest is not None and latest["version"] >= first:
            raise EngineError(f"the state of {eq.name} is at batch {latest['version']}, not before batch {first}")
        prev = self.store.latest_before(first)
        prev_files = dict(prev["files"]) if prev else {}
        rng = range_name(first, last)
        results_dir = fsutil.join(self.results_root, rng)
        # an earlier attempt's output of these batches, in either layout (results.clear_batches): a re-run
        # replaces it, never adds to it
        clear_batches(self.results_root, batches)
        for stream in eq.streams:
            clear_batches(fsutil.join(self.quarantine_root, stream, "rows"), batches)
        tmp = self.store.tmp_dir(last)
        fsutil.remove(tmp)
        cache_bytes = cfg.state_cache_mb * 1024 * 1024
        ctx = BucketContext(eq=eq, plan=plan, frame_schema=self.arrow_schema, result_schema=self.result_schema,
                            batch_id=first, stage=1, buckets=cfg.buckets, emit=True, purge_bound=None,
                            prefilter_accounting=cfg.prefilter_accounting, track_state=True,
                            punctuation=plan.punctuation, punctuation_threshold=plan.punctuation_threshold,
                            psp_slices=cfg.psp_slices)
        conf = self.conf()
        promised = any(k.split("/")[1].endswith(PROMISES) for k in prev_files)
        merged = frozenset() if punctuations or promised else \
            frozenset(ci for ci, c in enumerate(eq.classes) if not eq.is_band(c))
        run_stage, next_input = self._pipelined_local(routed, len(batches)) if local else self._pipelined_spark(routed)
        docs, final, stage_seconds, physical, files_seconds = [], [], {}, {}, 0.0
        stage_input, stage = routed, 1
        while True:
            t0 = time.perf_counter()
            fn = _pipelined_task(replace(ctx, stage=stage), self.store.root, prev_files, results_dir, tmp,
                                 cache_bytes, eq.classes, purge_bounds, last if stage == 1 else None,
                                 self.quarantine_root, rng, warmup, merged)
            got, physical[f"stage{stage}"] = run_stage(fn, stage_input)
            self._late_rejects(inputs)
            stage_docs = []
            for d in got:
                if "final_state" in d:
                    final.append(d)
                elif "files_seconds" in d:
                    files_seconds += d["files_seconds"]
                elif "rejects" in d or (stage == 1 and "rows_in" in d):
                    inputs[d["batch_id"]].add_reports([d])
                    if "rejects" not in d:
                        stage_docs.append(d)
                else:
                    stage_docs.append(d)
            docs += stage_docs
            stage_seconds[f"stage{stage}"] = time.perf_counter() - t0
            if not sum(c["partials"] for d in stage_docs for c in d["chains"]):
                break
            stage += 1
            if stage > len(eq.streams):
                raise RuntimeError("partial results still pending after n stages: plan segments are inconsistent")
            # the classes the partial results enter: their deltas replay the state batch by batch
            targets = sorted({eq.class_index(seg.attr_class) for ch in plan.chains.values() for seg in ch.segments[1:]})
            stage_input = next_input(fsutil.join(tmp, f"stage={stage - 1}"), targets)

        t0 = time.perf_counter()
        files = {}
        for d in final:
            for st in d["final_state"]:
                if st["entry"]:
                    files[file_key(st["class"], st["stream"], st["bucket"])] = st["entry"]
        by_batch: dict = {b: [] for b in batches}
        for d in docs:
            by_batch[d["batch_id"]].append(d)
        records = [self._record(b, inputs[b], plan, by_batch[b], started, extras.get(b, {})) for b in batches]
        max_ts = max([v for v in [(prev or {}).get("max_ts")] + [inputs[b].max_ts for b in batches] if v is not None],
                     default=None)
        self.store.commit({"version": last, "batch_id": last, "query": eq.name, "query_fingerprint": eq.fingerprint,
                           "buckets": cfg.buckets, "psp_slices": cfg.psp_slices, "max_ts": max_ts,
                           "watermark": None if max_ts is None else max_ts - eq.lateness_us,
                           "plan_version": plan.version, "plan_source": plan.source, "files": files,
                           "mode": self.mode, "pipelined_from": first,
                           "tuples": records[-1]["state_tuples"], "keys": records[-1]["state_keys"]})
        # one commit marker for the range: its batches and their rows (results.batch_folders)
        fsutil.atomic_write_text(fsutil.join(results_dir, "_SUCCESS"), json.dumps(
            {"batches": [first, last], "rows": {str(b): rec["result_rows"] for b, rec in zip(batches, records)},
             "columns": [f.name for f in self.result_schema], "plan_version": plan.version}))
        self.store.gc(cfg.state_versions_kept)
        fsutil.remove(tmp)
        stage_seconds["commit"] = time.perf_counter() - t0
        total = time.perf_counter() - t_run
        # the driver ran no Spark job: nothing to ask Spark's status store
        shuffle = {"read": 0, "written": 0, "stages": 0} if local else shuffle_bytes(spark, group)
        work = {b: sum(d["seconds"] + d.get("write_seconds", 0.0) for d in by_batch[b]) for b in batches}
        work_sum = sum(work.values())
        execution = {"mode": "pipelined", "where": "driver" if local else "executors", "batches": [first, last],
                     "jobs": 0 if local else stage, "stages": stage, "wall_seconds": total,
                     "stage_seconds": stage_seconds, "shuffle_bytes": shuffle,
                     "spark_stages": [] if local else stage_times(spark, group),
                     "final_state_write_seconds": sum(d["write_seconds"] for d in final),
                     "final_files_write_seconds": files_seconds,
                     "apportioned_by": "task seconds per batch"}
        if local:
            execution["threads"] = physical["stage1"]["threads"]
        for b, rec in zip(batches, records):
            share = work[b] / work_sum if work_sum > 0 else 1.0 / len(batches)
            rec["stage_seconds"] = {k: v * share for k, v in stage_seconds.items()}
            rec["stages"] = stage
            rec["spark_conf"] = conf
            rec["spark_plan"] = physical
            rec["spark_strategies"] = _strategies(physical)
            rec["execution"] = execution
            rec["shuffle_bytes"] = {k: (int(round(v * share)) if k != "stages" else v) for k, v in shuffle.items()}
            rec["wall_seconds"] = total * share
        if write_metrics:  # the run's records in one file, not one per batch (metrics.read_metrics reads either)
            write_jsonl(self.metrics_dir, [rec for rec in records if rec["batch_id"] != warmup])
        return records

    def _pipelined_spark(self, routed):
        """(run_stage, next_input) of a pipelined run's stages as Spark jobs: ``run_stage(fn, df)`` maps
        the task function over the stage's partitions and collects its documents; ``next_input(folder,
        targets)`` is the next stage's input: the partial results written there and the deltas (and
        punctuations) of the classes they enter, replayed batch by batch, partitioned by (class, bucket)."""
        from pyspark.sql.types import IntegerType, StructField, StructType

        def next_input(folder, targets):
            schema = StructType(list(self.frame_schema.fields) + [StructField("_batch", IntegerType(), True)])
            part_df = self.spark.read.schema(schema).parquet(folder)
            replay = self.conform(routed.where(f"_kind IN (1, 4) AND _c IN ({', '.join(map(str, targets))})"),
                                  keep=("_batch",), full=True)
            return self.partitioned(part_df.unionByName(replay)).sortWithinPartitions("_batch")

        return _spark_stage, next_input

    def _pipelined_local(self, routed: pa.Table, batches: int):
        """:meth:`_pipelined_spark` on the driver (no Spark job): a stage's rows split by bucket over
        ``driver_threads`` threads, each playing one Spark task (:func:`_run_task`; a thread's rows keep
        the table's order by ``_batch``); the next stage's input read back with pyarrow. With
        ``driver_threads`` 0, one thread unless the batches average :data:`PIPELINED_ROWS_PER_THREAD` rows
        or more (then the driver's cores): a small batch's operator time is Python calls that hold the GIL,
        so a second thread only adds contention."""
        import pyarrow.compute as pc

        def next_input(folder, targets):
            parts = [to_layout(t, self.arrow_schema, extra=("_batch",)) for t in _read_parts(folder)]
            replay = routed.filter(pc.and_(pc.is_in(routed.column("_kind"), pa.array([1, 4], pa.int8())),
                                           pc.is_in(routed.column("_c"), pa.array(targets, pa.int32()))))
            parts.append(to_layout(replay, self.arrow_schema, extra=("_batch",)))
            t = pa.concat_tables([x.cast(parts[-1].schema) for x in parts])
            return t.take(pc.sort_indices(t, sort_keys=[("_batch", "ascending")]))  # stable

        threads = self.config.driver_threads or (
            self.config.threads_on_driver() if routed.num_rows >= PIPELINED_ROWS_PER_THREAD * max(1, batches) else 1)
        return _driver_stage(threads), next_input

    # ---- metrics --------------------------------------------------------------------------------
    def _record(self, batch_id, binput: BatchInput, plan: CompiledPlan, docs, started, extra) -> dict:
        eq = self.eq
        views = {}  # (class, stream) -> old/full keys summed over buckets
        state_tuples, state_keys = {}, {}
        for d in docs:
            if d["stage"] != 1:
                continue
            for s, v in d["views"].items():
                acc = views.setdefault((d["class"], s), {"old_keys": 0, "full_keys": 0})
                acc["old_keys"] += v["old_keys"]
                acc["full_keys"] += v["full_keys"]
            for st in d["state"]:
                if st["stream"] in eq.stream_classes and d["class"] == eq.stream_classes[st["stream"]][0]:
                    state_tuples[st["stream"]] = state_tuples.get(st["stream"], 0) + st["tuples"]
                    state_keys[st["stream"]] = state_keys.get(st["stream"], 0) + st["keys"]
        chains = []
        agg = {}
        for d in docs:
            for c in d["chains"]:
                a = agg.setdefault((c["stream"], c["group"]), {"rows_in": 0, "seconds": 0.0, "cpu_seconds": 0.0,
                                                               "materialise_seconds": 0.0, "results": 0, "partials": 0,
                                                               "steps": {}})
                for k in ("rows_in", "seconds", "cpu_seconds", "materialise_seconds", "results", "partials"):
                    a[k] += c.get(k, 0)
                for idx, st in c["steps"].items():
                    s = a["steps"].setdefault(int(idx), dict(_STEP_ZERO))
                    for k in s:
                        s[k] += st.get(k, 0)
        for g in plan.groups:
            for s in eq.streams:
                chain = plan.chain(s, g)
                a = agg.get((s, g), {"rows_in": 0, "seconds": 0.0, "cpu_seconds": 0.0, "materialise_seconds": 0.0,
                                     "results": 0, "partials": 0, "steps": {}})
                steps = []
                for k, (l, r, cls) in enumerate(chain.steps):
                    st = a["steps"].get(k, _STEP_ZERO)
                    v = views.get((cls, r), {"old_keys": 0, "full_keys": 0})
                    kappa = v["full_keys"] if eq.index(r) < eq.index(s) else v["old_keys"]
                    steps.append({"left": l, "right": r, "attr_class": cls, "lookups": st["lookups"],
                                  "found": st["found"], "hits": st["hits"], "matches": st["matches"], "kappa": kappa,
                                  "seconds": round(st["seconds"], 6), "cpu_seconds": round(st["cpu_seconds"], 6),
                                  "calls": st["calls"],
                                  "strategy": "index-nested-loop",
                                  "stage": _stage_of(chain, k)})
                chains.append({"stream": s, "group": g, "rows_in": a["rows_in"], "seconds": round(a["seconds"], 6),
                               "cpu_seconds": round(a["cpu_seconds"], 6),
                               "materialise_seconds": round(a["materialise_seconds"], 6), "results": a["results"],
                               "steps": steps})
        pre = None
        if plan.prefilter:
            pre = {"checked": 0, "dropped": 0, "lookups_saved": 0, "matches_saved": 0, "seconds": 0.0}
            for d in docs:
                if d.get("prefilter"):
                    for k in pre:
                        pre[k] += d["prefilter"][k]
        punct = None
        for d in docs:
            if d["stage"] == 1 and d.get("punctuation"):
                punct = punct or {}
                for k, v in d["punctuation"].items():
                    if isinstance(v, dict):  # per stream
                        acc = punct.setdefault(k, {})
                        for s, n in v.items():
                            acc[s] = acc.get(s, 0) + n
                    else:
                        punct[k] = punct.get(k, 0) + v
        result_rows = sum(c["results"] for c in chains)
        quarantined = {s: {r: binput.quarantined.get(s, {}).get(r, 0) for r in REASONS} for s in eq.streams}
        task_seconds = sum(d["seconds"] for d in docs)
        task_cpu = sum(d.get("cpu_seconds", 0.0) for d in docs)
        record = {
            "query": eq.name, "engine": "mjoin", "mode": self.mode, "batch_id": batch_id,
            "plan_version": plan.version, "plan_strategy": plan.strategy, "plan_source": plan.source,
            "plan_switch": None, "interval": None, "started_at": iso(started),
            "rows_in": {s: binput.rows_in.get(s, 0) for s in eq.streams},
            "quarantined": quarantined, "quarantined_files": binput.quarantined_files,
            "result_rows": result_rows, "state_tuples": {s: state_tuples.get(s, 0) for s in eq.streams},
            "state_keys": {s: state_keys.get(s, 0) for s in eq.streams}, "state_backend": "sorted",
            "chains": chains, "prefilter": pre, "punctuation": punct,
            "buckets": self.config.buckets, "shuffle_partitions": self.partitions,
            "task_seconds": round(task_seconds, 6), "task_cpu_seconds": round(task_cpu, 6),
            "state_load_seconds": round(sum(d["load_seconds"] for d in docs), 6),
            "state_write_seconds": round(sum(d.get("write_seconds", 0.0) for d in docs), 6),
            "workers": sorted({d["pid"] for d in docs}),
            "state_reads": _count_sources(docs),
            "watermark": None, "max_ts": binput.max_ts,
        }
        record.update(extra)
        return record


_STEP_ZERO = {"lookups": 0, "found": 0, "hits": 0, "matches": 0, "seconds": 0.0, "cpu_seconds": 0.0, "calls": 0}


def _strategies(physical: dict) -> dict:
    """What Spark chose, from the physical plans of a batch's stages: join nodes (expected none: the
    probe orders run as index nested loops in the tasks, so Spark has no join to reorder), the
    exchanges (partitioning) and the Python operator per stage, and whether AQE re-plans."""
    return {"joins": sorted({j for p in physical.values() for j in p.get("joins", [])}),
            "exchanges": {k: p.get("exchanges") for k, p in physical.items()},
            "python_operator": {k: p.get("python_operator") for k, p in physical.items()},
            "adaptive": any(p.get("adaptive") for p in physical.values()),
            "probe": "index-nested-loop (sorted arrays, numpy) in the operator, in the plan's order"}


def _count_sources(docs) -> dict:
    """How the tasks got their state: from the worker's memory, memory plus one file, files, or empty."""
    out: dict = {}
    for d in docs:
        for src in d.get("state_sources", {}).values():
            out[src] = out.get(src, 0) + 1
    return out


def _stage_of(chain, step: int) -> int:
    """Stage (1-based) that runs ``step`` of ``chain``: one per segment."""
    for n, seg in enumerate(chain.segments):
        if seg.start <= step < seg.end:
            return n + 1
    raise IndexError(step)
