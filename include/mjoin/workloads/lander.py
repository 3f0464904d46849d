"""The replayer: land a workload's arrival cycles into a lake on a simulated clock.

Every arrival cycle with ``since <= epoch < until`` of every source is copied to
``<lake>/streams/<source>/arrival=<epoch>/``: first into a hidden temporary
folder next to it (``.arrival=<epoch>.<id>.tmp``; Spark's file sources skip
names starting with ``.``), then renamed into place, so a streaming reader never
sees half a cycle. Landing is idempotent: a cycle already in the lake is skipped
(after checking it holds the same files, byte sizes equal), never duplicated.
One lander per lake: stale temporary folders older than ``stale_after`` seconds
(left by a killed lander) are removed when landing starts.

With ``speed`` the lander follows the simulated clock in real time: cycle
``e`` lands when ``(e + cycle - first) / speed`` wall seconds have passed,
i.e. once the simulated cycle is over. With ``wall_clock`` (a live feed whose
event times are wall-clock times, :mod:`mjoin.workloads.live`) cycle ``e``
lands once ``wall_clock()`` has passed ``e + cycle``: cycles already over land
at once, later ones exactly when they end, whenever the lander started.
"""
from __future__ import annotations

import logging
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
from pyarrow import fs as pafs

from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso, to_epoch
from mjoin.runtime import fsutil
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.manifest import Manifest, load_manifest

log = logging.getLogger(__name__)

TEMP = re.compile(r"^\.arrival=\d+\.[0-9a-f]+\.tmp$")


@dataclass(frozen=True)
class LandedCycle:
    source: str
    arrival: int
    rows: int
    files: int
    path: str


@dataclass
class LandResult:
    """What one :func:`land` call did."""

    workload: str
    lake: str
    since: float | None
    until: float | None
    landed: list = field(default_factory=list)   # LandedCycle, in landing order
    skipped: list = field(default_factory=list)  # (source, arrival) already in the lake

    @property
    def files(self) -> int:
        return sum(c.files for c in self.landed)

    @property
    def cycles(self) -> list[int]:
        """Arrival epochs landed (any source), ascending."""
        return sorted({c.arrival for c in self.landed})

    def rows_per_source(self) -> dict:
        out: dict = {}
        for c in self.landed:
            out[c.source] = out.get(c.source, 0) + c.rows
        return out

    def files_per_source(self) -> dict:
        out: dict = {}
        for c in self.landed:
            out[c.source] = out.get(c.source, 0) + c.files
        return out

    def to_dict(self) -> dict:
        return {"workload": self.workload, "lake": self.lake, "since": self.since, "until": self.until,
                "files": self.files, "cycles": self.cycles, "rows_per_source": self.rows_per_source(),
                "files_per_source": self.files_per_source(),
                "skipped": [{"source": s, "arrival": a} for s, a in self.skipped]}

    def summary(self) -> str:
        rng = (f"[{iso(self.since) if self.since is not None else '-inf'}, "
               f"{iso(self.until) if self.until is not None and math.isfinite(self.until) else '+inf'})")
        lines = [f"landed {self.files} files in {len(self.cycles)} cycles {rng} into {self.lake}"
                 + (f"; {len(self.skipped)} already there, skipped" if self.skipped else "")]
        files = self.files_per_source()
        for s, n in self.rows_per_source().items():
            lines.append(f"  {s:<16} {files[s]:>5} files {n:>10} rows")
        return "\n".join(lines)


def _bound(value, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isinf(value):
        return float(value)
    try:
        return to_epoch(value)
    except (ValueError, OverflowError) as exc:
        raise WorkloadError(str(exc), name) from None


def _files(folder: Path) -> dict:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}


def _lake_files(fs, path: str) -> dict | None:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None
    return {Path(i.path).name: i.size for i in fs.get_file_info(pafs.FileSelector(path)) if i.type == pafs.FileType.File}


def _clean_stale(fs, streams_dir: str, stale_after: float) -> int:
    removed = 0
    now = time.time()
    if fs.get_file_info(streams_dir).type != pafs.FileType.Directory:
        return 0
    for info in fs.get_file_info(pafs.FileSelector(streams_dir, recursive=False)):
        if info.type != pafs.FileType.Directory:
            continue
        for tmp in fs.get_file_info(pafs.FileSelector(info.path, recursive=False)):
            if TEMP.match(Path(tmp.path).name) and (tmp.mtime is None or now - tmp.mtime.timestamp() > stale_after):
                fs.delete_dir(tmp.path)
                removed += 1
    if removed:
        log.warning("removed %d stale temporary landing folders under %s", removed, streams_dir)
    return removed


def plan_cycles(manifest: Manifest, since: float | None, until: float | None) -> list[tuple[int, list[str]]]:
    """``[(arrival epoch, [sources with a file in it]), ...]`` in time order, within ``[since, until)``."""
    by_epoch: dict = {}
    for s in manifest.sources:
        for a in manifest.arrivals(s):
            if (since is None or a >= since) and (until is None or a < until):
                by_epoch.setdefault(a, []).append(s)
    return sorted(by_epoch.items())


def cycles_bound(manifest: Manifest, n: int, since=None) -> float:
    """``until`` that lands ``n`` arrival cycles from ``since`` (default: the workload's first cycle)."""
    if int(n) != n or n < 0:
        raise WorkloadError(f"{n!r} is not a non-negative whole number", "--cycles")
    first = manifest.first_cycle if since is None else _bound(since, "--since")
    first = math.ceil((first - manifest.first_cycle) / manifest.cycle_seconds) * manifest.cycle_seconds + manifest.first_cycle
    return first + int(n) * manifest.cycle_seconds


def land(workload_dir, lake, until, *, since=None, speed: float | None = None, stale_after: float = 600.0,
         sleep=time.sleep, clock=time.monotonic, on_cycle=None, wall_clock=None) -> LandResult:
    """Copy every arrival cycle with ``since <= epoch < until`` of the workload into the lake.

    ``until``/``since``: ISO-8601, epoch seconds, datetime, or None (no bound).
    ``lake``: a :class:`mjoin.lake.layout.Lake` or its root (local path or filesystem URL).
    ``speed``: follow the simulated clock at ``speed`` x real time (None: as fast as possible).
    ``wall_clock`` (e.g. ``time.time``; not with ``speed``): land cycle ``e`` once the wall clock passes its end.
    ``on_cycle(epoch, [LandedCycle])`` is called after each landed cycle.
    """
    manifest = workload_dir if isinstance(workload_dir, Manifest) else load_manifest(workload_dir)
    lake = lake if isinstance(lake, Lake) else Lake(str(lake))
    until_e, since_e = _bound(until, "--until"), _bound(since, "--since")
    if speed is not None and (not math.isfinite(float(speed)) or float(speed) <= 0):
        raise WorkloadError(f"{speed!r} must be a positive number", "--speed")
    if speed is not None and wall_clock is not None:
        raise WorkloadError("give a speed or a wall clock, not both", "--speed")
    if since_e is not None and until_e is not None and until_e < since_e:
        raise WorkloadError(f"until {iso(until_e)} is before since {iso(since_e)}", "--until")
    fs, _ = fsutil.resolve(lake.streams())
    _clean_stale(fs, fsutil.resolve(lake.streams())[1], stale_after)
    result = LandResult(workload=manifest.root, lake=lake.root, since=since_e, until=until_e)
    root = Path(manifest.root)
    plan = plan_cycles(manifest, since_e, until_e)
    anchor = None  # (wall, simulated) time of the first cycle that has anything to land
    for epoch, sources in plan:
        todo = []
        for source in sources:
            src_dir = root / "streams" / source / f"arrival={epoch}"
            if not src_dir.is_dir():
                raise WorkloadError(f"{src_dir} is listed in the manifest but missing; regenerate the workload")
            wanted = _files(src_dir)
            _, target = fsutil.resolve(lake.arrival_dir(source, epoch))
            have = _lake_files(fs, target)
            if have is None:
                todo.append((source, src_dir, wanted, target))
            elif have == wanted:
                result.skipped.append((source, epoch))
            else:
                raise WorkloadError(f"the lake already holds a different {source} arrival={epoch} "
                                    f"({sorted(have)} vs {sorted(wanted)}); land into a fresh lake or remove it")
        if not todo:
            continue  # already landed: no waiting either (a re-run catches up at once)
        if speed is not None:
            anchor = anchor or (clock(), epoch)
            wait = anchor[0] + (epoch + manifest.cycle_seconds - anchor[1]) / float(speed) - clock()
            if wait > 0:
                sleep(wait)
        elif wall_clock is not None:
            wait = epoch + manifest.cycle_seconds - wall_clock()
            if wait > 0:
                sleep(wait)
        landed_now = []
        for source, src_dir, wanted, target in todo:
            tmp = f"{Path(target).parent}/.arrival={epoch}.{uuid.uuid4().hex[:12]}.tmp"
            fs.create_dir(tmp, recursive=True)
            try:
                for name in wanted:
                    pafs.copy_files(str(src_dir / name), f"{tmp}/{name}", source_filesystem=pafs.LocalFileSystem(),
                                    destination_filesystem=fs)
                fs.move(tmp, target)  # a rename on POSIX and HDFS: readers see all of the cycle or none
            except BaseException:
                if fs.get_file_info(tmp).type != pafs.FileType.NotFound:
                    fs.delete_dir(tmp)
                raise
            cycle = LandedCycle(source, epoch, _rows(src_dir), len(wanted), lake.arrival_dir(source, epoch))
            result.landed.append(cycle)
            landed_now.append(cycle)
        if on_cycle is not None:
            on_cycle(epoch, landed_now)
    log.debug("landed %d files (%d skipped) from %s", result.files, len(result.skipped), manifest.root)
    return result


def _rows(folder: Path) -> int:
    return sum(pq.read_metadata(str(p)).num_rows for p in sorted(folder.glob("*.parquet")))
