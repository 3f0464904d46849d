"""Engine settings (what a user may tune; everything else follows from the query and the plan)."""
from __future__ import annotations

from dataclasses import asdict, dataclass


class EngineError(ValueError):
    """An engine run that cannot proceed for a reason the user can fix (named in the message)."""


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
    #: testing only: "crash_before_commit:<batch>" ends the process (os._exit) after the
    #: batch's state and result files are written, before its commit
    fault: str | None = None

    def __post_init__(self):
        if self.buckets < 1:
            raise EngineError("buckets must be >= 1")
        if self.state_versions_kept < 2:
            raise EngineError("state_versions_kept must be >= 2 (a re-run of a batch reads the version before it)")
        if self.shuffle_partitions is not None and self.shuffle_partitions < 1:
            raise EngineError("shuffle_partitions must be >= 1")

    def to_json(self) -> dict:
        return asdict(self)
