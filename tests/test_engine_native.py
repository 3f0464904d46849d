"""The spark-native baseline: Spark's chained stream-stream joins in the written order, same results."""
from __future__ import annotations

import json

import pytest

from engine_helpers import T0, assert_same_results, reference, replay_tpcds
from mjoin.cli import main
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_stream
from mjoin.engine.native import native_plan, plan_info
from mjoin.lake.layout import Lake
from mjoin.model.query import parse_query

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def tpcds_lake(tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("native") / "lake"))
    return lake, replay_tpcds(lake, 0.01)


class _Plan:
    def __init__(self, text):
        self.text = text

    def explainInternal(self, extended):
        return self.text


def _order(text: str) -> list:
    return plan_info(type("Q", (), {"_jsq": _Plan(text)})())["join_order"]


def test_physical_plan_joins_in_the_written_order(spark, tpcds_lake, seed_query):
    """Spark executes the order it is given: the physical plan's join chain is the spec's order,
    for the spec as written and for the same query written in another order."""
    lake, _ = tpcds_lake
    assert spark.conf.get("spark.sql.cbo.joinReorder.enabled") == "false"
    text = native_plan(spark, seed_query, lake)
    assert text.count("StreamingSymmetricHashJoin") == 3
    assert _order(text) == ["cu", "sr", "wr", "cr"]
    spec = seed_query.to_spec()
    spec["streams"] = [spec["streams"][i] for i in (3, 1, 0, 2)]
    reordered = parse_query(spec)
    assert _order(native_plan(spark, reordered, lake)) == ["cr", "sr", "cu", "wr"]


def test_native_interval_through_the_cli_equals_reference(spark, tpcds_lake, seed_query, tmp_path, capsys):
    lake, info = tpcds_lake
    start, end = T0 + 300, info["end"] + 1
    out = str(tmp_path / "native")
    rc = main(["run", "--engine", "spark-native", "--query", "tpcds_returns_by_address", "--lake", lake.root,
               "--from", str(start), "--to", str(end), "--cycle", "450", "--out", out, "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["engine"] == "spark-native"
    ref = reference(seed_query, lake, start * 1_000_000, end * 1_000_000)
    assert_same_results(read_results(out, seed_query.name), ref, "spark-native")
    assert summary["result_rows"] == len(ref)
    assert summary["extra"]["join_order"] == ["cu", "sr", "wr", "cr"]
    assert summary["extra"]["join_strategies"] == ["StreamingSymmetricHashJoin"] * 3
    records = read_metrics(out, seed_query.name)
    assert [r["batch_id"] for r in records][:3] == [0, 1, 2]
    assert all(r["engine"] == "spark-native" for r in records)
    assert max(r["state_tuples"]["total"] for r in records) > 0
    assert sum(r["rows_in"]["sr"] for r in records if r["batch_id"] >= 1) == summary["rows_in"]["sr"]
    assert summary["quarantined"]["sr"]["null_key"] > 0  # the same validation as mjoin


def test_native_streaming_mode(spark, tpcds_lake, seed_query, tmp_path):
    lake, info = tpcds_lake
    out = Lake(lake.root, namespace="native-stream")
    s = run_stream(spark, seed_query, out, engine="spark-native")
    assert s.engine == "spark-native" and s.batches
    assert s.extra["join_order"] == ["cu", "sr", "wr", "cr"]
    assert_same_results(read_results(out, seed_query.name), reference(seed_query, lake), "spark-native stream")
