"""Event time that one bad producer cannot poison (the landing contract's future rule, mjoin.lake.contract).

The reproduction: a copy of an early store_returns part file whose ``ts`` are ten years ahead, landed as
``arrival=<an early cycle>/part-00001.parquet``. Before the rule the streaming job accepted it, its watermark
jumped to 2035, every later row was ``late``: 4,593 results against the interval run's 209,707. Now the file is
quarantined whole as ``future`` (rule ``input.event_time_not_future``), a file with a few future rows loses
just those, no watermark moves, and the streaming job (capped micro-batches, on the driver, on the executors, on
Spark's SQL path) gives exactly the interval run over the accepted rows (count and fingerprint). The input gate
names the same file by the same rule and counts the same future rows.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from engine_helpers import TPCDS_TABLES, assert_same_results, no_leaked_queries, reference, replay_tpcds
from hostile_helpers import accepted_lake, rejected_row_keys, same_results
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results, result_fingerprint
from mjoin.engine.runs import run_interval, run_stream
from mjoin.lake import contract
from mjoin.lake.layout import Lake
from mjoin.model import punctuation
from mjoin.model.query import parse_query

_ = no_leaked_queries
US = 1_000_000
TEN_YEARS = 10 * 365 * 86400
CYCLE = 20  # the staged lake's arrival cycle (seconds)


# ---- the rule, pure ------------------------------------------------------------------------------------


def test_arrival_cycle_is_the_most_common_gap():
    assert contract.arrival_cycle([[0, 10, 20, 30, 40]]) == 10
    assert contract.arrival_cycle([[0, 10, 20, 23, 30, 40, 50]]) == 10  # a replay at arrival=<now> is one odd gap
    assert contract.arrival_cycle([[0, 20, 60], [0, 10, 20, 30]]) == 10  # a sparse source skips cycles
    assert contract.arrival_cycle([[100], [100]]) is None  # no source has two folders: not known
    assert contract.arrival_cycle([[0, 20, 40], [0, 10]]) == 20
    assert contract.future_allowance(None, 10) == 2 * 10 == contract.FUTURE_CYCLES * 10
    assert contract.future_allowance(45.0, 10) == 45.0 and contract.future_allowance(float("inf"), 10) is None
    assert contract.future_allowance(None, None) is None
    # a young lake (no source with two folders yet): the query's shortest window, unless configured
    assert contract.future_allowance(None, None, 300.0) == 300.0 and contract.future_allowance(None, 10, 300.0) == 20
    assert contract.future_allowance(float("inf"), None, 300.0) is None
    assert contract.future_from_us("/l/streams/s/arrival=100/part-00000.parquet", 20.0) == 120 * US
    assert contract.future_from_us("/l/streams/s/x.parquet", 20.0) is None


@pytest.mark.parametrize("stats", [True, False], ids=["footer", "column"])
def test_future_rows_by_footer_or_column(tmp_path, stats):
    """Counted from the footer where it settles it (none, or all, future), else from the event-time column."""
    q = parse_query({"spec_version": 1, "name": "two", "streams": [
        {"name": n, "source": f"s{n}", "event_time": "ts", "window": "60s",
         "columns": {"ts": "timestamp", "k": "long"}, "keys": ["k"]} for n in "ab"],
        "predicates": ["a.k = b.k"], "output": ["a.k"]})
    lake = Lake(str(tmp_path / "lake"))

    def facts(ts: list):
        path = lake.stream_file("sa", 100, len(os.listdir(lake.arrival_dir("sa", 100))) if os.path.isdir(
            lake.arrival_dir("sa", 100)) else 0)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table({"ts": pa.array([None if t is None else int(t * US) for t in ts], pa.timestamp("us")),
                                 "k": pa.array(range(len(ts)), pa.int64())}), path, write_statistics=stats)
        return contract.inspect(path, q.stream("a"))

    bound = contract.future_from_us(100, 20.0)  # 120 s
    assert contract.future_rows(facts([100, 110, 119.999999]), q.stream("a"), bound) == (0, 3)
    assert contract.future_rows(facts([120, 130, 10**9]), q.stream("a"), bound) == (3, 3)
    assert contract.future_rows(facts([100, 120, None, 10**9]), q.stream("a"), bound) == (2, 3)
    two_of_three = facts([105, 10**9, 10**9])
    assert "2 of 3 rows" in contract.future_problem(two_of_three, q.stream("a"), bound)
    assert contract.future_problem(facts([101, 102, 10**9]), q.stream("a"), bound) is None  # one of three: rows
    assert contract.future_rows(facts([101]), q.stream("a"), None) == (0, 1)  # no allowance: no check


# ---- the reproduction, on Spark -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """TPC-DS sf=0.01, the paper's replay at 10 tuples/s in 20-s arrival cycles (4 files per cycle)."""
    stage = Lake(str(tmp_path_factory.mktemp("staging") / "lake"))
    info = replay_tpcds(stage, 0.01, rate=10.0, arrival_cycle=CYCLE)
    return stage, info


def copy_lake(stage: Lake, root) -> Lake:
    shutil.copytree(stage.streams(), os.path.join(str(root), "streams"))
    return Lake(str(root))


def span(info) -> tuple[int, int]:
    return info["start"] - 3600, info["end"] + 60


def interval(spark, query, lake: Lake, info, out, **config) -> str:
    start, end = span(info)
    run_interval(spark, query, None, lake, start, end, end - start, str(out), config=EngineConfig(buckets=4, **config))
    return str(out)


@pytest.fixture(scope="module")
def clean(spark, staged, seed_query, tmp_path_factory):
    """The interval run over the clean lake, checked against DuckDB once."""
    stage, info = staged
    out = interval(spark, seed_query, stage, info, tmp_path_factory.mktemp("clean"))
    assert_same_results(read_results(out, seed_query.name), reference(seed_query, stage), "clean: interval vs DuckDB")
    return out


def early_file(lake: Lake) -> tuple[int, str]:
    arrival = lake.arrivals("store_returns")[2]
    return arrival, lake.stream_file("store_returns", arrival)


def shifted(table: pa.Table, seconds: float, rows=None, ticket_offset: int = 0) -> pa.Table:
    """``table`` with ``ts`` moved by ``seconds`` (all rows, or the row indices ``rows``) and its ticket numbers
    moved by ``ticket_offset`` (new rows: they would join, and add results, if accepted)."""
    i = table.schema.get_field_index("ts")
    us = pc.cast(table.column(i), pa.int64()).to_numpy().copy()
    idx = np.arange(len(us)) if rows is None else np.asarray(rows)
    us[idx] += int(seconds * US)
    table = table.set_column(i, "ts", pa.array(us, pa.int64()).cast(table.schema.field(i).type))
    j = table.schema.get_field_index("sr_ticket_number")
    return table.set_column(j, "sr_ticket_number", pc.add(table.column(j), pa.scalar(ticket_offset, pa.int64())))


def stream_config(where: str, monkeypatch, **extra) -> EngineConfig:
    if where == "executors-sql":  # Spark's file source and the SQL projection (normalize_group)
        monkeypatch.setenv("MJOIN_SPARK_SCAN", "0")
    return EngineConfig(buckets=4, driver_rows=0 if where.startswith("executors") else 10**6, **extra)


def no_watermark_beyond_the_data(records, info) -> None:
    for r in records:
        for s, wm in (r["watermarks"]["per_stream"] or {}).items():
            assert wm is None or wm < (info["end"] + 2 * CYCLE) * US, (r["batch_id"], s, wm)


@pytest.mark.spark
@pytest.mark.parametrize("where", ["driver", "executors", "executors-sql"])
def test_a_file_ten_years_ahead_is_quarantined_whole_and_moves_no_watermark(spark, staged, clean, seed_query,
                                                                             tmp_path, monkeypatch, where):
    stage, info = staged
    lake = copy_lake(stage, tmp_path / "lake")
    arrival, good = early_file(lake)
    bad = os.path.join(lake.arrival_dir("store_returns", arrival), "part-00001.parquet")
    pq.write_table(shifted(pq.read_table(good), TEN_YEARS), bad)
    bad_rows = pq.read_metadata(bad).num_rows

    s = run_stream(spark, seed_query, lake, config=stream_config(where, monkeypatch, max_files_per_trigger=8))
    records = read_metrics(lake, seed_query.name)
    assert s.quarantined["sr"].get("future") == bad_rows and sum(v.get("late", 0) for v in s.quarantined.values()) == 0
    (rej,) = [f for r in records for f in r["quarantined_files"]]
    assert (rej["path"], rej["rule"], rej["reason"], rej["rows"]) == (bad, "input.event_time_not_future", "future",
                                                                     bad_rows)
    assert f"{bad_rows} of {bad_rows} rows" in rej["detail"]
    assert {r["future_allowance"] for r in records} == {2.0 * CYCLE} and {r["arrival_cycle"] for r in records} == {CYCLE}
    no_watermark_beyond_the_data(records, info)
    # the accepted rows are the clean lake's: streaming = the interval over them = the interval over this lake
    same_results(lake, clean, seed_query, f"{where}: a file ten years ahead")
    out = interval(spark, seed_query, lake, info, tmp_path / "interval")
    assert result_fingerprint(out, seed_query.name) == result_fingerprint(clean, seed_query.name)
    assert sum(r["quarantined"]["sr"]["future"] for r in read_metrics(out, seed_query.name)) == bad_rows


@pytest.mark.spark
@pytest.mark.parametrize("where", ["driver", "executors", "executors-sql"])
def test_a_few_future_rows_are_quarantined_one_by_one(spark, staged, seed_query, tmp_path, monkeypatch, where):
    """New rows in an early folder, three of them ten years ahead: those three are ``future``, the others join."""
    stage, info = staged
    lake = copy_lake(stage, tmp_path / "lake")
    arrival, good = early_file(lake)
    extra = os.path.join(lake.arrival_dir("store_returns", arrival), "part-00001.parquet")
    pq.write_table(shifted(pq.read_table(good), TEN_YEARS, rows=[0, 3, 5], ticket_offset=10**9), extra)

    s = run_stream(spark, seed_query, lake, config=stream_config(where, monkeypatch, max_files_per_trigger=8))
    assert s.quarantined["sr"].get("future") == 3 and sum(v.get("late", 0) for v in s.quarantined.values()) == 0
    rows, reasons = rejected_row_keys(lake, seed_query)
    assert reasons["future"] == 3 and sum(rows[("sr", extra)].values()) >= 3  # (and its NULL keys)
    no_watermark_beyond_the_data(read_metrics(lake, seed_query.name), info)
    accepted = accepted_lake(lake, seed_query, tmp_path / "accepted")
    assert pq.read_metadata(accepted.stream_file("store_returns", arrival, 1)).num_rows == \
        pq.read_metadata(extra).num_rows - sum(rows[("sr", extra)].values())
    out = interval(spark, seed_query, accepted, info, tmp_path / "interval")
    fp = same_results(lake, out, seed_query, f"{where}: three future rows")
    assert_same_results(read_results(out, seed_query.name), reference(seed_query, accepted), "accepted: vs DuckDB")
    # the interval run over the lake itself quarantines the same three rows and joins the rest alike
    direct = interval(spark, seed_query, lake, info, tmp_path / "direct")
    assert result_fingerprint(direct, seed_query.name) == fp
    assert sum(r["quarantined"]["sr"]["future"] for r in read_metrics(direct, seed_query.name)) == 3


@pytest.mark.spark
def test_the_gate_names_the_same_file_and_counts_the_same_rows(staged, seed_query, tmp_path):
    """One rule for the gate and the engine: the ten-years file fails ``input.event_time_not_future``; the three
    future rows of another file count as future rows (its cycle fails ``input.future_fraction_below_max``)."""
    from mjoin.gates.config import GateConfig
    from mjoin.gates.input import check_input

    stage, info = staged
    lake = copy_lake(stage, tmp_path / "lake")
    arrival, good = early_file(lake)
    folder = lake.arrival_dir("store_returns", arrival)
    pq.write_table(shifted(pq.read_table(good), TEN_YEARS), os.path.join(folder, "part-00001.parquet"))
    pq.write_table(shifted(pq.read_table(good), TEN_YEARS, rows=[0, 3, 5], ticket_offset=10**9),
                   os.path.join(folder, "part-00002.parquet"))
    res = check_input(seed_query, lake, arrival, arrival + CYCLE, cycle=CYCLE,
                      config=GateConfig(null_key_fraction_max=1.0, fraction_history=0, min_rows_per_cycle=0))
    assert res.failed_expectations == ["input.event_time_not_future", "input.future_fraction_below_max"]
    whole = next(f for f in res.failures if f.expectation == "input.event_time_not_future")
    assert [v["where"].split("/")[-1] for v in whole.values] == ["part-00001.parquet"]
    sr = next(x for x in res.details["streams"] if x["where"] == "sr")
    assert sr["future"] == 3 + pq.read_metadata(good).num_rows  # the whole file's rows and the three
    assert res.details["future_allowance_seconds"] == 2 * CYCLE and res.details["arrival_cycle_seconds"] == CYCLE
    # --set future_allowance=never: no row is future
    off = check_input(seed_query, lake, arrival, arrival + CYCLE, cycle=CYCLE, config=GateConfig.from_dict(
        {"null_key_fraction_max": 1.0, "fraction_history": 0, "min_rows_per_cycle": 0, "future_allowance": "never"}))
    assert "input.event_time_not_future" not in off.failed_expectations


@pytest.mark.spark
def test_a_promise_from_the_future_is_rejected(spark, staged, clean, seed_query, tmp_path):
    """A punctuation promising "no store_returns before 2036" would move sr's watermark as far as a row could:
    it is quarantined (``bad_punctuation``), the results are the clean lake's."""
    stage, info = staged
    lake = copy_lake(stage, tmp_path / "lake")
    arrival, _ = early_file(lake)
    punctuation.write(os.path.join(lake.arrival_dir("store_returns", arrival), "punctuation-0.json"),
                      event_time_before=arrival + TEN_YEARS)
    s = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=8))
    (rej,) = [f for r in read_metrics(lake, seed_query.name) for f in r["quarantined_files"]]
    assert rej["reason"] == "bad_punctuation" and "future" in rej["detail"] and rej["path"].endswith("punctuation-0.json")
    assert sum(v.get("late", 0) for v in s.quarantined.values()) == 0
    same_results(lake, clean, seed_query, "a promise ten years ahead")


@pytest.mark.spark
def test_configured_allowance_and_arrival_cycle(spark, staged, clean, seed_query, tmp_path):
    """``future_allowance`` set: rows just beyond it are future; ``arrival_cycle`` set: the default is two of it."""
    stage, info = staged
    lake = copy_lake(stage, tmp_path / "lake")
    arrival, good = early_file(lake)
    extra = os.path.join(lake.arrival_dir("store_returns", arrival), "part-00001.parquet")
    t = shifted(pq.read_table(good), 0, ticket_offset=10**9)
    us = pc.cast(t.column("ts"), pa.int64()).to_numpy().copy()
    us[:4] = (arrival + 30) * US  # 30 s after the folder's epoch: within two 20-s cycles, beyond a 25-s allowance
    pq.write_table(t.set_column(t.schema.get_field_index("ts"), "ts", pa.array(us, pa.int64()).cast(
        t.schema.field("ts").type)), extra)
    s = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, future_allowance=25.0))
    assert s.quarantined["sr"].get("future") == 4
    records = read_metrics(lake, seed_query.name)
    assert {r["future_allowance"] for r in records} == {25.0}
    accepted = accepted_lake(lake, seed_query, tmp_path / "accepted")
    out = interval(spark, seed_query, accepted, info, tmp_path / "interval", future_allowance=25.0)
    same_results(lake, out, seed_query, "allowance 25 s")
    # an arrival cycle of 10 s told: 20 s allowance, those rows future again
    lake2 = copy_lake(lake, tmp_path / "lake2")
    s2 = run_stream(spark, seed_query, lake2, config=EngineConfig(buckets=4, arrival_cycle=10.0))
    assert s2.quarantined["sr"].get("future") == 4
    assert {r["future_allowance"] for r in read_metrics(lake2, seed_query.name)} == {20.0}


@pytest.mark.spark
def test_a_job_started_on_the_first_folders_judges_them_as_future(spark, staged, clean, seed_query, tmp_path):
    """A young lake: every source has landed one folder when the job first runs (a cycle-mode run, or a job started
    as the feed starts), so the lake's arrival cycle cannot be inferred yet. A file ten years ahead in such a folder
    must still be quarantined whole as ``future`` and move no watermark; the rest lands and a second run joins it
    without a late row, the results the clean lake's."""
    stage, info = staged
    lake = Lake(str(tmp_path / "lake"))
    for t in TPCDS_TABLES:
        first = stage.arrivals(t)[0]
        shutil.copytree(stage.arrival_dir(t, first), lake.arrival_dir(t, first))
    arrival = stage.arrivals("store_returns")[0]
    bad = os.path.join(lake.arrival_dir("store_returns", arrival), "part-00001.parquet")
    pq.write_table(shifted(pq.read_table(lake.stream_file("store_returns", arrival)), TEN_YEARS), bad)
    bad_rows = pq.read_metadata(bad).num_rows
    s1 = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=8))
    for t in TPCDS_TABLES:
        for a in stage.arrivals(t)[1:]:
            shutil.copytree(stage.arrival_dir(t, a), lake.arrival_dir(t, a))
    s2 = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=8))
    records = read_metrics(lake, seed_query.name)
    future = sum(x.quarantined["sr"].get("future", 0) for x in (s1, s2))
    late = sum(v.get("late", 0) for x in (s1, s2) for v in x.quarantined.values())
    assert (future, late) == (bad_rows, 0)
    (rej,) = [f for r in records for f in r["quarantined_files"]]
    assert (rej["path"], rej["rule"]) == (bad, "input.event_time_not_future")
    no_watermark_beyond_the_data(records, info)
    same_results(lake, clean, seed_query, "a file ten years ahead in a young lake's first folder")
