"""Streaming mode: hot plan switches between batches, idempotent re-runs, a crash mid-batch."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine_helpers import (TPCDS_TABLES, assert_same_results, kill_tree, multiset, no_leaked_queries, reference,
                            replay_tpcds, start_job)
from mjoin.engine.config import EngineConfig
from mjoin.engine.results import committed_batches, read_results
from mjoin.engine.metrics import read_metrics
from mjoin.engine.runs import run_stream
from mjoin.engine.batch import BatchInput, BatchRunner
from mjoin.engine.sparkplan import apply_engine_conf, restore_conf
from mjoin.engine.control import JobControl
from mjoin.engine.inputs import compile_plan
from mjoin.engine.state import StateStore
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.lake.registry import PlanRegistry

pytestmark = pytest.mark.spark
PROJECT = Path(__file__).resolve().parent.parent
_ = no_leaked_queries  # autouse fixture: no streaming query outlives its test


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


@pytest.mark.parametrize("where", ["executors", "driver"])
def test_hot_plan_switches_at_batch_boundaries(spark, staged, seed_query, tmp_path, monkeypatch, where):
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
                   config=EngineConfig(buckets=4, max_files_per_trigger=-(-n_files // 4) // 4 * 4 + 4,
                                       driver_rows=0 if where == "executors" else 10**6))
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
    assert all(r["execution"]["where"] == where for r in records)
    if where == "executors":  # the new tuples, shuffled once per batch
        assert all(r["shuffle_bytes"]["written"] > 0 for r in records)
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
    from mjoin.engine.config import EngineError

    with pytest.raises(EngineError, match="ahead"):
        runner.store.commit(dict(m1, version=5, batch_id=5))
        runner.run(3, BatchInput(deltas=deltas), plan_a, purge_bound=None)


STREAM_ARGS = ["--stream", "--query", "tpcds_returns_by_address", "--buckets", "4", "--max-files-per-trigger", "8"]


def _start_job(lake: Lake, log: Path, *extra, spark_submit: bool = True) -> subprocess.Popen:
    return start_job(lake, log, *STREAM_ARGS, *extra, spark_submit=spark_submit)


def _wait_for_pause(control: JobControl, proc: subprocess.Popen, log: Path, batch: int, point: str) -> dict:
    """Wait until the job reports it is paused at ``point`` of ``batch`` (fault injection)."""
    deadline = time.monotonic() + 480
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the job ended ({proc.returncode}):\n{log.read_text()[-3000:]}"
        st = control.status()
        pause = st.get("fault_pause") or {}
        if st["running"] and (pause.get("batch_id"), pause.get("point")) == (batch, point):
            return st
        time.sleep(0.5)
    raise AssertionError(f"the job never paused {point} of batch {batch}:\n{log.read_text()[-3000:]}")


def _kill_9(proc: subprocess.Popen) -> None:
    kill_tree(proc)


def _state_files(lake: Lake, query: str, version: int) -> set:
    root = Path(lake.state(query))
    return {str(p.relative_to(root)) for p in (root / f"v{version:08d}").rglob("*") if p.is_file()}


def _referenced(lake: Lake, query: str) -> set:
    return StateStore(lake.state(query)).referenced()


@pytest.mark.slow
def test_killed_mid_batch_then_restarted_gives_the_same_result(spark, staged, seed_query, tmp_path):
    """The streaming job runs as its own OS process and is killed with SIGKILL (whole process tree)
    twice: in batch 2 after its tasks wrote state and result files but before the commit, then
    (restarted through `python -m mjoin run`, with another plan) after batch 3's commit but before
    Spark recorded it. Each restart starts at once; the last (in-process) finishes the data. The
    result equals DuckDB's as a multiset, no duplicates, no gaps, and the killed batches' files
    never reach results or state."""
    stage, info, arrivals = staged
    q = seed_query.name
    lake = Lake(str(tmp_path / "lake"))
    land(stage, lake, arrivals[:12])  # 48 files, 8 per batch: batches 0..5
    control = JobControl(lake, q)
    ckpt = Path(lake.checkpoints(q))

    # 1. killed inside batch 2: its files are written, its commit is not
    log1 = tmp_path / "job1.log"
    job = _start_job(lake, log1, "--inject-fault", "pause_before_commit:2:600")
    try:
        st = _wait_for_pause(control, job, log1, 2, "before_commit")
        assert st["batch_in_progress"] == 2 and st["last_batch_id"] == 1
        _kill_9(job)
    finally:
        if job.poll() is None:
            job.kill()
    batch2 = Path(lake.results(q)) / "batch=2"
    assert any(batch2.glob("*.parquet")) and not (batch2 / "_SUCCESS").exists()
    assert committed_batches(lake, q) == [0, 1] and StateStore(lake.state(q)).versions() == [0, 1]
    orphans = _state_files(lake, q, 2)
    assert orphans, "the killed batch wrote state files"
    st = control.status()
    assert (st["state"], st["running"]) == ("dead", False) and "in batch 2" in st["note"]

    # 2. restarted at once (python -m mjoin run, another plan); killed after batch 3's commit
    plan = tmp_path / "other.json"
    _plan(seed_query, ["cr", "wr", "sr", "cu"]).save(plan)
    log2 = tmp_path / "job2.log"
    job = _start_job(lake, log2, "--plan", str(plan), "--inject-fault", "pause_after_commit:3:600", spark_submit=False)
    try:
        _wait_for_pause(control, job, log2, 3, "after_commit")
        _kill_9(job)
    finally:
        if job.poll() is None:
            job.kill()
    assert "already running" not in log2.read_text()
    assert committed_batches(lake, q) == [0, 1, 2, 3]
    assert (ckpt / "offsets" / "3").exists() and not (ckpt / "commits" / "3").exists()  # Spark re-runs 3
    first_run_of_3 = _state_files(lake, q, 3)
    assert orphans.isdisjoint(_referenced(lake, q))

    # 3. restarted in-process: batch 3 again (replaced), then the rest
    s = run_stream(spark, seed_query, lake, plan=str(plan), config=EngineConfig(buckets=4, max_files_per_trigger=8))
    assert s.batches == [3, 4, 5]
    assert control.status()["state"] == "stopped"
    assert committed_batches(lake, q) == [0, 1, 2, 3, 4, 5]
    res = read_results(lake, q)
    ref = reference(seed_query, lake)
    assert len(ref) > 200
    assert_same_results(res, ref, "after two kills and restarts")
    assert max(multiset(res).values()) == 1
    records = read_metrics(lake, q)
    assert [r["batch_id"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert sum(r["result_rows"] for r in records) == len(ref)
    assert [r["plan_source"] for r in records] == ["default"] * 2 + ["cli"] * 4
    assert [bool(r["plan_switch"]) for r in records] == [False, False, True, False, False, False]
    landed = sum(pq.read_metadata(f).num_rows for f in lake.stream_files("store_returns"))
    null_keys = sum(r["quarantined"]["sr"]["null_key"] for r in records)
    assert sum(r["rows_in"]["sr"] for r in records) + null_keys == landed
    quarantined = Path(lake.quarantine(q, "sr")) / "rows"
    assert sum(pq.read_metadata(f).num_rows for f in quarantined.rglob("*.parquet")) == null_keys
    # the killed runs' state files are in no manifest; those of batch 2 (older than every kept
    # version) are deleted, those of the first batch 3 wait for their version to age out
    referenced = _referenced(lake, q)
    assert orphans.isdisjoint(referenced) and first_run_of_3.isdisjoint(referenced)
    assert not any((Path(lake.state(q)) / f).exists() for f in orphans)
    assert all((Path(lake.state(q)) / f).exists() for f in referenced)
    assert not list((Path(lake.state(q)) / "tmp").rglob("*.parquet"))
