"""Streaming mode: one Structured Streaming query over the landed files, one checkpoint,
``foreachBatch`` running the same per-batch function as interval evaluation.

Source: the ``mjoin_lake`` data source of :mod:`mjoin.engine.source`, the query's landed files in arrival order from a
file log of the job's own in the checkpoint (modification times play no part: a copied or restored
lake, several producers and object stores give the same batches). Spark's offset log fixes which
log positions each batch id holds, so a batch re-run after a crash sees the same files; the batch
itself reads and validates them (one odd file is quarantined, never fails the query). Outputs are
idempotent per batch id (:mod:`mjoin.engine.batch`), so the source's at-least-once replay becomes
exactly-once output.

Event time (:mod:`mjoin.engine.watermark`): a watermark per stream, combined by the minimum (with
an idle timeout in event time); rows below the job's watermark when their batch starts are late,
and the state is purged with that watermark after every stage of the batch has probed.

Hot plan reload: before every batch the job reads the registry's ACTIVE version
and switches when it changed (recorded as ``plan_switch``); without an active plan
it uses the plan given (``plan=``), else the spec's fixed stream order.

The job's own statistics (``stats``, :class:`mjoin.stats.emitted.JobStatistics`, given by the caller: the engine
knows nothing of the statistics schema): each batch's stage-1 tasks count the statistics cycles its watermark
made final from the state they hold, the state keeps the lead-in of the cycles still open, and the counts are
written to the statistics history before the commit (docs/statistics.md, "Where the statistics come from").

Lifecycle (:mod:`mjoin.engine.control`): a run claims the query's job (a second start
is refused while one runs, a crashed one never blocks a restart), reports its status
with a heartbeat, and stops at a batch boundary when a stop is requested.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone

from pyspark import StorageLevel

from mjoin.engine.batch import BatchInput, BatchRunner
from mjoin.engine.compiled import CompiledPlan
from mjoin.engine.config import EngineConfig, EngineError
from mjoin.engine.control import Claim, JobControl, Watcher
from mjoin.engine.failure import JobFailed, filesystem_failure
from mjoin.engine.inputs import as_lake, as_plan, as_query
from mjoin.engine.normalize import (add_counts, inspect_files, local_supported, normalize_local, normalize_streams,
                                    punctuation_rows, write_quarantine)
from mjoin.engine.interval import future_allowance_of
from mjoin.engine.source import ARRIVAL, FileLog, batch_offsets, file_log_dir, source_frame
from mjoin.engine.sparkplan import apply_engine_conf, restore_conf
from mjoin.engine.watermark import Watermarks
from mjoin.lake import contract
from mjoin.lake.registry import PlanRegistry, RegistryError
from mjoin.model.plan import PlanError
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)


def young_cap(batch_max: dict, entries, by_source: dict) -> dict:
    """A batch's largest accepted event times with each stream's capped at the newest arrival epoch (micros) it
    read: while the lake's arrival cycle is unknown (a young lake) the future allowance is a window
    (:func:`mjoin.lake.contract.young_allowance`), so a row that far ahead may be accepted, but it moves no
    watermark past its folder: a later folder's rows are not late because of it (docs/engine.md, "Semantics")."""
    newest: dict = {}
    for e in entries:
        for n in by_source.get(e.source, ()):
            if e.arrival is not None:
                newest[n] = max(newest.get(n, e.arrival), e.arrival)
    return {s: v if v is None or s not in newest else min(int(v), newest[s] * contract.US) for s, v in batch_max.items()}


@dataclass
class StreamSummary:
    query: str
    engine: str
    trigger: str
    batches: list  # batch ids processed by this run
    result_rows: int
    wall_seconds: float
    plan_versions: dict  # batch id -> plan version (None: not from the registry)
    plan_switches: list
    rows_in: dict
    quarantined: dict
    metrics_path: str
    results_path: str
    checkpoint: str
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        q = sum(sum(v.values()) for v in self.quarantined.values())
        sw = "; ".join(f"batch {s['batch_id']}: v{s['from']} -> v{s['to']}" for s in self.plan_switches) or "none"
        return (f"{self.query} [{self.engine}, {self.trigger}] {len(self.batches)} batches {self.batches[:1]}.."
                f"{self.batches[-1:]}: {self.result_rows} result rows, {sum(self.rows_in.values())} rows in, {q} "
                f"quarantined; plan switches: {sw}; {self.wall_seconds:.2f}s\n"
                f"  results: {self.results_path}\n  metrics: {self.metrics_path}")


#: Spark's checkpoint logs on a local lake: mjoin's manager (no fork per log write; :mod:`mjoin.runtime.jvm`, on the
#: class path when built), else through Hadoop's ``FileSystem`` API (Spark 4 name, then Spark 3's)
FS_CHECKPOINT_MANAGERS = (
    "mjoin.spark.LocalCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager")
CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"


def checkpoint_manager(spark, lake) -> str | None:
    """The checkpoint file manager for ``lake``'s streaming query: on a local lake Hadoop's ``FileSystem``
    API (write a temporary file, rename), not Spark's default ``FileContext`` one, whose local
    implementation without Hadoop's native library forks ``readlink`` (and ``chmod``) for every rename of
    the offset and commit logs: that cost 75-80 ms of each of ``walCommit`` and ``commitOffsets`` per
    micro-batch here, 15-20 ms with the ``FileSystem`` one. Even that one forks ``chmod`` for each
    temporary file and its checksum file (~8 ms each); mjoin's own manager (:mod:`mjoin.runtime.jvm`, when its jar
    was built and is on the driver's class path) writes the temporary file without it and is preferred.
    A rename on a local filesystem is atomic either way, and one job per query holds the claim
    (engine.control), so nobody races the log. A ``file://`` URL is the same local filesystem through
    Hadoop's URL path. None: leave Spark's choice (a remote URL lake: HDFS, S3A, ..., or a Spark without
    the classes)."""
    if fsutil.is_url(lake.root) and not str(lake.root).startswith("file:"):
        return None
    try:
        loader = spark._jvm.java.lang.Thread.currentThread().getContextClassLoader()
    except Exception:  # no JVM gateway here (a Spark Connect session): Spark's choice
        return None
    for name in FS_CHECKPOINT_MANAGERS:
        try:
            loader.loadClass(name)
            return name
        except Exception:  # py4j error: no such class in this Spark
            continue
    return None


def claim_info(trigger: str, interval: float | None, stats_cycle: float = 0) -> dict:
    """What a streaming job's claim records about its run (``engine.control``); ``stats_cycle``: the cycle of
    the statistics it computes itself (0: none), which the loop's statistics step reads before waiting for them."""
    return {"trigger": trigger, "interval": interval, "engine": "mjoin", "stats_cycle": stats_cycle}


class StopAtBoundary(Exception):
    """A batch refused because the job is stopping (ends the query; Spark re-runs it after a restart)."""


class StreamJob:
    """The state of one streaming run: the current plan and the records of its batches."""

    def __init__(self, spark, query, lake, plan, config: EngineConfig, stats=None):
        self.spark = spark
        self.stats = stats  # the job's own statistics (mjoin.stats.emitted.JobStatistics), or None
        self.query = query
        self.lake = lake
        self.config = config
        self.runner = BatchRunner(spark, query, lake, config, mode="stream")
        self.eq = self.runner.eq
        self.registry = PlanRegistry(lake, query.name)
        fallback, src = as_plan(query, plan)
        self.fallback = CompiledPlan.from_plan(query, fallback, source=src, prefilter=config.prefilter)
        self.current: CompiledPlan | None = None
        self._plan_problem: str | None = None  # the registry problem logged last (logged once per change)
        self.records: list = []
        self.idle_us = (max(self.eq.window_us.values()) if config.idle_timeout is None
                        else config.idle_timeout * 1_000_000)
        self.by_source: dict = {}
        for s in query.streams:
            self.by_source.setdefault(s.source, []).append(s.name)
        self.checkpoint = lake.checkpoints(query.name)
        self._flog = None  # the source's file log, read on the driver (engine.source)
        self.in_batch: int | None = None  # the batch running now (status: batch_in_progress)
        self.batch_started_at: str | None = None
        self.last_done: int | None = None  # the last batch this run completed
        self.fault_pause: dict | None = None
        self.idle = threading.Event()
        self.idle.set()
        self._gate = threading.Lock()
        self.stopping = False  # set by hold(): every later batch is refused
        self.refused: int | None = None
        self.failure: BaseException | None = None  # the first error of a batch (the job's real cause)
        self.on_batch_end = None  # the lifecycle watcher's hook
        if any(f.startswith("pause_before_commit:") for f in config.faults()):
            self._pause_before_commit()

    # ---- plans ------------------------------------------------------------------------------
    def plan_for_batch(self, batch_id: int, prev_manifest: dict | None):
        """(plan to run, switch record or None, plan error or None), reading the registry's ACTIVE.

        A pointer that cannot be read or names no version (:class:`~mjoin.lake.registry.DamagedPointer`), and a
        version that is missing or cannot run, are alike: the job keeps the last good plan (the running one;
        after a restart the one the last committed batch ran, if it still loads; else the fallback) and records
        ``plan_error`` in every batch's metrics, but logs the problem once per change, not per batch."""
        error = None
        try:
            version = self.registry.active_version()
        except (RegistryError, OSError, ValueError) as exc:
            version, error = None, f"the registry's ACTIVE pointer cannot be used: {exc}"
        new = None
        if version is not None:
            if self.current is not None and self.current.source == "registry" and self.current.version == version:
                new = self.current
            else:
                try:
                    new = self._registry_plan(version)
                except (PlanError, RegistryError, OSError, ValueError) as exc:
                    # a bad plan never stops the join: keep the running plan and report it
                    error = f"active plan v{version} cannot run: {exc}"
        if new is None and self.current is None and error and prev_manifest \
                and prev_manifest.get("plan_source") == "registry" and prev_manifest.get("plan_version"):
            try:  # a restart: the last good plan is the one the last committed batch ran
                new = self._registry_plan(int(prev_manifest["plan_version"]))
            except (PlanError, RegistryError, OSError, ValueError):
                new = None
        if new is None:
            new = self.current or self.fallback
            if new is self.fallback and self.current is None and error is None:
                log.info("no active plan in the registry: running %s", new.describe())
        if error != self._plan_problem:  # logged once per change, recorded in every batch's metrics
            if error:
                log.error("batch %d: %s; running %s (logged again only when this changes)", batch_id, error,
                          new.describe())
            elif self._plan_problem:
                log.info("batch %d: the registry's active plan is usable again", batch_id)
            self._plan_problem = error
        before = (self.current.version, self.current.source) if self.current else (
            (prev_manifest.get("plan_version"), prev_manifest.get("plan_source")) if prev_manifest else None)
        switch = None
        if before is not None and before != (new.version, new.source):
            switch = {"from": before[0], "to": new.version, "from_source": before[1], "to_source": new.source,
                      "batch_id": batch_id}
            log.info("batch %d: plan switch v%s (%s) -> v%s (%s)", batch_id, before[0], before[1], new.version,
                     new.source)
        self.current = new
        return new, switch, error

    def _registry_plan(self, version: int) -> CompiledPlan:
        plan = self.registry.get(version, self.query)
        return CompiledPlan.from_plan(self.query, plan, source="registry", prefilter=self.config.prefilter)

    def future_allowance(self, prev_manifest: dict | None) -> tuple[float | None, float | None]:
        """``(future allowance in seconds or None, arrival cycle or None)`` of the next batch
        (:func:`mjoin.engine.interval.future_allowance_of`): the arrival cycle configured, else the one the
        committed state holds (inferred once, then kept: a restart or a re-run judges alike), else inferred from
        every arrival folder the file log has listed (not only this batch's)."""
        cycle = self.config.arrival_cycle
        if cycle is None and prev_manifest and prev_manifest.get("arrival_cycle"):
            cycle = prev_manifest["arrival_cycle"]
        if cycle is None:
            per: dict = {}
            flog = self._flog if self._flog is not None else FileLog(file_log_dir(self.checkpoint))
            for key in flog.folders:
                source, _, name = key.partition("/")
                m = ARRIVAL.match(name)
                if m and source in self.by_source:
                    per.setdefault(source, []).append(int(m.group(1)))
            cycle = contract.arrival_cycle(per.values())
        return future_allowance_of(replace(self.config, arrival_cycle=cycle), (), self.query)

    def files_by_stream(self, entries) -> tuple[dict, int]:
        """Stream -> landed files of a batch (the source's rows, in arrival order); files of sources no
        stream reads are counted as ignored."""
        out: dict = {s: [] for s in self.eq.streams}
        ignored = 0
        for e in entries:
            names = self.by_source.get(e.source)
            if not names:
                ignored += 1
                continue
            for n in names:
                out[n].append(e.path)
        return out, ignored

    def batch_entries(self, df, batch_id: int) -> list:
        """The batch's landed files in log order: the positions Spark's offset log gives this batch id, read
        from the file log on the driver (no Spark job for a few file names); else the source's rows."""
        where = batch_offsets(self.checkpoint, batch_id)
        for fresh in (False, True) if where is not None else ():
            start, end = where
            try:
                if fresh or self._flog is None:
                    self._flog = FileLog(file_log_dir(self.checkpoint))
                got = self._flog.refresh().between(start, end)
                if len(got) == end - start:
                    return got
            except (RuntimeError, OSError, ValueError) as exc:
                log.warning("batch %d: the file log on the driver: %s", batch_id, exc)
        return sorted(df.collect(), key=lambda r: r.seq)

    def progress(self) -> dict:
        """What the job's status file reports about the batches (see ``engine.control``)."""
        doc = {"batches_this_run": len(self.records), "batch_in_progress": self.in_batch,
               "batch_started_at": self.batch_started_at if self.in_batch is not None else None}
        if self.records:
            last = self.records[-1]
            doc.update(last_batch_id=last["batch_id"], last_batch_at=last.get("started_at"),
                       plan_version=last.get("plan_version"), plan_source=last.get("plan_source"))
        if self.fault_pause:
            doc["fault_pause"] = self.fault_pause
        return doc

    # ---- fault injection (tests) ---------------------------------------------------------------
    def _pause(self, point: str, batch_id: int) -> None:
        seconds = self.config.pause_at(point, batch_id)
        if seconds:
            log.error("fault injection: pausing %ss %s of batch %d", seconds, point.replace("_", " "), batch_id)
            self.fault_pause = {"batch_id": batch_id, "point": point, "since": iso(datetime.now(timezone.utc))}
            time.sleep(seconds)
            self.fault_pause = None

    def _pause_before_commit(self) -> None:
        """Pause inside the runner, after the batch's tasks wrote their files, before the manifest."""
        store = self.runner.store
        commit = store.commit

        def paused_commit(doc):
            self._pause("before_commit", doc["batch_id"])
            commit(doc)

        store.commit = paused_commit

    # ---- lifecycle (engine.control.Watcher) ---------------------------------------------------------
    def hold(self) -> bool:
        """If no batch runs, refuse every later one (the job is stopping) and return True."""
        with self._gate:
            if not self.idle.is_set():
                return False
            self.stopping = True
            return True

    def recorded(self) -> bool:
        """Spark's checkpoint has committed the last batch this run completed (or none ran)."""
        return self.last_done is None or fsutil.exists(
            fsutil.join(self.lake.checkpoints(self.query.name), "commits", str(self.last_done)))

    # ---- one micro-batch -----------------------------------------------------------------------
    def run_batch(self, df, batch_id: int) -> None:
        """The ``foreachBatch`` function: :meth:`process`, tracked for the job's status."""
        with self._gate:
            if self.stopping:  # Spark began a batch while the job stops: refuse it before any work
                self.refused = batch_id
                raise StopAtBoundary(f"batch {batch_id} not run: the job is stopping (it runs after the restart)")
            self.idle.clear()
        self.in_batch, self.batch_started_at = batch_id, iso(datetime.now(timezone.utc))
        try:
            self.process(df, batch_id)
            self.last_done = batch_id
            self._pause("after_commit", batch_id)
        except BaseException as exc:  # kept: Spark relays it as text in a StreamingQueryException
            if self.failure is None:
                self.failure = exc
            raise
        finally:
            self.in_batch = None
            self.idle.set()
            if self.on_batch_end is not None:
                self.on_batch_end()

    def process(self, df, batch_id: int) -> None:
        """One micro-batch: the files' contract checks on the driver, then one Spark job (read, normalise,
        route, one exchange, the operator; rejected rows are written to the quarantine by the tasks),
        a further one per class change of the plan, then the commit."""
        spark, eq, runner = self.spark, self.eq, self.runner
        t0 = time.perf_counter()
        entries = self.batch_entries(df, batch_id)
        files, ignored = self.files_by_stream([e for e in entries if e.kind != "punctuation"])
        punctuations = [(e.path, e.source, e.arrival) for e in entries if e.kind == "punctuation"]
        prev = runner.store.latest_before(batch_id)
        marks = Watermarks.from_manifest(prev, eq.streams, eq.lateness_us)
        late_before = marks.watermark  # rows below the job's watermark when the batch starts are late
        compiled, switch, plan_error = self.plan_for_batch(batch_id, prev)
        seen = contract.Seen(prev.get("seen_files", []) if prev else [])  # as committed before this batch
        allowance, cycle = self.future_allowance(prev)
        inspected = inspect_files(self.query, eq, files, seen, future_allowance=allowance)
        stages = max(len(ch.segments) for ch in compiled.chains.values())
        state_tuples = sum(e.get("tuples", 0) for e in (prev or {}).get("files", {}).values())
        present = {name for (name, _), _ in inspected.groups.items()}
        local = (state_tuples + inspected.rows <= self.config.driver_rows and self.config.driver_rows > 0
                 and local_supported(self.query, present))
        frame = table = None
        if local:  # small: the driver runs the batch (no Spark job)
            table = normalize_local(self.query, eq, inspected, late_before=late_before)
            if table is None:
                table = runner.arrow_schema.empty_table()
        else:
            frame = normalize_streams(spark, self.query, eq, inspected, late_before=late_before)
            if frame is not None and stages > 1:  # later stages read the batch's deltas again
                frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
        punct_rows, promised, bad_punct = punctuation_rows(self.query, eq, punctuations, self.config.buckets,
                                                          runner.arrow_schema, future_allowance=allowance)
        inspected.rejects += bad_punct
        write_quarantine(None, {}, inspected.rejects, self.lake, self.query.name, eq, batch_id)
        counts: dict = {}
        for rej in inspected.rejects:
            per = counts.setdefault(rej.stream, {})
            per[rej.reason] = per.get(rej.reason, 0) + (rej.rows or 0)
        binput = BatchInput(frame=frame, local=table if local else None, punctuations=punct_rows, quarantined=counts,
                            quarantined_files=[r.to_json() for r in inspected.rejects], files=len(entries),
                            late_rejects=None if local else inspected.collect_unreadable)
        prepare_seconds = time.perf_counter() - t0
        # the job's own statistics: the cycles the watermark made final, counted by the stage-1 tasks; the state
        # keeps the lead-in of the cycles still open (purged with a bound at most one cycle below the watermark)
        emission = self.stats.emission(prev, late_before, compiled) if self.stats is not None else None
        purge = self.stats.purge_bound(late_before, emission) if self.stats is not None else late_before

        def after_tasks(done: BatchInput):
            # a file accepted by its footer whose data then did not read joined nothing: not remembered, so a
            # repaired copy of it is read, not rejected as its duplicate
            for rej in inspected.rejects:
                if rej.rule == "input.files_readable":
                    seen.forget(rej.stream, rej.path)
            after = marks.advance(young_cap(done.max_ts_by_stream, entries, self.by_source) if cycle is None
                                  else done.max_ts_by_stream, eq.streams, eq.lateness_us, self.idle_us, promised)
            # duplicates are remembered while they could still double-count: until the job's watermark
            # passes every row of the file (a copy of it then is late row by row; docs/engine.md)
            for f in seen.files:
                if f.ts_max is None:
                    known = after.max_ts.get(f.stream)
                    f.ts_max = known / 1e6 if known is not None else 0.0
            forgotten = seen.forget_before(None if after.watermark is None else after.watermark / 1e6)
            manifest, record = ({"event_time": after.to_json(), "seen_files": seen.to_json(), "arrival_cycle": cycle},
                                {"watermarks": {"per_stream": after.per_stream(eq.lateness_us), "job": after.watermark,
                                                "idle": list(after.idle)},
                                 "files_remembered": len(seen.files), "files_forgotten": forgotten})
            if self.stats is not None:  # the cycles made final, to the statistics history (before the commit)
                more_manifest, more_record = self.stats.after_tasks(batch_id, emission, done.jobstats, prev, compiled)
                manifest.update(more_manifest)
                record.update(more_record)
            return manifest, record

        try:
            # the state is purged with the watermark the batch started with (safe: every accepted row of
            # this and later batches is at or above it), after every stage of the batch has probed; with the
            # job's statistics, no further than the first statistics cycle still open
            rec = runner.run(batch_id, binput, compiled, purge_bound=purge, after_tasks=after_tasks, stats=emission,
                             extra={
                "plan_switch": switch, "plan_error": plan_error, "watermark": late_before,
                "arrivals": [min((e.arrival for e in entries if e.arrival is not None), default=None),
                             max((e.arrival for e in entries if e.arrival is not None), default=None)],
                "files": sum(len(v) for v in files.values()), "files_ignored": ignored,
                "punctuation_files": len(punctuations), "future_allowance": allowance, "arrival_cycle": cycle,
                "prepare_seconds": round(prepare_seconds, 6)})
        finally:
            if frame is not None and stages > 1:
                frame.unpersist()
        self.records.append(rec)
        log.info("batch %d (%s): %d files, %d rows in, %d results, %.2fs", batch_id, compiled.describe(),
                 rec["files"], sum(rec["rows_in"].values()), rec["result_rows"], rec["wall_seconds"])


def run_stream(spark, query, lake, *, trigger: str = "availableNow", interval: float | None = None, plan=None,
               config: EngineConfig | None = None, timeout: float | None = None, claim: Claim | None = None,
               stats=None) -> StreamSummary:
    """Run the streaming join of ``query`` over ``lake`` (results, metrics, state, checkpoint in the lake).

    ``trigger="availableNow"`` processes what has landed and returns; ``"processingTime"``
    runs a micro-batch every ``interval`` seconds until stopped (or ``timeout`` seconds).
    ``claim``: the job's claim, taken before (``python -m mjoin run --stream`` claims before Spark starts, so
    a second start is refused at once); else claimed here. A filesystem error (a full disk, a read-only
    folder) ends the run with :class:`~mjoin.engine.failure.JobFailed`, whose message names the cause and the
    path; ``job status`` records it (``failed``).
    ``stats``: the job's own statistics (:class:`mjoin.stats.emitted.JobStatistics`), or None.
    """
    if trigger not in ("availableNow", "processingTime"):
        raise EngineError(f"unknown trigger {trigger!r} (availableNow, processingTime)")
    if trigger == "processingTime" and not interval:
        raise EngineError("trigger processingTime needs an interval in seconds")
    config = config or EngineConfig()
    query = as_query(query)
    lake = as_lake(lake)
    t0 = time.perf_counter()
    if claim is None:
        claim = JobControl(lake, query.name).claim(claim_info(trigger, interval, stats.tau_s if stats else 0))
    job = None
    watcher = Watcher(claim, progress=lambda: job.progress() if job else {},
                      recorded=lambda: job is None or job.recorded(), hold=lambda: job is None or job.hold())
    before = apply_engine_conf(spark)
    manager = checkpoint_manager(spark, lake)
    if manager is not None:
        before.setdefault(CHECKPOINT_MANAGER_KEY, spark.conf.get(CHECKPOINT_MANAGER_KEY, None))
        spark.conf.set(CHECKPOINT_MANAGER_KEY, manager)
    try:
        job = StreamJob(spark, query, lake, plan, config, stats=stats)
        job.on_batch_end = watcher.batch_ended
        writer = (source_frame(spark, lake, query, lake.checkpoints(query.name), config).writeStream
                  .foreachBatch(job.run_batch)
                  .option("checkpointLocation", lake.checkpoints(query.name))
                  .queryName(f"mjoin_{query.name}_{claim.run_id}"))
        writer = writer.trigger(availableNow=True) if trigger == "availableNow" else \
            writer.trigger(processingTime=f"{float(interval)} seconds")
        sq = writer.start()
        watcher.start(sq)
        try:
            try:
                finished = sq.awaitTermination(timeout) if timeout else sq.awaitTermination()
            except Exception:
                if job.refused is None:
                    raise
                log.info("batch %d refused while stopping: the query ended at the boundary", job.refused)
                finished = True
        finally:
            if sq.isActive:
                sq.stop()
            if not job.idle.wait(600):  # never report stopped (and free the claim) while a batch runs
                log.error("a batch of %s is still running 600 s after its query stopped", query.name)
        if finished is False:
            log.info("stopped after %ss", timeout)
        watcher.finish("stopped", reason="timeout" if finished is False else
                       "all landed data processed (availableNow)" if trigger == "availableNow" else "query ended")
    except BaseException as exc:
        found = filesystem_failure(job.failure if job is not None else None, exc)
        line = found.line() if found is not None else None
        watcher.finish("failed", error=line or f"{type(exc).__name__}: {str(exc)[:2000]}")
        if line is not None:
            raise JobFailed(line, found) from (job.failure if job is not None and job.failure is not None else exc)
        raise
    finally:
        restore_conf(spark, before)
    records = job.records
    rows_in = {s: sum(r["rows_in"][s] for r in records) for s in query.stream_names}
    quarantined: dict = {}
    for r in records:
        add_counts(quarantined, r["quarantined"])
    return StreamSummary(
        query=query.name, engine="mjoin", trigger=trigger, batches=[r["batch_id"] for r in records],
        result_rows=sum(r["result_rows"] for r in records), wall_seconds=time.perf_counter() - t0,
        plan_versions={r["batch_id"]: r["plan_version"] for r in records},
        plan_switches=[r["plan_switch"] for r in records if r["plan_switch"]], rows_in=rows_in,
        quarantined=quarantined, metrics_path=lake.metrics(query.name), results_path=lake.results(query.name),
        checkpoint=lake.checkpoints(query.name))
