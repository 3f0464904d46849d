"""Band predicates (PSP) beside an equi-key: applied inside the operator after the key lookup. The TPC-DS
query of similar return amounts equals DuckDB's reference (count and every output column) under every
probe order, in interval and streaming mode; the loader names what is wrong with a band."""
from __future__ import annotations

from itertools import permutations

import pytest

from engine_helpers import assert_same_results, no_leaked_queries, reference, replay_tpcds
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results, result_fingerprint
from mjoin.engine.runs import run_interval, run_stream
from mjoin.engine.interval import run_interval_plans
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.model.query import QuerySpecError, load_query, parse_query

_ = no_leaked_queries


@pytest.fixture(scope="module")
def band_lake(tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("band") / "lake"))
    info = replay_tpcds(lake, 0.01, rate=40.0, arrival_cycle=20, tables=("store_returns", "web_returns",
                                                                         "catalog_returns"))
    return lake, info


@pytest.mark.spark
def test_band_query_equals_duckdb_in_every_order(spark, band_lake, tmp_path):
    lake, info = band_lake
    q = load_query("tpcds_returns_similar_amounts")
    ref = reference(q, lake)
    unbanded = reference(parse_query(dict(q.to_spec(), predicates=[str(p) for p in q.predicates]), source="x"), lake)
    assert 50 < len(ref) < len(unbanded)  # the bands filter something, not everything
    plans = {"".join(p): make_plan(q, orders_from_permutation(q, p), "fixedOrder") for p in permutations(q.stream_names)}
    start = info["start"] - 3600
    summaries = run_interval_plans(spark, q, plans, lake, start, info["end"] + 60, 300, str(tmp_path / "orders"),
                                   config=EngineConfig(buckets=4))
    fps = set()
    for name, s in summaries.items():
        assert_same_results(read_results(s.results_path), ref, f"band query, order {name}")
        fps.add(str(result_fingerprint(s.results_path)))
    assert len(fps) == 1
    # the bands filter during probing: fewer matches than the key alone finds
    one = read_metrics(summaries["srwrcr"].metrics_path)
    assert sum(st["matches"] for r in one for c in r["chains"] for st in c["steps"]) > 0


@pytest.mark.spark
@pytest.mark.parametrize("where", ["driver", "executors"])
def test_band_query_streaming_equals_interval(spark, band_lake, tmp_path, where):
    lake, info = band_lake
    q = load_query("tpcds_returns_similar_amounts")
    import shutil

    mine = Lake(str(tmp_path / "lake"))
    shutil.copytree(lake.streams(), mine.streams())
    run_stream(spark, q, mine, config=EngineConfig(buckets=4, max_files_per_trigger=5,
                                                   driver_rows=0 if where == "executors" else 10**6))
    assert_same_results(read_results(mine, q.name), reference(q, lake), f"band query streaming on the {where}")


def test_band_validation_names_the_problem():
    base = load_query("tpcds_returns_similar_amounts").to_spec()

    def parse(preds):
        return parse_query(dict(base, predicates=preds), source="t")

    keys = [str(p) for p in load_query("tpcds_returns_similar_amounts").predicates]
    with pytest.raises(QuerySpecError, match=r"predicates\[2\].*sr.sr_ticket_numbr is not a declared column"):
        parse(keys + ["abs(sr.sr_ticket_numbr - wr.wr_return_amt) <= 5"])
    with pytest.raises(QuerySpecError, match="same column and width"):
        parse(keys + ["sr.sr_return_amt BETWEEN wr.wr_return_amt - 5 AND wr.wr_return_amt + 6"])
    with pytest.raises(QuerySpecError, match="sr_addr_sk' is not used by any predicate"):  # keys without a key predicate
        parse(["abs(sr.sr_return_amt - wr.wr_return_amt) <= 5"])
    q = parse(keys + ["abs(sr.sr_return_amt - wr.wr_return_amt) <= 5"])
    assert [str(b) for b in q.bands] == ["abs(sr.sr_return_amt - wr.wr_return_amt) <= 5"]
    assert parse_query(q.to_spec(), source="round trip") == q
