"""Engine settings (what a user may tune; everything else follows from the query and the plan)."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass


class EngineError(ValueError):
    """An engine run that cannot proceed for a reason the user can fix (named in the message)."""


#: testing only, what ``EngineConfig.fault`` can ask (``<kind>:<batch>[:<seconds>]``, several separated by commas):
FAULTS = {
    # end the process (os._exit(17)) after the batch's tasks wrote its state and result files,
    # before its commit (the state manifest)
    "crash_before_commit": False,
    # streaming only: sleep after the batch's tasks wrote its files, before its commit: a window
    # in which a test kills the job from outside (the status file reports ``fault_pause``)
    "pause_before_commit": True,
    # streaming only: sleep after the batch's commit, before Spark records it in its checkpoint: a killed
    # job then re-runs a batch whose outputs are already committed
    "pause_after_commit": True,
    # on the executors: the first attempt of the batch's stage-1 task of partition 0 writes
    # ``<checkpoint>/_control/fault_in_task-<batch>.json`` (its pid, process group, host) and sleeps: a
    # window in which a test kills the worker running it (the retry elsewhere does not sleep)
    "pause_in_task": True,
}


def parse_fault(text: str) -> tuple[str, int, float]:
    """``(kind, batch, seconds)`` of a fault injection spec; :class:`EngineError` if malformed."""
    parts = str(text).split(":")
    kind = parts[0]
    if kind not in FAULTS or len(parts) != (3 if FAULTS[kind] else 2):
        raise EngineError(f"bad fault {text!r}: expected one of " + ", ".join(
            f"{k}:<batch>" + (":<seconds>" if v else "") for k, v in FAULTS.items()))
    try:
        return kind, int(parts[1]), float(parts[2]) if FAULTS[kind] else 0.0
    except ValueError:
        raise EngineError(f"bad fault {text!r}: batch must be an integer, seconds a number") from None


@dataclass(frozen=True)
class EngineConfig:
    #: key buckets per attribute class: the unit of state files and of per-task work.
    #: Fixed for the life of a state (the manifest records it); change it only with a new state.
    buckets: int = 16
    #: Spark partitions of the per-batch shuffle of new tuples (None: the session's
    #: spark.sql.shuffle.partitions, which mjoin sizes to the machine).
    shuffle_partitions: int | None = None
    #: committed state versions kept on disk (>= 2, so that a re-run of the last batch finds its input)
    state_versions_kept: int = 3
    #: per Python worker, memory for state files kept between batches (LRU of immutable versions)
    state_cache_mb: int = 512
    #: override the plan's options.prefilter (None: follow the plan)
    prefilter: bool | None = None
    #: re-probe the tuples the prefilter dropped (untimed) to report the lookups it saved
    prefilter_accounting: bool = True
    #: streaming: at most this many landed files per micro-batch (None: all available)
    max_files_per_trigger: int | None = None
    #: streaming: a stream whose event time lags the leading stream's by more than this many seconds
    #: is idle, left out of the job's watermark (None: the query's largest window; inf: never idle).
    #: See :mod:`mjoin.engine.watermark`.
    idle_timeout: float | None = None
    #: a row whose event time is at or after its arrival folder's epoch plus this many seconds is ``future``:
    #: quarantined, it never moves a watermark (:mod:`mjoin.lake.contract`, "Event-time sanity"); None: two
    #: arrival cycles (``arrival_cycle``); inf: no row is future
    future_allowance: float | None = None
    #: the lake's arrival cycle in seconds (None: inferred from its arrival folders, the most common gap between
    #: two consecutive folders of a source: :func:`mjoin.lake.contract.arrival_cycle`)
    arrival_cycle: float | None = None
    #: streaming: re-list an arrival folder while its epoch is within this many seconds of the newest
    #: arrival of its source (see :mod:`mjoin.engine.source`)
    recheck_seconds: float = 600.0
    #: time slices of the state of a pair joined by a band alone (PSP): every new tuple visits every slice.
    #: Fixed for the life of a state, like ``buckets``; :func:`mjoin.optimizer.psp.choose_slices` picks it (docs/algorithms.md Eq. 58-61).
    psp_slices: int = 4
    #: streaming: a micro-batch whose committed state plus new rows hold at most this many tuples runs on
    #: the driver with the same operator, no Spark job (Spark's fixed cost per job is most of a small
    #: batch); so does a single-plan interval run whose accepted files hold at most this many rows (by
    #: their footers); 0: always on the executors. See docs/engine.md ("Small batches on the driver").
    driver_rows: int = 1_000_000
    #: a single-plan interval run goes to the driver only while its accepted files hold at most this many
    #: rows (and at most ``driver_rows``). It was 100 k while the driver's threads ran each bucket alone (sf 1,
    #: 604 k rows: 14.5 s vs 9.1 s on Spark); with one scan of the input, merged buckets and one thread the
    #: driver is ahead at sf 1 (5.7-8.6 s vs 9.3-13.3 s; dense, 2.2 M results: 2.1-2.5 s vs 8.5-11.6 s).
    #: 0: intervals always on Spark. See docs/engine.md ("Small intervals").
    interval_driver_rows: int = 1_000_000
    #: threads of a batch run on the driver: its (class, bucket) groups split over this many, as Spark
    #: would split them over tasks (0: the driver's cores, at most 4; a pipelined interval on the driver:
    #: one, unless its batches average ``pipelined.PIPELINED_ROWS_PER_THREAD`` rows)
    driver_threads: int = 0
    #: testing only (fault injection, see :data:`FAULTS`): "crash_before_commit:<batch>",
    #: "pause_before_commit:<batch>:<seconds>" or "pause_after_commit:<batch>:<seconds>"
    fault: str | None = None

    def __post_init__(self):
        if self.buckets < 1:
            raise EngineError("buckets must be >= 1")
        if self.state_versions_kept < 2:
            raise EngineError("state_versions_kept must be >= 2 (a re-run of a batch reads the version before it)")
        if self.shuffle_partitions is not None and self.shuffle_partitions < 1:
            raise EngineError("shuffle_partitions must be >= 1")
        for f in self.faults():
            parse_fault(f)
        if self.idle_timeout is not None and not self.idle_timeout > 0:
            raise EngineError("idle_timeout must be a positive number of seconds (or inf: never idle)")
        if self.psp_slices < 1:
            raise EngineError("psp_slices must be >= 1")
        if self.driver_rows < 0:
            raise EngineError("driver_rows must be >= 0 (0: never run a batch on the driver)")
        if self.interval_driver_rows < 0:
            raise EngineError("interval_driver_rows must be >= 0 (0: never run an interval on the driver)")
        if self.driver_threads < 0:
            raise EngineError("driver_threads must be >= 0 (0: the driver's cores, at most 4)")
        if self.future_allowance is not None and not self.future_allowance > 0:
            raise EngineError("future_allowance must be a positive number of seconds (or inf: no row is future)")
        if self.arrival_cycle is not None and not (0 < self.arrival_cycle < float("inf")):
            raise EngineError("arrival_cycle must be a positive number of seconds")
        if not self.recheck_seconds >= 0:
            raise EngineError("recheck_seconds must be >= 0")

    def threads_on_driver(self) -> int:
        """:attr:`driver_threads`, 0 resolved to the driver's cores (at most 4)."""
        return self.driver_threads or max(1, min(os.cpu_count() or 1, 4))

    def pause_at(self, point: str, batch_id: int) -> float:
        """Seconds the fault asks to pause at ``point`` (``before_commit``, ``after_commit``) of batch
        ``batch_id``; 0 when it asks nothing there."""
        for f in self.faults():
            kind, batch, seconds = parse_fault(f)
            if kind == f"pause_{point}" and batch == batch_id:
                return seconds
        return 0.0

    def faults(self) -> list[str]:
        """The fault injection specs asked for (``fault`` split at commas)."""
        return [f.strip() for f in (self.fault or "").split(",") if f.strip()]

    def to_json(self) -> dict:
        return asdict(self)
