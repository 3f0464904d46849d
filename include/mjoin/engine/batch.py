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
Every batch of an interval in one job per stage: :mod:`mjoin.engine.pipelined`.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mjoin.engine.compiled import CompiledPlan, EngineQuery, key_name
from mjoin.engine.config import EngineConfig, EngineError
from mjoin.engine.frame import (arrow_frame_schema, arrow_input_schema, arrow_result_schema, frame_ddl, input_ddl,
                                spark_frame_schema, spark_input_schema, spark_slot_exprs, to_layout)
from mjoin.engine.metrics import shuffle_bytes, write_record
from mjoin.engine.normalize import REASONS, add_counts, write_file_rejects
from mjoin.engine.operator import KIND_PROBE, KIND_REJECT, BucketContext, process_bucket
from mjoin.engine.results import write_parquet
from mjoin.engine.routing import buckets_of, route_local
from mjoin.engine.sparkplan import conf_in_effect, strategies
from mjoin.engine.state import StateStore, StateWriter, file_key, load_state
from mjoin.engine.tasks import (driver_stage, fault_pause_in_task, partition_id, read_parts, spark_stage, split_rejects,
                                write_rejects)
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)


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
    #: the tasks' reports of the job's own statistics (``jobstats`` counts, ``by_cycle`` quarantine counts)
    jobstats: list = field(default_factory=list)

    def add_late_rejects(self) -> bool:
        """Fold the files the tasks found unreadable (:attr:`late_rejects`) into the file-level counts and
        ``quarantined_files``; whether there were any."""

        new = self.late_rejects() if self.late_rejects is not None else []
        for rej in new:
            add_counts(self.quarantined, {rej.stream: {rej.reason: rej.rows or 0}})
            self.quarantined_files.append(rej.to_json())
        return bool(new)

    def add_reports(self, docs) -> "BatchInput":
        """Fold the tasks' counts (stage-1 ``rows_in``/``max_ts``, ``rejects``) into this input."""

        for d in docs:
            if "jobstats" in d or "by_cycle" in d:
                self.jobstats.append(d)
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


def _stage_task(ctx: BucketContext, state_root: str, prev_files: dict, results_dir: str, partials_dir: str,
                cache_bytes: int, classes: tuple, quarantine_root: str, pause: tuple | None = None, stats=None):
    """The mapInArrow function of one stage of one batch (runs in Python workers). ``pause``: (marker path,
    seconds) of the ``pause_in_task`` fault injection; ``stats``: what the job's own statistics count in this
    stage-1 task (:meth:`mjoin.stats.instate.Emission.task`; None: nothing)."""

    def run(batches):
        if pause:
            fault_pause_in_task(pause[0], ctx.batch_id, pause[1])
        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not tables:
            return
        t = pa.concat_tables(tables).combine_chunks()
        part = partition_id()
        counter = stats.task() if stats is not None else None
        task_started = time.thread_time()
        t, rejected = split_rejects(t)
        if rejected is not None:
            counts = write_rejects(rejected, quarantine_root, ctx.eq.streams, ctx.batch_id, f"p{part:05d}")
            doc = {"rejects": counts, "batch_id": ctx.batch_id}
            if counter is not None:  # quarantined rows per statistics cycle (NULL keys: counted, in no statistic)
                doc["by_cycle"] = counter.rejected(rejected)
            yield pa.RecordBatch.from_pydict({"doc": [json.dumps(doc)]})
        if not t.num_rows:
            return
        results, partials, docs = [], [], []
        writer = StateWriter(state_root, ctx.batch_id, f"s{ctx.stage}-p{part:05d}", cache_bytes)
        for ci, bucket, rows in buckets_of(t):
            cls = classes[ci]
            sources = {}

            def load(attr_class, stream, b):
                rows, sources[stream] = load_state(state_root, prev_files.get(file_key(attr_class, stream, b)),
                                                   key_name(attr_class), cache_bytes)
                return rows

            out = process_bucket(ctx, cls, bucket, rows, load if counter is None else counter.loader(load))
            if counter is not None:  # the job's statistics of the cycles made final, from the state loaded
                counter.bucket(cls)
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
        if counter is not None:
            yield pa.RecordBatch.from_pydict({"doc": [json.dumps(counter.doc(task_started))]})

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
            after_tasks=None, stats=None) -> dict:
        """Run one batch and commit it. ``purge_bound``: every row of this and later batches has
        ``ts >= purge_bound`` (state tuples that can join none of them go after the batch);
        ``after_tasks(binput) -> (manifest fields, record fields)``: called when the tasks are done, with
        the batch's input holding their counts (:meth:`BatchInput.add_reports`), before the commit: what
        the streaming job keeps with the state from batch to batch (``event_time``: its watermarks,
        :class:`mjoin.engine.watermark.Watermarks`; ``seen_files``: the files it accepted,
        :class:`mjoin.lake.contract.Seen`; ``jobstats``: its own statistics) and what it adds to the batch's
        metrics. ``stats``: what the stage-1 tasks count for the job's own statistics
        (:class:`mjoin.stats.instate.Emission`; their reports land in ``binput.jobstats``)."""
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
                                                                   cache_bytes, stats)
            where = "driver"
        else:
            docs, stage_seconds, physical, stage = self._run_spark(ctx, binput, prev_files, results_dir, tmp,
                                                                   cache_bytes, stats)
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
        record = self.record(batch_id, binput, plan, docs, started, {**(extra or {}), **more_record})
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
        record["spark_strategies"] = strategies(physical)
        record["execution"] = {"mode": "per-batch", "jobs": stage if where == "executors" else 0, "where": where}
        # a batch on the driver ran no Spark job: nothing to ask Spark's status store
        record["shuffle_bytes"] = shuffle_bytes(spark, group) if where == "executors" else \
            {"read": 0, "written": 0, "stages": 0}
        record["wall_seconds"] = time.perf_counter() - t_batch
        if write_metrics:
            write_record(self.metrics_dir, record)
        return record

    def _stages(self, ctx: BucketContext, binput: BatchInput, prev_files: dict, results_dir: str, tmp: str,
                cache_bytes: int, stage_input, run_stage, next_input, stats=None):
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
                             eq.classes, self.quarantine_root, (marker, pause) if pause else None,
                             stats if stage == 1 else None)
            stage_docs, physical[f"stage{stage}"] = run_stage(fn, stage_input)
            self.late_rejects({ctx.batch_id: binput})
            binput.add_reports([d for d in stage_docs if "rejects" in d or stage == 1])
            stage_docs = [d for d in stage_docs if "rejects" not in d and "jobstats" not in d]
            docs += stage_docs
            stage_seconds[f"stage{stage}"] = time.perf_counter() - t0
            if not sum(c["partials"] for d in stage_docs for c in d["chains"]):
                return docs, stage_seconds, physical, stage
            stage += 1
            if stage > len(eq.streams):
                raise RuntimeError("partial results still pending after n stages: plan segments are inconsistent")
            stage_input = next_input(fsutil.join(tmp, f"stage={stage - 1}"))

    def late_rejects(self, inputs: dict) -> None:
        """After a stage's job: the files its input tasks found unreadable (:meth:`BatchInput.add_late_rejects`)
        counted in their batch's input, and that batch's rejected files written again with them
        (``files-batch=<B>.json``, as :func:`mjoin.engine.normalize.write_quarantine` wrote them before)."""
        for b, binput in inputs.items():
            if binput.add_late_rejects():
                write_file_rejects(self.quarantine_root, binput.quarantined_files, b)

    def _run_spark(self, ctx: BucketContext, binput: BatchInput, prev_files: dict, results_dir: str, tmp: str,
                   cache_bytes: int, stats=None):
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

        return self._stages(ctx, binput, prev_files, results_dir, tmp, cache_bytes, stage_input, spark_stage, next_input,
                            stats)

    def _with_punctuations(self, df, binput: BatchInput, rejects: bool = True):
        if binput.punctuations is None or not binput.punctuations.num_rows:
            return df
        return df.unionByName(self.spark.createDataFrame(to_layout(binput.punctuations, self.input_layout(rejects)[1])))

    def _run_local(self, ctx: BucketContext, binput: BatchInput, prev_files: dict, results_dir: str, tmp: str,
                   cache_bytes: int, stats=None):
        """The batch's stages on the driver, with the same task function Spark would run (one "task"
        holding every bucket): no Spark job. For small batches of a small state, where Spark's fixed
        cost per job (~0.3-0.5 s here) is most of a micro-batch."""

        first = route_local(binput.local, self.eq, self.config.buckets, self.arrow_input_schema, self.config.psp_slices)
        deltas = first.filter(pc.equal(first.column("_kind"), 1))
        if binput.punctuations is not None and binput.punctuations.num_rows:
            first = pa.concat_tables([first, to_layout(binput.punctuations, self.arrow_input_schema)])

        def next_input(folder):
            parts = [t.cast(self.arrow_schema) for t in read_parts(folder)]
            return pa.concat_tables(parts + [to_layout(deltas, self.arrow_schema)])

        return self._stages(ctx, binput, prev_files, results_dir, tmp, cache_bytes, first,
                            driver_stage(self.config.threads_on_driver()), next_input, stats)


    # ---- metrics --------------------------------------------------------------------------------
    def record(self, batch_id, binput: BatchInput, plan: CompiledPlan, docs, started, extra) -> dict:
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
