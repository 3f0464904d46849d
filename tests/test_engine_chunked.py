"""An interval on the driver read in chunks of batches while the operator runs (:mod:`mjoin.engine.chunked`) gives
exactly what reading it whole first gives (``interval_chunks=0``): results (count + fingerprint), per-batch rows
in, results, quarantine counts and files, state and probe work, the quarantined rows; on the seed query over a
lake with bad rows and files, a file with NULL event times (its footer bounds nothing: read with the first
chunk), a file landed late with early event times, and a file whose data does not read (found by the reading
thread mid-run: counted in batch 1 all the same). Both equal DuckDB's reference."""
from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine_helpers import assert_same_results, no_leaked_queries, reference, replay_tpcds, write_null_time_copy
from mjoin import fsutil, quarantine
from mjoin.engine import EngineConfig, read_metrics, read_results, result_fingerprint, run_interval
from mjoin.engine.chunked import chunk_edges
from mjoin.lake import Lake

pytestmark = pytest.mark.spark
_ = no_leaked_queries


def test_chunk_edges_cover_every_batch_once_in_order():
    for n in (0, 1, 5, 7, 60, 61):
        for k in (1, 2, 3, 8, 100):
            edges = chunk_edges(n, k)
            assert edges[0][0] == 0 and edges[-1][1] == n + 1 and len(edges) <= k
            assert all(a[1] == b[0] for a, b in zip(edges, edges[1:])) and all(lo < hi for lo, hi in edges)


def _quarantine(out: str, query) -> tuple[list, dict]:
    lake = Lake(out)
    rows, files = [], {}
    for s in query.stream_names:
        base = lake.quarantine(query.name, s)
        for r in quarantine.rejected_rows(lake, query.name, s).to_pylist():
            rows.append((s, r["batch"], r["reason"], os.path.basename(r["file"]), r["row"]))
        for name in fsutil.listdir(base):
            if name.startswith("files-"):
                files[(s, name)] = sorted(json.loads(fsutil.read_bytes(fsutil.join(base, name))), key=lambda d: d["path"])
    return sorted(rows), files


def _both(spark, query, lake, start, end, cycle, out) -> dict:
    runs = {name: run_interval(spark, query, None, lake, start, end, cycle, str(out / name),
                               config=EngineConfig(buckets=4, interval_chunks=chunks))
            for name, chunks in (("chunked", 8), ("whole", 0))}
    c, w = runs["chunked"], runs["whole"]
    assert c.extra["execution"] == w.extra["execution"] == "fused-driver"
    assert c.extra["phases"]["input_chunks"] >= 2 and "input_chunks" not in w.extra["phases"]
    assert c.extra["phases"]["input_driver_work"] > 0
    assert c.result_rows == w.result_rows
    assert result_fingerprint(c.results_path) == result_fingerprint(w.results_path)
    assert c.rows_in == w.rows_in and c.quarantined == w.quarantined and c.batches == w.batches
    assert c.extra["warmup_state_tuples"] == w.extra["warmup_state_tuples"]
    for a, b in zip(read_metrics(c.metrics_path), read_metrics(w.metrics_path), strict=True):
        for k in ("batch_id", "rows_in", "result_rows", "quarantined", "state_tuples", "state_keys", "punctuation"):
            assert a[k] == b[k], (k, a["batch_id"], a[k], b[k])
        assert sorted(json.dumps(f, sort_keys=True) for f in a["quarantined_files"]) == \
            sorted(json.dumps(f, sort_keys=True) for f in b["quarantined_files"])
        assert [[(st["lookups"], st["matches"]) for st in ch["steps"]] for ch in a["chains"]] == \
            [[(st["lookups"], st["matches"]) for st in ch["steps"]] for ch in b["chains"]]
    assert _quarantine(str(out / "chunked"), query) == _quarantine(str(out / "whole"), query)
    return runs


def test_seed_query_in_chunks_equals_the_whole_read(spark, seed_query, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    info = replay_tpcds(lake, 0.01, rate=10.0, arrival_cycle=20)
    arrivals = lake.arrivals("web_returns")
    write_null_time_copy(lake, arrivals[4])  # two NULL event times: batch 1's bad_time
    junk = os.path.join(lake.arrival_dir("store_returns", lake.arrivals("store_returns")[6]), "junk.parquet")
    with open(junk, "wb") as fh:
        fh.write(b"this is not parquet")  # rejected by the contract
    src = lake.stream_file("catalog_returns", lake.arrivals("catalog_returns")[7])
    copy = os.path.join(os.path.dirname(src), "copy.parquet")
    shutil.copy(src, copy)  # a duplicate
    # landed late: early store returns in the last arrival folder (its footer's earliest time is early)
    early = pq.read_table(lake.stream_file("store_returns", lake.arrivals("store_returns")[8]))
    late_dir = lake.arrival_dir("store_returns", lake.arrivals("store_returns")[-1])
    pq.write_table(early.set_column(early.schema.get_field_index("sr_ticket_number"), "sr_ticket_number",
                                    pa.array(range(10**9, 10**9 + early.num_rows), pa.int64())),
                   os.path.join(late_dir, "late.parquet"))
    # a file whose footer passes the contract but whose data does not read, in a late range: the reading thread
    # finds it mid-run
    broken = lake.stream_file("customer", lake.arrivals("customer")[-3])
    with open(broken, "r+b") as fh:
        fh.seek(4)
        fh.write(b"\xff" * 24)
    start, end = info["start"] + 120, info["end"] + 1
    runs = _both(spark, seed_query, lake, start, end, 20, tmp_path)
    c = runs["chunked"]
    assert c.batches >= 16 and c.result_rows > 200
    assert c.quarantined["wr"]["bad_time"] == 2 and c.quarantined["cu"]["unreadable"] > 0
    assert c.quarantined["cr"]["duplicate_file"] > 0
    rec1 = read_metrics(c.metrics_path)[0]
    files = {(os.path.basename(f["path"]), f["reason"]) for f in rec1["quarantined_files"]}
    assert {("junk.parquet", "unreadable"), (os.path.basename(broken), "unreadable")} <= files
    # the reference leaves out the files the engine quarantines whole
    exclude = {"cu": [broken], "sr": [junk], "cr": [copy]}
    assert_same_results(read_results(c.results_path), reference(seed_query, lake, start * 10**6, end * 10**6,
                                                                exclude_files=exclude), "chunked, bad lake")

