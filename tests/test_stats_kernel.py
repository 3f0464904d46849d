"""The statistics kernel (numpy, no Spark) against pandas / DuckDB computed independently: the
per-partition partial counts summed over any split of the rows by key give every statistic."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from mjoin.stats import kernel
from mjoin.stats.job import StatsConfig, _assemble
from mjoin.stats.sources import US, Grid
from test_stats_helpers import T0, compare, four_streams_query, measured, reference_edges, reference_streams
from test_stats_job import EDGE_COLS, N, STREAM_COLS, TAU, _dataset

HASH3 = ({"method": "hash", "attr_class": "c0", "groups": 3}, lambda k: np.mod(k, 3))


def _rows(q, data, rule_fn=None) -> pa.Table:
    """The routed rows the Spark job hands the kernel: (ci, sid, t, g, key), the interval plus lead-in."""
    cols = {c: [] for c in ("sid", "t", "g", "key")}
    for sid, s in enumerate(q.streams):
        df = data.get(s.name)
        if df is None:
            continue
        t = np.round(df["ts"].to_numpy() * US).astype(np.int64)
        keep = (t > (T0 - s.window) * US) & (t <= (T0 + N * TAU) * US)
        k = df[s.keys[0]].to_numpy(dtype=float)[keep]
        cols["sid"].append(np.full(keep.sum(), sid))
        cols["t"].append(t[keep])
        cols["key"].append(k)
        cols["g"].append(np.zeros(len(k)) if rule_fn is None
                         else np.where(np.isnan(k), np.nan, rule_fn(np.nan_to_num(k).astype(np.int64))))
    sid, t, g, key = (np.concatenate(cols[c]) for c in ("sid", "t", "g", "key"))
    return pa.table({"ci": pa.array(np.zeros(len(sid), np.int32)), "sid": pa.array(sid.astype(np.int32)),
                     "t": pa.array(t), "g": pa.array(g, mask=np.isnan(g)).cast(pa.int64()),
                     "key": pa.array(key, mask=np.isnan(key)).cast(pa.int64())})


def _run(q, table, parts, rule=None, buckets=8):
    """Split ``table`` into ``parts`` partitions by key (NULL keys anywhere), run the kernel on each,
    reduce and assemble the statistics rows."""
    grid = Grid(T0 * US, (T0 + N * TAU) * US, TAU * US)
    p = kernel.Params(grid.t0_us, grid.t1_us, grid.tau_us, tuple(int(s.window * US) for s in q.streams),
                      (0,) * len(q.streams), (tuple(range(len(q.streams))),), buckets)
    key = table.column("key").fill_null(-1).to_numpy()
    rng = np.random.default_rng(1)
    part = np.where(key >= 0, np.mod(key * 7919, parts), rng.integers(0, parts, len(key)))
    outs = [kernel.partials(table.filter(pa.array(part == i)), p) for i in range(parts)]
    red = kernel.reduce_partials(pa.concat_tables(outs), p, 1)
    cfg = StatsConfig(partitioning=rule, histogram_buckets=buckets)
    run = _assemble(q, grid, cfg, red["counts"], red["window_tuples"], red["kappa"], red["edges"], red["histogram"],
                    [[0]] * len(q.streams), ["c0"])
    return run, red


@pytest.fixture(scope="module")
def data():
    return four_streams_query(), _dataset()


@pytest.mark.parametrize("parts", [1, 3])
def test_kernel_matches_references_over_any_split(data, parts):
    q, d = data
    run, red = _run(q, _rows(q, d), parts)
    st, ed = measured(run.rows, T0, TAU)
    compare(st, reference_streams(q, d, T0, N, TAU), ["j", "group", "stream"], STREAM_COLS)
    compare(ed, reference_edges(q, d, T0, N, TAU), ["j", "group", "stream", "right"], EDGE_COLS)
    assert ed["s"].sum() > ed["m"].sum() > 50
    # NULL keys counted per cycle: rows minus non-NULL keys
    inside = d["a"][(d["a"].ts >= T0) & (d["a"].ts < T0 + N * TAU)]
    assert sum(m["null_keys"]["a"]["ka"] for m in run.cycle_meta.values()) == inside["ka"].isna().sum() > 0


def test_kernel_with_key_groups(data):
    q, d = data
    rule, fn = HASH3
    run, red = _run(q, _rows(q, d, fn), 2, rule=rule)
    groups = (fn, 3, "c0")
    st, ed = measured(run.rows, T0, TAU)
    compare(st, reference_streams(q, d, T0, N, TAU, groups), ["j", "group", "stream"], STREAM_COLS)
    compare(ed, reference_edges(q, d, T0, N, TAU, groups), ["j", "group", "stream", "right"], EDGE_COLS)
    inside = d["a"][(d["a"].ts >= T0) & (d["a"].ts < T0 + N * TAU)]
    assert sum(m["null_partition_key"]["a"] for m in run.cycle_meta.values()) == inside["ka"].isna().sum()


def test_kernel_fallbacks_for_codes_that_would_overflow(data, monkeypatch):
    """Huge key or time ranges: kappa sorts with lexsort and the edges go chunk by chunk of keys."""
    q, d = data
    want, _ = _run(q, _rows(q, d), 2)
    monkeypatch.setattr(kernel, "_I64_MAX", 1)  # kappa: lexsort; edges: one (group, key) id per chunk
    got, _ = _run(q, _rows(q, d), 2)
    cols = ["tuples", "window_tuples", "kappa", "q", "m", "s", "gamma", "mu"]
    np.testing.assert_allclose(got.rows[cols].to_numpy(dtype=float), want.rows[cols].to_numpy(dtype=float))


def test_histogram_and_key_range(data):
    q, d = data
    run, red = _run(q, _rows(q, d), 3, buckets=8)
    h = run.histogram
    df = d["b"].dropna(subset=["kb"])
    df = df[(df.ts >= T0) & (df.ts < T0 + N * TAU)]
    want = df.groupby([((df.ts - T0) // TAU).astype(int), np.mod(df["kb"].astype(np.int64), 8)]).size()
    got = h[h.stream == "b"].assign(j=lambda x: (x.cycle_start.map(lambda c: c.timestamp()) - T0) // TAU)
    assert got.groupby(["j", "bucket"])["tuples"].sum().to_dict() == {(int(a), int(b)): v for (a, b), v in want.items()}
    assert red["key_range"][(1, 0)] == (int(d["b"]["kb"].min()), int(d["b"]["kb"].max()))


def test_empty_partition_and_rows_without_time():
    p = kernel.Params(0, 20 * US, 10 * US, (30 * US,), (0,), ((0,),), 4)
    assert kernel.partials(pa.table({"ci": pa.array([], pa.int32())}), p).num_rows == 0
    t = pa.table({"ci": pa.array([0, 0], pa.int32()), "sid": pa.array([0, 0], pa.int32()),
                  "t": pa.array([None, 5 * US], pa.int64()), "g": pa.array([0, 0], pa.int64()),
                  "key": pa.array([1, None], pa.int64())})
    red = kernel.reduce_partials(kernel.partials(t, p), p, 1)
    c = red["counts"].set_index("j")
    assert c.loc[-2, "rows"] == 1 and c.loc[-2, "nn0"] == 1  # NULL event time: counted, j = -2
    assert c.loc[0, "rows"] == 1 and c.loc[0, "nn0"] == 0  # NULL key: a row, no key
    assert red["window_tuples"].empty or red["window_tuples"]["window_tuples"].sum() == 0  # not in the state
    assert red["kappa"].empty or red["kappa"]["kappa"].sum() == 0
