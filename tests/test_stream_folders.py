"""A micro-batch never splits what the landing contract lands as one unit: an arrival folder of a source.

The reproduction: with lateness 0 and ``--max-files-per-trigger 4``, a catalog_returns folder of two part files
was split over two micro-batches; the first part advanced the stream's watermark and 940 rows of the second
were quarantined as ``late`` (209,763 results against the interval run's 223,428). The source now caps a batch
in whole folders (mjoin.engine.source.capped_end): every folder is read whole by one batch, with caps of 1, 2
and 3 files and 1 to 3 part files per folder (each part spanning its cycle), and the results are the interval
run's (count and fingerprint), without a late row.
"""
from __future__ import annotations

import os
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine_helpers import TPCDS_TABLES, no_leaked_queries, replay_tpcds
from hostile_helpers import same_results
from mjoin.engine import source
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.runs import run_interval, run_stream
from mjoin.lake.layout import Lake

_ = no_leaked_queries


def _land(lake: Lake, src: str, arrival: int, n: int) -> None:
    d = lake.arrival_dir(src, arrival)
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        open(os.path.join(d, f"part-{i:05d}.parquet"), "w").write("x")


def test_capped_end_takes_whole_folders(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    # the log: a@100 (3 files), b@100 (2), a@110 (1), b@110 (3): positions 0-2, 3-4, 5, 6-8
    for src, arrival, n in (("a", 100, 3), ("b", 100, 2), ("a", 110, 1), ("b", 110, 3)):
        _land(lake, src, arrival, n)
    flog = source.FileLog(source.file_log_dir(str(tmp_path / "ckpt")))
    source.discover(lake, ["a", "b"], flog, 600)
    assert [(e.source, e.arrival) for e in flog.between(0, 9)] == [("a", 100)] * 3 + [("b", 100)] * 2 + \
        [("a", 110)] + [("b", 110)] * 3

    def batches(cap: int) -> list:
        out, start = [], 0
        while start < flog.next_seq:
            end = source.capped_end(flog, start, flog.next_seq, cap)
            out.append((start, end))
            start = end
        return out

    assert batches(1) == [(0, 3), (3, 5), (5, 6), (6, 9)]  # a folder larger than the cap: alone, whole
    assert batches(2) == [(0, 3), (3, 5), (5, 6), (6, 9)]
    assert batches(3) == [(0, 3), (3, 6), (6, 9)]  # b@100 and a@110 together: 3 files
    assert batches(4) == [(0, 3), (3, 6), (6, 9)]
    assert batches(6) == [(0, 6), (6, 9)]
    assert batches(9) == [(0, 9)] and batches(0) == [(0, 9)]


def split_folders(lake: Lake, rng: random.Random, parts=(1, 2, 3)) -> dict:
    """Every folder's file rewritten as 1-3 part files, rows dealt round-robin (each part spans the cycle: the
    first part's latest event time is after the second's earliest). Returns (source, arrival) -> parts."""
    out = {}
    for t in TPCDS_TABLES:
        for a in lake.arrivals(t):
            path = lake.stream_file(t, a)
            table = pq.read_table(path)
            k = min(rng.choice(parts), max(1, table.num_rows))
            os.remove(path)
            idx = np.arange(table.num_rows)
            for i in range(k):
                pq.write_table(table.take(pa.array(idx[i::k])), lake.stream_file(t, a, i))
            out[(t, a)] = k
    return out


@pytest.fixture(scope="module")
def split_lake(spark, seed_query, tmp_path_factory):
    """TPC-DS sf=0.01 in 60-s arrival cycles, every folder as 1-3 part files, and the interval run over it."""
    lake = Lake(str(tmp_path_factory.mktemp("split") / "lake"))
    info = replay_tpcds(lake, 0.01, rate=10.0, arrival_cycle=60)
    parts = split_folders(lake, random.Random(35))
    assert sum(1 for k in parts.values() if k > 1) > len(parts) // 2
    out = str(tmp_path_factory.mktemp("interval"))
    start, end = info["start"] - 3600, info["end"] + 60
    run_interval(spark, seed_query, None, lake, start, end, end - start, out, config=EngineConfig(buckets=4))
    return lake, parts, out


def copy_streams(lake: Lake, root) -> Lake:
    import shutil

    shutil.copytree(lake.streams(), os.path.join(str(root), "streams"))
    return Lake(str(root))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("cap", [1, 2, 3])
def test_caps_of_1_2_3_files_read_whole_folders(spark, split_lake, seed_query, tmp_path, cap):
    base, parts, interval_out = split_lake
    lake = copy_streams(base, tmp_path / "lake")
    assert seed_query.lateness == 0
    s = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=cap))
    assert sum(v.get("late", 0) for v in s.quarantined.values()) == 0
    same_results(lake, interval_out, seed_query, f"several part files per folder, {cap} file(s) per trigger")
    # every batch holds whole folders: each (source, arrival) of a batch with all of its part files
    ckpt = lake.checkpoints(seed_query.name)
    flog = source.FileLog(source.file_log_dir(ckpt))
    seen = {}
    for r in read_metrics(lake, seed_query.name):
        start, end = source.batch_offsets(ckpt, r["batch_id"])
        folders = {}
        for e in flog.between(start, end):
            folders.setdefault((e.source, e.arrival), []).append(e.path)
        assert len(folders) == 1 or end - start <= cap, (r["batch_id"], folders)  # the cap, in whole folders
        for key, paths in folders.items():
            assert key not in seen, f"{key} split over batches {seen[key]} and {r['batch_id']}"
            assert len(paths) == parts[key], (key, paths)
            seen[key] = r["batch_id"]
    assert set(seen) == set(parts)
