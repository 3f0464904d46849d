"""Sketch mode of the statistics job against exact mode (Spark) on skewed data."""
from __future__ import annotations

import numpy as np
import pytest

from mjoin.lake.layout import Lake
from mjoin.stats.sketch import SketchConfig
from mjoin.stats.job import StatsConfig, compute_statistics
from test_stats_helpers import T0, four_streams_query, make_rows, write_stream

pytestmark = pytest.mark.spark

TAU, N = 30, 6


@pytest.fixture(scope="module")
def skewed(spark, tmp_path_factory):
    """Zipf-skewed keys over a 3000-key domain; a, b, c get data, d none."""
    q = four_streams_query()
    lake = Lake(str(tmp_path_factory.mktemp("sketch") / "lake"))
    rng = np.random.default_rng(17)
    p = 1.0 / np.arange(1, 3001) ** 1.1
    keys = rng.permutation(3000)
    for name, col, n, shift in (("a", "ka", 2500, 0), ("b", "kb", 2500, 40), ("c", "kc", 1500, 0)):
        df = make_rows(rng, n, T0 - 160, T0 + N * TAU, [0], null_frac=0.05, whole_seconds=False, column=col)
        ok = df[col].notna()
        df.loc[ok, col] = keys[(rng.choice(3000, ok.sum(), p=p / p.sum()) + shift) % 3000]
        write_stream(lake, q.stream(name), df)
    exact = compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU)
    return q, lake, exact


def _errors(exact_rows, sketch_rows):
    keys = ["cycle_start", "group", "entity", "stream", "right"]
    m = exact_rows.merge(sketch_rows, on=keys, suffixes=("_x", "_s"))
    assert len(m) == len(exact_rows) == len(sketch_rows)
    return m


def test_sketch_mode_with_room_for_every_key_is_close(spark, skewed):
    q, lake, exact = skewed
    run = compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU,
                             StatsConfig(mode="sketch", sketch=SketchConfig(sample_keys=100_000)))
    info = run.summary["sketch"]
    assert info["sample_rate"] == 1.0 and info["slices_per_cycle"] == 6  # 5 s slices align every window
    m = _errors(exact.rows, run.rows)
    for c in ("lambda", "tuples", "window_tuples", "q"):  # no per-key state needed: exact
        assert np.allclose(m[f"{c}_x"].astype(float), m[f"{c}_s"].astype(float), equal_nan=True), c
    st = m[m.entity == "stream"]
    assert np.allclose(st["kappa_s"], st["kappa_x"], rtol=0.03)  # HLL
    ed = m[(m.entity == "edge") & (m.q_x > 0)]
    # the remaining error is the time slicing (uniform arrivals within 10 s slices)
    for c in ("m", "s"):
        assert abs(ed[f"{c}_s"].sum() / ed[f"{c}_x"].sum() - 1) < 0.05, c
    assert np.mean(np.abs(ed["gamma_s"] - ed["gamma_x"])) < 0.03
    for j in range(N):
        snap = run.snapshot(T0 + j * TAU)
        assert snap.check(q) and snap.lam("d") == 0


def test_small_sketch_bounds_memory_and_stays_usable(spark, skewed):
    q, lake, exact = skewed
    cfg = SketchConfig(depth=3, width=128, dense_keys=16, sample_keys=200, slices_per_cycle=1, hll_lg_k=8)
    run = compute_statistics(spark, q, lake, T0, T0 + N * TAU, TAU, StatsConfig(mode="sketch", sketch=cfg))
    info = run.summary["sketch"]
    assert 0 < info["sample_rate"] < 1
    # memory per slice is bounded by the configuration, not by the 3000-key domain
    assert info["max_slice_bytes"] <= cfg.depth * cfg.width * 8 + (16 * 3 + 2 * cfg.sample_keys) * 16 + (1 << 8)
    m = _errors(exact.rows, run.rows)
    ed = m[(m.entity == "edge") & (m.q_x > 0)]
    assert abs(ed["s_s"].sum() / ed["s_x"].sum() - 1) < 0.3
    assert abs(ed["m_s"].sum() / ed["m_x"].sum() - 1) < 0.3
    for j in range(N):
        assert run.snapshot(T0 + j * TAU).check(q)
