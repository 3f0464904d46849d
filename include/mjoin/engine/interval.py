"""Interval evaluation: join the data of ``[start, end)`` in cycles, from the lake alone.

A pure function of the lake's contents (no registry, no checkpoint): the state is
built from the rows with ``ts`` in ``(start - W_i, start)`` (a warm-up batch that
emits nothing), then every cycle ``[t, t + cycle)`` of event time is one batch run
by the same per-bucket operator as streaming. So the results are exactly the join
results whose newest member has ``ts`` in ``[start, end)``, whatever the plan.

By default the cycles run *pipelined* (:func:`~mjoin.engine.pipelined.run_pipelined`):
one Spark job per stage for the whole interval, each task running its buckets batch
after batch with the state in memory, so that the measured time is the operator's
work and not Spark's per-job overhead (which hid the order in the first benchmark).
``pipelined=False`` runs one job per batch, exactly as streaming does.

A small interval (one plan, at most ``EngineConfig.interval_driver_rows`` accepted rows by the footers) runs
on the driver instead (:func:`run_fused`): the same rows, batches, routing and task function, read with
pyarrow and run on threads, no Spark job (Spark's fixed cost per job and per stage is most of a small
interval's time).
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow import fs as pafs
from pyspark import StorageLevel
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StructField, StructType

from mjoin.engine.batch import BatchInput, BatchRunner
from mjoin.engine.compiled import MICROS, key_name
from mjoin.engine.config import EngineConfig, EngineError
from mjoin.engine.frame import arrow_input_schema, to_layout
from mjoin.engine.inputs import as_lake, as_query, compile_plan
from mjoin.engine.metrics import shuffle_bytes, write_jsonl
from mjoin.engine.normalize import (ARRIVAL_SQL, add_counts, inspect_files, local_supported, normalize_local,
                                    normalize_streams, punctuation_rows, write_quarantine)
from mjoin.engine.pipelined import run_pipelined
from mjoin.engine.routing import route_local
from mjoin.engine.sparkplan import apply_engine_conf, restore_conf
from mjoin.lake.contract import Seen, arrival_cycle, future_allowance, young_allowance
from mjoin.model.timeutil import iso, to_micros
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    query: str
    engine: str
    mode: str
    interval: list
    cycle_seconds: float
    plan_version: int | None
    plan_strategy: str
    batches: int
    result_rows: int
    wall_seconds: float
    batch_seconds: float  # sum of the batches' wall time (without input preparation and warm-up)
    prepare_seconds: float
    warmup_seconds: float
    rows_in: dict
    quarantined: dict
    metrics_path: str
    results_path: str
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        q = sum(sum(v.values()) for v in self.quarantined.values())
        return (f"{self.query} [{self.engine}] {self.interval[0]} .. {self.interval[1]} in {self.batches} batches of "
                f"{self.cycle_seconds:g}s: {self.result_rows} result rows, {sum(self.rows_in.values())} rows in, "
                f"{q} quarantined; {self.wall_seconds:.2f}s wall ({self.batch_seconds:.2f}s in batches)\n"
                f"  results: {self.results_path}\n  metrics: {self.metrics_path}")


def clear_outputs(out_lake, query_name: str, quarantine: bool = True) -> None:
    for path in (out_lake.state(query_name), out_lake.results(query_name), out_lake.metrics(query_name),
                 out_lake.checkpoints(query_name)) + ((out_lake.quarantine(query_name),) if quarantine else ()):
        fsutil.remove(path)


def _batch_expr(eq, start_us: int, end_us: int, cycle_us: int, future: bool = False) -> str:
    """Batch of a row: 0 = warm-up state, 1.. = cycles; null = outside the interval. Rows
    without an event time (quarantined as bad_time) count in batch 1; with ``future`` (the frame has
    ``_reason`` and ``_file``), so do ``future`` rows whose file's arrival lies in the interval (their event
    time says nothing: they belong to the interval they arrived in), the others are dropped."""
    window = "(CASE _s " + " ".join(f"WHEN {i} THEN {eq.window_us[s]}" for i, s in enumerate(eq.streams)) + " END)"
    arrival = ARRIVAL_SQL.format(path="_file")
    fut = (f"WHEN _reason = 'future' THEN CASE WHEN {arrival} * 1000000 >= {start_us} AND {arrival} * 1000000 < "
           f"{end_us} THEN 1 END ") if future else ""
    return (f"CASE WHEN _ts IS NULL THEN 1 {fut}"
            f"WHEN _ts >= {start_us} AND _ts < {end_us} THEN CAST(1 + floor((_ts - {start_us}) / {cycle_us}) AS INT) "
            f"WHEN _ts < {start_us} AND _ts > {start_us} - {window} THEN 0 END")


def batch_local(ts: pa.Array, s: np.ndarray, eq, start_us: int, end_us: int, cycle_us: int,
                reason: pa.Array | None = None, file: pa.Array | None = None) -> np.ndarray:
    """:func:`_batch_expr` in numpy (the driver's twin, same rule): each row's batch from its event time
    ``ts`` (micros, nullable) and stream index ``s``; -1 = outside the interval (dropped). With ``reason`` and
    ``file`` (the rows' ``_reason`` and ``_file``): ``future`` rows by their file's arrival."""
    ts = pa.array(ts) if not isinstance(ts, (pa.Array, pa.ChunkedArray)) else ts
    null = np.asarray(ts.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    t = np.asarray(ts.fill_null(0).to_numpy(), dtype=np.int64)
    window = np.asarray([eq.window_us[x] for x in eq.streams], dtype=np.int64)[np.asarray(s, dtype=np.int64)]
    out = np.full(len(t), -1, dtype=np.int64)
    inside = (t >= start_us) & (t < end_us)
    out[inside] = 1 + (t[inside] - start_us) // cycle_us
    out[(t < start_us) & (t > start_us - window)] = 0
    out[null] = 1
    if reason is not None and file is not None and len(t):
        fut = np.asarray(pc.fill_null(pc.equal(reason, "future"), False).to_numpy(zero_copy_only=False), dtype=bool)
        if fut.any():
            arr = pc.extract_regex(pc.fill_null(file, ""), r"arrival=(?P<a>[0-9]+)/[^/]*$")
            a = pc.cast(pc.struct_field(arr, [0]), pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)
            a = np.asarray(a, dtype=np.int64)
            inside_a = (a >= 0) & (a * 1_000_000 >= start_us) & (a * 1_000_000 < end_us)
            out[fut] = np.where(inside_a[fut], 1, -1)
    return out


@dataclass
class IntervalInput:
    """The interval's rows, normalised (lazily: no Spark job yet), with their batch (column ``_batch``:
    0 = warm-up, 1.. = cycles), and the files rejected by the contract. The counts per batch (rows in,
    rejected rows) are reported by the tasks that process them."""

    start_us: int
    end_us: int
    cycle_us: int
    n_batches: int
    frame: object  # Spark DataFrame of frame rows with _reason and _batch, or None
    rejects: list  # FileReject
    seconds: float = 0.0
    #: the future allowance the input was judged with (seconds; None: no row was future) and the arrival cycle
    #: it came from (:func:`mjoin.lake.contract.future_allowance`)
    future_allowance: float | None = None
    arrival_cycle: float | None = None
    streams: tuple = ()  # the engine's stream order (``_s``)
    punctuations: list = field(default_factory=list)  # [(path, source, arrival, batch)] of punctuation files
    #: or the same rows on the driver (``frame`` None): an Arrow table in the input layout with ``_batch``
    #: (:func:`mjoin.engine.normalize.normalize_local`, :func:`batch_local`), read in ``local_seconds``
    local: object = None
    local_seconds: float = 0.0
    #: ``() -> [FileReject]``: the files Spark's tasks found unreadable since the last call, added to ``rejects``
    #: (:meth:`mjoin.engine.normalize.Inspected.collect_unreadable`): ask after a job that read the input
    late_rejects: object = None
    #: stream -> accepted files not read: every row outside the interval by the footers (:meth:`Inspected.prune_outside`)
    not_read: dict = field(default_factory=dict)

    def valid(self):
        if self.frame is None or "_reason" not in self.frame.columns:  # no row can be rejected (normalize_streams)
            return self.frame
        return self.frame.where(F.col("_reason").isNull())

    def rejected_counts(self) -> dict:
        """batch -> stream -> reason -> rows rejected (one Spark job; the engine's tasks report these
        themselves, the spark-native baseline asks here), the rejected files in batch 1."""
        counts: dict = {}
        if self.frame is not None and "_reason" in self.frame.columns:
            for r in self.frame.where(F.col("_reason").isNotNull()).groupBy("_batch", "_s", "_reason").count().collect():
                counts.setdefault(r["_batch"], {}).setdefault(self.streams[r["_s"]], {})[r["_reason"]] = r["count"]
        if self.late_rejects is not None:
            self.late_rejects()
        add_counts(counts.setdefault(1, {}), self.file_counts())
        return counts

    def file_counts(self) -> dict:
        """stream -> reason -> rows of the rejected files (counted in batch 1)."""
        counts: dict = {}
        for rej in self.rejects:
            per = counts.setdefault(rej.stream, {})
            per[rej.reason] = per.get(rej.reason, 0) + (rej.rows or 0)
        return counts


def read_interval(spark, query, eq, in_lake, out_lake, start, end, cycle, driver_rows: int = 0,
                  config: EngineConfig | None = None) -> IntervalInput:
    """The landed files of the query's streams judged by the contract (rejected files go to
    ``out_lake``'s quarantine), the accepted ones read lazily, rows assigned to batches. ``driver_rows``
    > 0: when the accepted files hold at most that many rows (footers) and the driver reads their streams
    as Spark does (:func:`local_supported`), they are read on the driver now (``local``), not by Spark.
    ``config``: its ``future_allowance`` and ``arrival_cycle`` (:func:`future_allowance_of`)."""
    t0 = time.perf_counter()
    start_us, end_us = to_micros(start), to_micros(end)
    cycle_us = int(round(float(cycle) * MICROS))
    if cycle_us <= 0 or end_us <= start_us:
        raise EngineError(f"need start < end and a positive cycle (got {iso(start)} .. {iso(end)}, cycle {cycle})")
    n_batches = -(-(end_us - start_us) // cycle_us)
    landed = {}
    for s in query.streams:  # each source listed once, data and punctuation files together
        if s.source not in landed:
            landed[s.source] = in_lake.landed(s.source)
    files = {s.name: [p for _, p, kind in landed[s.source] if kind == "data"] for s in query.streams}
    allowance, arrival_cycle = future_allowance_of(config, [[a for a, _, _ in entries] for entries in landed.values()],
                                                  query)
    inspected = inspect_files(query, eq, files, Seen(), future_allowance=allowance)  # duplicates within the interval's
    pruned = inspected.prune_outside(eq.window_us, start_us, end_us)  # files no row of which is read
    if pruned:
        log.info("interval %s .. %s: %d landed file(s) not read, every row outside it by the footers (%s)",
                 iso(start), iso(end), sum(pruned.values()), ", ".join(f"{k} {v}" for k, v in sorted(pruned.items())))
    present = {name for (name, _), _ in inspected.groups.items()}
    frame = local = None
    local_seconds = 0.0
    if 0 < driver_rows and inspected.rows <= driver_rows and local_supported(query, present):
        t1 = time.perf_counter()
        local = _read_local(query, eq, inspected, start_us, end_us, cycle_us)
        local_seconds = time.perf_counter() - t1
    else:
        frame = normalize_streams(spark, query, eq, inspected)
        if frame is not None:
            future = "_reason" in frame.columns and allowance is not None
            frame = frame.withColumn("_batch", F.expr(_batch_expr(eq, start_us, end_us, cycle_us, future))) \
                .where(F.col("_batch").isNotNull())
    punct = _interval_punctuations(query, landed, inspected.ts_max, start_us, end_us, cycle_us)
    write_quarantine(None, {}, inspected.rejects, out_lake, query.name, eq)
    return IntervalInput(start_us, end_us, cycle_us, n_batches, frame, inspected.rejects,
                         time.perf_counter() - t0 - local_seconds, allowance, arrival_cycle, eq.streams, punct, local,
                         local_seconds, inspected.collect_unreadable, pruned)


def future_allowance_of(config: EngineConfig | None, epochs, query) -> tuple[float | None, float | None]:
    """``(future allowance in seconds or None, arrival cycle or None)`` of a run of ``query``:
    ``config.future_allowance`` if set, else :data:`mjoin.lake.contract.FUTURE_CYCLES` arrival cycles, the cycle
    ``config.arrival_cycle`` or the lake's (:func:`mjoin.lake.contract.arrival_cycle` of ``epochs``: per source,
    its arrival epochs), else the query's shortest window (:func:`mjoin.lake.contract.young_allowance`)."""
    config = config or EngineConfig()
    cycle = config.arrival_cycle if config.arrival_cycle is not None else arrival_cycle(epochs)
    return future_allowance(config.future_allowance, cycle, young_allowance(query)), cycle


def _read_local(query, eq, inspected, start_us: int, end_us: int, cycle_us: int) -> pa.Table:
    """The accepted files' rows normalised on the driver (:func:`normalize_local`), each with its batch
    (:func:`batch_local`), the rows outside the interval dropped: the input layout plus ``_batch``."""
    table = normalize_local(query, eq, inspected)
    if table is None:
        table = arrow_input_schema(eq).empty_table()
    b = batch_local(table.column("_ts"), table.column("_s").to_numpy(), eq, start_us, end_us, cycle_us,
                    table.column("_reason"), table.column("_file"))
    keep = np.flatnonzero(b >= 0)
    return table.take(pa.array(keep)).append_column(pa.field("_batch", pa.int32()), pa.array(b[keep].astype(np.int32)))


def _interval_punctuations(query, landed: dict, ts_max: dict, start_us: int, end_us: int, cycle_us: int) -> list:
    """``[(path, source, arrival, batch)]`` of the lake's punctuation files: each in the batch that holds
    the latest event time of its folder's data (after it, the promise holds); earlier ones in the
    warm-up (batch 0), later ones not at all. ``landed``: source -> :meth:`mjoin.lake.layout.Lake.landed`;
    ``ts_max``: (stream, path) -> the footer's latest event time (:func:`inspect_files`)."""
    out, folder_end = [], {}
    for s in query.streams:
        entries = landed[s.source]
        for a, path, kind in entries:
            if kind != "punctuation":
                continue
            if (s.source, a) not in folder_end:
                ends = [ts_max[(s.name, p)] for b, p, k in entries
                        if b == a and k == "data" and ts_max.get((s.name, p)) is not None]
                folder_end[(s.source, a)] = int(round(max(ends) * 1_000_000)) if ends else a * 1_000_000
            t = folder_end[(s.source, a)]
            if t < end_us:
                out.append((path, s.source, a, 0 if t < start_us else int(1 + (t - start_us) // cycle_us)))
    return list(dict.fromkeys(out))


@dataclass
class Prepared(IntervalInput):
    """The interval's input routed to key buckets once (shared by every plan evaluated on it)."""

    routed: object = None  # persisted: stage-1 rows of every batch (column _batch), partitioned by (_c, _b)

    def batch_input(self, b: int, routed: bool = True) -> BatchInput:
        """Batch ``b``'s input: its routed rows (a filter of the cached interval; ``routed=False``:
        none, pipelined runs read the whole interval at once) and the file-level counts."""
        return BatchInput(routed=self.routed.where(f"_batch = {b}").drop("_batch") if routed else None,
                          quarantined=self.file_counts() if b == 1 else {},
                          quarantined_files=[r.to_json() for r in self.rejects] if b == 1 else [])

    def release(self) -> None:
        self.routed.unpersist()


def _punctuation_table(runner: BatchRunner, data: IntervalInput, layout: pa.Schema) -> pa.Table | None:
    """The interval's punctuation files as routed rows in ``layout`` (an Arrow input layout) with ``_batch``
    (None if none); the unreadable ones join ``data.rejects``."""
    if not data.punctuations:
        return None
    batch = {path: b for path, _, _, b in data.punctuations}
    rows, _, bad = punctuation_rows(runner.query, runner.eq, [p[:3] for p in data.punctuations],
                                    runner.config.buckets, layout, batch_of=lambda path, arrival: batch[path],
                                    future_allowance=data.future_allowance)
    data.rejects += bad
    return rows


def route_interval(runner: BatchRunner, data: IntervalInput):
    """Every batch's stage-1 rows (accepted ones to their key buckets, rejected ones for the tasks to
    quarantine, the bucket ticks), partitioned by (class, bucket), lazily (one exchange); for an input
    read on the driver (``data.local``), the same rows as one Arrow table (:func:`route_interval_local`).

    Sorted by batch inside each partition, so that the in-memory column batches' statistics let every
    batch's scan skip the other batches' rows (and pipelined tasks see batches in order); then by class,
    bucket, stream and key, so that the operator takes each stream's new tuples of a bucket as one slice
    already sorted by key."""
    if data.local is not None:
        return route_interval_local(runner, data)


    rejects = data.frame is None or "_reason" in data.frame.columns  # else no reject columns (normalize_streams)
    routed = runner.ticks(list(range(0, data.n_batches + 1)), rejects=rejects)
    if data.frame is not None:
        routed = runner.route_frame(data.frame, keep=("_batch",)).unionByName(routed)
    spark_layout, arrow_layout = runner.input_layout(rejects)
    rows = _punctuation_table(runner, data, arrow_layout)
    if rows is not None:
        schema = StructType(list(spark_layout.fields) + [StructField("_batch", IntegerType(), True)])
        routed = routed.unionByName(runner.spark.createDataFrame(rows, schema=schema))
    key = "CASE _c " + " ".join(f"WHEN {i} THEN {key_name(c)}" for i, c in enumerate(runner.eq.classes)) + " END"
    return runner.partitioned(routed).sortWithinPartitions("_batch", "_c", "_b", "_s", F.expr(key))


def route_interval_local(runner: BatchRunner, data: IntervalInput) -> pa.Table:
    """:func:`route_interval` on the driver: ``data.local`` routed (:func:`route_local`, with every batch's
    ticks), the punctuations, sorted by (batch, class, bucket, stream, key) as Spark sorts each partition
    (stable; NULLs first)."""

    eq, schema = runner.eq, runner.arrow_input_schema
    parts = [route_local(data.local, eq, runner.config.buckets, schema, runner.config.psp_slices,
                         batches=list(range(0, data.n_batches + 1)))]
    punct = _punctuation_table(runner, data, schema)
    if punct is not None:
        parts.append(punct)
    t = pa.concat_tables([to_layout(p, schema, extra=("_batch",)) for p in parts])
    c = t.column("_c")
    key = t.column(key_name(eq.classes[0]))
    for ci, cl in enumerate(eq.classes[1:], 1):
        key = pc.if_else(pc.equal(c, ci), t.column(key_name(cl)), key)
    return t.take(sort_order([t.column(n) for n in ("_batch", "_c", "_b", "_s")] + [key]))


def sort_order(columns: list) -> pa.Array:
    """The stable ascending order of rows by the integer ``columns`` (NULLs first), as Arrow's sort on them
    gives it: where each column's range (and one code for NULL) fits, all packed into one int64 code and
    sorted once (numpy's stable sort: ~2x faster than Arrow's five-key sort on the interval's ~700 k rows);
    else Arrow's sort on the columns."""
    n = len(columns[0]) if columns else 0
    codes, bits = [], 0
    for col in columns:
        lo, hi = pc.min_max(col).values()
        lo, hi = (0, 0) if lo.as_py() is None else (lo.as_py(), hi.as_py())
        width = (hi - lo + 2).bit_length()  # codes 1 .. hi - lo + 1, and 0 for NULL
        bits += width
        if bits > 63:
            break
        codes.append((col, lo, width))
    if bits > 63 or not n:
        table = pa.table({str(i): col for i, col in enumerate(columns)}) if columns else None
        return (pc.sort_indices(table, sort_keys=[(str(i), "ascending", "at_start") for i in range(len(columns))])
                if table is not None else pa.array([], pa.uint64()))
    packed = np.zeros(n, np.int64)
    for col, lo, width in codes:
        v = pc.fill_null(col, lo).to_numpy().astype(np.int64) - np.int64(lo) + 1
        if col.null_count:
            v[~np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)] = 0
        packed = (packed << np.int64(width)) | v
    return pa.array(np.argsort(packed, kind="stable"))


def prepare_interval(spark, query, runner: BatchRunner, in_lake, start, end, cycle) -> Prepared:
    """:func:`read_interval`, then route every batch's rows (accepted ones to their key buckets, rejected
    ones for the tasks to quarantine, and the bucket ticks) once: one Spark job."""

    t0 = time.perf_counter()
    data = read_interval(spark, query, runner.eq, in_lake, runner.lake, start, end, cycle, config=runner.config)
    routed = route_interval(runner, data).persist(StorageLevel.MEMORY_AND_DISK)
    routed.count()
    if data.late_rejects():  # files the input's tasks could not read: quarantined (their counts in batch 1)
        write_quarantine(None, {}, data.rejects, runner.lake, query.name, runner.eq)
    prepared = Prepared(**{f.name: getattr(data, f.name) for f in fields(IntervalInput)}, routed=routed)
    prepared.frame = None
    prepared.seconds = time.perf_counter() - t0
    return prepared


def warm_up(runner: BatchRunner, compiled, prepared: Prepared) -> dict:
    """Batch 0: build the state from the rows before ``start`` (emits nothing; plan-independent)."""
    t0 = time.perf_counter()
    rec = runner.run(0, prepared.batch_input(0), compiled, purge_bound=prepared.start_us, emit=False,
                     write_metrics=False)
    rec["warmup_seconds"] = time.perf_counter() - t0
    return rec


def copy_state(src: BatchRunner, dst: BatchRunner) -> None:
    """Give ``dst`` the committed state of ``src`` (the shared warm-up of several plans)."""
    sfs, sp = fsutil.resolve(src.store.root)
    dfs, dp = fsutil.resolve(dst.store.root)
    fsutil.remove(dst.store.root)
    pafs.copy_files(sp, dp, source_filesystem=sfs, destination_filesystem=dfs)


def _cycles(data: IntervalInput) -> tuple[dict, dict]:
    """Purge bounds and record extras of the cycles 1..n: a cycle's state is purged with its end (every
    later row is at or after it)."""
    bounds, extras = {}, {}
    for b in range(1, data.n_batches + 1):
        c0 = data.start_us + (b - 1) * data.cycle_us
        c1 = min(c0 + data.cycle_us, data.end_us)
        bounds[b] = c1
        extras[b] = {"interval": [iso(c0 / MICROS), iso(c1 / MICROS)], "watermark": c0}
    return bounds, extras


def run_fused(spark, query, compiled, runner: BatchRunner, in_lake, start, end, cycle) -> RunSummary:
    """One plan over an interval in as few Spark jobs as the plan has stages: the files' contract checks
    on the driver, then one job reads, normalises and routes every row (one exchange), and runs the
    warm-up and every cycle in the operator's tasks, the state kept in their memory. Nothing is cached
    between jobs unless the plan changes attribute class (a further stage replays the deltas).

    Small intervals on the driver: when the accepted files hold at most ``config.driver_rows`` and
    ``config.interval_driver_rows`` rows (by their footers, before reading; both > 0) and the driver
    reads their streams as Spark would (:func:`local_supported`), the same rows are read, batched and
    routed on the driver (pyarrow, numpy) and :func:`mjoin.engine.pipelined.run_pipelined` runs the same task
    function on threads: no Spark job (``extra.execution = "fused-driver"``). Either at 0: always Spark."""
    t_run = time.perf_counter()
    cfg = runner.config
    data = read_interval(spark, query, runner.eq, in_lake, runner.lake, start, end, cycle,
                         driver_rows=min(cfg.driver_rows, cfg.interval_driver_rows), config=cfg)
    local = data.local is not None
    t0 = time.perf_counter()
    routed = route_interval(runner, data)
    route_seconds = time.perf_counter() - t0
    data.local = None  # (the routed table holds the rows now)
    multi = max(len(ch.segments) for ch in compiled.chains.values()) > 1
    if multi and not local:
        routed = routed.persist(StorageLevel.MEMORY_AND_DISK)
    bounds, extras = _cycles(data)
    bounds[0] = data.start_us
    inputs = {b: BatchInput(quarantined=data.file_counts() if b == 1 else {},
                            quarantined_files=[r.to_json() for r in data.rejects] if b == 1 else [],
                            late_rejects=data.late_rejects if b == 1 else None)
              for b in range(0, data.n_batches + 1)}
    try:
        records = run_pipelined(runner, list(inputs), routed, inputs, compiled, bounds, extras, warmup=0,
                                         punctuations=bool(data.punctuations))
    finally:
        if multi and not local:
            routed.unpersist()
    warm, records = records[0], records[1:]
    for rec in records:
        log.info("batch %d: %d rows in, %d results, %.2fs", rec["batch_id"], sum(rec["rows_in"].values()),
                 rec["result_rows"], rec["wall_seconds"])
    metrics_path = write_jsonl(runner.metrics_dir, records)
    execution = warm["execution"]
    stages = execution["spark_stages"]
    if local:  # the input part: normalise, batch and route on the driver; the operator: the stages' threads
        input_seconds = data.local_seconds + route_seconds
        phases = {"contract_checks_driver": data.seconds, "input_driver": input_seconds,
                  "operator_driver": sum(v for k, v in execution["stage_seconds"].items() if k.startswith("stage")),
                  "input_stage": 0.0, "spark_stages": []}
    else:
        input_seconds = sum(st["wall_seconds"] or 0 for st in stages if st["kind"] == "input")
        phases = {"contract_checks_driver": data.seconds, "input_stage": input_seconds, "spark_stages": stages}
    return RunSummary(
        query=query.name, engine="mjoin", mode="interval",
        interval=[iso(data.start_us / MICROS), iso(data.end_us / MICROS)], cycle_seconds=data.cycle_us / MICROS,
        plan_version=compiled.version, plan_strategy=compiled.strategy, batches=data.n_batches,
        result_rows=sum(r["result_rows"] for r in records), wall_seconds=time.perf_counter() - t_run,
        batch_seconds=sum(r["wall_seconds"] for r in records), prepare_seconds=data.seconds + input_seconds,
        warmup_seconds=warm["wall_seconds"], rows_in={s: sum(r["rows_in"][s] for r in records) for s in runner.eq.streams},
        quarantined=_totals(records), metrics_path=metrics_path, results_path=runner.results_root,
        extra={"warmup_state_tuples": warm["state_tuples"], "plan_source": compiled.source,
               "prefilter": compiled.prefilter, "buckets": runner.config.buckets,
               "execution": "fused-driver" if local else "fused", "where": execution["where"],
               "phases": phases, "files_not_read": data.not_read, "future_allowance": data.future_allowance,
               "arrival_cycle": data.arrival_cycle})


def run_prepared(spark, query, compiled, prepared: Prepared, runner: BatchRunner, warm: dict | None = None,
                 pipelined: bool = True) -> RunSummary:
    """Evaluate one plan on prepared input into the runner's lake (``warm``: the warm-up already
    ran into the runner's state, this is its record; ``pipelined``: every cycle in one Spark job
    per stage, else one job per cycle)."""
    t_run = time.perf_counter()
    config = runner.config
    eq = runner.eq
    if warm is None:
        warm = warm_up(runner, compiled, prepared)
    warmup_seconds = warm["warmup_seconds"]
    batches = list(range(1, prepared.n_batches + 1))
    bounds, extras = _cycles(prepared)
    if pipelined:
        records = run_pipelined(runner, batches, prepared.routed.where("_batch >= 1"),
                                       {b: prepared.batch_input(b, routed=False) for b in batches}, compiled, bounds,
                                       extras, punctuations=bool(prepared.punctuations))
    else:
        records = [runner.run(b, prepared.batch_input(b), compiled, purge_bound=bounds[b], extra=extras[b])
                   for b in batches]
    for rec in records:
        log.info("batch %d: %d rows in, %d results, %.2fs", rec["batch_id"], sum(rec["rows_in"].values()),
                 rec["result_rows"], rec["wall_seconds"])
    metrics_path = write_jsonl(runner.metrics_dir, records)
    return RunSummary(
        query=query.name, engine="mjoin", mode="interval",
        interval=[iso(prepared.start_us / MICROS), iso(prepared.end_us / MICROS)],
        cycle_seconds=prepared.cycle_us / MICROS, plan_version=compiled.version, plan_strategy=compiled.strategy,
        batches=prepared.n_batches, result_rows=sum(r["result_rows"] for r in records),
        wall_seconds=time.perf_counter() - t_run + prepared.seconds,
        batch_seconds=sum(r["wall_seconds"] for r in records), prepare_seconds=prepared.seconds,
        warmup_seconds=warmup_seconds,
        rows_in={s: sum(r["rows_in"][s] for r in records) for s in eq.streams},
        quarantined=_totals(records), metrics_path=metrics_path, results_path=runner.results_root,
        extra={"warmup_state_tuples": warm["state_tuples"], "plan_source": compiled.source,
               "prefilter": compiled.prefilter, "buckets": config.buckets,
               "future_allowance": prepared.future_allowance, "arrival_cycle": prepared.arrival_cycle},
    )


def _totals(records) -> dict:
    """stream -> reason -> rows quarantined over the interval's batches (none of the warm-up's)."""
    totals: dict = {}
    for r in records:
        add_counts(totals, {s: {k: v for k, v in reasons.items() if v} for s, reasons in r["quarantined"].items()})
    return totals


def run_interval(spark, query, plan, lake, start, end, cycle, out, *, config: EngineConfig | None = None,
                 pipelined: bool = True) -> RunSummary:
    """Join the lake's data of ``[start, end)`` in cycles of ``cycle`` seconds into ``out``.

    ``plan``: a :class:`~mjoin.model.plan.Plan`, a plan file, or None (the spec's fixed order).
    ``out``: a folder (or Lake) for results, metrics, state and quarantine; it is cleared first.
    """
    return run_interval_plans(spark, query, {"": plan}, lake, start, end, cycle, out, config=config,
                              pipelined=pipelined)[""]


def run_interval_plans(spark, query, plans: dict, lake, start, end, cycle, out, *,
                       config: EngineConfig | None = None, pipelined: bool = True) -> dict:
    """Evaluate several plans on the same interval, reading and validating the input once.
    ``plans``: name -> plan; each plan's outputs go to ``out/<name>`` (``out`` itself for name "").
    ``pipelined``: see the module docstring."""
    config = config or EngineConfig()
    query = as_query(query)
    compiled = {name: compile_plan(query, p, config) for name, p in plans.items()}
    before = apply_engine_conf(spark)
    prepared = None
    try:
        out_root = as_lake(out)
        clear_outputs(out_root, query.name)
        root_runner = BatchRunner(spark, query, out_root, config, mode="interval")
        if pipelined and list(compiled) == [""]:  # one plan: read, route and join in one job per stage
            return {"": run_fused(spark, query, compiled[""], root_runner, as_lake(lake), start, end, cycle)}
        group = f"mjoin-{query.name}-prepare-{time.time_ns()}"
        spark.sparkContext.setJobGroup(group, f"mjoin {query.name}: read and route the interval", interruptOnCancel=False)
        prepared = prepare_interval(spark, query, root_runner, as_lake(lake), start, end, cycle)
        prepare_shuffle = shuffle_bytes(spark, group)
        summaries = {}
        shared = None
        if len(compiled) > 1 or "" not in compiled:
            # the warm-up state does not depend on the plan: build it once, copy it to every plan
            shared = warm_up(root_runner, next(iter(compiled.values())), prepared)
        for name in sorted(compiled, key=lambda n: n == ""):  # the root's own plan last: it advances the root state
            cp = compiled[name]
            runner = root_runner
            if name:
                target = as_lake(fsutil.join(out_root.root, name))
                clear_outputs(target, query.name)
                runner = BatchRunner(spark, query, target, config, mode="interval")
                copy_state(root_runner, runner)
            summaries[name] = run_prepared(spark, query, cp, prepared, runner, warm=shared, pipelined=pipelined)
            summaries[name].extra["execution"] = "pipelined" if pipelined else "per-batch"
            summaries[name].extra["prepare_shuffle_bytes"] = prepare_shuffle
        return summaries
    finally:
        if prepared is not None:
            prepared.release()
        restore_conf(spark, before)
