"""Durable, versioned window state: per (class, stream, bucket) a short log of immutable Arrow IPC pieces.

Layout under ``<lake>/state/<query>/``::

    v00000007/s1-p00001-<id>.pieces     one file per task of batch 7: the Arrow IPC files (rows sorted
                                        by key: _ts, _k_<class>..., payload) of every (class, stream,
                                        bucket) state the task wrote, one after the other
    manifests/v00000007.json            the commit of batch 7: per (class, stream, bucket) the pieces
                                        holding its state (``<file>@<offset>:<length>``), the purge
                                        threshold, counts; the max event time seen, the plan version
    tmp/batch=7/stage=2/...             partial results between stages of batch 7

A (class, stream, bucket) state is the union of the rows of its pieces with ``ts`` above
its purge threshold. A batch appends one piece with only its new rows (the durable
copy costs the delta, not the state); when the pieces hold more than twice the live
rows or more than :data:`MAX_FILES` pieces, the task writes the live state as one piece
instead (compaction). A task writes all its pieces as one file (:class:`StateWriter`):
one write per task and batch, not one per (class, stream, bucket), which was ~2 ms each
and most of a small streaming batch's own time. Batch ``B`` reads the latest manifest with
version < B and writes version B; the driver writes the manifest only after every task
succeeded (the commit). A crash before it leaves the previous version in force, and the
re-run of B writes new files (unique names) for a new manifest. Garbage collection keeps
every file a kept manifest names. Files are immutable, so Python workers keep the
materialised state in memory between batches (:func:`load_state`), keyed by the
piece list; a worker that misses the cache but holds the list without its newest
piece reads only that piece. (State written before pieces, one ``.arrow`` file per
(class, stream, bucket) and version, named by its path alone, is read the same way.)
"""
from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections import OrderedDict
from datetime import datetime, timezone

import pyarrow as pa
from pyarrow import fs as pafs

from mjoin.engine.config import EngineError
from mjoin.engine.operator import KeyedRows
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)
MANIFEST = re.compile(r"^v(\d{8})\.json$")
VERSION_DIR = re.compile(r"^v(\d{8})$")


def file_key(attr_class: str, stream: str, bucket: int) -> str:
    return f"{attr_class}/{stream}/{bucket}"


class StateStore:
    """Driver side: manifests, commits, garbage collection."""

    def __init__(self, root: str):
        self.root = root

    def manifest_path(self, version: int) -> str:
        return fsutil.join(self.root, "manifests", f"v{version:08d}.json")

    def versions(self) -> list[int]:
        return sorted(int(m.group(1)) for n in fsutil.listdir(fsutil.join(self.root, "manifests"))
                      if (m := MANIFEST.match(n)))

    def manifest(self, version: int) -> dict:
        return json.loads(fsutil.read_text(self.manifest_path(version)))

    def latest(self) -> dict | None:
        v = self.versions()
        return self.manifest(v[-1]) if v else None

    def latest_before(self, version: int) -> dict | None:
        older = [v for v in self.versions() if v < version]
        return self.manifest(older[-1]) if older else None

    @staticmethod
    def file_rel(version: int, tag: str) -> str:
        """A new state file's name. The random suffix makes every write a new path, so a worker's
        cache (keyed by path) can never serve rows of an earlier run that reused the folder."""
        return f"v{version:08d}/{tag}-{uuid.uuid4().hex[:12]}.pieces"

    def referenced(self, versions=None) -> set:
        """The files (not pieces) the manifests of ``versions`` (default: all) name."""
        out = set()
        for v in self.versions() if versions is None else versions:
            for entry in self.manifest(v)["files"].values():
                out.update(piece_file(r) for r in entry["files"])
        return out

    def tmp_dir(self, batch_id: int) -> str:
        return fsutil.join(self.root, "tmp", f"batch={batch_id}")

    def commit(self, doc: dict) -> None:
        doc = dict(doc, committed_at=iso(datetime.now(timezone.utc)))
        fsutil.atomic_write_text(self.manifest_path(doc["version"]), json.dumps(doc, indent=1, sort_keys=True))

    def check_compatible(self, buckets: int, fingerprint: str, psp_slices: int | None = None) -> None:
        """The committed state can continue under this run's bucket count (and time slices of band classes)
        and query spec."""
        m = self.latest()
        if m is None:
            return
        if psp_slices is not None and m.get("psp_slices") not in (None, psp_slices):
            raise EngineError(f"the state in {self.root} was built with {m.get('psp_slices')} time slices for the "
                              f"band classes, this run uses {psp_slices}; use --psp-slices {m.get('psp_slices')} or "
                              "start from an empty state")
        if m.get("buckets") != buckets:
            raise EngineError(f"the state in {self.root} was built with {m.get('buckets')} buckets, this run uses "
                              f"{buckets}; use --buckets {m.get('buckets')} or start from an empty state")
        if m.get("query_fingerprint") != fingerprint:
            raise EngineError(f"the state in {self.root} was built for another version of the query spec "
                              f"(fingerprint {m.get('query_fingerprint')}, now {fingerprint}); start from an empty "
                              "state and checkpoint")

    def gc(self, keep: int) -> list[str]:
        """Delete manifests beyond the newest ``keep`` and every file no kept manifest names."""
        versions = self.versions()
        kept = versions[-keep:]
        for v in versions[:-keep]:
            fsutil.remove(self.manifest_path(v))
        referenced = self.referenced(kept)
        oldest = kept[0] if kept else None
        removed = []
        fs, root = fsutil.resolve(self.root)
        for name in fsutil.listdir(self.root):
            m = VERSION_DIR.match(name)
            if not m or (oldest is not None and int(m.group(1)) >= oldest):
                continue
            prefix = name + "/"
            if not any(r.startswith(prefix) for r in referenced):
                fsutil.remove(fsutil.join(self.root, name))
                removed.append(name)
                continue
            for info in fs.get_file_info(pafs.FileSelector(f"{root}/{name}", recursive=True)):
                rel = info.path[len(root) + 1:]
                if info.type == pafs.FileType.File and rel not in referenced:
                    fs.delete_file(info.path)
        return removed


# ---- worker side: read/write state files, cache them between batches -------------------

#: compaction: at most this many files per (class, stream, bucket) state
MAX_FILES = 8

#: (root, files, purge threshold) -> rows. The threshold is part of the key: a batch that purges a
#: state without adding rows keeps its file list, and a later stage of the same batch (or a re-run)
#: must still find the state as committed before the batch, not the purged one.
_CACHE: "OrderedDict[tuple, KeyedRows]" = OrderedDict()
_CACHE_BYTES = [0]
_BY_FILES: dict = {}  # (root, files) -> thresholds cached
#: a batch on the driver runs its buckets on a few threads (batch.py ``_run_local``): they share the cache
_CACHE_LOCK = threading.RLock()


def clear_cache() -> None:
    """Forget every cached state (tests; a worker's memory otherwise ages out by LRU)."""
    with _CACHE_LOCK:
        _CACHE.clear()
        _BY_FILES.clear()
        _CACHE_BYTES[0] = 0


def _le(a, b) -> bool:
    """Threshold ``a`` purges no more than ``b`` (None: nothing purged)."""
    return a is None or (b is not None and a <= b)


def _cache_drop(key: tuple) -> None:
    _CACHE_BYTES[0] -= _CACHE.pop(key).nbytes
    thr = _BY_FILES.get(key[:2])
    if thr is not None:
        thr.discard(key[2])
        if not thr:
            del _BY_FILES[key[:2]]


def _cache_put(key: tuple, rows: KeyedRows, budget_bytes: int) -> None:
    with _CACHE_LOCK:
        _cache_put_locked(key, rows, budget_bytes)


def _cache_put_locked(key: tuple, rows: KeyedRows, budget_bytes: int) -> None:
    if key in _CACHE:
        _cache_drop(key)
    size = rows.nbytes
    if size > budget_bytes:
        return
    _CACHE[key] = rows
    _CACHE_BYTES[0] += size
    _BY_FILES.setdefault(key[:2], set()).add(key[2])
    while _CACHE_BYTES[0] > budget_bytes and _CACHE:
        _cache_drop(next(iter(_CACHE)))


def _cache_get(root: str, files: tuple, after) -> KeyedRows | None:
    """Cached rows of ``files`` purged at most to ``after`` (then purged to it), or None."""
    with _CACHE_LOCK:
        thresholds = [t for t in _BY_FILES.get((root, files), ()) if _le(t, after)]
        if not thresholds:
            return None
        best = max(thresholds, key=lambda t: -1 << 62 if t is None else t)
        key = (root, files, best)
        _CACHE.move_to_end(key)
        rows = _CACHE[key]
    return rows.purge(after)


def piece_file(ref: str) -> str:
    """The file a piece reference (``<file>@<offset>:<length>``, or a whole file) lies in."""
    return ref.rsplit("@", 1)[0]


def _read_file(root: str, ref: str) -> pa.Table:
    """The rows of one piece (or of a whole state file written before pieces)."""
    path, _, span = ref.rpartition("@")
    if not path:
        data = pa.py_buffer(fsutil.read_bytes(fsutil.join(root, ref)))
    else:
        offset, length = (int(x) for x in span.split(":"))
        data = fsutil.read_range(fsutil.join(root, path), offset, length)
    with pa.ipc.open_file(data) as reader:
        return reader.read_all()


def load_state(root: str, entry: dict | None, key_col: str, budget_bytes: int) -> tuple[KeyedRows | None, str]:
    """The committed state a manifest entry describes (None: no rows), and where it came from
    (``cache``, ``cache+file``, ``files``)."""
    if entry is None:
        return None, "empty"
    files = tuple(entry["files"])
    after = entry.get("after")
    hit = _cache_get(root, files, after)
    if hit is not None:
        return hit, "cache"
    prefix = _cache_get(root, files[:-1], after) if len(files) > 1 else None
    if prefix is not None:
        rows, source = prefix.concat(KeyedRows(_read_file(root, files[-1]), key_col, presorted=True)), "cache+file"
    else:
        tables = [_read_file(root, f) for f in files]
        rows = KeyedRows(pa.concat_tables(tables) if len(tables) > 1 else tables[0], key_col,
                         presorted=len(tables) == 1)
        source = "files"
    rows = rows.purge(after)
    _cache_put((root, files, after), rows, budget_bytes)
    return rows, source


def _ipc_bytes(rows: KeyedRows) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    table = rows.table.combine_chunks()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


class StateWriter:
    """One task's state writes of one version, made durable as one file of pieces (:meth:`flush`).

    :meth:`persist` decides per (class, stream, bucket) whether to append the batch's new rows or to
    compact, and returns the new manifest entry at once; its last piece reference is filled in (and the
    rows cached) by :meth:`flush`, which the task calls before it reports the entries."""

    def __init__(self, root: str, version: int, tag: str, budget_bytes: int):
        self.root, self.rel, self.budget = root, StateStore.file_rel(version, tag), budget_bytes
        self.pending: list = []  # (entry, rows written, live rows)

    def persist(self, prev: dict | None, update) -> dict | None:
        """The new manifest entry for ``update`` (a :class:`~mjoin.engine.operator.StateUpdate`) on top of
        ``prev`` (None: no rows): the batch's new rows as one more piece, or the live rows as one (compaction)."""
        rows = update.rows
        if len(rows) == 0:
            return None
        files = list(prev["files"]) if prev else []
        stored = prev.get("stored", 0) if prev else 0
        entry = {"files": files, "after": update.threshold, "stored": stored, "tuples": len(rows), "keys": rows.nkeys}
        if len(update.delta) or not files:
            if files and len(files) < MAX_FILES and stored + len(update.delta) <= 2 * len(rows):
                piece, entry["stored"] = update.delta, stored + len(update.delta)
            else:  # compaction: the live state as one piece
                piece, entry["files"], entry["stored"] = rows, [], len(rows)
            entry["files"].append(None)  # filled in by flush
            self.pending.append((entry, piece, rows))
        else:
            _cache_put((self.root, tuple(files), update.threshold), rows, self.budget)
        return entry

    def flush(self) -> None:
        """Write every pending piece into one file, complete the entries, cache the rows."""
        if not self.pending:
            return
        blobs, offset = [], 0
        for entry, piece, _ in self.pending:
            blob = _ipc_bytes(piece)
            entry["files"][-1] = f"{self.rel}@{offset}:{blob.size}"
            blobs.append(blob)
            offset += blob.size
        fsutil.write_buffers(fsutil.join(self.root, self.rel), blobs)
        for entry, _, rows in self.pending:
            _cache_put((self.root, tuple(entry["files"]), entry["after"]), rows, self.budget)
        self.pending = []

