"""Punctuations for a generated workload: where a key's life in a stream ends, say so (PJoin).

Scans a workload's stream files per source and join-key column, finds each key's last arrival cycle,
and writes one punctuation file (:mod:`mjoin.model.punctuation`) per source and cycle into the workload's
arrival folder of that cycle, promising that the keys whose last tuple was in it come no more. Keys
still seen in the last ``keep_cycles`` cycles are not promised (their life may go on after the
workload ends). The promises are exact: they are computed from the whole workload. The lander lands
them with their cycle (a folder is landed whole), after the folder's data in the join's reading order.
Keys end in the drifting presets whose key ranges move (``match-drift``: the last stream's keys shift
by one domain).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.model import punctuation
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.manifest import load_manifest


def write_punctuations(workload_dir, columns: dict, *, keep_cycles: int = 1) -> dict:
    """``columns``: source -> key column. Returns source -> number of keys promised."""
    manifest = load_manifest(workload_dir)
    root = Path(manifest.root)
    out = {}
    for source, column in columns.items():
        if source not in manifest.sources:
            raise WorkloadError(f"no source {source!r} in {root} (sources: {', '.join(manifest.sources)})", "--source")
        last: dict = {}
        arrivals = manifest.arrivals(source)
        for a in arrivals:
            for f in sorted((root / "streams" / source / f"arrival={a}").glob("*.parquet")):
                t = pq.read_table(f, columns=[column])
                keys = pc.unique(t.column(column).drop_null()).to_numpy()
                for k in keys.tolist():
                    last[int(k)] = a
        if not arrivals:
            out[source] = 0
            continue
        cutoff = arrivals[-keep_cycles] if len(arrivals) >= keep_cycles and keep_cycles > 0 else arrivals[-1] + 1
        by_cycle: dict = {}
        for k, a in last.items():
            if a < cutoff:
                by_cycle.setdefault(a, []).append(k)
        for a, keys in by_cycle.items():
            path = root / "streams" / source / f"arrival={a}" / "punctuation-0.json"
            punctuation.write(str(path), column=column, keys=np.sort(np.asarray(keys, dtype=np.int64)))
        out[source] = sum(len(v) for v in by_cycle.values())
    return out
