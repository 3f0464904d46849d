"""Durable, versioned window state: one Arrow IPC file per (class, stream, bucket) and version.

Layout under ``<lake>/state/<query>/``::

    v00000007/c0/cu/b00003.arrow     rows sorted by (key, ts): _ts, _k_<class>..., payload
    manifests/v00000007.json         the commit of batch 7: which file holds each
                                     (class, stream, bucket), the max event time seen,
                                     the plan version, counts
    tmp/batch=7/stage=2/...          partial results between stages of batch 7

Batch ``B`` reads the latest manifest with version < B and writes version B;
the driver writes the manifest only after every task succeeded (the commit).
A crash before it leaves the previous version in force, and the re-run of B
overwrites B's files. An unchanged (class, stream, bucket) keeps pointing at the
file of an older version; garbage collection keeps every file a kept manifest
names. Files are immutable once committed, so Python workers cache them in memory
across batches (:func:`load_rows`), keyed by path.
"""
from __future__ import annotations

import json
import logging
import re
import uuid
from collections import OrderedDict
from datetime import datetime, timezone

import pyarrow as pa

from .. import fsutil
from ..timeutil import iso
from .config import EngineError
from .operator import KeyedRows

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
    def file_rel(version: int, attr_class: str, stream: str, bucket: int) -> str:
        """A new state file's name. The random suffix makes every write a new path, so a worker's
        cache (keyed by path) can never serve rows of an earlier run that reused the folder."""
        return f"v{version:08d}/{attr_class}/{stream}/b{bucket:05d}-{uuid.uuid4().hex[:12]}.arrow"

    def tmp_dir(self, batch_id: int) -> str:
        return fsutil.join(self.root, "tmp", f"batch={batch_id}")

    def commit(self, doc: dict) -> None:
        doc = dict(doc, committed_at=iso(datetime.now(timezone.utc)))
        fsutil.atomic_write_text(self.manifest_path(doc["version"]), json.dumps(doc, indent=1, sort_keys=True))

    def check_compatible(self, buckets: int, fingerprint: str) -> None:
        """The committed state can continue under this run's bucket count and query spec."""
        m = self.latest()
        if m is None:
            return
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
        referenced = set()
        for v in kept:
            referenced.update(self.manifest(v)["files"].values())
        oldest = kept[0] if kept else None
        removed = []
        for name in fsutil.listdir(self.root):
            m = VERSION_DIR.match(name)
            if not m or (oldest is not None and int(m.group(1)) >= oldest):
                continue
            vdir = fsutil.join(self.root, name)
            prefix = name + "/"
            refs = [r for r in referenced if r.startswith(prefix)]
            if not refs:
                fsutil.remove(vdir)
                removed.append(name)
                continue
            for cls in fsutil.listdir(vdir):
                for stream in fsutil.listdir(fsutil.join(vdir, cls)):
                    for f in fsutil.listdir(fsutil.join(vdir, cls, stream)):
                        rel = f"{name}/{cls}/{stream}/{f}"
                        if rel not in referenced:
                            fsutil.remove(fsutil.join(self.root, rel))
        return removed


# ---- worker side: read/write state files, cache them between batches -------------------

_CACHE: "OrderedDict[str, KeyedRows]" = OrderedDict()
_CACHE_BYTES = [0]


def _cache_put(path: str, rows: KeyedRows, budget_bytes: int) -> None:
    if path in _CACHE:
        _CACHE_BYTES[0] -= _CACHE.pop(path).nbytes
    size = rows.nbytes
    if size > budget_bytes:
        return
    _CACHE[path] = rows
    _CACHE_BYTES[0] += size
    while _CACHE_BYTES[0] > budget_bytes and _CACHE:
        _, old = _CACHE.popitem(last=False)
        _CACHE_BYTES[0] -= old.nbytes


def cache_stats() -> dict:
    return {"entries": len(_CACHE), "bytes": _CACHE_BYTES[0]}


def load_rows(root: str, rel: str | None, key_col: str, budget_bytes: int) -> KeyedRows | None:
    """The committed state file ``rel`` (None: no rows), from this worker's cache when possible."""
    if rel is None:
        return None
    path = fsutil.join(root, rel)
    hit = _CACHE.get(path)
    if hit is not None:
        _CACHE.move_to_end(path)
        return hit
    with pa.ipc.open_file(pa.py_buffer(fsutil.read_bytes(path))) as reader:
        table = reader.read_all()
    rows = KeyedRows(table, key_col, presorted=True)
    _cache_put(path, rows, budget_bytes)
    return rows


def write_rows(root: str, rel: str, rows: KeyedRows, budget_bytes: int) -> None:
    sink = pa.BufferOutputStream()
    table = rows.table.combine_chunks()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    path = fsutil.join(root, rel)
    fsutil.atomic_write_bytes(path, sink.getvalue().to_pybytes())
    _cache_put(path, rows, budget_bytes)
