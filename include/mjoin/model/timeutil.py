"""Durations and instants: one parser for every spec, CLI flag and DAG param.

Instants are timezone-aware UTC ``datetime`` objects inside the library and
microsecond integers (epoch) inside the engine's arrays.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|min|m|h|d|w)?\s*$")


def parse_duration(value) -> float:
    """Seconds from ``90``, ``"90s"``, ``"10m"``, ``"2h"``, ``"1d"``, ``"500ms"`` or a timedelta."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration (use e.g. 90, '90s', '10m', '2h', '1d')")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds != seconds or seconds < 0:
        raise ValueError(f"{value!r} is not a non-negative duration")
    return seconds


def format_duration(seconds: float) -> str:
    """Shortest exact spelling of a duration: 300 -> '5m', 90 -> '90s'."""
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def parse_time(value) -> datetime:
    """A UTC instant from an ISO-8601 string, epoch seconds or a datetime (naive means UTC)."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(float(value), tz=timezone.utc)
    text = str(value).strip()
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return datetime.fromtimestamp(float(text), tz=timezone.utc)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a time (use ISO-8601 like 2026-01-01T00:10:00Z or epoch seconds)") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def to_epoch(value) -> float:
    """Epoch seconds of anything :func:`parse_time` accepts."""
    return parse_time(value).timestamp()


def to_micros(value) -> int:
    """Epoch microseconds (the engine's time unit)."""
    return int(round(to_epoch(value) * 1_000_000))


def iso(value) -> str:
    """Canonical ISO-8601 UTC spelling, e.g. ``2026-01-01T00:10:00Z``."""
    return parse_time(value).astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def cycles(start, end, cycle_seconds: float) -> list[datetime]:
    """Start instants of the cycles ``[start, end)`` cut every ``cycle_seconds``."""
    if cycle_seconds <= 0:
        raise ValueError("cycle must be positive")
    t0, t1 = to_epoch(start), to_epoch(end)
    out, i = [], 0
    while t0 + i * cycle_seconds < t1 - 1e-9:
        out.append(parse_time(t0 + i * cycle_seconds))
        i += 1
    return out
