"""Punctuations (PJoin): a stream's promise that a key ends lets the join drop every state tuple of it once
the promising stream holds none; results stay identical (they only remove what cannot join), the state
shrinks. Streaming (on the driver and on the executors) and interval runs, eager and lazy."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from engine_helpers import T0, assert_same_results, no_leaked_queries, reference, write_stream_file
from mjoin.model import punctuation
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_interval, run_stream
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.model.query import parse_query

pytestmark = pytest.mark.spark
_ = no_leaked_queries

SPEC = {
    "spec_version": 1, "name": "ending_keys", "lateness": "0s",
    # a's window is short, b's and c's long: once a promises a key's end and its own tuples of the key
    # expired, b's and c's tuples of it would sit in the state for minutes without joining anything
    "streams": [{"name": n, "source": f"e{n}", "event_time": "ts", "window": w,
                 "columns": {"ts": "timestamp", "k": "long", "id": "long"}, "keys": ["k"]}
                for n, w in (("a", "20s"), ("b", "300s"), ("c", "300s"))],
    "predicates": ["a.k = b.k", "b.k = c.k"],
    "output": ["a.id AS a", "b.id AS b", "c.id AS c", "a.k AS k"],
}
CYCLE = 10
CYCLES = 40


def land_ending_keys(lake: Lake, seed: int = 5, punctuate: bool = True) -> dict:
    """Key k lives for 4 arrival cycles from cycle k // 3; every stream sends it while it lives. After a's
    last cycle of a key, a promises it ends (a punctuation in a's folder, after its data)."""
    rng = np.random.default_rng(seed)
    ids = 0
    promised = 0
    for cyc in range(CYCLES):
        a0 = cyc * CYCLE
        live = [k for k in range(0, 3 * CYCLES) if k // 3 <= cyc < k // 3 + 4]
        for n in "abc":
            m = 12
            ks = rng.choice(live, m) if live else np.zeros(0, np.int64)
            ts = np.sort(rng.uniform(a0, a0 + CYCLE, len(ks)))
            tbl = pa.table({"ts": pa.array(((T0 + ts) * 1e6).astype(np.int64), pa.timestamp("us")),
                            "k": pa.array(ks, pa.int64()), "id": pa.array(np.arange(ids, ids + len(ks)), pa.int64())})
            ids += len(ks)
            write_stream_file(lake, f"e{n}", T0 + a0, tbl)
            if n == "a" and punctuate:
                ended = [k for k in live if cyc == k // 3 + 3]
                if ended:
                    punctuation.write(os.path.join(lake.arrival_dir("ea", T0 + a0), "punctuation-0.json"),
                                      column="k", keys=ended)
                    promised += len(ended)
    return {"promised": promised}


def _plan(q, mode: str, threshold: int = 1000):
    return make_plan(q, orders_from_permutation(q, ["b", "a", "c"]), "fixedOrder",
                     options={"punctuation": mode, "punctuation_threshold": threshold})


@pytest.fixture(scope="module")
def query():
    return parse_query(SPEC, source="ending_keys")


@pytest.mark.parametrize("mode,where", [("eager", "driver"), ("lazy", "driver"), ("eager", "executors")])
def test_streaming_with_punctuations_equals_without(spark, query, tmp_path, mode, where):
    with_p, without = Lake(str(tmp_path / "with")), Lake(str(tmp_path / "without"))
    info = land_ending_keys(with_p)
    land_ending_keys(without, punctuate=False)
    cfg = EngineConfig(buckets=2, max_files_per_trigger=5, driver_rows=0 if where == "executors" else 10**6)
    s1 = run_stream(spark, query, with_p, plan=_plan(query, mode, threshold=30), config=cfg)
    s0 = run_stream(spark, query, without, plan=_plan(query, "eager"), config=cfg)
    ref = reference(query, without)
    assert len(ref) > 100
    assert_same_results(read_results(without, query.name), ref, "without punctuations")
    assert_same_results(read_results(with_p, query.name), ref, f"with punctuations ({mode}, {where})")
    r1, r0 = read_metrics(with_p, query.name), read_metrics(without, query.name)
    assert sum(r["punctuation_files"] for r in r1) > 0
    p = {k: sum((r["punctuation"] or {}).get(k, 0) for r in r1) for k in ("promised", "purged", "skipped", "violations")}
    assert p["promised"] == info["promised"] and p["purged"] > 0 and p["violations"] == 0, p
    state1 = [sum(r["state_tuples"].values()) for r in r1]
    state0 = [sum(r["state_tuples"].values()) for r in r0]
    # the state is smaller over the run (batches differ: punctuation files count in the file cap)
    assert np.mean(state1) < 0.6 * np.mean(state0), (state1, state0)
    if mode == "lazy":  # purges happen in bursts of >= the threshold per bucket
        purges = [(r["punctuation"] or {}).get("purged", 0) for r in r1]
        assert all(x == 0 or x >= 30 for x in purges), purges
    assert sum(sum(v.values()) for v in s1.quarantined.values()) == 0


def test_interval_with_punctuations_equals_without(spark, query, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    land_ending_keys(lake)
    start, end = T0 + 60, T0 + CYCLES * CYCLE
    out = {}
    for mode in ("eager", "off"):
        s = run_interval(spark, query, _plan(query, mode), lake, start, end, 30, str(tmp_path / mode),
                         config=EngineConfig(buckets=2))
        out[mode] = (read_results(s.results_path), read_metrics(s.metrics_path))
    ref = reference(query, lake, start * 1_000_000, end * 1_000_000)
    assert_same_results(out["eager"][0], ref, "interval with punctuations")
    assert_same_results(out["off"][0], ref, "interval, punctuations off")
    eager, off = out["eager"][1], out["off"][1]
    assert sum((r["punctuation"] or {}).get("purged", 0) for r in eager) > 0
    assert all(r["punctuation"] is None for r in off)
    assert sum(sum(r["state_tuples"].values()) for r in eager) < sum(sum(r["state_tuples"].values()) for r in off)


def test_punctuation_format_is_validated(tmp_path):
    with pytest.raises(punctuation.PunctuationError, match="column"):
        punctuation.parse({"punctuation_version": 1, "keys": [1]})
    with pytest.raises(punctuation.PunctuationError, match="nothing"):
        punctuation.parse({"punctuation_version": 1})
    with pytest.raises(punctuation.PunctuationError, match="punctuation-<n>.json"):
        punctuation.write(str(tmp_path / "p.json"), column="k", keys=[1])
    p = punctuation.read(punctuation.write(str(tmp_path / "punctuation-1.json"), column="k", keys=[3, 1],
                                           ranges=[(10, 20)], event_time_before="2026-01-01T00:00:00Z"))
    assert p.keys == (3, 1) and p.ranges == ((10, 20),) and p.event_time_before == T0
    lo, hi = punctuation.merged_ranges(np.array([5, 1, 3, 10]), np.array([6, 2, 4, 12]))
    assert lo.tolist() == [1, 10] and hi.tolist() == [6, 12]
    assert punctuation.covered(np.array([0, 1, 6, 7, 11]), lo, hi).tolist() == [False, True, True, False, True]
