"""Small interval runs on the driver (one plan, at most ``driver_rows`` rows: no Spark job) give exactly what
the Spark jobs give (``driver_rows=0``): results (count + fingerprint), per-batch rows in, results,
quarantine counts and state, the quarantined rows and files. On the seed query over a lake with bad rows
(NULL keys, NULL event times) and rejected files (a key of the wrong type, not Parquet, a duplicate), a
two-class plan (three stages), punctuations and a band query; and the driver's batch rule against
Spark's."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine_helpers import T0, no_leaked_queries, replay_tpcds, write_null_time_copy
from mjoin.runtime import fsutil
from mjoin.engine import quarantine
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import result_fingerprint
from mjoin.engine.runs import run_interval
from mjoin.engine.compiled import EngineQuery
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation

pytestmark = pytest.mark.spark
_ = no_leaked_queries


def _quarantine(out: str, query) -> tuple[list, dict]:
    """(every quarantined row as (stream, batch, reason, file name, row), stream -> rejected files' docs)."""
    lake = Lake(out)
    rows, files = [], {}
    for s in query.stream_names:
        base = lake.quarantine(query.name, s)
        for r in quarantine.rejected_rows(lake, query.name, s).to_pylist():
            rows.append((s, r["batch"], r["reason"], os.path.basename(r["file"]),
                         json.dumps(json.loads(r["row"]), sort_keys=True)))
        for name in fsutil.listdir(base):
            if name.startswith("files-"):
                files[(s, name)] = sorted(json.loads(fsutil.read_bytes(fsutil.join(base, name))),
                                          key=lambda d: d["path"])
    return sorted(rows), files


def _both(spark, query, plan, lake, start, end, cycle, out, **cfg) -> dict:
    """The same interval run on the driver and by Spark (``driver_rows=0``); asserts they agree."""
    runs = {where: run_interval(spark, query, plan, lake, start, end, cycle, str(out / where),
                                config=EngineConfig(driver_rows=rows, **cfg))
            for where, rows in (("driver", 10**6), ("executors", 0))}
    d, x = runs["driver"], runs["executors"]
    assert d.extra["execution"] == "fused-driver" and x.extra["execution"] == "fused"
    assert d.result_rows == x.result_rows
    assert result_fingerprint(d.results_path) == result_fingerprint(x.results_path)
    assert d.rows_in == x.rows_in and d.quarantined == x.quarantined and d.batches == x.batches
    rd, rx = read_metrics(d.metrics_path), read_metrics(x.metrics_path)
    assert [r["batch_id"] for r in rd] == [r["batch_id"] for r in rx] == list(range(1, d.batches + 1))
    for a, b in zip(rd, rx):
        for k in ("rows_in", "result_rows", "quarantined", "quarantined_files", "state_tuples", "state_keys",
                  "punctuation"):
            assert a[k] == b[k], (k, a["batch_id"], a[k], b[k])
        # the same probe work per chain and step
        assert [[(st["lookups"], st["matches"]) for st in c["steps"]] for c in a["chains"]] == \
            [[(st["lookups"], st["matches"]) for st in c["steps"]] for c in b["chains"]]
        assert a["execution"]["where"] == "driver" and a["execution"]["jobs"] == 0
        assert a["execution"]["spark_stages"] == [] and a["shuffle_bytes"]["written"] == 0
        assert b["execution"]["where"] == "executors" and b["execution"]["jobs"] == b["execution"]["stages"] >= 1
        assert a["execution"]["stages"] == b["execution"]["stages"]
    assert _quarantine(str(out / "driver"), query) == _quarantine(str(out / "executors"), query)
    ph = d.extra["phases"]
    assert ph["spark_stages"] == [] and ph["contract_checks_driver"] > 0 and ph["input_driver"] > 0
    assert ph["operator_driver"] > 0 and d.prepare_seconds == pytest.approx(ph["contract_checks_driver"] + ph["input_driver"])
    assert d.extra["where"] == "driver" and x.extra["where"] == "executors"
    return runs


@pytest.fixture(scope="module")
def bad_lake(tmp_path_factory):
    """TPC-DS sf 0.01 (store returns with NULL address keys), plus: a web-returns file with two NULL event
    times, a customer file whose key column is a string (rejected: schema_mismatch), a file that is not
    Parquet (unreadable) and a copy of a landed file (duplicate_file)."""
    lake = Lake(str(tmp_path_factory.mktemp("local-interval") / "lake"))
    info = replay_tpcds(lake, 0.01, rate=10.0, arrival_cycle=20)
    arrivals = lake.arrivals("web_returns")
    write_null_time_copy(lake, arrivals[4])
    c = pq.read_table(lake.stream_file("customer", lake.arrivals("customer")[5]))
    key = c.schema.get_field_index("c_current_addr_sk")
    pq.write_table(c.set_column(key, "c_current_addr_sk", c.column(key).cast(pa.string())),
                   os.path.join(lake.arrival_dir("customer", lake.arrivals("customer")[5]), "string_key.parquet"))
    with open(os.path.join(lake.arrival_dir("store_returns", lake.arrivals("store_returns")[6]), "junk.parquet"),
              "wb") as fh:
        fh.write(b"this is not parquet")
    src = lake.stream_file("catalog_returns", lake.arrivals("catalog_returns")[7])
    shutil.copy(src, os.path.join(os.path.dirname(src), "copy.parquet"))
    return lake, info


@pytest.fixture(scope="module")
def seed_runs(spark, seed_query, bad_lake, tmp_path_factory):
    """The seed query over ``bad_lake`` on the driver and by Spark (:func:`_both`): (runs, their folder)."""
    lake, info = bad_lake
    out = tmp_path_factory.mktemp("seed-runs")
    return _both(spark, seed_query, None, lake, info["start"] + 120, info["end"] + 1, 60, out, **SEED_CFG), out


SEED_CFG = {"buckets": 4, "driver_threads": 3}


def test_seed_query_with_bad_input_on_the_driver_equals_spark(seed_query, seed_runs):
    runs, tmp_path = seed_runs
    d = runs["driver"]
    assert d.batches >= 8 and d.result_rows > 200
    assert d.quarantined["sr"]["null_key"] > 0 and d.quarantined["wr"]["bad_time"] == 2
    assert d.quarantined["cu"]["schema_mismatch"] > 0
    reasons = {f["reason"] for docs in _quarantine(str(tmp_path / "driver"), seed_query)[1].values() for f in docs}
    assert reasons == {"schema_mismatch", "unreadable", "duplicate_file"}
    rec = read_metrics(d.metrics_path)[0]
    assert rec["execution"]["threads"] == 3 and rec["spark_plan"]["stage1"] == {"where": "driver", "threads": 3}
    assert d.extra["warmup_state_tuples"] == runs["executors"].extra["warmup_state_tuples"]
    assert sum(d.extra["warmup_state_tuples"].values()) > 0  # rows before start built the state


def test_two_class_plan_runs_its_stages_on_the_driver(spark, two_class_query, bad_lake, tmp_path):
    lake, info = bad_lake
    q = two_class_query
    # cu probes wr (address class), then sr (customer class), then cr (address class): three stages
    plan = make_plan(q, orders_from_permutation(q, ["wr", "cu", "sr", "cr"]), "fixedOrder")
    runs = _both(spark, q, plan, lake, info["start"] + 120, info["end"] + 1, 120, tmp_path, buckets=4)
    assert runs["driver"].result_rows > 50
    rec = read_metrics(runs["driver"].metrics_path)[0]
    assert rec["execution"]["stages"] == 3 and set(rec["stage_seconds"]) >= {"stage1", "stage2", "stage3"}


def test_punctuations_on_the_driver_equal_spark(spark, tmp_path):
    from test_engine_punctuation import CYCLE, CYCLES, SPEC, _plan, land_ending_keys

    from mjoin.model.query import parse_query

    q = parse_query(SPEC, source="ending_keys")
    lake = Lake(str(tmp_path / "lake"))
    land_ending_keys(lake)
    runs = _both(spark, q, _plan(q, "eager"), lake, T0 + 60, T0 + CYCLES * CYCLE, 30, tmp_path, buckets=2)
    recs = read_metrics(runs["driver"].metrics_path)
    assert sum((r["punctuation"] or {}).get("purged", 0) for r in recs) > 0


def test_band_query_on_the_driver_equals_spark(spark, tmp_path):
    from mjoin.engine.normalize import local_supported
    from mjoin.model.query import load_query

    q = load_query("tpcds_returns_similar_amounts")
    assert local_supported(q, q.stream_names)
    lake = Lake(str(tmp_path / "lake"))
    info = replay_tpcds(lake, 0.01, rate=40.0, arrival_cycle=20, tables=("store_returns", "web_returns",
                                                                         "catalog_returns"))
    runs = _both(spark, q, None, lake, info["start"] + 30, info["end"] + 60, 30, tmp_path, buckets=4, psp_slices=3)
    assert runs["driver"].result_rows > 50


def test_driver_rows_bound_and_unsupported_streams_keep_spark(spark, seed_query, bad_lake, tmp_path):
    """The rule: at most ``driver_rows`` accepted rows by the footers (and streams the driver reads as Spark
    does); above it, or with ``driver_rows=0``, the rows are Spark's (a lazy frame, no job yet)."""
    from mjoin.engine.interval import read_interval
    from mjoin.model.query import parse_query

    lake, info = bad_lake
    eq = EngineQuery.from_query(seed_query)
    out = Lake(str(tmp_path / "out"))
    args = (spark, seed_query, eq, lake, out, info["start"] + 120, info["end"] + 1, 60)
    probe = read_interval(*args, driver_rows=10**9)
    rejected = {r.path for r in probe.rejects}
    assert len(rejected) == 3
    accepted = sum(pq.read_metadata(f).num_rows for t in ("customer", "store_returns", "web_returns", "catalog_returns")
                   for f in lake.stream_files(t) if f not in rejected)
    at = read_interval(*args, driver_rows=accepted)
    below = read_interval(*args, driver_rows=accepted - 1)
    off = read_interval(*args, driver_rows=0)
    assert at.local is not None and at.frame is None and at.local.num_rows > 0
    assert below.local is None and below.frame is not None and off.local is None
    with pytest.raises(ValueError, match="interval_driver_rows"):
        EngineConfig(interval_driver_rows=-1)
    # an event time Spark computes (a Spark SQL expression): never on the driver
    spec = seed_query.to_spec()
    spec["streams"][0] = dict(spec["streams"][0], event_time={"expr": "ts"})
    q2 = parse_query(spec, source="x")
    assert read_interval(spark, q2, EngineQuery.from_query(q2), lake, out, info["start"] + 120, info["end"] + 1, 60,
                         driver_rows=10**9).local is None


def test_batch_rule_on_the_driver_equals_sparks(spark, seed_query):
    """:func:`batch_local` (numpy) and :func:`_batch_expr` (Spark SQL) give every row the same batch: the
    warm-up (0) within a stream's window before start, cycles 1.., NULL times in batch 1, others dropped."""
    from mjoin.engine.interval import _batch_expr, batch_local

    eq = EngineQuery.from_query(seed_query)
    start, cycle, end = 10**15, 7_000_000, 10**15 + 30_000_000  # the last cycle cut short
    w = eq.window_us[eq.streams[1]]
    edges = [start - w - 1, start - w, start - w + 1, start - 1, start, start + 1, start + cycle - 1, start + cycle,
             end - 1, end, end + 1, None]
    rng = np.random.default_rng(3)
    ts = edges + [int(x) for x in rng.integers(start - 2 * w, end + 2 * cycle, 400)]
    s = [1] * len(edges) + [int(x) for x in rng.integers(0, len(eq.streams), 400)]
    mine = batch_local(pa.array(ts, pa.int64()), np.asarray(s), eq, start, end, cycle)
    df = spark.createDataFrame([(i, t, x) for i, (t, x) in enumerate(zip(ts, s))], "i long, _ts long, _s int")
    theirs = {r["i"]: r["b"] for r in df.selectExpr("i", f"{_batch_expr(eq, start, end, cycle)} AS b").collect()}
    assert [theirs[i] if theirs[i] is not None else -1 for i in range(len(ts))] == mine.tolist()
    assert mine[:len(edges)].tolist() == [-1, -1, 0, 0, 1, 1, 1, 2, 5, -1, -1, 1]


def _entries(lake: Lake, query) -> list:
    return [(e.id, e.kind, e.stream, e.batch, e.reason, e.rows) for e in quarantine.entries(lake, query)]


def test_pipelined_outputs_equal_a_per_batch_runs(spark, seed_query, bad_lake, seed_runs):
    """A pipelined run (driver and Spark) writes per run: its results in one range folder under one
    ``_SUCCESS``, each stream's rejected rows in one range folder, the metrics as one ``metrics.jsonl``; a
    per-batch run (``pipelined=False``) writes per batch. Every reader gives the same: committed batches,
    result rows per batch (fingerprint with the batch), a subset of batches, metrics per batch, the
    quarantine's entries (ids, counts), their rows, and the quarantined rows with their batches."""
    from mjoin.engine.results import committed_batches, fingerprint_tables, read_results_arrow

    lake, info = bad_lake
    runs, out = seed_runs
    q = seed_query.name
    per = run_interval(spark, seed_query, None, lake, info["start"] + 120, info["end"] + 1, 60, str(out / "per-batch"),
                       config=EngineConfig(**SEED_CFG), pipelined=False)
    ref = Lake(str(out / "per-batch"))
    n = per.batches
    assert committed_batches(ref, q) == list(range(0, n + 1))
    assert fsutil.listdir(ref.results(q)) == sorted(f"batch={b}" for b in range(0, n + 1))
    ref_rows = read_results_arrow(ref, q, with_batch=True)
    ref_entries = _entries(ref, seed_query)
    ref_records = read_metrics(per.metrics_path)
    # rejected rows of three streams in several batches: the case the range folders hold
    assert len({(e[2], e[3]) for e in ref_entries if e[1] == "rows"}) >= 6
    assert len({e[2] for e in ref_entries if e[1] == "rows"}) >= 3
    for where, s in runs.items():
        lake_out = Lake(str(out / where))
        # the layout: per run, not per batch
        assert fsutil.listdir(lake_out.results(q)) == [f"batches=0-{n}"], where
        assert fsutil.listdir(lake_out.metrics(q)) == ["metrics.jsonl"], where
        for stream in seed_query.stream_names:
            assert fsutil.listdir(fsutil.join(lake_out.quarantine(q, stream), "rows")) in ([], [f"batches=0-{n}"])
        assert committed_batches(lake_out, q) == list(range(0, n + 1))
        assert result_fingerprint(lake_out, q) == result_fingerprint(ref, q) and s.result_rows == per.result_rows
        rows = read_results_arrow(lake_out, q, with_batch=True)
        assert rows.column_names == ref_rows.column_names and "_batch" not in rows.column_names
        assert rows.column("batch_id").to_pylist() == sorted(rows.column("batch_id").to_pylist())
        assert fingerprint_tables([rows]) == fingerprint_tables([ref_rows])  # the same rows in the same batches
        some = [2, 3, n]
        part = read_results_arrow(lake_out, q, batches=some)
        assert part.num_rows == sum(r["result_rows"] for r in ref_records if r["batch_id"] in some) > 0
        assert fingerprint_tables([part]) == fingerprint_tables([read_results_arrow(ref, q, batches=some)])
        records = read_metrics(s.metrics_path)
        assert read_metrics(lake_out, q) == records and [r["batch_id"] for r in records] == list(range(1, n + 1))
        for a, b in zip(records, ref_records):
            for k in ("rows_in", "result_rows", "quarantined", "quarantined_files", "state_tuples"):
                assert a[k] == b[k], (where, k, a["batch_id"])
        marker = json.loads(fsutil.read_text(fsutil.join(lake_out.results(q), f"batches=0-{n}", "_SUCCESS")))
        assert marker["batches"] == [0, n] and marker["rows"] == {str(r["batch_id"]): r["result_rows"] for r in
                                                                  [{"batch_id": 0, "result_rows": 0}] + records}
        entries = _entries(lake_out, seed_query)
        assert entries == ref_entries, where
        counted = quarantine.summary(quarantine.entries(lake_out, seed_query))["by_batch"]
        for r in records:  # the listing's rows per batch are the metrics' row counts
            rows_only = {st: {k: v for k, v in per_r.items() if v and k in ("null_key", "bad_type", "bad_time", "late")}
                         for st, per_r in r["quarantined"].items()}
            listed = {st: {k: v for k, v in per_r.items() if k in ("null_key", "bad_type", "bad_time", "late")}
                      for st, per_r in counted.get(r["batch_id"], {}).items()}
            assert {k: v for k, v in listed.items() if v} == {k: v for k, v in rows_only.items() if v}, r["batch_id"]
        e = next(x for x in quarantine.entries(lake_out, seed_query) if x.kind == "rows" and x.batch > 1)
        got = quarantine.rows_of(e, seed_query)
        want = quarantine.rows_of(quarantine.find(ref, seed_query, e.id), seed_query)
        assert got.num_rows == e.rows > 0 and got.schema == want.schema
        assert sorted(json.dumps(r, sort_keys=True, default=str) for r in got.to_pylist()) == \
            sorted(json.dumps(r, sort_keys=True, default=str) for r in want.to_pylist())
        assert _quarantine(str(out / where), seed_query) == _quarantine(str(out / "per-batch"), seed_query)


def test_rerun_over_a_killed_attempts_files_adds_nothing(spark, seed_query, bad_lake, seed_runs, tmp_path):
    """Files of an attempt killed before its commit are never read (no range ``_SUCCESS``: no batch counts),
    and a re-run of the interval into the same output, over those files and over a batch's own folder left
    by a per-batch run, replaces them: the same results, quarantine and counts as one clean run."""
    from mjoin.engine.batch import BatchRunner
    from mjoin.engine.inputs import compile_plan
    from mjoin.engine.interval import run_fused
    from mjoin.engine.results import committed_batches

    lake, info = bad_lake
    runs, out = seed_runs
    q = seed_query.name
    clean = Lake(str(out / "driver"))
    shutil.copytree(clean.root, tmp_path / "x")
    x = Lake(str(tmp_path / "x"))
    n = runs["driver"].batches
    # killed before the commit: no state manifest, no _SUCCESS; its results and rejected rows are there
    fsutil.remove(fsutil.join(x.results(q), f"batches=0-{n}", "_SUCCESS"))
    fsutil.remove(x.state(q))
    rng = fsutil.join(x.results(q), f"batches=0-{n}")
    parts = sorted(f for f in fsutil.listdir(rng) if f.endswith(".parquet"))
    shutil.copy(fsutil.join(rng, parts[0]), fsutil.join(rng, "part-s1-p00009-000.parquet"))  # a task the re-run has not
    assert committed_batches(x, q) == [] and result_fingerprint(x, q)["rows"] == 0
    # and batch 2's own folders, as a per-batch run leaves them: they win over the range, until replaced
    os.makedirs(fsutil.join(x.results(q), "batch=2"))
    shutil.copy(fsutil.join(rng, parts[0]), fsutil.join(x.results(q), "batch=2", "part-x.parquet"))
    fsutil.atomic_write_text(fsutil.join(x.results(q), "batch=2", "_SUCCESS"), "{}")
    stale = quarantine.rejected_rows(x, q, "sr").slice(0, 1).drop_columns(["batch"])
    os.makedirs(fsutil.join(x.quarantine(q, "sr"), "rows", "batch=2"))
    pq.write_table(stale, fsutil.join(x.quarantine(q, "sr"), "rows", "batch=2", "part-x.parquet"))
    assert committed_batches(x, q) == [2]
    assert [e.rows for e in quarantine.entries(x, seed_query) if e.batch == 2 and e.stream == "sr"] == [1]
    cfg = EngineConfig(driver_rows=10**6, **SEED_CFG)
    runner = BatchRunner(spark, seed_query, x, cfg, mode="interval")
    s = run_fused(spark, seed_query, compile_plan(seed_query, None, cfg), runner, lake, info["start"] + 120,
                  info["end"] + 1, 60)
    assert s.extra["execution"] == "fused-driver"
    assert not fsutil.exists(fsutil.join(x.results(q), "batch=2"))
    assert not fsutil.exists(fsutil.join(x.quarantine(q, "sr"), "rows", "batch=2"))
    assert committed_batches(x, q) == committed_batches(clean, q)
    assert result_fingerprint(x, q) == result_fingerprint(clean, q) and s.result_rows == runs["driver"].result_rows
    assert _entries(x, seed_query) == _entries(clean, seed_query)
    assert _quarantine(x.root, seed_query) == _quarantine(clean.root, seed_query)
