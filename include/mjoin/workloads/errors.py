"""The workloads package's one user-fixable error type."""
from __future__ import annotations


class WorkloadError(ValueError):
    """A workload request or folder that cannot be used (bad parameter, bad schedule, bad
    manifest, lake conflict); the message names the parameter or field. CLI exit 2."""

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class ScheduleError(WorkloadError):
    """A drift schedule that cannot be used; ``field`` is its path, e.g. ``events[2].at``."""
