"""Pipelined interval runs (:func:`run_pipelined`): interval evaluation has the
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
(:mod:`mjoin.engine.results` and :mod:`mjoin.engine.quarantine` read both layouts).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import IntegerType, StructField, StructType

from mjoin.engine.batch import BatchRunner
from mjoin.engine.compiled import CompiledPlan, key_name
from mjoin.engine.config import EngineError
from mjoin.engine.frame import to_layout
from mjoin.engine.metrics import shuffle_bytes, stage_times, write_jsonl
from mjoin.engine.operator import PROMISES, BucketContext, StateUpdate, process_bucket
from mjoin.engine.results import RowFiles, clear_batches, range_name, with_batch_column, write_parquet
from mjoin.engine.routing import task_groups
from mjoin.engine.sparkplan import strategies
from mjoin.engine.state import StateWriter, file_key, load_state
from mjoin.engine.tasks import driver_stage, partition_id, read_parts, rejects_by_stream, spark_stage, split_rejects
from mjoin.runtime import fsutil

#: a pipelined run on the driver uses more than one thread only when its batches average this many stage-1 rows
#: (sf 1 seed query, 604 k rows: one thread ran the operator in 4.4-5.0 s against 5.8-6.2 s on two at 360
#: batches of 10 s, 0.7-0.9 s against 1.3-1.4 s at 60 batches of 60 s, ~10 k rows a batch)
PIPELINED_ROWS_PER_THREAD = 50_000


def pipelined_task(ctx: BucketContext, state_root: str, prev_files: dict, results_dir: str, partials_dir: str,
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

    def run(batches):
        part = partition_id()
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
            t, rejected = split_rejects(t)
            if rejected is not None:
                counts = {}
                for stream, rows, c in rejects_by_stream(rejected, ctx.eq.streams):
                    if stream not in rejects_out:
                        rejects_out[stream] = RowFiles(fsutil.join(quarantine_root, stream, "rows", rows_folder),
                                                       f"p{part:05d}")
                    rejects_out[stream].add(with_batch_column(rows, b, "batch"))
                    counts[stream] = c
                yield pa.RecordBatch.from_pydict({"doc": [json.dumps({"rejects": counts, "batch_id": b})]})
            if not t.num_rows:
                return
            results, docs = [], []
            for ci, bks, rows in task_groups(t, merged):
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


# ---- every batch of an interval: one Spark job per stage, or on the driver ------------------------
def run_pipelined(runner: BatchRunner, batches: list, routed, inputs: dict, plan: CompiledPlan, purge_bounds: dict,
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
    each task runs all of its buckets of a class in one operator call, see :func:`pipelined_task`).
    Outputs: the results of all the batches in one range folder ``results/<query>/batches=<first>-<last>/``
    with one ``_SUCCESS`` (:mod:`mjoin.engine.results`), the rejected rows in
    ``quarantine/<query>/<stream>/rows/batches=<first>-<last>/`` (:mod:`mjoin.engine.quarantine`)."""
    spark, eq, cfg = runner.spark, runner.eq, runner.config
    extras = extras or {}
    batches = sorted(batches)
    first, last = batches[0], batches[-1]
    if batches != list(range(first, last + 1)):
        raise ValueError(f"pipelined batches must be consecutive, got {batches}")
    started = datetime.now(timezone.utc)
    t_run = time.perf_counter()
    local = isinstance(routed, pa.Table)
    group = f"mjoin-{eq.name}-{runner.mode}-{first}-{last}-{time.time_ns()}"
    if not local:
        spark.sparkContext.setJobGroup(group, f"mjoin {eq.name} batches {first}..{last}", interruptOnCancel=False)
    latest = runner.store.latest()
    if latest is not None and latest["version"] >= first:
        raise EngineError(f"the state of {eq.name} is at batch {latest['version']}, not before batch {first}")
    prev = runner.store.latest_before(first)
    prev_files = dict(prev["files"]) if prev else {}
    rng = range_name(first, last)
    results_dir = fsutil.join(runner.results_root, rng)
    # an earlier attempt's output of these batches, in either layout (results.clear_batches): a re-run
    # replaces it, never adds to it
    clear_batches(runner.results_root, batches)
    for stream in eq.streams:
        clear_batches(fsutil.join(runner.quarantine_root, stream, "rows"), batches)
    tmp = runner.store.tmp_dir(last)
    fsutil.remove(tmp)
    cache_bytes = cfg.state_cache_mb * 1024 * 1024
    ctx = BucketContext(eq=eq, plan=plan, frame_schema=runner.arrow_schema, result_schema=runner.result_schema,
                        batch_id=first, stage=1, buckets=cfg.buckets, emit=True, purge_bound=None,
                        prefilter_accounting=cfg.prefilter_accounting, track_state=True,
                        punctuation=plan.punctuation, punctuation_threshold=plan.punctuation_threshold,
                        psp_slices=cfg.psp_slices)
    conf = runner.conf()
    promised = any(k.split("/")[1].endswith(PROMISES) for k in prev_files)
    merged = frozenset() if punctuations or promised else \
        frozenset(ci for ci, c in enumerate(eq.classes) if not eq.is_band(c))
    run_stage, next_input = pipelined_local(runner, routed, len(batches)) if local else pipelined_spark(runner, routed)
    docs, final, stage_seconds, physical, files_seconds = [], [], {}, {}, 0.0
    stage_input, stage = routed, 1
    while True:
        t0 = time.perf_counter()
        fn = pipelined_task(replace(ctx, stage=stage), runner.store.root, prev_files, results_dir, tmp,
                             cache_bytes, eq.classes, purge_bounds, last if stage == 1 else None,
                             runner.quarantine_root, rng, warmup, merged)
        got, physical[f"stage{stage}"] = run_stage(fn, stage_input)
        runner.late_rejects(inputs)
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
    records = [runner.record(b, inputs[b], plan, by_batch[b], started, extras.get(b, {})) for b in batches]
    max_ts = max([v for v in [(prev or {}).get("max_ts")] + [inputs[b].max_ts for b in batches] if v is not None],
                 default=None)
    runner.store.commit({"version": last, "batch_id": last, "query": eq.name, "query_fingerprint": eq.fingerprint,
                       "buckets": cfg.buckets, "psp_slices": cfg.psp_slices, "max_ts": max_ts,
                       "watermark": None if max_ts is None else max_ts - eq.lateness_us,
                       "plan_version": plan.version, "plan_source": plan.source, "files": files,
                       "mode": runner.mode, "pipelined_from": first,
                       "tuples": records[-1]["state_tuples"], "keys": records[-1]["state_keys"]})
    # one commit marker for the range: its batches and their rows (results.batch_folders)
    fsutil.atomic_write_text(fsutil.join(results_dir, "_SUCCESS"), json.dumps(
        {"batches": [first, last], "rows": {str(b): rec["result_rows"] for b, rec in zip(batches, records)},
         "columns": [f.name for f in runner.result_schema], "plan_version": plan.version}))
    runner.store.gc(cfg.state_versions_kept)
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
        rec["spark_strategies"] = strategies(physical)
        rec["execution"] = execution
        rec["shuffle_bytes"] = {k: (int(round(v * share)) if k != "stages" else v) for k, v in shuffle.items()}
        rec["wall_seconds"] = total * share
    if write_metrics:  # the run's records in one file, not one per batch (metrics.read_metrics reads either)
        write_jsonl(runner.metrics_dir, [rec for rec in records if rec["batch_id"] != warmup])
    return records


def pipelined_spark(runner: BatchRunner, routed):
    """(run_stage, next_input) of a pipelined run's stages as Spark jobs: ``run_stage(fn, df)`` maps
    the task function over the stage's partitions and collects its documents; ``next_input(folder,
    targets)`` is the next stage's input: the partial results written there and the deltas (and
    punctuations) of the classes they enter, replayed batch by batch, partitioned by (class, bucket)."""

    def next_input(folder, targets):
        schema = StructType(list(runner.frame_schema.fields) + [StructField("_batch", IntegerType(), True)])
        part_df = runner.spark.read.schema(schema).parquet(folder)
        replay = runner.conform(routed.where(f"_kind IN (1, 4) AND _c IN ({', '.join(map(str, targets))})"),
                              keep=("_batch",), full=True)
        return runner.partitioned(part_df.unionByName(replay)).sortWithinPartitions("_batch")

    return spark_stage, next_input


def pipelined_local(runner: BatchRunner, routed: pa.Table, batches: int):
    """:meth:`_pipelined_spark` on the driver (no Spark job): a stage's rows split by bucket over
    ``driver_threads`` threads, each playing one Spark task (:func:`run_task`; a thread's rows keep
    the table's order by ``_batch``); the next stage's input read back with pyarrow. With
    ``driver_threads`` 0, one thread unless the batches average :data:`PIPELINED_ROWS_PER_THREAD` rows
    or more (then the driver's cores): a small batch's operator time is Python calls that hold the GIL,
    so a second thread only adds contention."""

    def next_input(folder, targets):
        parts = [to_layout(t, runner.arrow_schema, extra=("_batch",)) for t in read_parts(folder)]
        replay = routed.filter(pc.and_(pc.is_in(routed.column("_kind"), pa.array([1, 4], pa.int8())),
                                       pc.is_in(routed.column("_c"), pa.array(targets, pa.int32()))))
        parts.append(to_layout(replay, runner.arrow_schema, extra=("_batch",)))
        t = pa.concat_tables([x.cast(parts[-1].schema) for x in parts])
        return t.take(pc.sort_indices(t, sort_keys=[("_batch", "ascending")]))  # stable

    threads = runner.config.driver_threads or (
        runner.config.threads_on_driver() if routed.num_rows >= PIPELINED_ROWS_PER_THREAD * max(1, batches) else 1)
    return driver_stage(threads), next_input
