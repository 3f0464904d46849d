"""Interval evaluation against an independent DuckDB reference (TPC-DS seed query and a synthetic
seed-shaped query), the physical plan of a batch, and the engine's Spark settings during a batch."""
from __future__ import annotations

from itertools import permutations

import pyarrow.parquet as pq
import pytest

from engine_helpers import T0, TPCDS_TABLES, assert_same_results, reference, replay_tpcds, synthetic_with_reference
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_interval
from mjoin.engine.interval import run_interval_plans
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation

pytestmark = pytest.mark.spark

START, CYCLE = T0 + 300, 450


@pytest.fixture(scope="module")
def tpcds_lake(tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("tpcds") / "lake"))
    info = replay_tpcds(lake, 0.01)
    return lake, info


@pytest.fixture(scope="module")
def seed_reference(tpcds_lake, seed_query):
    lake, info = tpcds_lake
    return reference(seed_query, lake, START * 1_000_000, (info["end"] + 1) * 1_000_000)


def _fixed(query, perm, **options):
    return make_plan(query, orders_from_permutation(query, perm), "fixedOrder", options=options or None)


def _check_probe_orders(perm, records: list) -> None:
    """Each chain probed exactly the order of the fixed permutation ``perm``, factorised: each step looks
    up once per group alive after the previous step (the first once per new tuple the prefilter kept)."""
    for rec in records:
        for chain in rec["chains"]:
            assert [st["right"] for st in chain["steps"]] == [s for s in perm if s != chain["stream"]]
            first = chain["steps"][0]["lookups"]
            assert first <= chain["rows_in"] if rec["prefilter"] else first == chain["rows_in"]
            for a, b in zip(chain["steps"], chain["steps"][1:]):
                assert b["lookups"] == a["hits"]


def test_all_24_fixed_orders_equal_duckdb(spark, tpcds_lake, seed_query, seed_reference, tmp_path):
    lake, info = tpcds_lake
    assert len(seed_reference) > 200, "the fixture must produce a non-trivial join"
    plans = {"".join(p): _fixed(seed_query, p) for p in permutations(seed_query.stream_names)}
    assert len(plans) == 24
    # two cycles per plan: the state built by the first batch is probed by the second
    summaries = run_interval_plans(spark, seed_query, plans, lake, START, info["end"] + 1, CYCLE,
                                   str(tmp_path), config=EngineConfig(buckets=4))
    lookups = {}
    for name, summary in summaries.items():
        res = read_results(summary.results_path)
        assert_same_results(res, seed_reference, f"order {name}")
        assert summary.result_rows == len(seed_reference)
        records = read_metrics(summary.metrics_path)
        assert [r["batch_id"] for r in records] == [1, 2] and all(r["result_rows"] for r in records)
        _check_probe_orders([name[i:i + 2] for i in range(0, 8, 2)], records)
        lookups[name] = sum(st["lookups"] for rec in records for c in rec["chains"] for st in c["steps"])
    # the work depends on the order: the orders do not all cost the same number of lookups
    assert max(lookups.values()) > 1.2 * min(lookups.values()), lookups


def test_default_plan_and_metrics_record(spark, tpcds_lake, seed_query, seed_reference, tmp_path):
    lake, info = tpcds_lake
    out = str(tmp_path / "out")
    # driver_rows=0: this test is about the Spark job's record (its stages); a run this small would otherwise
    # run on the driver (tests/test_engine_interval_local.py compares the two)
    s = run_interval(spark, seed_query, None, lake, START, info["end"] + 1, CYCLE, out, config=EngineConfig(driver_rows=0))
    assert_same_results(read_results(out, seed_query.name), seed_reference, "default plan")
    records = read_metrics(Lake(out), seed_query.name)
    assert len(records) == s.batches == 2
    rec = records[0]
    for key in ("query", "engine", "mode", "batch_id", "plan_version", "plan_strategy", "plan_switch", "interval",
                "started_at", "wall_seconds", "rows_in", "quarantined", "result_rows", "state_tuples", "state_keys",
                "state_backend", "chains", "prefilter", "shuffle_bytes", "stage_seconds"):
        assert key in rec, key
    assert rec["engine"] == "mjoin" and rec["mode"] == "interval" and rec["state_backend"] == "sorted"
    assert rec["plan_strategy"] == "fixedOrder" and rec["plan_source"] == "default"
    # one plan: the files are read once, routed (one exchange) and joined in one Spark job
    stages = rec["execution"]["spark_stages"]
    assert s.extra["execution"] == "fused" and [st["kind"] for st in stages] == ["input", "operator"]
    # the input stage's tasks read the files themselves (normalize.scan_streams): Spark counts one input row per
    # task, its chunk's id (the ticks: a local relation, none), not the files' rows
    landed = sum(pq.read_metadata(f).num_rows for t in TPCDS_TABLES for f in lake.stream_files(t))
    assert 0 < stages[0]["input_rows"] < stages[0]["tasks"] and stages[0]["input_rows"] < landed
    assert stages[0]["shuffle_write_bytes"] > 0
    # TPC-DS returns have NULL address keys: quarantined with their reason and counted
    assert sum(r["quarantined"]["sr"]["null_key"] for r in records) > 0
    assert s.quarantined["sr"]["null_key"] == sum(r["quarantined"]["sr"]["null_key"] for r in records)
    # rows in per stream match the valid rows of the interval
    assert sum(s.rows_in.values()) == sum(sum(r["rows_in"].values()) for r in records)
    assert s.result_rows == sum(r["result_rows"] for r in records) == sum(c["results"] for r in records for c in r["chains"])


def test_prefilter_same_results_and_counts(spark, tpcds_lake, seed_query, seed_reference, tmp_path):
    lake, info = tpcds_lake
    plans = {"off": _fixed(seed_query, ["cu", "sr", "wr", "cr"]),
             "on": _fixed(seed_query, ["cu", "sr", "wr", "cr"], prefilter=True)}
    summaries = run_interval_plans(spark, seed_query, plans, lake, START, info["end"] + 1, CYCLE, str(tmp_path),
                                   config=EngineConfig(buckets=4))
    for name, summary in summaries.items():
        assert_same_results(read_results(summary.results_path), seed_reference, f"prefilter {name}")
    on = read_metrics(summaries["on"].metrics_path)
    off = read_metrics(summaries["off"].metrics_path)
    assert all(r["prefilter"] is None for r in off)
    dropped = sum(r["prefilter"]["dropped"] for r in on)
    saved = sum(r["prefilter"]["lookups_saved"] for r in on)
    assert dropped > 0 and saved >= dropped
    # what it saved is exactly the difference in lookups made
    lookups = {n: sum(st["lookups"] for r in recs for c in r["chains"] for st in c["steps"])
               for n, recs in (("on", on), ("off", off))}
    assert lookups["off"] - lookups["on"] == saved


def test_two_attribute_classes_equal_duckdb(spark, tpcds_lake, two_class_query, tmp_path):
    """Steps that change attribute class re-bucket the partial results (one stage per segment)."""
    lake, info = tpcds_lake
    q = two_class_query
    ref = reference(q, lake, START * 1_000_000, (info["end"] + 1) * 1_000_000)
    assert len(ref) > 100
    perms = [["sr", "cu", "wr", "cr"], ["wr", "cu", "sr", "cr"], ["cr", "wr", "cu", "sr"], ["cu", "cr", "sr", "wr"]]
    plans = {"".join(p): _fixed(q, p) for p in perms}
    summaries = run_interval_plans(spark, q, plans, lake, START, info["end"] + 1, info["end"] + 1 - START,
                                   str(tmp_path), config=EngineConfig(buckets=4))
    for name, summary in summaries.items():
        assert_same_results(read_results(summary.results_path), ref, f"two-class order {name}")
    # cu probing wr (address class), then sr (customer class), then cr (address class): three stages
    rec = read_metrics(summaries["wrcusrcr"].metrics_path)[0]
    cu = next(c for c in rec["chains"] if c["stream"] == "cu")
    assert [(st["right"], st["attr_class"], st["stage"]) for st in cu["steps"]] == [
        ("wr", "c1", 1), ("sr", "c0", 2), ("cr", "c1", 3)]
    assert set(rec["stage_seconds"]) >= {"stage1", "stage2", "stage3"}
    # each further stage re-buckets the partial results by the next class key: still no Spark join
    for stage in ("stage2", "stage3"):
        plan = rec["spark_plan"][stage]
        assert plan["joins"] == [] and "hashpartitioning(_c, _b, 4)" in plan["exchanges"], plan
    # a step into another class looks up once per partial result (rho = mu): lookups = matches before
    assert cu["steps"][1]["lookups"] >= cu["steps"][0]["hits"]


def test_partitioned_plan_uses_each_groups_order(spark, tpcds_lake, seed_query, seed_reference, tmp_path):
    lake, info = tpcds_lake
    q = seed_query
    rule = {"method": "hash", "attr_class": "c0", "groups": 2}
    orders = {0: orders_from_permutation(q, ["cu", "sr", "wr", "cr"]),
              1: orders_from_permutation(q, ["cr", "wr", "sr", "cu"])}
    plan = make_plan(q, orders, "pmjoin-test", partitioning=rule)
    summary = run_interval(spark, q, plan, lake, START, info["end"] + 1, CYCLE, str(tmp_path),
                           config=EngineConfig(buckets=4))
    assert_same_results(read_results(summary.results_path), seed_reference, "partitioned plan")
    rec = read_metrics(summary.metrics_path)[0]
    by_group = {(c["stream"], c["group"]): c for c in rec["chains"]}
    assert {g for _, g in by_group} == {0, 1}
    for (stream, g), chain in by_group.items():
        assert [st["right"] for st in chain["steps"]] == [r for _, r in orders[g][stream]]
    # every delta tuple went through exactly one group's chain
    assert sum(c["rows_in"] for c in rec["chains"]) == sum(rec["rows_in"].values())
    assert all(by_group[(s, 0)]["rows_in"] > 0 and by_group[(s, 1)]["rows_in"] > 0 for s in q.stream_names)


# ---- a synthetic seed-shaped query: 4 streams on one key (the complete graph K4) ----------------

SYN_START, SYN_END, SYN_CYCLE = T0 + 60, T0 + 300, 30  # 8 batches of 30 s after a 1-minute warm-up


@pytest.fixture(scope="module")
def synthetic4(tmp_path_factory):
    """The synthetic workload generator's 4-stream query (rates 0.4-1.6 x 4/s, skewed keys over 400
    values, 1-minute windows): windows span two cycles, so every batch probes state built earlier."""
    return synthetic_with_reference(tmp_path_factory.mktemp("synthetic4") / "w", SYN_START, SYN_END, streams=4,
                                    duration="5m", rate=4, domain=400, window="1m", cycle="30s", seed=5)


def test_synthetic_all_orders_prefilter_on_off_and_native_equal_duckdb(spark, synthetic4, tmp_path):
    lake, q, ref = synthetic4
    assert len(ref) > 300, "the synthetic join must be non-trivial"
    perms = list(permutations(q.stream_names))
    plans = {"".join(p): _fixed(q, p) for p in perms}
    plans.update({"".join(p) + "+pre": _fixed(q, p, prefilter=True) for p in perms})
    summaries = run_interval_plans(spark, q, plans, lake, SYN_START, SYN_END, SYN_CYCLE, str(tmp_path / "mjoin"),
                                   config=EngineConfig(buckets=2))
    assert len(summaries) == 48
    for name, summary in summaries.items():
        assert_same_results(read_results(summary.results_path), ref, f"synthetic order {name}")
        records = read_metrics(summary.metrics_path)
        assert [r["batch_id"] for r in records] == list(range(1, 9))
        # the state is carried across cycles: results in most batches, each made in the plan's order
        assert sum(1 for r in records if r["result_rows"]) >= 6
        _check_probe_orders([name[i:i + 2] for i in range(0, 8, 2)], records)
        if name.endswith("+pre"):
            off = read_metrics(summaries[name[:-4]].metrics_path)
            dropped = sum(r["prefilter"]["dropped"] for r in records)
            saved = sum(r["prefilter"]["lookups_saved"] for r in records)
            assert dropped > 0
            lookups = [sum(st["lookups"] for r in recs for c in r["chains"] for st in c["steps"]) for recs in (off, records)]
            assert lookups[0] - lookups[1] == saved
    # spark-native: Spark's chained stream-stream joins, same results
    native = run_interval(spark, q, None, lake, SYN_START, SYN_END, 60, str(tmp_path / "native"), engine="spark-native")
    assert native.engine == "spark-native" and native.extra["join_order"] == list(q.stream_names)
    assert_same_results(read_results(native.results_path), ref, "synthetic spark-native")


# ---- what Spark executes for a batch ------------------------------------------------------------

def test_batch_physical_plan_has_no_join_and_one_bucket_exchange(spark, synthetic4, tmp_path):
    """Spark cannot reorder what it does not see: a batch's physical plan holds no join node (the probe
    orders run inside the MapInArrow tasks), one exchange by (class, bucket), no adaptive re-planning;
    the engine's settings are in force during the batch (even when the session had AQE and CBO join
    reordering on) and restored after; the operator probed in the plan's order."""
    lake, q, ref = synthetic4
    keys = ("spark.sql.adaptive.enabled", "spark.sql.cbo.enabled", "spark.sql.cbo.joinReorder.enabled")
    before = {k: spark.conf.get(k, None) for k in keys}
    for k in keys:
        spark.conf.set(k, "true")
    try:
        perm = ["s2", "s0", "s3", "s1"]
        runs = {mode: run_interval(spark, q, _fixed(q, perm), lake, SYN_START, SYN_END, SYN_CYCLE,
                                   str(tmp_path / mode),  # driver_rows=0: about Spark's plan, never the driver
                                   config=EngineConfig(buckets=2, shuffle_partitions=3, driver_rows=0),
                                   pipelined=mode == "pipelined")
                for mode in ("pipelined", "per-batch")}
        for k in keys:
            assert spark.conf.get(k) == "true", f"{k} not restored after the run"
    finally:
        for k, v in before.items():
            spark.conf.set(k, v) if v is not None else spark.conf.unset(k)
    for mode, summary in runs.items():
        assert_same_results(read_results(summary.results_path), ref, mode)
        records = read_metrics(summary.metrics_path)
        for rec in records:
            assert rec["execution"]["mode"] == mode
            for k in keys:
                assert rec["spark_conf"][k] == "false", (mode, k)
            plan = rec["spark_plan"]["stage1"]
            assert plan["joins"] == [] and not plan["adaptive"], plan
            assert plan["exchanges"] == ["hashpartitioning(_c, _b, 3)"], plan
            assert plan["python_operator"] == "MapInArrow"
            # per-batch runs read the interval routed and cached once; one plan pipelined reads the files
            # in the same job (fused: read, normalise, route, exchange, operator)
            assert ("InMemoryTableScan" in plan["nodes"]) == (mode == "per-batch"), plan["nodes"]
            assert rec["spark_strategies"]["joins"] == []
        _check_probe_orders(perm, records)
    # pipelined: one Spark job for the 8 batches; per-batch: one job per batch
    pipe = read_metrics(runs["pipelined"].metrics_path)
    assert {r["execution"]["jobs"] for r in pipe} == {1} and pipe[0]["execution"]["batches"] == [0, 8]  # with the warm-up
    assert sum(r["wall_seconds"] for r in pipe) + runs["pipelined"].warmup_seconds == \
        pytest.approx(pipe[0]["execution"]["wall_seconds"])
