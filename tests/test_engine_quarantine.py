"""Bad input never crashes a job and never vanishes: each kind is quarantined with its reason and counted.
Plus the synthetic differential tests (skewed keys, NULL keys, out-of-order and late rows)."""
from __future__ import annotations

from itertools import permutations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine_helpers import WAVE, assert_same_results, make_synthetic, reference, synth_query, write_stream_file
from mjoin.runtime import fsutil
from mjoin.lake.contract import FILE_REASONS
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_stream
from mjoin.engine.compiled import EngineQuery
from mjoin.engine.interval import run_interval_plans
from mjoin.engine.normalize import inspect_files
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation



def test_file_checks_reject_what_spark_cannot_read(tmp_path):
    """Footer checks (pyarrow only): each rejected file is named with the problem."""
    q = synth_query()
    lake = Lake(str(tmp_path))
    ok = write_stream_file(lake, "sc", 0, pa.table({"e": pa.array([1], pa.int64()), "kc": pa.array([1], pa.int32()),
                                                    "idc": pa.array([1], pa.int32())}))
    wide = write_stream_file(lake, "sc", 3, pa.table({"e": pa.array([1], pa.int64()), "kc": pa.array([1], pa.uint64()),
                                                      "idc": pa.array([1], pa.int32())}))
    ns = write_stream_file(lake, "sb", 0, pa.table({"ts": pa.array([1], pa.timestamp("ns")), "kb": [1], "idb": [1],
                                                    "vb": [0.5]}))
    listed = write_stream_file(lake, "sc", 1, pa.table({"e": [1], "kc": pa.array([[1, 2]]), "idc": [1]}))
    boolean_key = write_stream_file(lake, "sc", 2, pa.table({"e": [1], "kc": [True], "idc": [1]}))
    missing = write_stream_file(lake, "sa", 0, pa.table({"t": ["x"], "ka": [1]}))
    garbage = lake.stream_file("sa", 1)
    fsutil.atomic_write_bytes(garbage, b"PAR1 but not really")
    got = inspect_files(q, EngineQuery.from_query(q), {"a": [missing, garbage], "b": [ns],
                                                       "c": [ok, listed, boolean_key, wide]})
    rejected = {r.path: r for r in got.rejects}
    assert set(rejected) == {listed, boolean_key, missing, garbage, wide}
    # the input gate's rules (mjoin.lake.contract), by name
    assert {p: (r.rule, r.reason) for p, r in rejected.items()} == {
        missing: ("input.schema_matches_spec", "schema_mismatch"), listed: ("input.schema_matches_spec", "schema_mismatch"),
        boolean_key: ("input.schema_matches_spec", "schema_mismatch"), wide: ("input.schema_matches_spec", "schema_mismatch"),
        garbage: ("input.files_readable", "unreadable")}
    assert "missing column ida" in rejected[missing].detail and rejected[missing].rows == 1
    assert "kc" in rejected[listed].detail and "kc" in rejected[boolean_key].detail
    assert "uint64" in rejected[wide].detail  # a 64-bit unsigned key does not fit a long
    assert "not a readable Parquet file" in rejected[garbage].detail and rejected[garbage].rows is None
    accepted = [p for _, (_, paths) in got.groups.items() for p in paths]
    assert sorted(accepted) == sorted([ok, ns])  # nanosecond timestamps and narrower integer keys are read


def odd_files(info) -> dict:
    """Stream -> the files of the synthetic lake that the contract rejects whole (the 4th file of each wave)."""
    out: dict = {}
    for w, (stream, _, _) in info["rejected_files"].items():
        out.setdefault(stream, []).append(info["files"][w][3])
    return out


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("synth") / "lake"))
    return lake, make_synthetic(lake)


@pytest.mark.spark
def test_stream_quarantines_every_kind_and_joins_the_rest(spark, synthetic):
    lake, info = synthetic
    q = synth_query()
    # one micro-batch per arrival wave (4 files each, oldest first)
    s = run_stream(spark, q, lake, config=EngineConfig(buckets=4, max_files_per_trigger=4))
    assert s.batches == [0, 1, 2, 3]
    records = read_metrics(lake, q.name)
    assert sum(info["late_ids"][x].__len__() for x in "abc") > 10, "the data must hold late rows"
    for w, rec in enumerate(records):
        for stream in "abc":
            got = rec["quarantined"][stream]
            planted = info["planted"][w][stream]
            for reason in ("null_key", "bad_type", "bad_time", "late"):
                assert got[reason] == planted.get(reason, 0), (w, stream, reason, got, planted)
            odd = info["rejected_files"].get(w)
            for reason in FILE_REASONS:
                expected = (odd[1] or 0) if odd and odd[0] == stream and odd[2] == reason else 0
                assert got[reason] == expected, (w, stream, reason, got)
            assert rec["rows_in"][stream] == info["rows"][w][stream], (w, stream)
        rejected = info["rejected_files"].get(w)
        assert [f["stream"] for f in rec["quarantined_files"]] == ([rejected[0]] if rejected else [])
    # the quarantined rows are kept with their reason, per stream and batch
    for stream in "abc":
        rows = pq.read_table(fsutil.join(lake.quarantine(q.name, stream), "rows")).to_pandas()
        for reason in ("null_key", "bad_time", "late"):
            expected = sum(info["planted"][w][stream].get(reason, 0) for w in info["planted"])
            assert (rows["reason"] == reason).sum() == expected, (stream, reason)
        assert rows["row"].str.startswith("{").all() and rows["file"].str.contains(f"/s{stream}/").all()
    assert fsutil.exists(fsutil.join(lake.quarantine(q.name, "a"), "files-batch=0.json"))
    # what was accepted joins exactly as the reference over the accepted rows
    rejected_files = odd_files(info)
    ref = reference(q, lake, exclude_files=rejected_files,
                    exclude_ids={"a": ("ida", info["late_ids"]["a"]), "b": ("idb", info["late_ids"]["b"]),
                                 "c": ("idc", info["late_ids"]["c"])})
    assert len(ref) > 50
    assert_same_results(read_results(lake, q.name), ref, "synthetic stream")


@pytest.mark.spark
def test_interval_all_orders_and_prefilter_on_skewed_synthetic_data(spark, synthetic, tmp_path):
    lake, info = synthetic
    q = synth_query()
    plans = {"".join(p): make_plan(q, orders_from_permutation(q, p), "fixedOrder") for p in permutations("abc")}
    plans["abc_prefilter"] = make_plan(q, orders_from_permutation(q, "abc"), "fixedOrder", options={"prefilter": True})
    start, end = info["start"] + 60, info["end"] + 60
    summaries = run_interval_plans(spark, q, plans, lake, start, end, WAVE, str(tmp_path),
                                   config=EngineConfig(buckets=3))
    ref = reference(q, lake, start * 1_000_000, end * 1_000_000, exclude_files=odd_files(info))
    assert len(ref) > 50
    for name, summary in summaries.items():
        assert_same_results(read_results(summary.results_path), ref, f"synthetic order {name}")
        assert summary.quarantined["a"]["schema_mismatch"] == 5
        assert summary.quarantined["c"]["schema_mismatch"] == 2 and summary.quarantined["b"]["schema_mismatch"] == 4
    pre = read_metrics(summaries["abc_prefilter"].metrics_path)
    assert sum(r["prefilter"]["dropped"] for r in pre) > 0
