"""Punctuations (PJoin): a stream's promise that no later tuple will carry certain keys, or an event
time below a bound. Part of the landing contract (docs/workloads.md, "Punctuations"); pure, no Spark.

A punctuation is a small JSON file landed in a stream's arrival folder next to its data,
``<lake>/streams/<source>/arrival=<epoch>/punctuation-<n>.json``::

    {"punctuation_version": 1, "column": "key", "keys": [17, 42]}          no later tuple with key 17 or 42
    {"punctuation_version": 1, "column": "key", "ranges": [[100, 199]]}    ... with a key in [100, 199]
    {"punctuation_version": 1, "event_time_before": "2026-01-01T00:05:00Z"} ... with an event time before it

It promises what comes *after* its arrival folder's data (the streaming job reads it after the
folder's Parquet files). ``column`` names a join-key column of the source; a promise about a column
that is no key of the query is ignored (and counted). What the join does with it
(:mod:`mjoin.engine.operator`): once stream s promised no more tuples with key k (in k's attribute
class) and s's own state holds no tuple with key k any more, no future result can have key k, so every
other stream's state tuples of k go, and their new tuples of k are not probed nor kept. An event-time
bound lets the job's watermark pass s without waiting for its data (:mod:`mjoin.engine.watermark`).
A tuple of s that breaks its own promise is joined as any other and counted (the batch's ``punctuation.violations``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from mjoin.model.timeutil import iso, to_epoch
from mjoin.runtime import fsutil

FILE = re.compile(r"^punctuation-[\w.-]+\.json$")
VERSION = 1


class PunctuationError(ValueError):
    """A punctuation file that does not follow the format (named, with the field)."""


@dataclass(frozen=True)
class Punctuation:
    path: str
    column: str | None = None
    keys: tuple = ()  # exact keys promised
    ranges: tuple = ()  # ((lo, hi), ...) inclusive
    event_time_before: float | None = None  # epoch seconds

    def to_json(self) -> dict:
        doc = {"punctuation_version": VERSION}
        if self.column is not None:
            doc["column"] = self.column
        if self.keys:
            doc["keys"] = [int(k) for k in self.keys]
        if self.ranges:
            doc["ranges"] = [[int(lo), int(hi)] for lo, hi in self.ranges]
        if self.event_time_before is not None:
            doc["event_time_before"] = iso(self.event_time_before)
        return doc


def parse(doc: dict, path: str = "(punctuation)") -> Punctuation:
    if not isinstance(doc, dict):
        raise PunctuationError(f"{path}: a punctuation is a JSON object")
    if doc.get("punctuation_version") != VERSION:
        raise PunctuationError(f"{path}: punctuation_version must be {VERSION}")
    unknown = set(doc) - {"punctuation_version", "column", "keys", "ranges", "event_time_before"}
    if unknown:
        raise PunctuationError(f"{path}: unknown field(s) {', '.join(sorted(unknown))}")
    keys = doc.get("keys") or []
    ranges = doc.get("ranges") or []
    if (keys or ranges) and not isinstance(doc.get("column"), str):
        raise PunctuationError(f"{path}: keys and ranges need the key column they are about (column)")
    if not isinstance(keys, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
        raise PunctuationError(f"{path}: keys must be a list of integers")
    if not isinstance(ranges, list) or not all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) and r[0] <= r[1] for r in ranges):
        raise PunctuationError(f"{path}: ranges must be a list of [lo, hi] integer pairs with lo <= hi")
    before = doc.get("event_time_before")
    if before is not None:
        try:
            before = to_epoch(before)
        except (ValueError, OverflowError) as exc:
            raise PunctuationError(f"{path}: event_time_before: {exc}") from None
    if not keys and not ranges and before is None:
        raise PunctuationError(f"{path}: promises nothing (keys, ranges or event_time_before)")
    return Punctuation(path=path, column=doc.get("column"), keys=tuple(keys), ranges=tuple(tuple(r) for r in ranges),
                       event_time_before=before)


def read(path: str) -> Punctuation:
    try:
        doc = json.loads(fsutil.read_text(path))
    except json.JSONDecodeError as exc:
        raise PunctuationError(f"{path}: not JSON ({exc})") from None
    return parse(doc, path)


def write(path: str, *, column: str | None = None, keys=(), ranges=(), event_time_before=None) -> str:
    """Write a punctuation file atomically (``path`` must be named ``punctuation-<n>.json``)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if not FILE.match(name):
        raise PunctuationError(f"{path}: a punctuation file is named punctuation-<n>.json")
    p = Punctuation(path=path, column=column, keys=tuple(int(k) for k in np.asarray(keys, dtype=np.int64)),
                    ranges=tuple((int(a), int(b)) for a, b in ranges),
                    event_time_before=None if event_time_before is None else to_epoch(event_time_before))
    parse(p.to_json(), path)
    fsutil.atomic_write_text(path, json.dumps(p.to_json()))
    return path


def merged_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted intervals covering the inclusive intervals ``[lo_i, hi_i]``."""
    if len(lo) == 0:
        return lo, hi
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    start = np.concatenate(([True], lo[1:] > reach[:-1] + 1))
    idx = np.flatnonzero(start)
    return lo[idx], np.maximum.reduceat(hi, idx)


def covered(keys: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Which ``keys`` lie in one of the disjoint sorted intervals ``[lo_i, hi_i]``."""
    if len(lo) == 0 or len(keys) == 0:
        return np.zeros(len(keys), dtype=bool)
    pos = np.searchsorted(lo, keys, side="right") - 1
    ok = pos >= 0
    out = np.zeros(len(keys), dtype=bool)
    out[ok] = keys[ok] <= hi[pos[ok]]
    return out
