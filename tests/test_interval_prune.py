"""An interval run reads only the landed files that can give it a row: a file whose footer puts every row's event
time at or before ``start - W_s`` or at or after ``end`` is judged by the contract and not read
(:meth:`mjoin.engine.normalize.Inspected.prune_outside`). On the footers of files at the edges (each event-time
encoding of the synthetic query, NULL times, times from a pattern) the rule takes out exactly the files whose
every row the engine's own batch rule drops; on a lake longer than the interval the run gives what it gives
reading every file (results by count and fingerprint, per-batch counts, the quarantine, both paths) and what
DuckDB's reference query gives."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine_helpers import (T0, assert_same_results, no_leaked_queries, reference, replay_tpcds, synth_query,
                            write_null_time_copy)
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results, result_fingerprint
from mjoin.engine.runs import run_interval
from mjoin.engine.compiled import EngineQuery
from mjoin.engine.interval import batch_local
from mjoin.engine.normalize import PRUNE_MARGIN_US, Inspected, inspect_files
from mjoin.model.eventtime import micros_arrow
from mjoin.lake.layout import Lake

_ = no_leaked_queries
US = 1_000_000


def _write(tmp_path, name: str, table: pa.Table) -> str:
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(table, path)
    return path


def _b(tmp_path, name, micros: list) -> str:
    """A file of synth3's stream b (event time: a timestamp[us] column ``ts``)."""
    n = len(micros)
    return _write(tmp_path, name, pa.table({"ts": pa.array(micros, pa.int64()).cast(pa.timestamp("us")),
                                            "kb": pa.array(range(n), pa.int64()), "idb": pa.array(range(n), pa.int64()),
                                            "vb": pa.array([0.5] * n)}))


def _c(tmp_path, name, seconds: list) -> str:
    """A file of stream c (event time: epoch seconds in a long column ``e``)."""
    n = len(seconds)
    return _write(tmp_path, name, pa.table({"e": pa.array(seconds, pa.int64()), "kc": pa.array(range(n), pa.int64()),
                                            "idc": pa.array(range(n), pa.int64())}))


def _a(tmp_path, name, seconds: list) -> str:
    """A file of stream a (event time: a string with a pattern: the footer says nothing usable)."""
    from datetime import datetime, timezone

    n = len(seconds)
    return _write(tmp_path, name, pa.table({
        "t": [datetime.fromtimestamp(x, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S") for x in seconds],
        "ka": pa.array(range(n), pa.int64()), "ida": pa.array(range(n), pa.int64())}))


def test_prune_takes_out_exactly_the_files_whose_rows_the_batch_rule_drops(tmp_path):
    q = synth_query()
    eq = EngineQuery.from_query(q)
    start, end = T0 + 1000, T0 + 1300  # seconds; W_b = 30 s, W_c = 45 s
    s_us, e_us = start * US, end * US
    m = PRUNE_MARGIN_US
    files = {
        "b": {  # name -> (path, expected: pruned?); "slack": every row dropped, but within the margin: read
            "before": (_b(tmp_path, "b-before", [s_us - 200 * US, s_us - 30 * US - m]), True),
            "slack-before": (_b(tmp_path, "b-slack-before", [s_us - 200 * US, s_us - 30 * US]), False),  # = start - W
            "edge": (_b(tmp_path, "b-edge", [s_us - 200 * US, s_us - 30 * US + 1]), False),  # 1 us inside the warm-up
            "inside": (_b(tmp_path, "b-inside", [s_us + 5 * US]), False),
            "last": (_b(tmp_path, "b-last", [e_us - 1, e_us + 50 * US]), False),  # 1 us before the end
            "slack-after": (_b(tmp_path, "b-slack-after", [e_us, e_us + 50 * US]), False),  # min = end
            "after": (_b(tmp_path, "b-after", [e_us + m, e_us + 50 * US]), True),
            "slack-across": (_b(tmp_path, "b-across", [s_us - 500 * US, e_us + 500 * US]), False),  # bounds span it
            "spans": (_b(tmp_path, "b-spans", [s_us - 500 * US, s_us, e_us + 500 * US]), False),
            "ns-before": (_write(tmp_path, "b-ns-before", pa.table({  # nanoseconds: converted as the engine does
                "ts": pa.array([(s_us - 31 * US) * 1000 + 999], pa.int64()).cast(pa.timestamp("ns")),
                "kb": pa.array([1], pa.int64()), "idb": pa.array([1], pa.int64()), "vb": [0.1]})), True),
            "slack-ns": (_write(tmp_path, "b-slack-ns", pa.table({
                "ts": pa.array([(s_us - 30 * US) * 1000 + 999], pa.int64()).cast(pa.timestamp("ns")),
                "kb": pa.array([1], pa.int64()), "idb": pa.array([1], pa.int64()), "vb": [0.1]})), False),
            "null": (_write(tmp_path, "b-null", pa.table({  # all before, but a NULL time counts in batch 1
                "ts": pa.array([s_us - 500 * US, None], pa.int64()).cast(pa.timestamp("us")),
                "kb": pa.array([1, 2], pa.int64()), "idb": pa.array([1, 2], pa.int64()), "vb": [0.1, 0.2]})), False),
        },
        "c": {
            "before": (_c(tmp_path, "c-before", [start - 100, start - 46]), True),
            "slack-before": (_c(tmp_path, "c-slack-before", [start - 100, start - 45]), False),
            "edge": (_c(tmp_path, "c-edge", [start - 100, start - 44]), False),
            "slack-after": (_c(tmp_path, "c-slack-after", [end, end + 9]), False),
            "after": (_c(tmp_path, "c-after", [end + 1, end + 9]), True),
            "last": (_c(tmp_path, "c-last", [end - 1]), False),
        },
        "a": {"before": (_a(tmp_path, "a-before", [start - 900, start - 800]), False)},  # a pattern: not known
    }
    inspected = inspect_files(q, eq, {s: [p for p, _ in fs.values()] for s, fs in files.items()})
    assert not inspected.rejects
    rows_before = inspected.rows
    pruned = inspected.prune_outside(eq.window_us, s_us, e_us)
    assert pruned == {"b": 3, "c": 2}
    kept = {p for (_, paths) in inspected.groups.values() for p in paths}
    for s, fs in files.items():
        for name, (path, expect_pruned) in fs.items():
            assert (path not in kept) == expect_pruned, (s, name)
            assert ((s, path) in inspected.accepted) == (not expect_pruned), (s, name)
    gone = [p for fs in files.values() for p, x in fs.values() if x]
    assert inspected.rows == rows_before - sum(pq.ParquetFile(p).metadata.num_rows for p in gone)
    # independently of the footers: the engine's batch rule, on every row of every file, drops every row of the
    # pruned files and of the slack ones, and keeps a row of every other file (stream a: its footer tells nothing)
    sid = {s: i for i, s in enumerate(eq.streams)}
    for s, fs in files.items():
        stream = q.stream(s)
        for name, (path, expect_pruned) in fs.items():
            if s == "a":
                continue
            col = pq.read_table(path).column(stream.event_time.column)
            kind = ("ts_ns" if col.type.unit == "ns" else "ts") if pa.types.is_timestamp(col.type) else "int"
            ts = micros_arrow(col.combine_chunks(), kind)
            b = batch_local(ts, np.full(len(ts), sid[s]), eq, s_us, e_us, 30 * US)
            assert bool((b < 0).all()) == (expect_pruned or name.startswith("slack")), (s, name, b)


def test_nothing_pruned_without_footer_bounds():
    ins = Inspected()
    ins.groups[("b", ())] = (None, ["x.parquet"])
    assert ins.prune_outside({"b": 30 * US}, T0 * US, (T0 + 60) * US) == {}  # no facts: read
    assert ins.groups[("b", ())][1] == ["x.parquet"]


# ---- a real run over a lake longer than its interval -----------------------------------------------------

@pytest.fixture(scope="module")
def long_lake(tmp_path_factory):
    """TPC-DS sf 0.01 replayed at 5 tuples/s in 60-s arrival folders (~20 min), plus a web-returns file with two
    NULL event times in an early folder (its other rows are long before the interval)."""
    lake = Lake(str(tmp_path_factory.mktemp("prune") / "lake"))
    info = replay_tpcds(lake, 0.01, rate=5.0, arrival_cycle=60)
    write_null_time_copy(lake, lake.arrivals("web_returns")[1])
    return lake, info


@pytest.mark.spark
@pytest.mark.parametrize("driver_rows", [10**6, 0], ids=["driver", "spark"])
def test_interval_over_a_longer_lake_reads_fewer_files_and_gives_the_same(spark, seed_query, long_lake, tmp_path,
                                                                         monkeypatch, driver_rows):
    lake, info = long_lake
    start, end = info["start"] + 540, info["start"] + 840  # 5 minutes in the middle; W = 5 minutes
    assert info["end"] > end + 120
    cfg = EngineConfig(buckets=4, driver_rows=driver_rows)
    pruned = run_interval(spark, seed_query, None, lake, start, end, 60, str(tmp_path / "pruned"), config=cfg)
    monkeypatch.setattr(Inspected, "prune_outside", lambda self, *a: {})  # every accepted file read, as before
    full = run_interval(spark, seed_query, None, lake, start, end, 60, str(tmp_path / "full"), config=cfg)
    monkeypatch.undo()
    files = sum(len(lake.landed(t)) for t in {s.source for s in seed_query.streams})
    not_read = sum(pruned.extra["files_not_read"].values())
    assert full.extra["files_not_read"] == {} and 0.3 * files < not_read < files, (not_read, files)
    assert pruned.extra["execution"] == full.extra["execution"] == ("fused-driver" if driver_rows else "fused")
    assert pruned.result_rows == full.result_rows > 0
    assert result_fingerprint(pruned.results_path) == result_fingerprint(full.results_path)
    assert pruned.rows_in == full.rows_in and pruned.quarantined == full.quarantined
    assert pruned.quarantined["wr"]["bad_time"] == 2  # the early file with NULL times was read (batch 1)
    assert pruned.extra["warmup_state_tuples"] == full.extra["warmup_state_tuples"]
    for a, b in zip(read_metrics(pruned.metrics_path), read_metrics(full.metrics_path), strict=True):
        for k in ("batch_id", "rows_in", "result_rows", "quarantined", "state_tuples", "state_keys"):
            assert a[k] == b[k], (k, a["batch_id"])
    assert_same_results(read_results(pruned.results_path), reference(seed_query, lake, start * US, end * US),
                        "pruned interval")
