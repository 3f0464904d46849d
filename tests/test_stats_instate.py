"""The job's own statistics counted from a key-bucketed, key-sorted state (mjoin.stats.instate) equal the statistics
kernel's over the same rows (mjoin.stats.kernel, tested against pandas and DuckDB in test_stats_kernel.py): every
statistic, the histogram, the per-cell statistics and the per-cycle meta, for any split into buckets, key groups
that are and are not a function of the bucket's key, one cycle or a backlog of many, and a state that also holds
rows of later cycles. Pure numpy and pyarrow: no Spark."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from mjoin.engine.compiled import key_name
from mjoin.engine.operator import KeyedRows
from mjoin.lake.layout import Lake
from mjoin.model.keygroups import group_of
from mjoin.model.query import parse_query
from mjoin.stats import kernel
from mjoin.stats.emitted import JobStatistics, merge_spans
from mjoin.stats.instate import Emission, range_rule, read_doc
from mjoin.stats.job import StatsConfig, assemble_run
from mjoin.stats.sources import US, Grid
from test_stats_helpers import FOUR_STREAMS, T0

TAU = 10
J0 = T0 // TAU  # the cycle starting at T0 (cycle indices are absolute: start // tau)

TWO_CLASS = {
    "spec_version": 1, "name": "two_class_test",
    "streams": [
        {"name": "a", "source": "src_a", "event_time": "ts", "window": "45s",
         "columns": {"ts": "timestamp", "x": "long", "y": "long"}, "keys": ["x", "y"]},
        {"name": "b", "source": "src_b", "event_time": "ts", "window": "30s",
         "columns": {"ts": "timestamp", "x": "long"}, "keys": ["x"]},
        {"name": "c", "source": "src_c", "event_time": "ts", "window": "60s",
         "columns": {"ts": "timestamp", "x": "long", "y": "long"}, "keys": ["x", "y"]},
    ],
    "predicates": ["a.x = b.x", "b.x = c.x", "a.y = c.y"],
    "output": ["a.x"],
}


def _data(q, rng, rows=400, keys=25, span=(-100, 400)):
    """Per stream: event times (micros; whole seconds, so with ties on every boundary) and its keys."""
    out = {}
    for s in q.streams:
        ts = (T0 + rng.integers(span[0], span[1], rows)) * US
        cols = {"ts": ts}
        for k in s.keys:
            cols[k] = rng.integers(0, keys, rows) + (1000 if k == "y" else 0)
        out[s.name] = pd.DataFrame(cols)
    return out


def _states(q, data, buckets):
    """{(class, bucket): {stream: KeyedRows}} as the engine holds them: per class, each stream's rows bucketed by
    pmod(key, buckets), sorted by key (stable)."""
    classes = q.all_classes
    out = {}
    for s in q.streams:
        df = data[s.name]
        mine = q.all_classes_of(s.name)
        for c in mine:
            k = df[q.key_column(s.name, c)].to_numpy()
            for b in range(buckets):
                sel = np.flatnonzero(np.mod(k, buckets) == b)
                cols = {"_ts": pa.array(df["ts"].to_numpy()[sel])}
                for c2 in mine:
                    cols[key_name(c2)] = pa.array(df[q.key_column(s.name, c2)].to_numpy()[sel])
                out.setdefault((classes.index(c), b), {})[s.name] = KeyedRows(pa.table(cols), key_name(c))
    return out


def _kernel_rows(q, data, rule):
    """The kernel's input: every row once per class of its stream."""
    classes = q.all_classes
    parts = []
    for sid, s in enumerate(q.streams):
        df = data[s.name]
        g = (group_of(df[q.key_column(s.name, rule["attr_class"])].to_numpy(), rule) if rule
             else np.zeros(len(df), np.int64))
        for c in q.all_classes_of(s.name):
            parts.append(pa.table({"ci": pa.array(np.full(len(df), classes.index(c), np.int32)),
                                   "sid": pa.array(np.full(len(df), sid, np.int32)),
                                   "t": pa.array(df["ts"].to_numpy()), "g": pa.array(g),
                                   "key": pa.array(df[q.key_column(s.name, c)].to_numpy())}))
    return pa.concat_tables(parts)


def _emitted(q, data, rule, lo, hi, buckets, *, key_ranges=64, lake=None):
    """The job's counts over every (class, bucket), reported by two "tasks"; (job, emission, task docs)."""
    job = JobStatistics(q, lake or Lake("/nonexistent/lake"), TAU, key_buckets=16, key_ranges=key_ranges,
                        histogram_buckets=8)
    em = job.emission({"jobstats": {"cycle_seconds": TAU, "next": lo}}, hi * TAU * US + 1, Plan(rule))
    assert em.hi == hi and em.lo == lo
    docs = []
    states = _states(q, data, buckets)
    for task in range(2):  # two "tasks", each with some of the (class, bucket)s
        counter = em.task()
        for (ci, b), st in sorted(states.items()):
            if b % 2 == task:
                load = counter.loader(lambda c, s, b_, st=st: st.get(s))
                for stream in st:
                    load(q.all_classes[ci], stream, b)
                counter.bucket(q.all_classes[ci])
        docs.append(counter.doc())
    assert not any(d.get("error") for d in docs), docs
    return job, em, docs


class Plan:
    def __init__(self, rule, version=3):
        self.partitioning, self.version, self.source = rule, version, "registry"


def _reference(q, data, rule, lo, hi, span, key_ranges=64):
    classes = q.all_classes
    grid = Grid(lo * TAU * US, hi * TAU * US, TAU * US)
    cells = {}
    if len(classes) == 1:
        cells["buckets"] = {"method": "hash", "attr_class": classes[0], "groups": 16}
        if key_ranges and span > 1:
            cells["ranges"] = range_rule(classes[0], span, key_ranges)
    stream_classes = [[classes.index(c) for c in q.all_classes_of(s)] for s in q.stream_names]
    p = kernel.Params(grid.t0_us, grid.t1_us, grid.tau_us, tuple(int(s.window * US) for s in q.streams),
                      tuple(cs[0] for cs in stream_classes),
                      tuple(tuple(i for i, cs in enumerate(stream_classes) if ci in cs) for ci in range(len(classes))), 8,
                      tuple(("mod", 16) if k == "buckets" else ("range", tuple(r["bounds"])) for k, r in cells.items()))
    red = kernel.reduce_partials(kernel.partials(_kernel_rows(q, data, rule), p), p, len(classes))
    return assemble_run(q, grid, StatsConfig(partitioning=rule, histogram_buckets=8, key_buckets=16,
                                             key_ranges=key_ranges), red, cells), red


def _same(got, want):
    pd.testing.assert_frame_equal(got.rows, want.rows, check_like=False)
    key = ["cycle_start", "stream", "attr_class", "bucket"]
    pd.testing.assert_frame_equal(got.histogram.sort_values(key).reset_index(drop=True),
                                  want.histogram.sort_values(key).reset_index(drop=True), check_dtype=False)
    assert set(got.cells) == set(want.cells)
    for kind in want.cells:
        assert got.cells[kind][0] == want.cells[kind][0]
        pd.testing.assert_frame_equal(got.cells[kind][1], want.cells[kind][1])
    strip = ("run", "source", "job", "quarantined")
    assert {e: {k: v for k, v in m.items() if k not in strip} for e, m in got.cycle_meta.items()} == \
        {e: {k: v for k, v in m.items() if k not in strip} for e, m in want.cycle_meta.items()}


def _assembled(job, em, docs, hi, rule):
    """What the driver assembles from the tasks' reports: (run, span, first cycle)."""
    table, span, first = merge_spans([read_doc(d) for d in docs], em)
    start = em.lo if em.lo is not None else first
    run, _ = job.assemble(table, start, hi, span, {}, rule, {"batch_id": 7})
    return run, span, start


RULES = [None, {"method": "hash", "attr_class": "c0", "groups": 3},
         {"method": "range", "attr_class": "c0", "bounds": [5, 12]}]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("buckets", [1, 4])
@pytest.mark.parametrize("cycles", [1, 3, 20])  # one cycle, a few (kappa per cycle), a backlog (the run union)
def test_counts_from_the_state_equal_the_kernel(rule, buckets, cycles):
    q = parse_query(FOUR_STREAMS)
    rng = np.random.default_rng(buckets * 10 + cycles)
    data = _data(q, rng, span=(-150, 420))
    data["d"] = data["d"].iloc[:0]  # a stream without rows
    lo = J0 + 4
    hi = lo + cycles
    job, em, docs = _emitted(q, data, rule, lo, hi, buckets)
    got, span, _ = _assembled(job, em, docs, hi, rule)
    want, red = _reference(q, data, rule, lo, hi, span)
    _same(got, want)
    edges = want.rows[want.rows.entity == "edge"]
    assert edges["m"].sum() > 0 and edges["s"].sum() > edges["m"].sum()  # the data exercise the edges
    assert set(got.cells) == {"buckets", "ranges"}


@pytest.mark.parametrize("rule", [None, {"method": "hash", "attr_class": "c0", "groups": 3},
                                  {"method": "range", "attr_class": "c0", "bounds": [4]}])
def test_two_attribute_classes_and_groups_of_another_class(rule):
    """A stream in two classes is counted once (its first class) for the stream statistics, in each class for
    the edges; the edges of class c1 under key groups of c0 match within a group, not only a key."""
    q = parse_query(TWO_CLASS)
    rng = np.random.default_rng(5)
    data = _data(q, rng, rows=300, keys=12)
    job, em, docs = _emitted(q, data, rule, J0 + 2, J0 + 8, 3)
    got, span, _ = _assembled(job, em, docs, J0 + 8, rule)
    want, _ = _reference(q, data, rule, J0 + 2, J0 + 8, span)
    _same(got, want)
    assert not got.cells  # per-cell statistics: queries on one attribute class only


def test_first_emission_starts_at_the_oldest_row():
    """Without a cycle to start from (the first watermark), the tasks start at the cycle whose end reaches the
    oldest row they hold; the driver takes the earliest."""
    q = parse_query(FOUR_STREAMS)
    data = _data(q, np.random.default_rng(11), span=(30, 300))
    oldest = min(int(df["ts"].min()) for df in data.values())
    job, em, docs = _emitted(q, data, None, None, J0 + 40, 4)
    got, span, start = _assembled(job, em, docs, J0 + 40, None)
    assert start == -(-(oldest - TAU * US) // (TAU * US))
    want, _ = _reference(q, data, None, start, J0 + 40, span)
    _same(got, want)


def test_range_cells_of_buckets_with_other_spans_merge_to_the_largest():
    """Each bucket counts range cells over the span its own keys need; merged, the cells are those of the
    largest span (ranges of a power-of-two span nest), and the emission's span never shrinks."""
    q = parse_query(FOUR_STREAMS)
    data = _data(q, np.random.default_rng(3), keys=40)
    for s in ("a", "b"):  # one bucket holds a much larger key
        data[s].loc[0, q.stream(s).keys[0]] = 4 * 1000  # 4000 % 4 == 0: bucket 0
    job, em, docs = _emitted(q, data, None, J0 + 3, J0 + 9, 4)
    got, span, _ = _assembled(job, em, docs, J0 + 9, None)
    assert span == 4096
    want, _ = _reference(q, data, None, J0 + 3, J0 + 9, span)
    _same(got, want)


def test_no_positive_key_means_no_range_cells():
    q = parse_query(FOUR_STREAMS)
    data = _data(q, np.random.default_rng(9))
    for s in data:
        for k in q.stream(s).keys:
            data[s][k] = -data[s][k] - 1
    job, em, docs = _emitted(q, data, None, J0 + 3, J0 + 6, 2)
    got, span, _ = _assembled(job, em, docs, J0 + 6, None)
    assert span == 1 and set(got.cells) == {"buckets"}
    want, _ = _reference(q, data, None, J0 + 3, J0 + 6, span)
    _same(got, want)


def test_quarantined_rows_per_cycle():
    """The rows a task quarantines with an event time are counted per cycle for the reasons that have one; the
    NULL-key rows become the cycle's NULL-key counts (rows, no key: not tuples)."""
    q = parse_query(FOUR_STREAMS)
    em = Emission(tau_us=TAU * US, lo=0, hi=5, streams=tuple(q.stream_names), windows_us=(1,) * 4,
                  first_class=(0,) * 4, classes=("c0",), class_members=((0, 1, 2, 3),), rule=None)
    rej = pa.table({"_s": pa.array([0, 0, 1, 1, 2], pa.int32()),
                    "_reason": ["null_key", "null_key", "bad_type", "late", "bad_time"],
                    "_ts": pa.array([T0 * US, (T0 + 15) * US, (T0 + 1) * US, T0 * US, None], pa.int64())})
    j0 = T0 // TAU
    assert em.rejected(rej) == {"a": {"null_key": {str(j0): 1, str(j0 + 1): 1}}, "b": {"bad_type": {str(j0): 1}}}
    # the driver adds them to the cycle's rows: NULL keys in the meta, not in tuples
    job = JobStatistics(q, Lake("/nonexistent/lake"), TAU, key_buckets=0, key_ranges=0, histogram_buckets=8)
    table = pa.concat_tables([kernel.OUT_SCHEMA.empty_table()])
    run, grid = job.assemble(table, j0, j0 + 2, 1, {str(j0): {"a": {"null_key": 3}}}, None, {"batch_id": 1})
    meta = run.cycle_meta[j0 * TAU]
    assert meta["null_keys"]["a"] == {"ka": 3.0} and meta["quarantined"] == {"a": {"null_key": 3}}
    assert run.rows["tuples"].sum() == 0 and meta["source"] == "job"
    assert len(run.rows) == 2 * (4 + len(q.directed_edges))  # complete rows for every cycle
