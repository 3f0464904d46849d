"""Parsing and checking of the parameters every generator shares (start, cycle, seed, rate, duration)."""
from __future__ import annotations

import math

from mjoin.model.timeutil import parse_duration, parse_time, to_micros
from mjoin.workloads.errors import WorkloadError

#: Default start of the simulated clock.
DEFAULT_START = "2026-01-01T00:00:00Z"
#: Default arrival-cycle length (seconds).
DEFAULT_CYCLE = 10
#: Highest total rate: above 1e6 tuples/s two tuples would share a microsecond ``ts``.
MAX_RATE = 1_000_000.0


def start_micros(start) -> int:
    """Epoch microseconds of ``--start`` (ISO-8601 or epoch seconds)."""
    try:
        return to_micros(parse_time(start))
    except (ValueError, OverflowError) as exc:
        raise WorkloadError(str(exc), "--start") from None


def cycle_seconds(cycle) -> int:
    """``--cycle`` as whole seconds >= 1 (arrival folders are named by whole epoch seconds)."""
    try:
        seconds = parse_duration(cycle)
    except ValueError as exc:
        raise WorkloadError(str(exc), "--cycle") from None
    if seconds < 1 or seconds != int(seconds):
        raise WorkloadError(f"{cycle!r} is not a whole number of seconds >= 1 (arrival=<epoch> folders are whole seconds)", "--cycle")
    return int(seconds)


def seed_value(seed) -> int:
    if isinstance(seed, bool):
        raise WorkloadError(f"{seed!r} is not a seed", "--seed")
    try:
        value = int(seed)
    except (TypeError, ValueError):
        raise WorkloadError(f"{seed!r} is not an integer", "--seed") from None
    if value < 0 or value != float(seed):
        raise WorkloadError(f"{seed!r} is not a non-negative integer", "--seed")
    return value


def positive(value, name: str, upper: float | None = None) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise WorkloadError(f"{value!r} is not a number", name) from None
    if not math.isfinite(x) or x <= 0:
        raise WorkloadError(f"{value!r} must be a positive number", name)
    if upper is not None and x > upper:
        raise WorkloadError(f"{value!r} is above the maximum {upper:g}", name)
    return x


def duration_seconds(value, name: str = "--duration") -> float:
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise WorkloadError(str(exc), name) from None
    if seconds <= 0:
        raise WorkloadError(f"{value!r} must be positive", name)
    return seconds
