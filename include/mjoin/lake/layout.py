"""The lake layout (docs/design.md, "The lake"): one place that knows where things live.

    <lake>/streams/<source>/arrival=<epoch>/part-<n>.parquet   landed input, by arrival cycle
    <lake>/quarantine/<query>/<stream>/...                     rejected rows and files, with a reason
    <lake>/state/<query>/...                                   the join job's window state (durable)
    <lake>/checkpoints/<query>/...                             Structured Streaming checkpoint
    <lake>/results/<query>/batch=<id>/                         join output, idempotent per batch
    <lake>/results/<query>/batches=<first>-<last>/             ... of a pipelined interval run (engine.results)
    <lake>/metrics/<query>/...                                 per-batch engine metrics (JSON lines)
    <lake>/stats/<query>/cycle=<epoch>/                        statistics history (Parquet)
    <lake>/plans/<query>/v<N>.json, ACTIVE                     plan registry
    <lake>/reports/<query>/...                                 evaluation tables, HTML, plots

``namespace`` separates evaluation runs (backfills, what-if) from the live
deployment: ``Lake(root, namespace="eval/<run>")`` puts state, checkpoints,
results, metrics, stats, plans and reports under ``<lake>/<namespace>/``
while still reading the shared landed streams.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from pyarrow import fs as pafs

from mjoin.model.punctuation import FILE
from mjoin.runtime import fsutil
from mjoin.runtime.resources import Resources

ARRIVAL = re.compile(r"^arrival=(\d+)$")


@dataclass(frozen=True)
class Lake:
    root: str
    namespace: str = ""

    def __post_init__(self):
        # one absolute root for every process: executors run in their worker's folder, not the driver's
        object.__setattr__(self, "root", fsutil.absolute(self.root))

    @classmethod
    def default(cls) -> "Lake":
        return cls(Resources.from_env().lake)

    def _ns(self, *parts) -> str:
        base = fsutil.join(self.root, self.namespace) if self.namespace else self.root
        return fsutil.join(base, *parts)

    def with_namespace(self, namespace: str) -> "Lake":
        return Lake(self.root, namespace)

    # ---- input (shared by every namespace) --------------------------------------
    def streams(self, source: str | None = None) -> str:
        return fsutil.join(self.root, "streams", *([source] if source else []))

    def arrival_dir(self, source: str, arrival_epoch: int) -> str:
        return fsutil.join(self.streams(source), f"arrival={int(arrival_epoch)}")

    def stream_file(self, source: str, arrival_epoch: int, part: int = 0) -> str:
        return fsutil.join(self.arrival_dir(source, arrival_epoch), f"part-{part:05d}.parquet")

    def arrivals(self, source: str) -> list[int]:
        """Arrival-cycle starts (epoch seconds) landed for a source, ascending."""
        out = []
        for name in fsutil.listdir(self.streams(source)):
            m = ARRIVAL.match(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    @staticmethod
    def landed_kind(name: str) -> str | None:
        """What a file of an arrival folder is to the engine: ``data`` (Parquet), ``punctuation``
        (:mod:`mjoin.model.punctuation`), or None (not landed input: ignored)."""
        return "data" if name.endswith(".parquet") else "punctuation" if FILE.match(name) else None

    def landed(self, source: str) -> list[tuple[int, str, str]]:
        """``[(arrival epoch, path, kind)]`` of every landed file of ``source`` (:meth:`landed_kind`), by arrival
        then name, from one recursive listing of the source (not one per arrival folder): the one selection
        :meth:`stream_files` and :meth:`punctuation_files` are made of."""
        fs, root = fsutil.resolve(self.streams(source))
        root = root.rstrip("/") + "/"
        out = []
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True)):
            parts = info.path[len(root):].split("/") if info.path.startswith(root) else ()
            m = ARRIVAL.match(parts[0]) if len(parts) == 2 else None
            if m is None or parts[0] != f"arrival={int(m.group(1))}":
                continue
            kind = self.landed_kind(parts[1])
            if kind:
                out.append((int(m.group(1)), parts[1], kind))
        out.sort()
        base = self.streams(source).rstrip("/")  # (joined as strings: pathlib per file cost ~0.1 s at 720)
        return [(a, f"{base}/arrival={a}/{name}", kind) for a, name, kind in out]

    def stream_files(self, source: str, arrival_from: float | None = None, arrival_to: float | None = None) -> list[str]:
        """Parquet files landed for ``source`` with arrival cycle in ``[arrival_from, arrival_to)``."""
        return [p for a, p, kind in self.landed(source) if kind == "data"
                and (arrival_from is None or a >= arrival_from) and (arrival_to is None or a < arrival_to)]

    def punctuation_files(self, source: str) -> list[tuple[int, str]]:
        """``[(arrival epoch, path)]`` of the punctuation files landed for ``source`` (mjoin.model.punctuation)."""
        return [(a, p) for a, p, kind in self.landed(source) if kind == "punctuation"]

    # ---- per query, per namespace -------------------------------------------------
    def quarantine(self, query: str, stream: str | None = None) -> str:
        return self._ns("quarantine", query, *([stream] if stream else []))

    def state(self, query: str) -> str:
        return self._ns("state", query)

    def checkpoints(self, query: str) -> str:
        return self._ns("checkpoints", query)

    def results(self, query: str) -> str:
        return self._ns("results", query)

    def batch_results(self, query: str, batch_id: int) -> str:
        return fsutil.join(self.results(query), f"batch={int(batch_id)}")

    def metrics(self, query: str) -> str:
        return self._ns("metrics", query)

    def stats(self, query: str) -> str:
        return self._ns("stats", query)

    def plans(self, query: str) -> str:
        return self._ns("plans", query)

    def reports(self, query: str) -> str:
        return self._ns("reports", query)

    def gx(self) -> str:
        """The file-backed great-expectations context of this namespace (stored gate results, Data Docs)."""
        return self._ns("gx")

    def local_path(self) -> str | None:
        """The lake as a local folder, or None when it is a remote URL."""
        return None if fsutil.is_url(self.root) else os.path.abspath(self.root)
