"""A pipelined interval runs all of a task's buckets of a class in one operator call (``merged`` in
:func:`mjoin.engine.pipelined.pipelined_task`). It may not change a result: the merged runs (on the driver's
threads and in Spark tasks) give the per-batch run's results, per-batch counts, probe work and the same
committed state per (class, stream, bucket), row for row. And :class:`mjoin.engine.operator.KeyedRows` keeps
its rows sorted by key, old rows first within a key, through concat, purge and subset, with the key columns
it carries along."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine_helpers import no_leaked_queries, replay_tpcds
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import result_fingerprint
from mjoin.engine.runs import run_interval
from mjoin.engine import pipelined
from mjoin.engine.compiled import key_name
from mjoin.engine.operator import KeyedRows
from mjoin.engine.routing import task_groups
from mjoin.engine.state import StateStore, clear_cache, load_state
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation

_ = no_leaked_queries


def _rows(n: int, seed: int, t0: int = 0) -> KeyedRows:
    rng = np.random.default_rng(seed)
    return KeyedRows(pa.table({"_ts": pa.array(t0 + np.arange(n, dtype=np.int64)),
                               "_k": pa.array(rng.integers(0, 7, n)),
                               "_k2": pa.array(rng.integers(0, 3, n)),
                               "v": pa.array([f"s{seed}-{i}" for i in range(n)])}), "_k")


def _check(r: KeyedRows) -> None:
    """The permuted rows, their key/time arrays, CSR index and gathers agree with the materialised table."""
    t = r.table
    assert t.column("_k").to_pylist() == r.key.tolist() and t.column("_ts").to_pylist() == r.ts.tolist()
    assert r.keys_of("_k2").tolist() == t.column("_k2").to_pylist()
    idx = np.arange(len(r))[::3]
    assert r.gather("v", idx).to_pylist() == t.column("v").take(pa.array(idx)).to_pylist()
    assert r.take_rows(idx).to_pylist() == t.take(pa.array(idx)).to_pylist()
    assert r.ukeys.tolist() == sorted(set(r.key.tolist()))


def test_keyed_rows_concat_purge_subset_keep_the_sorted_stable_order():
    state, reference = _rows(0, 0), []
    for b in range(1, 120):
        add = _rows(5, b, t0=10 * b)
        state = state.concat(add).purge(10 * b - 150)
        reference = sorted([r for r in reference if r["_ts"] > 10 * b - 150] + add.table.to_pylist(),
                           key=lambda r: r["_k"])  # Python's sort is stable: old rows first within a key
        if b % 10 == 0:
            state.keys_of("_k2")
        assert state.table.to_pylist() == reference
        _check(state)
    sub = state.subset(np.flatnonzero(state.key % 2 == 0))
    assert sub.table.to_pylist() == [r for r in reference if r["_k"] % 2 == 0]
    _check(sub)


def test_task_groups_merge_only_the_merged_classes():
    t = pa.table({"_c": pa.array([0, 0, 0, 1, 1, 1], pa.int32()), "_b": pa.array([0, 1, 1, 0, 2, 2], pa.int32()),
                  "x": pa.array(range(6))})
    got = [(ci, bks, rows.column("x").to_pylist()) for ci, bks, rows in task_groups(t, frozenset({0}))]
    assert got == [(0, (0, 1), [0, 1, 2]), (1, (0,), [3]), (1, (2,), [4, 5])]


def _state(out: str, query) -> dict:
    """file key -> the committed rows of the latest state version, as a sorted list (the order of the rows
    within a key follows how the state was stored, in pieces or compacted: it is not part of its meaning)."""
    root = Lake(out).state(query.name)
    clear_cache()
    rows = {}
    for k, entry in StateStore(root).latest()["files"].items():
        got, _ = load_state(root, entry, key_name(k.split("/")[0]), 1 << 30)
        rows[k] = sorted(tuple(sorted(r.items())) for r in got.table.to_pylist()) if got is not None else []
    return {k: v for k, v in rows.items() if v}


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("merged") / "lake"))
    return lake, replay_tpcds(lake, 0.01, rate=10.0, arrival_cycle=20)


@pytest.mark.spark
def test_merged_buckets_equal_the_per_batch_run(spark, lake, seed_query, tmp_path, monkeypatch):
    _merged_equal_per_batch(spark, lake, seed_query, False, tmp_path, monkeypatch)


@pytest.mark.spark
def test_merged_buckets_of_a_two_class_plan_equal_the_per_batch_run(spark, lake, two_class_query, tmp_path, monkeypatch):
    _merged_equal_per_batch(spark, lake, two_class_query, True, tmp_path, monkeypatch)


def _merged_equal_per_batch(spark, lake, q, two_class: bool, tmp_path, monkeypatch):
    lake, info = lake
    plan = make_plan(q, orders_from_permutation(q, ["wr", "cu", "sr", "cr"]), "fixedOrder") if two_class else None
    calls = []
    real = pipelined.process_bucket

    def counting(ctx, cls, bucket, rows, load):
        calls.append(bucket)
        return real(ctx, cls, bucket, rows, load)

    monkeypatch.setattr(pipelined, "process_bucket", counting)
    start, end = info["start"] + 120, info["end"] + 1
    runs = {"per-batch": run_interval(spark, q, plan, lake, start, end, 60, str(tmp_path / "per-batch"),
                                      config=EngineConfig(buckets=4), pipelined=False)}
    calls.clear()
    runs["driver"] = run_interval(spark, q, plan, lake, start, end, 60, str(tmp_path / "driver"),
                                  config=EngineConfig(buckets=4, driver_threads=2))
    assert runs["driver"].extra["execution"] == "fused-driver"
    # each of the 2 threads ran its 2 buckets of a class in one call: bucket -1 = merged
    assert calls and set(calls) == {-1}
    if not two_class:
        runs["spark"] = run_interval(spark, q, plan, lake, start, end, 60, str(tmp_path / "spark"),
                                     config=EngineConfig(buckets=4, driver_rows=0))
        assert runs["spark"].extra["execution"] == "fused"
    ref = runs["per-batch"]
    assert ref.result_rows > 50
    ref_recs = read_metrics(ref.metrics_path)
    for name, run in runs.items():
        assert run.result_rows == ref.result_rows, name
        assert result_fingerprint(run.results_path) == result_fingerprint(ref.results_path), name
        assert run.quarantined == ref.quarantined and run.rows_in == ref.rows_in, name
        recs = read_metrics(run.metrics_path)
        assert len(recs) == len(ref_recs)
        for a, b in zip(recs, ref_recs):
            for k in ("rows_in", "result_rows", "quarantined", "state_tuples", "state_keys"):
                assert a[k] == b[k], (name, k, a["batch_id"])
            work = [sum(st["lookups"] + st["matches"] for c in r["chains"] for st in c["steps"]) for r in (a, b)]
            assert work[0] == work[1], (name, a["batch_id"])
        assert _state(str(tmp_path / name), q) == _state(str(tmp_path / "per-batch"), q), name
