"""The engine on a generated two-class synthetic workload: fixed orders that change class early and late (the hub
s0 probing key2, key, key2 or key, key2, key2; s2 via s0 or via s3 first) give DuckDB's result rows, and a class
change re-buckets the partial results."""
from __future__ import annotations

import pytest

from engine_helpers import T0, assert_same_results, synthetic_with_reference
from mjoin.evaluation.cycle_loop import covering_orders
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.interval import run_interval_plans
from mjoin.model.plan import make_plan, orders_from_permutation

START, END, CYCLE = T0 + 60, T0 + 180, 30  # 4 batches of 30 s after a 1-minute warm-up
SCHEDULE = {"defaults": {"zipf": 0.5, "domain": 40},
            "keys": {"s0": ["key", "key2"], "s2": ["key2"], "s3": ["key2"]},
            "streams": {"s1": {"rate": "2x"}, "s2": {"key2_domain": 60}},
            "events": [{"type": "step", "at": "50%", "stream": "s2", "param": "key2_domain", "value": 40},
                       {"type": "burst", "from": "40%", "to": "60%", "stream": "s3", "factor": 3}]}


@pytest.fixture(scope="module")
def two_class_synthetic(tmp_path_factory):
    return synthetic_with_reference(tmp_path_factory.mktemp("twoclass") / "w", START, END, streams=4, duration="3m",
                                    rate=2, window="1m", cycle="30s", seed=7, schedule=SCHEDULE)


def test_every_order_of_the_two_class_synthetic_query_equals_duckdb(spark, two_class_synthetic, tmp_path):
    lake, q, ref = two_class_synthetic
    assert len(ref) > 200, "the two-class join must be non-trivial"
    perms = [p for p in covering_orders(q.stream_names) if p[0] != "s1"][::2]  # 3 of the 6, s0 early and late
    plans = {"".join(p): make_plan(q, orders_from_permutation(q, p), "fixedOrder") for p in perms}
    summaries = run_interval_plans(spark, q, plans, lake, START, END, CYCLE, str(tmp_path),
                                   config=EngineConfig(buckets=2))
    assert len(summaries) == len(perms) == 3
    for name, summary in summaries.items():
        assert_same_results(read_results(summary.results_path), ref, f"two-class synthetic order {name}")
    # s0 probing s2 (key2), s1 (key), s3 (key2): two class changes, three stages, lookups per partial result
    rec = next(r for r in read_metrics(summaries["s2s1s0s3"].metrics_path) if r["result_rows"])
    s0 = next(c for c in rec["chains"] if c["stream"] == "s0")
    assert [(st["right"], st["stage"]) for st in s0["steps"]] == [("s2", 1), ("s1", 2), ("s3", 3)]
    assert s0["steps"][1]["lookups"] >= s0["steps"][0]["hits"]
