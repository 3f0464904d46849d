"""The feeder: land a pre-generated replay into a lake in real time at a chosen rate, up to hundreds of
thousands of tuples per second.

The lander (:mod:`mjoin.workloads.lander`) copies each cycle's files when the cycle is due, which caps a
live feed at a few thousand tuples/s. The feeder does the work ahead instead, in two steps:

1. :func:`prepare_feed` re-chunks a generated workload (``python -m mjoin generate``) into arrival
   folders of the target rate, in a staging folder on the lake's filesystem (``<lake>/.feed-staging/``;
   the engine lists ``<lake>/streams/`` only). The arrival folder of epoch ``e`` (a multiple of ``cycle``)
   holds each source's rows with event time in ``[e, e + cycle)``. Two paces (``pace``):

   - ``replay`` (default): each key keeps the replay's own pace. The replay runs in *lanes*: lane ``p`` is
     the whole replay shifted in time by ``p * n / rate - length`` (``n`` rows over ``length`` seconds) and
     in keys by ``p * key_span``, so ``rate * length / n`` lanes run at once and the total rate is ``rate``;
     the rate grows with the keys, every key as busy as in the generated replay (a window's matches per
     tuple do not grow with the rate). Lanes start before ``start``, already under way, so the rate is
     steady from the first cycle (the window state still fills over the first window).
   - ``compressed``: all sources' rows in the replay's order (by event time, stable; ties by source
     order), the k-th at ``start + k / rate``; used up, the replay starts again with keys shifted by
     ``key_span`` per pass. Each pass is squeezed into ``n / rate`` seconds, so a window holds every match
     of a pass (the dense case).

   ``key_span`` is a power of ten above every key column of the workload's queries, so lanes and passes
   never join each other. Only the columns the queries read are kept (``columns="all"``: every one).
2. :func:`run_feed` renames each staged folder into ``<lake>/streams/<source>/arrival=<e>/`` when its
   cycle has ended on the wall clock (``e + cycle``; folders already due land at once): one rename per
   folder, so a reader sees all of a folder or none of it (the landing contract, docs/workloads.md).
   After each rename it appends one JSON line to its record: source, arrival, rows, files, the planned
   and the landed time (epoch seconds). :func:`achieved` sums a record up.

The event times are wall-clock times (``start`` is a wall-clock epoch), so the loop's scheduled runs,
which read the period that just ended, see the feed as they see a live source. Local lakes only (a POSIX
rename).
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.lake.contract import US
from mjoin.lake.layout import Lake
from mjoin.runtime import fsutil
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.manifest import Manifest, load_manifest

log = logging.getLogger(__name__)

STAGING = ".feed-staging"
PACES = ("replay", "compressed")
PLAN = "feed.json"


@dataclass(frozen=True)
class Folder:
    """One staged arrival folder: ``<staging>/<source>/arrival=<arrival>/``."""

    source: str
    arrival: int
    rows: int
    files: int

    def to_dict(self) -> dict:
        return {"source": self.source, "arrival": self.arrival, "rows": self.rows, "files": self.files}


@dataclass
class FeedPlan:
    """What :func:`prepare_feed` staged, in landing order (arrival, then the workload's source order)."""

    lake: str
    staging: str
    rate: float
    cycle: int
    start: int
    duration: int
    passes: int
    key_span: int
    key_columns: dict
    folders: list = field(default_factory=list)
    pace: str = "replay"
    lane_seconds: float | None = None  # replay pace: seconds between two lanes' starts
    replay_seconds: float | None = None  # the replay's length
    prepare_seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.folders)

    @property
    def end(self) -> int:
        return self.start + self.duration

    def planned(self, folder: Folder) -> float:
        """When a folder is due: its cycle's end on the wall clock."""
        return float(folder.arrival + self.cycle)

    def to_dict(self) -> dict:
        return {"lake": self.lake, "staging": self.staging, "rate": self.rate, "cycle": self.cycle,
                "start": self.start, "duration": self.duration, "passes": self.passes, "key_span": self.key_span,
                "key_columns": self.key_columns, "pace": self.pace, "lane_seconds": self.lane_seconds,
                "replay_seconds": self.replay_seconds, "rows": self.rows, "prepare_seconds": round(self.prepare_seconds, 3),
                "folders": [f.to_dict() for f in self.folders]}

    @classmethod
    def from_dict(cls, doc: dict) -> "FeedPlan":
        return cls(lake=doc["lake"], staging=doc["staging"], rate=doc["rate"], cycle=doc["cycle"], start=doc["start"],
                   duration=doc["duration"], passes=doc["passes"], key_span=doc["key_span"],
                   key_columns=doc["key_columns"], folders=[Folder(**f) for f in doc["folders"]],
                   pace=doc.get("pace", "replay"), lane_seconds=doc.get("lane_seconds"),
                   replay_seconds=doc.get("replay_seconds"),
                   prepare_seconds=doc.get("prepare_seconds", 0.0))


def _local(lake: Lake) -> str:
    fs, path = fsutil.resolve(lake.root)
    if type(fs).__name__ != "LocalFileSystem":
        raise WorkloadError(f"the feeder lands by a local rename; {lake.root} is not a local folder", "--lake")
    return path


def _query_columns(manifest: Manifest) -> tuple[dict, dict]:
    """Per source: the key columns of the workload's queries and every column they read (event time included)."""
    keys: dict = {}
    cols: dict = {}
    for q in manifest.queries():
        for s in q.streams:
            keys.setdefault(s.source, set()).update(s.keys)
            cols.setdefault(s.source, set()).update(s.columns)
            if s.event_time.column:
                cols[s.source].add(s.event_time.column)
    return keys, cols


def _read_source(manifest: Manifest, source: str, columns) -> pa.Table:
    root = Path(manifest.root) / "streams" / source
    tables = []
    for a in manifest.arrivals(source):
        for f in sorted((root / f"arrival={a}").glob("*.parquet")):
            t = pq.read_table(f)
            tables.append(t if columns is None else t.select([c for c in t.column_names if c in columns]))
    if not tables:
        raise WorkloadError(f"source {source!r} of {manifest.root} has no rows")
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks()


def _event_column(manifest: Manifest, source: str) -> str:
    for q in manifest.queries():
        for s in q.streams:
            if s.source == source and s.event_time.column:
                return s.event_time.column
    return manifest.source(source).get("event_time") or "ts"


def prepare_feed(workload, lake, *, rate: float, duration: float, start: float, cycle: int = 10,
                 columns: str = "query", rows_per_file: int | None = None, pace: str = "replay") -> FeedPlan:
    """Stage the arrival folders of a feed of ``rate`` tuples/s (all sources together) for ``duration`` seconds
    from the wall-clock epoch ``start`` (rounded down to a multiple of ``cycle``) under ``<lake>/.feed-staging``.
    ``columns``: ``query`` (the columns the workload's queries read) or ``all``. ``rows_per_file``: split a
    folder's rows over several files of at most this many rows (default: one file). Returns the plan
    (also written to ``<staging>/feed.json``)."""
    t_prep = time.perf_counter()
    manifest = workload if isinstance(workload, Manifest) else load_manifest(workload)
    lake = lake if isinstance(lake, Lake) else Lake(str(lake))
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise WorkloadError(f"{rate!r} must be a positive number of tuples/s", "--rate")
    cycle = int(cycle)
    if cycle < 1:
        raise WorkloadError(f"{cycle!r} must be a whole number of seconds >= 1", "--cycle")
    n_cycles = int(math.ceil(float(duration) / cycle))
    if n_cycles < 1:
        raise WorkloadError(f"{duration!r} must be at least one cycle ({cycle} s)", "--duration")
    if pace not in PACES:
        raise WorkloadError(f"{pace!r}: use {' or '.join(PACES)}", "--pace")
    if columns not in ("query", "all"):
        raise WorkloadError(f"{columns!r}: use query or all", "--columns")
    start = int(math.floor(float(start) / cycle) * cycle)
    root = _local(lake)
    staging = os.path.join(root, STAGING)
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)

    keys, cols = _query_columns(manifest)
    sources = manifest.sources
    tables, ts_us = {}, {}
    for s in sources:
        t = _read_source(manifest, s, cols.get(s) if columns == "query" else None)
        et = _event_column(manifest, s)
        ts = pc.cast(t.column(et), pa.timestamp("us", tz="UTC")).to_numpy(zero_copy_only=False).astype("int64")
        order = np.argsort(ts, kind="stable")
        tables[s] = t.take(pa.array(order))
        ts_us[s] = ts[order]
    # the replay's order over all sources: by event time, stable, ties by source order
    all_ts = np.concatenate([ts_us[s] for s in sources])
    src_of = np.concatenate([np.full(len(ts_us[s]), i, dtype=np.int32) for i, s in enumerate(sources)])
    glob = np.argsort(all_ts, kind="stable")
    n = len(glob)
    position = np.empty(n, dtype=np.int64)
    position[glob] = np.arange(n, dtype=np.int64)
    offsets = np.cumsum([0] + [len(ts_us[s]) for s in sources])
    pos = {s: position[offsets[i]:offsets[i + 1]] for i, s in enumerate(sources)}  # ascending within a source
    assert all(np.all(np.diff(p) > 0) for p in pos.values())
    key_cols = {s: sorted(c for c in keys.get(s, ()) if c in tables[s].column_names) for s in sources}
    top = 0
    for s in sources:
        for c in key_cols[s]:
            m = pc.max(tables[s].column(c)).as_py()
            top = max(top, int(m) if m is not None else 0)
    key_span = 10 ** (len(str(max(top, 1))))
    ts_name = {s: _event_column(manifest, s) for s in sources}
    ts_type = {s: tables[s].schema.field(ts_name[s]).type for s in sources}

    def write(s: str, e: int, t: pa.Table) -> None:
        folder = os.path.join(staging, s, f"arrival={e}")
        os.makedirs(folder)
        step = rows_per_file or t.num_rows
        files = 0
        for f, lo in enumerate(range(0, t.num_rows, step)):
            pq.write_table(t.slice(lo, step), os.path.join(folder, f"part-{f:05d}.parquet"))
            files += 1
        plan.folders.append(Folder(s, e, t.num_rows, files))

    def shifted(t: pa.Table, s: str, ts, lane_offsets) -> pa.Table:
        i = t.column_names.index(ts_name[s])
        t = t.set_column(i, ts_name[s], pa.array(ts, pa.timestamp("us", tz="UTC")).cast(ts_type[s]))
        if lane_offsets is not None:
            for c in key_cols[s]:
                i = t.column_names.index(c)
                col = t.column(c)
                t = t.set_column(i, c, pc.add(col, pa.array(lane_offsets).cast(col.type)))
        return t

    if pace == "replay":
        # lanes: the replay shifted in time by a lane's start and in keys by lane x key_span; a new lane every
        # n / rate seconds, so rate / (n / replay length) lanes run at once; lanes started before `start` are
        # already under way (their rows before `start` are not fed)
        span_us = int(round((manifest.end_epoch - manifest.start_epoch) * US))
        tau = {s: ts_us[s] - int(round(manifest.start_epoch * US)) for s in sources}
        delta_us = n * US / float(rate)
        lanes = int(math.ceil((n_cycles * cycle * US + span_us) / delta_us))
        lane_start = (np.arange(lanes, dtype=np.float64) * delta_us - span_us).astype(np.int64)
        plan = FeedPlan(lake=lake.root, staging=staging, rate=float(rate), cycle=cycle, start=start,
                        duration=n_cycles * cycle, passes=lanes, key_span=key_span, key_columns=key_cols,
                        pace=pace, lane_seconds=delta_us / US, replay_seconds=span_us / US)
        for j in range(n_cycles):
            e = start + j * cycle
            r0, r1 = j * cycle * US, (j + 1) * cycle * US
            for s in sources:
                lo = np.searchsorted(tau[s], r0 - lane_start)
                hi = np.searchsorted(tau[s], r1 - lane_start)
                counts = hi - lo
                total = int(counts.sum())
                if not total:
                    continue
                lane = np.repeat(np.arange(lanes, dtype=np.int64), counts)
                first = np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
                idx = first + np.arange(total, dtype=np.int64)
                order = np.argsort(lane_start[lane] + tau[s][idx], kind="stable")  # event-time order in the file
                idx, lane = idx[order], lane[order]
                t = tables[s].take(pa.array(idx))
                write(s, e, shifted(t, s, start * US + lane_start[lane] + tau[s][idx], lane * key_span))
    else:
        # compressed: the k-th row of the replay's order at start + k / rate, passes one after another
        plan = FeedPlan(lake=lake.root, staging=staging, rate=float(rate), cycle=cycle, start=start,
                        duration=n_cycles * cycle, passes=int(math.ceil(rate * cycle * n_cycles / n)),
                        key_span=key_span, key_columns=key_cols, pace=pace)
        for j in range(n_cycles):
            e = start + j * cycle
            a, b = int(round(rate * cycle * j)), int(round(rate * cycle * (j + 1)))  # global positions [a, b)
            for s in sources:
                pieces = []
                for p in range(a // n, (b - 1) // n + 1 if b > a else a // n):
                    lo, hi = np.searchsorted(pos[s], [a - p * n, b - p * n])
                    if hi <= lo:
                        continue
                    k = pos[s][lo:hi] + p * n
                    ts = start * US + (k * US / rate).astype(np.int64)
                    pieces.append(shifted(tables[s].slice(lo, hi - lo), s, ts,
                                          np.full(hi - lo, p * key_span, dtype=np.int64) if p else None))
                if pieces:
                    write(s, e, pa.concat_tables(pieces))
    plan.prepare_seconds = time.perf_counter() - t_prep
    Path(staging, PLAN).write_text(json.dumps(plan.to_dict()) + "\n")
    log.info("staged %d rows in %d folders (%s pace, %d lanes or passes) in %.1f s", plan.rows, len(plan.folders),
             pace, plan.passes, plan.prepare_seconds)
    return plan


@dataclass
class FeedResult:
    """What :func:`run_feed` did."""

    record: str
    folders: int = 0
    rows: int = 0
    stopped: bool = False


def run_feed(plan: FeedPlan, record, *, sleep=time.sleep, wall_clock=time.time, stop=None, on_folder=None) -> FeedResult:
    """Rename the plan's staged folders into ``<lake>/streams/`` on schedule (each when its cycle has ended on
    ``wall_clock``), appending one JSON line per folder to ``record``. ``stop()`` (optional) is asked
    before every wait: True ends the feed between folders. ``sleep`` may raise to stop it too."""
    lake = Lake(plan.lake)
    root = _local(lake)
    result = FeedResult(record=str(record))
    for s in {f.source for f in plan.folders}:
        os.makedirs(os.path.join(root, "streams", s), exist_ok=True)
    fd = os.open(str(record), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for folder in plan.folders:
            due = plan.planned(folder)
            while True:
                if stop is not None and stop():
                    result.stopped = True
                    return result
                wait = due - wall_clock()
                if wait <= 0:
                    break
                sleep(min(wait, 0.5))
            src = os.path.join(plan.staging, folder.source, f"arrival={folder.arrival}")
            dst = os.path.join(root, "streams", folder.source, f"arrival={folder.arrival}")
            os.rename(src, dst)  # one rename: the whole folder appears at once
            landed = wall_clock()
            line = {"source": folder.source, "arrival": folder.arrival, "rows": folder.rows, "files": folder.files,
                    "planned": round(due, 6), "landed": round(landed, 6)}
            os.write(fd, (json.dumps(line) + "\n").encode())
            result.folders += 1
            result.rows += folder.rows
            if on_folder is not None:
                on_folder(line)
    finally:
        os.close(fd)
    return result


def read_record(record) -> list[dict]:
    """The record's lines (a last line still being written is skipped)."""
    out = []
    try:
        text = Path(record).read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def achieved(lines: list[dict], cycle: float) -> dict:
    """A record summed up: rows, folders, the achieved rate (rows over the landed span plus one cycle: a feed
    exactly on schedule achieves its planned rate) and how late folders landed against their plan."""
    if not lines:
        return {"rows": 0, "folders": 0, "rate": 0.0, "delay_max": None, "delay_p50": None}
    rows = sum(x["rows"] for x in lines)
    landed = [x["landed"] for x in lines]
    delays = sorted(x["landed"] - x["planned"] for x in lines)
    span = max(landed) - min(landed) + cycle
    return {"rows": rows, "folders": len(lines), "cycles": len({x["arrival"] for x in lines}),
            "rate": rows / span, "delay_max": delays[-1], "delay_p50": delays[len(delays) // 2],
            "first_landed": min(landed), "last_landed": max(landed)}
