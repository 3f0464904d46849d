"""The join job enforces the landing contract itself, with the input gate's rules (one rule for both: they can never disagree).

Into one arrival folder of store_returns land: a truncated Parquet file, a text file named .parquet,
new rows with ``sr_addr_sk`` written as a string, new rows without ``sr_addr_sk``, new rows whose
every ``ts`` is NULL, and a byte-identical copy of the cycle's file under another name. The gate
names each file's rule; the engine (interval and streaming) quarantines each file whole with the
same rule and returns exactly the results of the lake without them; a duplicate landed after a
restart is still recognised; a fixed file replayed from the quarantine adds exactly its results.
"""
from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from engine_helpers import TPCDS_TABLES, assert_same_results, no_leaked_queries, reference, replay_tpcds
from mjoin.engine import quarantine
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_interval, run_stream
from mjoin.lake.layout import Lake
from mjoin.model.query import parse_query

pytestmark = pytest.mark.spark
_ = no_leaked_queries

BAD = {  # file name -> (rule, quarantine reason)
    "truncated.parquet": ("input.files_readable", "unreadable"),
    "text.parquet": ("input.files_readable", "unreadable"),
    "string_key.parquet": ("input.schema_matches_spec", "schema_mismatch"),
    "no_key.parquet": ("input.key_columns_present", "missing_key"),
    "null_ts.parquet": ("input.event_time_parseable", "no_event_time"),
    "resent.parquet": ("input.no_duplicate_files", "duplicate_file"),
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    stage = Lake(str(tmp_path_factory.mktemp("clean") / "lake"))
    info = replay_tpcds(stage, 0.01, rate=10.0, arrival_cycle=20)
    return stage, info


def copy_lake(src: Lake, dst_root) -> Lake:
    shutil.copytree(os.path.join(src.root, "streams"), os.path.join(str(dst_root), "streams"))
    return Lake(str(dst_root))


def shifted(table: pa.Table) -> pa.Table:
    """New rows: the cycle's rows with other ticket numbers (they would join, and add results, if accepted)."""
    i = table.schema.get_field_index("sr_ticket_number")
    return table.set_column(i, "sr_ticket_number", pc.add(table.column(i), pa.scalar(10**9, table.schema.field(i).type)))


def plant(lake: Lake, arrival: int, *, skip=()) -> dict:
    """The six bad files in store_returns' arrival folder; returns name -> path."""
    folder = lake.arrival_dir("store_returns", arrival)
    good = os.path.join(folder, "part-00000.parquet")
    table = pq.read_table(good)
    raw = open(good, "rb").read()
    new = shifted(table)
    files = {
        "truncated.parquet": lambda p: open(p, "wb").write(raw[: len(raw) // 2]),
        "text.parquet": lambda p: open(p, "w").write("store_returns,not,parquet\n1,2,3\n"),
        "string_key.parquet": lambda p: pq.write_table(new.set_column(
            new.schema.get_field_index("sr_addr_sk"), "sr_addr_sk", pc.cast(new.column("sr_addr_sk"), pa.string())), p),
        "no_key.parquet": lambda p: pq.write_table(new.drop_columns(["sr_addr_sk"]), p),
        "null_ts.parquet": lambda p: pq.write_table(new.set_column(
            new.schema.get_field_index("ts"), "ts", pa.nulls(new.num_rows, new.schema.field("ts").type)), p),
        "resent.parquet": lambda p: shutil.copyfile(good, p),
    }
    out = {}
    for name, make in files.items():
        if name in skip:
            continue
        path = os.path.join(folder, name)
        make(path)
        out[name] = path
    return out


def _arrival(lake: Lake) -> int:
    arrivals = lake.arrivals("store_returns")
    return arrivals[len(arrivals) // 2]


def _span(info):
    return info["start"] - 3600, info["end"] + 60


@pytest.fixture(scope="module")
def expected(spark, clean, seed_query, tmp_path_factory):
    stage, info = clean
    start, end = _span(info)
    out = tmp_path_factory.mktemp("expected")
    run_interval(spark, seed_query, None, stage, start, end, end - start, str(out), config=EngineConfig(buckets=4))
    res = read_results(str(out), seed_query.name)
    assert_same_results(res, reference(seed_query, stage), "clean lake: interval vs DuckDB")
    assert len(res) > 500
    return res


def _rejected(records) -> dict:
    """file name -> (rule, reason) of every file the engine quarantined."""
    return {os.path.basename(f["path"]): (f["rule"], f["reason"]) for r in records for f in r["quarantined_files"]}


def test_gate_and_engine_reject_the_same_files_by_the_same_rules(spark, clean, expected, seed_query, tmp_path):
    from mjoin.gates.input import check_input

    stage, info = clean
    lake = copy_lake(stage, tmp_path / "lake")
    arrival = _arrival(lake)
    plant(lake, arrival)
    # the gate names every file by its rule
    res = check_input(seed_query, lake, arrival, arrival + 20, cycle=20)
    named = {}
    for f in res.failures:
        for v in f.values:
            named.setdefault(os.path.basename(v["where"]), set()).add(f.expectation)
    for name, (rule, _) in BAD.items():
        assert rule in named.get(name, set()), (name, rule, named)
    # the interval run quarantines each whole, with the same rule, and joins exactly the clean lake
    start, end = _span(info)
    s = run_interval(spark, seed_query, None, lake, start, end, 600, str(tmp_path / "out"),
                     config=EngineConfig(buckets=4))
    assert _rejected(read_metrics(s.metrics_path)) == BAD
    assert_same_results(read_results(s.results_path), expected, "interval run with the bad files")
    assert s.quarantined["sr"]["duplicate_file"] == pq.read_metadata(
        os.path.join(lake.arrival_dir("store_returns", arrival), "part-00000.parquet")).num_rows


def test_streaming_job_quarantines_them_and_a_duplicate_after_a_restart(spark, clean, expected, seed_query, tmp_path):
    stage, info = clean
    lake = copy_lake(stage, tmp_path / "lake")
    arrival = _arrival(lake)
    later = tmp_path / "later"  # the cycles after the planted one land after the first run
    for t in TPCDS_TABLES:
        for a in lake.arrivals(t):
            if a > arrival:
                shutil.move(lake.arrival_dir(t, a), later / t / f"arrival={a}")
    plant(lake, arrival, skip=("resent.parquet",))
    s1 = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=7))
    # after a restart, the copy lands (in an arrival folder of its own), then the remaining cycles
    original = os.path.join(lake.arrival_dir("store_returns", arrival), "part-00000.parquet")
    os.makedirs(lake.arrival_dir("store_returns", arrival + 7))
    shutil.copyfile(original, os.path.join(lake.arrival_dir("store_returns", arrival + 7), "resent.parquet"))
    for t in TPCDS_TABLES:
        for d in sorted((later / t).iterdir()) if (later / t).exists() else ():
            shutil.move(str(d), lake.arrival_dir(t, int(d.name.split("=")[1])))
    s2 = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=7))
    assert s2.batches[0] == s1.batches[-1] + 1
    records = read_metrics(lake, seed_query.name)
    assert _rejected(records) == BAD
    assert_same_results(read_results(lake, seed_query.name), expected, "streaming with the bad files")
    # the quarantine lists every file with its rule; the per-batch counts are in the metrics
    items = quarantine.entries(lake, seed_query)
    assert {os.path.basename(e.path): (e.rule, e.reason) for e in items if e.kind == "file"} == BAD
    assert sum(r["quarantined"]["sr"]["duplicate_file"] for r in records) == pq.read_metadata(original).num_rows
    # what the DAG's check_input reports in continuous mode, and the plugin page's table
    from mjoin.loop.ui import registry_page

    report = quarantine.job_report(lake, seed_query.name)
    assert {os.path.basename(f["path"]) for f in report["files"]} == set(BAD)
    assert report["by_stream"]["sr"]["schema_mismatch"] > 0 and report["last_batch"] == records[-1]["batch_id"]
    assert quarantine.job_report(lake, seed_query.name, report["last_batch"])["rows"] == 0  # nothing new since
    page = registry_page(lake)
    assert "quarantined by the join job" in page and "duplicate_file" in page
    # once the watermark has passed every row of the original, it is forgotten (bounded memory): a copy
    # landing now is quarantined row by row as late, so it still adds nothing
    assert records[-1]["files_remembered"] < sum(r["files"] for r in records)
    os.makedirs(lake.arrival_dir("store_returns", info["end"] + 100))
    shutil.copyfile(original, os.path.join(lake.arrival_dir("store_returns", info["end"] + 100), "again.parquet"))
    s3 = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4))
    n = pq.read_metadata(original).num_rows
    nulls = pc.sum(pc.is_null(pq.read_table(original).column("sr_addr_sk"))).as_py()
    assert s3.quarantined["sr"].get("late", 0) == n - nulls and s3.rows_in["sr"] == 0
    assert_same_results(read_results(lake, seed_query.name), expected, "after a late copy")


def test_replay_of_a_fixed_file_adds_exactly_its_results(spark, clean, seed_query, tmp_path):
    """The string-key file, fixed, replayed as a new arrival: an interval run and a streaming job whose
    lateness admits its rows add exactly the results of its rows; a second replay is refused."""
    from mjoin.cli import main

    import yaml

    from mjoin.model.query import resolve_query_path

    stage, info = clean
    doc = yaml.safe_load(resolve_query_path(seed_query.name).read_text())
    doc["lateness"] = "2h"  # the replay comes after the watermark passed its rows: admit them
    q = parse_query(doc, source="late-tolerant")
    lake = copy_lake(stage, tmp_path / "lake")
    arrival = _arrival(lake)
    bad = plant(lake, arrival, skip=("resent.parquet", "truncated.parquet", "text.parquet", "no_key.parquet",
                                     "null_ts.parquet"))["string_key.parquet"]
    s1 = run_stream(spark, q, lake, config=EngineConfig(buckets=4))
    (entry,) = [e for e in quarantine.entries(lake, q) if e.kind == "file"]
    assert entry.reason == "schema_mismatch" and entry.path == bad
    fixed = tmp_path / "fixed.parquet"
    t = pq.read_table(bad)
    pq.write_table(t.set_column(t.schema.get_field_index("sr_addr_sk"), "sr_addr_sk",
                                pc.cast(t.column("sr_addr_sk"), pa.int64())), fixed)
    spec_file = tmp_path / "q.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    assert main(["quarantine", "list", "--query", str(spec_file), "--lake", lake.root]) == 0
    assert main(["quarantine", "replay", entry.id, "--query", str(spec_file), "--lake", lake.root]) == 2  # needs --with
    assert main(["quarantine", "replay", entry.id, "--query", str(spec_file), "--lake", lake.root,
                 "--with", str(fixed)]) == 0
    assert main(["quarantine", "replay", entry.id, "--query", str(spec_file), "--lake", lake.root,
                 "--with", str(fixed)]) == 2  # exactly once
    record = quarantine.find(lake, q, entry.id).replayed
    assert record and record["rows"] == t.num_rows and os.path.exists(record["landed"])
    s2 = run_stream(spark, q, lake, config=EngineConfig(buckets=4))
    assert len(s2.batches) == 1 and sum(s2.rows_in.values()) == t.num_rows - pc.sum(
        pc.is_null(t.column("sr_addr_sk"))).as_py()
    streamed = read_results(lake, q.name)
    exclude = {"sr": [bad]}
    ref = reference(q, lake, exclude_files=exclude)  # the lake with the replayed file, without the bad one
    assert_same_results(streamed, ref, "streaming after the replay")
    start, end = _span(info)
    s = run_interval(spark, q, None, lake, start, end, 600, str(tmp_path / "out"), config=EngineConfig(buckets=4))
    assert_same_results(read_results(s.results_path), ref, "interval run after the replay")
    before = reference(q, lake, exclude_files={"sr": [bad, record["landed"]]})
    assert len(ref) > len(before)  # the replayed rows did add results
