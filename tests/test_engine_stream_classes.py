"""Streaming queries with two and three attribute classes: batches holding any subset of the streams,
tuples that expire inside the batch that needs them, restarts with a backlog; streaming = interval.

The two reproductions (partial batches of a two-class query that crashed the job) use their spec and landings verbatim; the randomized test draws small
two- and three-class specs with unequal windows, landings and ``--max-files-per-trigger`` values and
compares the streaming results with the interval run (and both with DuckDB) as multisets of full rows.
"""
from __future__ import annotations

import os
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from engine_helpers import T0, assert_same_results, multiset, no_leaked_queries, reference, write_stream_file
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_interval, run_stream
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan
from mjoin.model.query import parse_query

pytestmark = pytest.mark.spark
_ = no_leaked_queries

SPEC = {
    "spec_version": 1, "name": "purge_stage2", "lateness": "0s",
    "streams": [
        {"name": "p", "source": "rp", "event_time": "ts", "window": "60s",
         "columns": {"ts": "timestamp", "ka": "long", "id": "long"}, "keys": ["ka"]},
        {"name": "m", "source": "rm", "event_time": "ts", "window": "600s",
         "columns": {"ts": "timestamp", "ka": "long", "kb": "long", "id": "long"}, "keys": ["ka", "kb"]},
        {"name": "x", "source": "rx", "event_time": "ts", "window": "30s",
         "columns": {"ts": "timestamp", "kb": "long", "id": "long"}, "keys": ["kb"]},
    ],
    "predicates": ["p.ka = m.ka", "m.kb = x.kb"],
    "output": ["p.id AS pid", "m.id AS mid", "x.id AS xid"],
}


def _table(rows: list[dict], columns: dict) -> pa.Table:
    out = {}
    for c, t in columns.items():
        vals = [r.get(c) for r in rows]
        if t == "timestamp":
            out[c] = pa.array([None if v is None else int((T0 + v) * 1_000_000) for v in vals], pa.timestamp("us"))
        else:
            out[c] = pa.array(vals, pa.int64())
    return pa.table(out)


def land_files(lake: Lake, query, files: list, mtimes=None) -> list[str]:
    """``files``: [(source, arrival offset s, [row dicts])], landed in this order; modification times
    in this order unless ``mtimes`` (one per file, seconds) says otherwise."""
    by_source = {s.source: s for s in query.streams}
    paths = []
    for k, (source, arrival, rows) in enumerate(files):
        part = sum(1 for p in paths if f"/{source}/arrival={T0 + arrival}/" in p)
        path = write_stream_file(lake, source, T0 + arrival, _table(rows, by_source[source].columns), part)
        m = (T0 + 1000 + k) if mtimes is None else mtimes[k]
        os.utime(path, ns=(0, int(m * 1e9)))
        paths.append(path)
    return paths


def _plan(query, orders: dict):
    return make_plan(query, orders, "fixedOrder")


ISSUE_PLAN = {"p": [("p", "m"), ("m", "x")], "m": [("m", "p"), ("m", "x")], "x": [("x", "m"), ("m", "p")]}


def _interval(spark, query, lake, plan, tmp_path, start=-1000, end=2000):
    s = run_interval(spark, query, plan, lake, T0 + start, T0 + end, end - start, str(tmp_path / "interval"),
                     config=EngineConfig(buckets=1, shuffle_partitions=1))
    return read_results(str(tmp_path / "interval"), query.name), s


WHERE = pytest.mark.parametrize("where", ["executors", "driver"])


def _cfg(where: str, **kw) -> EngineConfig:
    """Micro-batches on the executors (Spark jobs) or on the driver (small batches)."""
    return EngineConfig(driver_rows=0 if where == "executors" else 10**6, **kw)


@WHERE
def test_batch_with_streams_of_one_class_only(spark, tmp_path, where):
    """First reproduction (streaming a two-class query): the first micro-batch holds only x (class kb); it used to fail in
    BatchRunner.route with UNRESOLVED_COLUMN _k_c0."""
    q = parse_query(SPEC, source="purge_stage2")
    lake = Lake(str(tmp_path / "lake"))
    land_files(lake, q, [("rx", 100, [{"kb": 1, "id": 1, "ts": 100}]),
                         ("rm", 100, [{"ka": 5, "kb": 1, "id": 2, "ts": 101}]),
                         ("rp", 120, [{"ka": 5, "id": 3, "ts": 120}])])
    plan = _plan(q, ISSUE_PLAN)
    s = run_stream(spark, q, lake, plan=plan, config=_cfg(where, buckets=1, shuffle_partitions=1,
                                                          max_files_per_trigger=1))
    assert s.batches == [0, 1, 2]
    records = read_metrics(lake, q.name)
    assert [sum(1 for v in r["rows_in"].values() if v) for r in records] == [1, 1, 1]
    res = read_results(lake, q.name)
    assert multiset(res, ["pid", "mid", "xid"]) == multiset(
        __import__("pandas").DataFrame({"pid": [3], "mid": [2], "xid": [1]}))
    expected, _ = _interval(spark, q, lake, plan, tmp_path)
    assert_same_results(res, expected, "streaming vs interval")


@WHERE
def test_tuple_expiring_in_the_batch_that_needs_it(spark, tmp_path, where):
    """Second reproduction (streaming a two-class query): in the batch that brings p@120, x@100 expires at the batch's end;
    stage 2 (class kb) must still see it: (pid 3, mid 2, xid 1) is a result (120 - 100 < 30)."""
    q = parse_query(SPEC, source="purge_stage2")
    lake = Lake(str(tmp_path / "lake"))
    land_files(lake, q, [("rx", 100, [{"kb": 1, "id": 1, "ts": 100}]),
                         ("rm", 90, [{"ka": 900, "kb": 900, "id": 90, "ts": 99}]),
                         ("rm", 100, [{"ka": 5, "kb": 1, "id": 2, "ts": 101}]),
                         ("rx", 110, [{"kb": 2, "id": 5, "ts": 110}]),
                         ("rp", 120, [{"ka": 5, "id": 3, "ts": 120}, {"ka": 6, "id": 4, "ts": 135}]),
                         ("rm", 130, [{"ka": 901, "kb": 901, "id": 91, "ts": 130}])])
    plan = _plan(q, ISSUE_PLAN)
    s = run_stream(spark, q, lake, plan=plan, config=_cfg(where, buckets=1, shuffle_partitions=1,
                                                          max_files_per_trigger=2))
    assert len(s.batches) == 3
    assert sum(sum(v.values()) for v in s.quarantined.values()) == 0
    res = read_results(lake, q.name)
    assert list(res[["pid", "mid", "xid"]].itertuples(index=False, name=None)) == [(3, 2, 1)]
    expected, _ = _interval(spark, q, lake, plan, tmp_path)
    assert_same_results(res, expected, "streaming vs interval")
    assert_same_results(res, reference(q, lake), "streaming vs DuckDB")


# ---- randomized: small 2- and 3-class specs, random landings, streaming = interval ----------------------

def random_spec(rng: random.Random, n_classes: int) -> dict:
    """A chain of streams over ``n_classes`` attribute classes (k0, k1, ...): every class has two or
    three member streams; bridge streams carry the keys of two neighbouring classes."""
    streams, preds = [], []
    members: list[list[str]] = [[] for _ in range(n_classes)]
    name = iter("abcdefghij")
    for c in range(n_classes):
        for _ in range(rng.choice([1, 2]) if c else 2):
            s = next(name)
            members[c].append(s)
            streams.append({"name": s, "keys": {c: f"k{c}"}})
        if c + 1 < n_classes:  # a bridge into the next class
            s = next(name)
            members[c].append(s)
            members[c + 1].append(s)
            streams.append({"name": s, "keys": {c: f"k{c}", c + 1: f"k{c + 1}"}})
    for c, ms in enumerate(members):
        for a, b in zip(ms, ms[1:]):
            preds.append(f"{a}.k{c} = {b}.k{c}")
    spec_streams = []
    for st in streams:
        cols = {"ts": "timestamp", "id": "long", **{col: "long" for col in st["keys"].values()}}
        spec_streams.append({"name": st["name"], "source": f"src_{st['name']}", "event_time": "ts",
                             "window": f"{rng.choice([15, 30, 45, 60, 120])}s", "columns": cols,
                             "keys": list(st["keys"].values())})
    return {"spec_version": 1, "name": f"rand{n_classes}", "lateness": "0s", "streams": spec_streams,
            "predicates": preds, "output": [f"{st['name']}.id AS id_{st['name']}" for st in streams]}


def random_landing(rng: random.Random, query, cycles: int = 8, cycle: int = 10) -> list:
    """Arrival cycles in event-time order (like the lander): per cycle and stream 0-2 files (some
    streams skip cycles), rows with keys from a small domain and ts inside the cycle."""
    files = []
    next_id = 0
    for k in range(cycles):
        a = k * cycle
        for s in query.streams:
            for _ in range(rng.choice([0, 1, 1, 2])):
                rows = []
                for _ in range(rng.randint(1, 4)):
                    row = {"id": next_id, "ts": a + rng.random() * (cycle - 0.001)}
                    next_id += 1
                    for col in s.keys:
                        row[col] = rng.randint(0, 3)
                    rows.append(row)
                files.append((s.source, a, rows))
    return files


def _random_orders(rng: random.Random, query) -> dict:
    """A valid random probe order per stream: repeatedly step along a random predicate edge from the
    streams joined so far."""
    orders = {}
    edges = [(p.left, p.right) for p in query.predicates]
    for s in query.stream_names:
        joined, steps = [s], []
        while len(joined) < len(query.stream_names):
            cand = [(a, b) for a, b in edges if a in joined and b not in joined] + \
                   [(b, a) for a, b in edges if b in joined and a not in joined]
            step = rng.choice(cand)
            steps.append(step)
            joined.append(step[1])
        orders[s] = steps
    return orders


@pytest.mark.slow
@pytest.mark.parametrize("seed,where", [(11, "driver"), (23, "executors"), (37, "driver"), (41, "executors")])
def test_random_multiclass_streaming_equals_interval(spark, tmp_path, seed, where):
    """Random 2- and 3-class specs and landings; the job runs on the first half, stops, the registry's
    active plan changes, the rest lands (a backlog), the job restarts with another batch size."""
    from mjoin.lake.registry import PlanRegistry

    rng = random.Random(seed)
    spec = random_spec(rng, 2 if seed % 2 else 3)
    q = parse_query(spec, source=spec["name"])
    assert len(q.attribute_classes) >= 2
    lake = Lake(str(tmp_path / "lake"))
    files = random_landing(rng, q)
    half = len(files) // 2
    mtimes = [rng.uniform(1e9, 2e9) for _ in files]  # modification times play no part
    land_files(lake, q, files[:half], mtimes[:half])
    plan = make_plan(q, _random_orders(rng, q), "fixedOrder")
    max_files = rng.choice([1, 2, 3, 5])
    cfg = _cfg(where, buckets=2, shuffle_partitions=2, max_files_per_trigger=max_files)
    s1 = run_stream(spark, q, lake, plan=plan, config=cfg)
    assert len(s1.batches) == whole_folder_batches(q, files[:half], max_files)
    reg = PlanRegistry(lake, q.name)
    reg.activate(reg.publish(make_plan(q, _random_orders(rng, q), "fixedOrder")), by="test")
    land_rest(lake, q, files, half, mtimes)
    max_files2 = rng.choice([1, 2, 4, 7])
    s2 = run_stream(spark, q, lake, plan=plan, config=_cfg(where, buckets=2, shuffle_partitions=2,
                                                           max_files_per_trigger=max_files2))
    assert s2.batches[0] == s1.batches[-1] + 1 and len(s2.batches) == whole_folder_batches(q, files[half:], max_files2)
    assert [sw["to"] for sw in s2.plan_switches] == [1]
    assert sum(sum(v.values()) for v in list(s1.quarantined.values()) + list(s2.quarantined.values())) == 0
    res = read_results(lake, q.name)
    expected, _ = _interval(spark, q, lake, plan, tmp_path)
    ref = reference(q, lake)
    assert len(ref) > 0, "the random workload should join something"
    assert_same_results(expected, ref, f"interval vs DuckDB (seed {seed})")
    assert_same_results(res, expected, f"streaming ({max_files}, then {max_files2} files per batch, a restart and "
                                       f"a plan switch) vs interval (seed {seed})")


def whole_folder_batches(query, files: list, cap: int) -> int:
    """How many batches ``files`` take when a batch holds at most ``cap`` files but never splits an arrival
    folder (a folder larger than the cap is read alone): folders in arrival order, then the sources' order."""
    rank = {s.source: k for k, s in enumerate(query.streams)}
    sizes = [n for _, n in sorted(Counter((arrival, rank[source]) for source, arrival, _ in files).items())]
    batches, i = 0, 0
    while i < len(sizes):
        taken, i = sizes[i], i + 1
        while i < len(sizes) and taken + sizes[i] <= cap:
            taken, i = taken + sizes[i], i + 1
        batches += 1
    return batches


def land_rest(lake: Lake, query, files: list, half: int, mtimes: list) -> None:
    """Land ``files[half:]`` after ``files[:half]`` (part numbers continue inside an arrival folder)."""
    by_source = {s.source: s for s in query.streams}
    for k in range(half, len(files)):
        source, arrival, rows = files[k]
        folder = lake.arrival_dir(source, T0 + arrival)
        part = len(os.listdir(folder)) if os.path.isdir(folder) else 0
        path = write_stream_file(lake, source, T0 + arrival, _table(rows, by_source[source].columns), part)
        os.utime(path, ns=(0, int(mtimes[k] * 1e9)))
