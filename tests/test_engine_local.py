"""Small micro-batches on the driver (no Spark job) give exactly what the executors give: results, counts
per batch and stream, quarantined rows (reason, file, the row), watermarks and state."""
from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine_helpers import assert_same_results, no_leaked_queries, replay_tpcds, write_null_time_copy
from mjoin.runtime import fsutil
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_stream
from mjoin.engine.state import StateStore
from mjoin.lake.layout import Lake

pytestmark = pytest.mark.spark
_ = no_leaked_queries


def _quarantined_rows(lake: Lake, query: str) -> list:
    out = []
    for stream in ("cu", "sr", "wr", "cr"):
        base = fsutil.join(lake.quarantine(query, stream), "rows")
        for b in fsutil.listdir(base):
            for f in fsutil.listdir(fsutil.join(base, b)):
                for r in pq.read_table(fsutil.join(base, b, f)).to_pylist():
                    out.append((stream, b, r["reason"], os.path.basename(r["file"]),
                                json.dumps(json.loads(r["row"]), sort_keys=True)))
    return sorted(out)


def test_driver_batches_equal_executor_batches(spark, seed_query, tmp_path):
    a = Lake(str(tmp_path / "a"))
    info = replay_tpcds(a, 0.01, rate=10.0, arrival_cycle=20)
    arrivals = a.arrivals("customer")
    # a file of late rows (old event times, in the last arrival) and one with a few NULL event times
    t = pq.read_table(a.stream_file("customer", arrivals[2]))
    old = t.slice(0, 5)
    folder = a.arrival_dir("customer", arrivals[-1])
    pq.write_table(old.set_column(old.schema.get_field_index("c_customer_id"), "c_customer_id",
                                  pa.array([f"late{i}" for i in range(5)])), os.path.join(folder, "late.parquet"))
    write_null_time_copy(a, arrivals[3])
    b, c = Lake(str(tmp_path / "b")), Lake(str(tmp_path / "c"))
    for lake in (b, c):
        shutil.copytree(os.path.join(a.root, "streams"), os.path.join(lake.root, "streams"))
    q = seed_query.name
    sa = run_stream(spark, seed_query, a, config=EngineConfig(buckets=4, max_files_per_trigger=6, driver_rows=0))
    # on the driver, the buckets split over 3 threads (unevenly: 4 buckets) and on one
    sb = run_stream(spark, seed_query, b, config=EngineConfig(buckets=4, max_files_per_trigger=6, driver_threads=3))
    sc = run_stream(spark, seed_query, c, config=EngineConfig(buckets=4, max_files_per_trigger=6, driver_threads=1))
    ra, rb, rc = read_metrics(a, q), read_metrics(b, q), read_metrics(c, q)
    assert {r["execution"]["where"] for r in ra} == {"executors"} and {r["execution"]["where"] for r in rb} == {"driver"}
    assert {r["spark_plan"]["stage1"]["threads"] for r in rb} == {3} and {r["spark_plan"]["stage1"]["threads"] for r in rc} == {1}
    assert sa.batches == sb.batches == sc.batches
    assert_same_results(read_results(b, q), read_results(a, q), "driver (3 threads) vs executors")
    assert_same_results(read_results(c, q), read_results(a, q), "driver (1 thread) vs executors")
    assert [r["state_tuples"] for r in rc] == [r["state_tuples"] for r in rb]
    for x, y in zip(ra, rb):
        assert x["rows_in"] == y["rows_in"] and x["quarantined"] == y["quarantined"], x["batch_id"]
        assert x["watermarks"] == y["watermarks"] and x["state_tuples"] == y["state_tuples"]
        assert x["result_rows"] == y["result_rows"]
    assert sum(r["quarantined"]["cu"]["late"] for r in ra) == 5
    assert sum(r["quarantined"]["wr"]["bad_time"] for r in ra) == 2
    assert _quarantined_rows(a, q) == _quarantined_rows(b, q)
    ma, mb = StateStore(a.state(q)).latest(), StateStore(b.state(q)).latest()
    assert ma["tuples"] == mb["tuples"] and ma["event_time"] == mb["event_time"]
