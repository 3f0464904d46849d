"""Streaming mode: hot plan switches between batches, idempotent re-runs, a crash mid-batch."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine_helpers import TPCDS_TABLES, assert_same_results, multiset, reference, replay_tpcds
from mjoin import fsutil
from mjoin.engine import EngineConfig, committed_batches, read_metrics, read_results, run_stream
from mjoin.engine.batch import BatchInput, BatchRunner, apply_engine_conf, restore_conf
from mjoin.engine.inputs import compile_plan
from mjoin.lake import Lake
from mjoin.plan import make_plan, orders_from_permutation
from mjoin.registry import PlanRegistry

pytestmark = pytest.mark.spark
PROJECT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """TPC-DS sf=0.01 replayed into a staging lake; tests copy arrival cycles into their own lake."""
    stage = Lake(str(tmp_path_factory.mktemp("staging") / "lake"))
    info = replay_tpcds(stage, 0.01)
    arrivals = sorted({a for t in TPCDS_TABLES for a in stage.arrivals(t)})
    return stage, info, arrivals


def land(stage: Lake, lake: Lake, arrivals) -> int:
    n = 0
    for t in TPCDS_TABLES:
        for a in arrivals:
            for f in stage.stream_files(t, a, a + 1):
                dst = lake.stream_file(t, a)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(f, dst)  # keeps the modification time: arrival order
                n += 1
    return n


def _plan(query, perm):
    return make_plan(query, orders_from_permutation(query, perm), "fixedOrder")


def test_hot_plan_switches_at_batch_boundaries(spark, staged, seed_query, tmp_path, monkeypatch):
    """One running query, four micro-batches; after each batch the registry's active plan changes
    (publish v1, publish v2, roll back to v1): the job picks each change up at the next boundary."""
    from mjoin.engine import stream

    stage, info, arrivals = staged
    lake = Lake(str(tmp_path / "lake"))
    reg = PlanRegistry(lake, seed_query.name)
    cli_plan = tmp_path / "cli_plan.json"
    _plan(seed_query, ["wr", "cr", "cu", "sr"]).save(cli_plan)
    land(stage, lake, arrivals)
    orders = [["wr", "cr", "cu", "sr"], ["cr", "wr", "sr", "cu"], ["sr", "cu", "cr", "wr"], ["cr", "wr", "sr", "cu"]]
    changes = [lambda: reg.activate(reg.publish(_plan(seed_query, orders[1])), by="test"),
               lambda: reg.activate(reg.publish(_plan(seed_query, orders[2])), by="test"),
               lambda: reg.rollback(by="test"), lambda: None]
    process = stream.StreamJob.process

    def process_then_change_plan(self, df, batch_id):  # what a DAG run does between two batches
        process(self, df, batch_id)
        changes[batch_id]()

    monkeypatch.setattr(stream.StreamJob, "process", process_then_change_plan)
    n_files = 4 * len(arrivals)
    s = run_stream(spark, seed_query, lake, plan=str(cli_plan),
                   config=EngineConfig(buckets=4, max_files_per_trigger=-(-n_files // 4) // 4 * 4 + 4))
    assert s.batches == [0, 1, 2, 3]
    records = read_metrics(lake, seed_query.name)
    assert [(r["plan_version"], r["plan_source"]) for r in records] == [(None, "cli"), (1, "registry"),
                                                                         (2, "registry"), (1, "registry")]
    assert records[0]["plan_switch"] is None
    assert [(r["plan_switch"]["from"], r["plan_switch"]["to"]) for r in records[1:]] == [(None, 1), (1, 2), (2, 1)]
    assert [(w["from"], w["to"]) for w in s.plan_switches] == [(None, 1), (1, 2), (2, 1)]
    for r, perm in zip(records, orders):  # each batch ran the order of its plan
        for c in r["chains"]:
            assert [st["right"] for st in c["steps"]] == [x for x in perm if x != c["stream"]]
    res = read_results(lake, seed_query.name)
    ref = reference(seed_query, lake)
    assert len(ref) > 200
    assert_same_results(res, ref, "union of batches under four plans")
    assert max(multiset(res).values()) == 1  # no duplicates: TPC-DS keys make every result row unique
    assert sum(r["result_rows"] for r in records) == len(ref)
    assert all(r["shuffle_bytes"]["written"] > 0 for r in records)  # the new tuples, shuffled once per batch
    # every landed row is either joined or quarantined (TPC-DS returns have NULL address keys)
    landed = sum(pq.read_metadata(f).num_rows for f in lake.stream_files("store_returns"))
    assert sum(r["quarantined"]["sr"]["null_key"] for r in records) > 0
    assert sum(r["rows_in"]["sr"] + r["quarantined"]["sr"]["null_key"] for r in records) == landed


def test_rerun_of_a_batch_replaces_its_output(spark, staged, seed_query, tmp_path):
    """Spark re-runs a batch whose commit it did not record: the outputs are replaced, not added to."""
    stage, info, arrivals = staged
    lake = Lake(str(tmp_path / "lake"))
    land(stage, lake, arrivals[:6])
    cfg = EngineConfig(buckets=4)
    before = apply_engine_conf(spark)
    try:
        from mjoin.engine.compiled import EngineQuery
        from mjoin.engine.normalize import inspect_files, normalize_streams

        runner = BatchRunner(spark, seed_query, lake, cfg, mode="stream")
        eq = EngineQuery.from_query(seed_query)
        files = {s.name: lake.stream_files(s.source) for s in seed_query.streams}
        frame = normalize_streams(spark, seed_query, eq, inspect_files(seed_query, eq, files))
        deltas = frame.where("_reason IS NULL").drop("_reason", "_file", "_raw")
        plan_a = compile_plan(seed_query, _plan(seed_query, ["cu", "sr", "wr", "cr"]), cfg)
        plan_b = compile_plan(seed_query, _plan(seed_query, ["cr", "sr", "cu", "wr"]), cfg)
        first = runner.run(0, BatchInput(deltas=deltas), plan_a, purge_bound=None)
        m0 = runner.store.manifest(0)
        # the re-run (after a crash, with another plan meanwhile active) replaces batch 0
        second = runner.run(0, BatchInput(deltas=deltas), plan_b, purge_bound=None)
        m1 = runner.store.manifest(0)
    finally:
        restore_conf(spark, before)
    assert first["result_rows"] == second["result_rows"] > 0
    assert committed_batches(lake, seed_query.name) == [0]
    res = read_results(lake, seed_query.name)
    assert len(res) == first["result_rows"]
    assert max(multiset(res).values()) == 1
    assert m0["tuples"] == m1["tuples"] and m0["keys"] == m1["keys"]
    assert [r["batch_id"] for r in read_metrics(lake, seed_query.name)] == [0]
    # a checkpoint that is behind the state is refused, not silently mixed
    from mjoin.engine import EngineError

    with pytest.raises(EngineError, match="ahead"):
        runner.store.commit(dict(m1, version=5, batch_id=5))
        runner.run(3, BatchInput(deltas=deltas), plan_a, purge_bound=None)


def _submit(lake: Lake, *extra, env=None):
    cmd = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[2]",
           "--conf", "spark.ui.enabled=false", "--driver-memory", "1g",
           str(PROJECT / "jobs" / "join.py"), "--stream", "--query", "tpcds_returns_by_address",
           "--lake", lake.root, "--buckets", "4", "--max-files-per-trigger", "24", "--json", *extra]
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PROJECT / "include")] + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p]), MJOIN_SHUFFLE_PARTITIONS="2", **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=600)


@pytest.mark.slow
def test_crash_mid_batch_then_restart_gives_the_same_result(spark, staged, seed_query, tmp_path):
    """spark-submit the streaming job; it dies (os._exit) in batch 1 after writing that batch's state
    and result files, before the commit. The restart (another plan) re-runs batch 1 only."""
    stage, info, arrivals = staged
    lake = Lake(str(tmp_path / "lake"))
    land(stage, lake, arrivals[:12])  # 48 files: batches of 24 files = 6 whole arrival cycles
    crashed = _submit(lake, "--inject-fault", "crash_before_commit:1")
    assert crashed.returncode == 17, crashed.stderr[-3000:]
    # batch 1 wrote its state and result files, but is not committed
    results = lake.results(seed_query.name)
    assert any(n.endswith(".parquet") for n in fsutil.listdir(fsutil.join(results, "batch=1")))
    assert committed_batches(lake, seed_query.name) == [0]
    state_versions = sorted(n for n in os.listdir(lake.state(seed_query.name)) if n.startswith("v"))
    assert "v00000001" in state_versions
    assert not os.path.exists(os.path.join(lake.state(seed_query.name), "manifests", "v00000001.json"))

    plan = tmp_path / "other.json"
    _plan(seed_query, ["cr", "wr", "sr", "cu"]).save(plan)
    s = run_stream(spark, seed_query, lake, plan=str(plan), config=EngineConfig(buckets=4, max_files_per_trigger=24))
    assert s.batches == [1], "the restart re-runs the interrupted batch and only it"
    assert [(w["from_source"], w["to_source"]) for w in s.plan_switches] == [("default", "cli")]
    assert committed_batches(lake, seed_query.name) == [0, 1]
    res = read_results(lake, seed_query.name)
    ref = reference(seed_query, lake)
    assert_same_results(res, ref, "after crash and restart")
    assert max(multiset(res).values()) == 1
    records = read_metrics(lake, seed_query.name)
    assert [r["batch_id"] for r in records] == [0, 1]
    assert sum(r["result_rows"] for r in records) == len(ref)
