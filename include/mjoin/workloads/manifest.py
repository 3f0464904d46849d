"""``<workload>/manifest.json``: what a generated workload holds (the one manifest format).

Written by the generators, read by the lander and by anyone who needs to know a
workload's time range, cycles, per-source row and NULL-key counts, or the query
specs it was made for. Validated with JSON Schema on write and on read.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import jsonschema

from mjoin.model.query import load_query
from mjoin.model.timeutil import iso
from mjoin.workloads.errors import WorkloadError

MANIFEST_VERSION = 1
MANIFEST = "manifest.json"

_COUNTS = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
_SOURCE = {
    "type": "object",
    "required": ["rows", "source_rows", "null_keys", "rejected", "arrivals", "files", "columns"],
    "properties": {
        "stream": {"type": "string"},
        "rows": {"type": "integer", "minimum": 0},
        "source_rows": {"type": "integer", "minimum": 0},
        "null_keys": _COUNTS,
        "rejected": {
            "type": "object",
            "required": ["rows"],
            "properties": {"rows": {"type": "integer", "minimum": 0}, "reasons": _COUNTS, "file": {"type": ["string", "null"]}},
        },
        "arrivals": {"type": "array", "items": {"type": "integer"}},
        "files": {"type": "integer", "minimum": 0},
        "columns": {"type": "object", "additionalProperties": {"type": "string"}},
        "event_time": {"type": "string"},
    },
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "mjoin workload manifest",
    "type": "object",
    "required": ["manifest_version", "kind", "parameters", "start", "end", "start_epoch", "end_epoch",
                 "cycle_seconds", "sources", "queries"],
    "properties": {
        "manifest_version": {"const": MANIFEST_VERSION},
        "kind": {"enum": ["tpcds", "synthetic"]},
        "parameters": {"type": "object", "required": ["seed", "start", "cycle"]},
        "generator": {"type": "object"},
        "start": {"type": "string"},
        "end": {"type": "string"},
        "start_epoch": {"type": "number"},
        "end_epoch": {"type": "number"},
        "cycle_seconds": {"type": "integer", "minimum": 1},
        "sources": {"type": "object", "minProperties": 1, "additionalProperties": _SOURCE},
        "queries": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "replay": {"type": "object"},
        "schedule": {"type": "object"},
        "notes": {"type": "array", "items": {"type": "string"}},
    },
}


def validate_manifest(doc, where: str = "manifest") -> None:
    """Raise :class:`WorkloadError` naming the first field that breaks :data:`SCHEMA`."""
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        err = errors[0]
        path = "/".join(str(p) for p in err.absolute_path) or "(document)"
        raise WorkloadError(f"invalid at {path}: {err.message}", where)
    if doc["end_epoch"] < doc["start_epoch"]:
        raise WorkloadError("end is before start", where)


@dataclass(frozen=True)
class Manifest:
    """A validated manifest plus the folder it describes."""

    doc: dict
    root: str | None = None

    @property
    def kind(self) -> str:
        return self.doc["kind"]

    @property
    def parameters(self) -> dict:
        return self.doc["parameters"]

    @property
    def start_epoch(self) -> float:
        return float(self.doc["start_epoch"])

    @property
    def end_epoch(self) -> float:
        return float(self.doc["end_epoch"])

    @property
    def cycle_seconds(self) -> int:
        return int(self.doc["cycle_seconds"])

    @property
    def first_cycle(self) -> int:
        """Epoch of the arrival cycle holding ``start`` (cycles are aligned to multiples of the cycle)."""
        return int(self.start_epoch // self.cycle_seconds) * self.cycle_seconds

    @property
    def sources(self) -> list[str]:
        return list(self.doc["sources"])

    def source(self, name: str) -> dict:
        try:
            return self.doc["sources"][name]
        except KeyError:
            raise WorkloadError(f"no source {name!r} (sources: {', '.join(self.sources)})") from None

    def rows(self, source: str) -> int:
        return int(self.source(source)["rows"])

    def arrivals(self, source: str | None = None) -> list[int]:
        """Arrival-cycle epochs with a file, for one source or (None) for any source, ascending."""
        if source is not None:
            return list(self.source(source)["arrivals"])
        return sorted({a for s in self.sources for a in self.source(s)["arrivals"]})

    def query_refs(self) -> list[str]:
        """The query specs this workload is meant for: shipped names, or paths inside the workload."""
        out = []
        for ref in self.doc["queries"]:
            if self.root and ref.endswith((".yaml", ".yml")) and not os.path.isabs(ref):
                ref = os.path.join(self.root, ref)
            out.append(ref)
        return out

    def queries(self):
        return [load_query(r) for r in self.query_refs()]

    def describe(self) -> str:
        """A short human summary: time range, cycles, rows and NULL keys per source."""
        d = self.doc
        p = d["parameters"]
        head = {"tpcds": f"tpcds sf={p.get('sf', 0):g} replay={p.get('replay')}", "synthetic": f"synthetic schedule={p.get('schedule')}"}
        n_cycles = len(self.arrivals())
        lines = [f"{head[self.kind]} seed={p['seed']}" + (f" -> {self.root}" if self.root else ""),
                 f"time range [{d['start']}, {d['end']})  {n_cycles} arrival cycles of {self.cycle_seconds}s"
                 + (f", rate {p['rate']:.4g} tuples/s" + (" per stream (base)" if self.kind == "synthetic" else " in total")
                    if p.get("rate") else "")]
        width = max([len("source")] + [len(s) for s in self.sources])
        lines.append(f"  {'source':<{width}}  {'rows':>10}  {'cycles':>6}  {'rejected':>8}  null keys")
        for s in self.sources:
            info = self.source(s)
            nulls = " ".join(f"{c}={n}" for c, n in info["null_keys"].items()) or "-"
            lines.append(f"  {s:<{width}}  {info['rows']:>10}  {len(info['arrivals']):>6}  {info['rejected']['rows']:>8}  {nulls}")
        return "\n".join(lines)


def write_manifest(root, doc: dict) -> Manifest:
    """Validate and write ``<root>/manifest.json`` (equal workloads give equal bytes)."""
    validate_manifest(doc)
    Path(root, MANIFEST).write_text(json.dumps(doc, indent=2) + "\n")  # insertion order is deterministic
    return Manifest(doc, str(root))


def load_manifest(workload_dir) -> Manifest:
    """Read and validate ``<workload_dir>/manifest.json``."""
    path = Path(workload_dir).expanduser() / MANIFEST
    if not path.exists():
        raise WorkloadError(f"{workload_dir} is not a workload (no {MANIFEST}); make one with `python -m mjoin generate`")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{path} is not valid JSON: {exc}") from None
    validate_manifest(doc, str(path))
    return Manifest(doc, str(path.parent.resolve()))


def time_range(start_us: int, end_us: int) -> dict:
    """The manifest's time-range fields from microsecond instants."""
    return {"start": iso(start_us / 1e6), "end": iso(end_us / 1e6), "start_epoch": start_us / 1e6, "end_epoch": end_us / 1e6}
