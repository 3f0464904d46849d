"""The streaming job's input: the landed files in arrival order, from a file log of the job's own.

Spark's file sources order new files by modification time when they cap a micro-batch
(``maxFilesPerTrigger``) and silently skip files whose modification time is older than
``maxFileAge`` behind the newest one. Modification times do not follow arrival in a copied or
restored lake, with several producers, or on object stores, so a catch-up over such a backlog
gave batches in random arrival order and quarantined most rows as late. The landing
contract names the arrival instead: ``<lake>/streams/<source>/arrival=<epoch>/*.parquet``, one
folder per source and arrival cycle, renamed into place whole (docs/workloads.md).

So the job reads its own source, :class:`LakeSource` (a PySpark Python data source,
``format("mjoin_lake")``), which lists the query's sources' arrival folders and appends every new
file to an append-only **file log** in the checkpoint, ordered by (arrival epoch, stream order,
path) within one listing. An offset is a position in that log (``{"seq": n}``): Spark's offset log
fixes which positions a batch id holds, and the file log never changes what a position means, so a
batch re-run after a crash sees the same files. Modification times play no part.

- What is listed: the Parquet files (``kind = "data"``) and the punctuation files
  (``punctuation-<n>.json``, ``kind = "punctuation"``, :mod:`mjoin.model.punctuation`), a folder's data
  before its punctuations.
- Listing: every arrival folder once (new folders), and again while its arrival epoch is within
  ``recheck_seconds`` of the newest arrival seen for the source (a producer that writes a folder's
  files one by one instead of renaming the folder whole is still caught then). A file that turns
  up in an older folder later is not read: the contract says folders land whole.
- Admission control: ``maxFilesPerTrigger`` caps a batch (Spark's ``ReadMaxFiles``) in **whole arrival
  folders**: a batch ends only where the log passes from one (source, arrival) folder to the next
  (:func:`capped_end`), so it holds all files of a folder or none; it holds as many whole folders as fit in
  the cap, and at least one (a folder with more files than the cap is read whole). The contract lands a
  folder as one unit, and the parts of one cycle span the same event times: a boundary between them let
  the first part advance its stream's watermark and made rows of the next part ``late``.
  ``availableNow`` reads up to what was listed when the query started.
- Compaction: entries before the last committed offset are only needed to recognise folders and
  files already listed; they are folded into ``known.json`` (folder -> file names) when the log
  holds more than :data:`COMPACT_SEGMENTS` segments.

Layout, under ``<checkpoint>/mjoin/files/``: ``<first seq, 12 digits>.json`` (a list of entries
``{seq, path, source, arrival, size, mtime}``), and ``known.json`` (``{"next_seq", "folders":
{"<source>/arrival=<e>": [names]}}``).
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

from pyarrow import fs as pafs
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles, SupportsTriggerAvailableNow

from mjoin.lake.layout import Lake
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)

ARRIVAL = re.compile(r"^arrival=(\d+)$")
SEGMENT = re.compile(r"^(\d{12})\.json$")
#: fold committed log segments into known.json beyond this many
COMPACT_SEGMENTS = 64
#: the schema of the source's rows (what a micro-batch's DataFrame holds: one row per file)
SCHEMA = "seq long, path string, source string, arrival long, size long, mtime double, kind string"


@dataclass(frozen=True)
class FileEntry:
    seq: int
    path: str
    source: str
    arrival: int | None
    size: int
    mtime: float
    kind: str = "data"  # "data" (Parquet) or "punctuation" (mjoin.model.punctuation), after its folder's data

    def to_json(self) -> dict:
        return {"seq": self.seq, "path": self.path, "source": self.source, "arrival": self.arrival,
                "size": self.size, "mtime": self.mtime, "kind": self.kind}


def file_log_dir(checkpoint: str) -> str:
    return fsutil.join(checkpoint, "mjoin", "files")


class FileLog:
    """The append-only log of landed files (see the module docstring)."""

    def __init__(self, root: str):
        self.root = root
        self.entries: list[FileEntry] = []  # uncompacted entries, by seq
        self.base_seq = 0  # seq of entries[0] (entries before it are compacted)
        self.next_seq = 0
        self.folders: dict[str, set] = {}  # "<source>/<folder name>" -> file names listed
        self._load()

    def _load(self) -> None:
        known = fsutil.join(self.root, "known.json")
        if fsutil.exists(known):
            doc = json.loads(fsutil.read_text(known))
            self.next_seq = self.base_seq = int(doc["next_seq"])
            self.folders = {k: set(v) for k, v in doc["folders"].items()}
        self.refresh()

    def _remember(self, e: FileEntry) -> None:
        folder, name = e.path.rstrip("/").rsplit("/", 2)[-2:]
        self.folders.setdefault(f"{e.source}/{folder}", set()).add(name)

    def append(self, found: list[dict]) -> list[FileEntry]:
        """Log ``found`` (dicts without ``seq``, already in arrival order) as one new segment."""
        if not found:
            return []
        new = [FileEntry(seq=self.next_seq + i, **f) for i, f in enumerate(found)]
        fsutil.atomic_write_text(fsutil.join(self.root, f"{self.next_seq:012d}.json"),
                                 json.dumps([e.to_json() for e in new]))
        for e in new:
            self._remember(e)
        self.entries += new
        self.next_seq += len(new)
        return new

    def refresh(self) -> "FileLog":
        """Read the segments appended since this log was loaded (the source's process writes them)."""
        starts = sorted(int(m.group(1)) for n in fsutil.listdir(self.root) if (m := SEGMENT.match(n)))
        for first in starts:
            if first < self.next_seq:
                continue
            for e in json.loads(fsutil.read_text(fsutil.join(self.root, f"{first:012d}.json"))):
                entry = FileEntry(**e)
                if entry.seq != self.next_seq:
                    raise RuntimeError(f"file log {self.root}: entry {entry.seq} where {self.next_seq} was expected")
                self.entries.append(entry)
                self.next_seq += 1
                self._remember(entry)
        return self

    def between(self, start: int, end: int) -> list[FileEntry]:
        if start < self.base_seq:
            raise RuntimeError(f"file log {self.root}: positions before {self.base_seq} were compacted, "
                               f"batch needs {start}..{end}")
        return self.entries[start - self.base_seq:end - self.base_seq]

    def compact(self, committed: int) -> None:
        """Fold the segments wholly before ``committed`` into known.json (when there are many)."""
        segments = sorted(int(m.group(1)) for n in fsutil.listdir(self.root) if (m := SEGMENT.match(n)))
        starts = segments + [self.next_seq]
        done = [s for s, nxt in zip(segments, starts[1:]) if nxt <= committed and s >= self.base_seq]
        if len(done) < COMPACT_SEGMENTS:
            return
        upto = starts[segments.index(done[-1]) + 1]
        doc = {"next_seq": upto, "folders": {k: sorted(v) for k, v in self.folders.items()}}
        # folders of entries after ``upto`` are in known.json too: harmless (they are listed files)
        fsutil.atomic_write_text(fsutil.join(self.root, "known.json"), json.dumps(doc))
        for s in done:
            fsutil.remove(fsutil.join(self.root, f"{s:012d}.json"))
        self.entries = self.entries[upto - self.base_seq:]
        self.base_seq = upto


def capped_end(flog: FileLog, start: int, end: int, max_files: int) -> int:
    """Where a batch from log position ``start`` ends when at most ``max_files`` files are wanted and the log
    holds positions up to ``end``: at a folder boundary (a position whose entry's (source, arrival) differs from
    the one before it), the last one within the cap, else the first one after it (one folder alone exceeds the
    cap: read whole), else ``end``."""
    if max_files <= 0 or end - start <= max_files:
        return end
    entries = flog.between(start, end)

    def boundary(p: int) -> bool:
        a, b = entries[p - start - 1], entries[p - start]
        return (a.source, a.arrival) != (b.source, b.arrival)

    cut = start + max_files
    for p in range(cut, start, -1):
        if boundary(p):
            return p
    for p in range(cut + 1, end):
        if boundary(p):
            return p
    return end


def discover(lake, sources: list[str], flog: FileLog, recheck_seconds: float) -> list[FileEntry]:
    """List the sources' arrival folders, log the files not seen before (ordered by arrival epoch,
    then the sources' order, then path) and return them."""
    found = []
    for rank, source in enumerate(sources):
        root = lake.streams(source)
        fs, p = fsutil.resolve(root)
        if fs.get_file_info(p).type != pafs.FileType.Directory:
            continue
        folders = []
        for info in fs.get_file_info(pafs.FileSelector(p)):
            name = os.path.basename(info.path)
            m = ARRIVAL.match(name)
            if info.type == pafs.FileType.Directory and m:
                folders.append((int(m.group(1)), name, info.path))
        if not folders:
            continue
        newest = max(e for e, _, _ in folders)
        for epoch, name, fpath in folders:
            key = f"{source}/{name}"
            if key in flog.folders and epoch < newest - recheck_seconds:
                continue
            listed = flog.folders.get(key, set())
            for info in fs.get_file_info(pafs.FileSelector(fpath)):
                fname = os.path.basename(info.path)
                if info.type != pafs.FileType.File or fname in listed or fname.startswith((".", "_")):
                    continue
                kind = lake.landed_kind(fname)
                if kind is None:
                    continue
                path = fsutil.join(root, name, fname)
                found.append((epoch, rank, kind == "punctuation", path,
                              {"path": path, "source": source, "arrival": epoch, "size": int(info.size or 0),
                               "mtime": info.mtime.timestamp() if info.mtime else 0.0, "kind": kind}))
    found.sort(key=lambda f: f[:4])  # arrival, stream order, a folder's data before its punctuations, path
    return flog.append([f[4] for f in found])


# ---- the PySpark data source ------------------------------------------------------------------

def _pyspark_classes():
    class FilesPartition(InputPartition):
        def __init__(self, rows):
            self.rows = rows

    class LakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        """Offsets are positions in the file log (runs in Spark's Python source runner process)."""

        def __init__(self, options):
            self.lake = Lake(options["lake"])
            self.sources = json.loads(options["sources"])
            self.checkpoint = options["checkpoint"]
            self.max_files = int(options.get("maxFilesPerTrigger") or 0)
            self.recheck = float(options.get("recheckSeconds") or 600)
            self.target = None
            self._log = None  # loaded on first use: Spark also builds a reader in the executors, for read()

        @property
        def log(self) -> FileLog:
            if self._log is None:
                self._log = FileLog(file_log_dir(self.checkpoint))
            return self._log

        def initialOffset(self):
            return {"seq": 0}

        def getDefaultReadLimit(self):
            return ReadMaxFiles(self.max_files) if self.max_files > 0 else ReadAllAvailable()

        def prepareForTriggerAvailableNow(self):
            discover(self.lake, self.sources, self.log, self.recheck)
            self.target = self.log.next_seq

        def latestOffset(self, start, limit):
            if self.target is None:
                discover(self.lake, self.sources, self.log, self.recheck)
            end = self.log.next_seq if self.target is None else self.target
            first = int(start["seq"])
            if isinstance(limit, ReadMaxFiles) and end > first:
                end = capped_end(self.log, first, end, limit.max_files)  # whole arrival folders
            return {"seq": max(end, first)}

        def reportLatestOffset(self):
            return {"seq": self.log.next_seq}

        def partitions(self, start, end):
            rows = [(e.seq, e.path, e.source, e.arrival, e.size, e.mtime, e.kind)
                    for e in self.log.between(int(start["seq"]), int(end["seq"]))]
            return [FilesPartition(rows)] if rows else []

        def read(self, partition):
            yield from partition.rows

        def commit(self, end):
            self.log.compact(int(end["seq"]))

    class LakeSource(DataSource):
        """``spark.readStream.format("mjoin_lake")``: options ``lake``, ``checkpoint``, ``sources`` (JSON
        list, in stream order), ``maxFilesPerTrigger``, ``recheckSeconds``."""

        @classmethod
        def name(cls):
            return "mjoin_lake"

        def schema(self):
            return SCHEMA

        def streamReader(self, schema):
            return LakeStreamReader(self.options)

    return LakeSource


def source_frame(spark, lake, query, checkpoint: str, config):
    """The file-listing stream of ``query``'s sources in arrival order (content never read here)."""
    sources = list(dict.fromkeys(s.source for s in query.streams))
    spark.dataSource.register(_pyspark_classes())
    fsutil.makedirs(lake.streams())
    reader = (spark.readStream.format("mjoin_lake").option("lake", lake.root).option("checkpoint", checkpoint)
              .option("sources", json.dumps(sources)).option("recheckSeconds", str(config.recheck_seconds)))
    if config.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(config.max_files_per_trigger))
    return reader.load()


def batch_offsets(checkpoint: str, batch_id: int) -> tuple[int, int] | None:
    """``(start, end)`` positions in the file log of micro-batch ``batch_id``, from Spark's offset log
    (``offsets/<id>``: a version line, the batch metadata, then this source's offset ``{"seq": n}``);
    None when it cannot tell (a purged or foreign log entry)."""
    def end_of(b: int) -> int | None:
        path = fsutil.join(checkpoint, "offsets", str(b))
        if not fsutil.exists(path):
            return None
        lines = [x for x in fsutil.read_text(path).splitlines() if x.strip()]
        try:
            return int(json.loads(lines[-1])["seq"])
        except (ValueError, KeyError, IndexError, TypeError):
            return None

    end = end_of(batch_id)
    start = 0 if batch_id == 0 else end_of(batch_id - 1)
    if end is None or start is None or start > end:
        return None
    return start, end
