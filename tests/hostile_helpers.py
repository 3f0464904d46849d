"""Helpers of the hostile-input tests: "the interval run over the accepted rows", built from what the streaming
job quarantined, and result comparison by count and fingerprint (mjoin.engine.results.result_fingerprint).

The accepted lake holds every landed file the streaming job did not quarantine whole, each without the rows it
quarantined one by one (matched by file and by the row as the quarantine keeps it: the declared columns as
JSON, :func:`mjoin.engine.normalize.raw_json`), in the same arrival folders. An interval run over it must give
exactly the streaming job's results: nothing accepted lost, nothing rejected joined.
"""
from __future__ import annotations

import glob
import json
import os
from collections import Counter
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from mjoin.engine.normalize import raw_json
from mjoin.engine.quarantine import rejected_rows
from mjoin.engine.results import result_fingerprint
from mjoin.lake.layout import Lake


def local_path(path_or_url: str) -> str:
    if path_or_url.startswith("file:"):
        return os.path.abspath(unquote(urlparse(path_or_url).path))
    return os.path.abspath(path_or_url)


def rejected_files(lake: Lake, query) -> dict:
    """Path -> (stream, reason) of every file the job quarantined whole (the latest record of each batch)."""
    out = {}
    for s in query.stream_names:
        for f in sorted(glob.glob(os.path.join(lake.quarantine(query.name, s), "files-batch=*.json"))):
            for r in json.load(open(f)):
                out[local_path(r["path"])] = (r["stream"], r["reason"])
    return out


def rejected_row_keys(lake: Lake, query) -> dict:
    """(stream, file path) -> Counter of the rows (as JSON) the job quarantined one by one, with their reasons:
    ``{(stream, path): Counter}``, ``{reason: rows}``."""
    rows, reasons = {}, Counter()
    for s in query.stream_names:
        t = rejected_rows(lake, query.name, s)
        for reason, file, row in zip(t.column("reason").to_pylist(), t.column("file").to_pylist(),
                                     t.column("row").to_pylist()):
            rows.setdefault((s, local_path(file)), Counter())[row] += 1
            reasons[reason] += 1
    return rows, reasons


def accepted_lake(lake: Lake, query, root) -> Lake:
    """The lake of the rows the streaming job accepted (see the module docstring), under ``root``."""
    out = Lake(str(root))
    whole = rejected_files(lake, query)
    rows, _ = rejected_row_keys(lake, query)
    by_source = {}
    for s in query.streams:
        by_source.setdefault(s.source, []).append(s)
    for source, streams in by_source.items():
        for arrival, path, kind in lake.landed(source):
            if kind != "data" or local_path(path) in whole:
                continue
            table = pq.read_table(path)
            keep = [True] * table.num_rows
            for s in streams:  # (the seed queries read each source by one stream)
                bad = rows.get((s.name, local_path(path)))
                if not bad:
                    continue
                bad = Counter(bad)
                for i, j in enumerate(raw_json(table.select(list(s.columns)))):
                    if bad.get(j):
                        bad[j] -= 1
                        keep[i] = False
                assert not +bad, f"{path}: quarantined rows not found in the file: {list((+bad).items())[:3]}"
            dst = os.path.join(out.arrival_dir(source, arrival), os.path.basename(path))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            pq.write_table(table.filter(pa.array(keep)), dst)
    return out


def same_results(streaming, interval, query, what: str) -> dict:
    """Assert equal result counts and fingerprints (streaming lake vs interval output folder); returns it."""
    a, b = result_fingerprint(streaming, query.name), result_fingerprint(interval, query.name)
    assert a == b, f"{what}: streaming {a} != interval over the accepted rows {b}"
    return a
