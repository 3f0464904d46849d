"""A streaming job meets a file whose footer passes the contract but whose data does not read: the file is
quarantined whole as ``unreadable`` (its rows counted), the job goes on, and the file is not remembered as
seen, so a repaired copy landing later is read and joined (not rejected as a duplicate of rows that were never
joined). Results equal the reference over every readable file."""
from __future__ import annotations

import os
import shutil

import pyarrow.parquet as pq
import pytest

from engine_helpers import assert_same_results, no_leaked_queries, reference, replay_tpcds
from mjoin.lake import contract
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_stream
from mjoin.engine.state import StateStore
from mjoin.lake.layout import Lake

pytestmark = pytest.mark.spark
_ = no_leaked_queries

SOURCES = {"cu": "customer", "sr": "store_returns", "wr": "web_returns", "cr": "catalog_returns"}


def _land(stage: Lake, lake: Lake, arrivals) -> None:
    for source in SOURCES.values():
        for a in arrivals:
            for f in stage.stream_files(source, a, a + 1):
                dst = lake.stream_file(source, a)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(f, dst)


def _sum(records, stream: str, reason: str) -> int:
    return sum(r["quarantined"].get(stream, {}).get(reason, 0) for r in records)


def test_a_repaired_copy_of_an_unreadable_file_is_read(spark, seed_query, tmp_path):
    """On the driver path (small micro-batches; the Spark path: tests/test_input_spark_scan.py)."""
    stage, lake = Lake(str(tmp_path / "stage")), Lake(str(tmp_path / "lake"))
    replay_tpcds(stage, 0.01, rate=10.0, arrival_cycle=20)
    arrivals = sorted({a for s in SOURCES.values() for a in stage.arrivals(s)})
    _land(stage, lake, arrivals[:4])
    bad = lake.stream_file("customer", arrivals[3])
    with open(bad, "rb") as fh:
        original = fh.read()
    st = os.stat(bad)
    with open(bad, "r+b") as fh:  # the first page garbled; the footer still reads and passes the contract
        fh.seek(4)
        fh.write(b"\xff" * 24)
    os.utime(bad, ns=(st.st_atime_ns, st.st_mtime_ns))
    bad_rows = pq.ParquetFile(bad).metadata.num_rows
    contract.FOOTERS.clear()
    q = seed_query.name
    config = EngineConfig(buckets=2, max_files_per_trigger=8)
    run_stream(spark, seed_query, lake, config=config)
    first = read_metrics(lake, q)
    assert {r["execution"]["where"] for r in first} == {"driver"}
    assert _sum(first, "cu", "unreadable") == bad_rows > 0
    seen = StateStore(lake.state(q)).latest()["seen_files"]
    assert bad not in {f["path"] for f in seen} and len(seen) > 0

    # the repaired file lands again (same rows, so the same footer fingerprint), with the next arrivals
    repaired = os.path.join(lake.arrival_dir("customer", arrivals[3]), "repaired.parquet")
    with open(repaired, "wb") as fh:
        fh.write(original)
    _land(stage, lake, arrivals[4:6])
    run_stream(spark, seed_query, lake, config=config)
    records = read_metrics(lake, q)
    assert _sum(records, "cu", "duplicate_file") == 0
    assert _sum(records, "cu", "unreadable") == bad_rows
    assert sum(r["rows_in"].get("cu", 0) for r in records[len(first):]) >= bad_rows
    assert_same_results(read_results(lake, q), reference(seed_query, lake, exclude_files={"cu": [bad]}),
                        "unreadable file, then its repaired copy")
