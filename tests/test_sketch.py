"""mjoin.stats.sketch: skimmed-sketch estimators against exact numpy computations."""
from __future__ import annotations

import numpy as np
import pytest

from mjoin.stats import sketch as sk


def zipf_keys(rng, n, z, domain, shift=0):
    p = 1.0 / np.arange(1, domain + 1) ** z
    return rng.choice(domain, n, p=p / p.sum()) + shift


def exact_join(a, b):
    ua, ca = np.unique(a, return_counts=True)
    ub, cb = np.unique(b, return_counts=True)
    _, ia, ib = np.intersect1d(ua, ub, return_indices=True)
    return float((ca[ia] * cb[ib]).sum()), float(ca[ia].sum())


@pytest.mark.parametrize("z, shift", [(1.0, 0), (1.0, 200), (1.5, 30)])
def test_skimmed_join_size_and_matches_are_close(z, shift):
    rng = np.random.default_rng(int(z * 10) + shift)
    a = zipf_keys(rng, 40_000, z, 100_000)
    b = zipf_keys(rng, 40_000, z, 100_000, shift)
    h = sk.NumpyHasher(5, 1024, seed=1)
    dense = np.union1d(*[np.unique(x, return_counts=True)[0][np.argsort(-np.unique(x, return_counts=True)[1])[:64]]
                         for x in (a, b)])
    rate = 0.25
    sa = sk.build(a, h, dense=dense, sample_rate=rate)
    sb = sk.build(b, h, dense=dense, sample_rate=rate)
    J, M = exact_join(a, b)
    assert sk.symmetric_error(sk.join_size(sa, sb), J) < 0.15
    assert sk.symmetric_error(sk.matched(sa, sb), M) < 0.15
    # the skimmed estimate is far better than the basic hash sketch on skewed data
    basic = sk.join_size(sk.build(a, h, dense_keys=0), sk.build(b, h, dense_keys=0))
    if shift:
        assert sk.symmetric_error(sk.join_size(sa, sb), J) < sk.symmetric_error(basic, J)


def test_sample_rate_one_is_exact():
    rng = np.random.default_rng(4)
    a, b = rng.integers(0, 300, 2000), rng.integers(100, 500, 1500)
    h = sk.NumpyHasher(3, 64)
    sa, sb = sk.build(a, h, dense_keys=10, sample_rate=1.0), sk.build(b, h, dense_keys=10, sample_rate=1.0)
    with pytest.raises(AssertionError):  # dense sets differ per summary here: share them for matched()
        np.testing.assert_array_equal(sa.keys, sb.keys)
    shared = np.union1d(sa.keys, sb.keys)
    sa, sb = sk.build(a, h, dense=shared, sample_rate=1.0), sk.build(b, h, dense=shared, sample_rate=1.0)
    J, M = exact_join(a, b)
    assert sk.join_size(sa, sb) == J and sk.matched(sa, sb) == M


def test_combine_is_linear():
    rng = np.random.default_rng(5)
    parts = [rng.integers(0, 1000, 500) for _ in range(3)]
    h = sk.NumpyHasher(4, 128)
    dense = np.arange(10)
    whole = sk.build(np.concatenate(parts), h, dense=dense, sample_rate=0.5)
    comb = sk.combine([sk.build(p, h, dense=dense, sample_rate=0.5) for p in parts])
    np.testing.assert_allclose(comb.residual, whole.residual)
    np.testing.assert_array_equal(comb.keys, whole.keys)
    np.testing.assert_allclose(comb.counts, whole.counts)
    np.testing.assert_array_equal(comb.sample_keys, whole.sample_keys)
    assert comb.total == whole.total == 1500
    half = sk.combine([whole], [0.5])
    assert half.total == 750 and np.allclose(half.residual, whole.residual / 2)
    with pytest.raises(ValueError, match="sample rates"):
        sk.combine([whole, sk.build(parts[0], h, dense=dense, sample_rate=0.1)])


def test_point_estimate_of_a_lone_key_is_exact():
    h = sk.NumpyHasher(5, 4096)
    s = sk.build(np.array([7] * 5 + [9]), h, dense_keys=0)
    assert sk.point(s, [7, 9, 11], h).tolist() == [5.0, 1.0, 0.0]


def test_window_weights():
    w = sk.window_weights(300, 30)
    assert w[0] == 0.5 and np.all(w[1:10] == 1.0) and w[10] == 0.5 and w[-1] == 0.0
    assert w.sum() == pytest.approx(300 / 30)  # the expected number of slices in the window
    w = sk.window_weights(40, 30)
    assert w.sum() == pytest.approx(40 / 30)
    # Monte Carlo check of the triangular formula
    rng = np.random.default_rng(0)
    u = rng.uniform(0, 30, 200_000)
    v = rng.uniform(-30, 0, 200_000)  # the slice before
    assert w[1] == pytest.approx(np.mean((u - v >= 0) & (u - v < 40)), abs=0.01)


def test_auto_slices_and_config():
    assert sk.auto_slices(30, [90, 150, 40]) == 6  # 5 s slices divide 30, 90, 150, 40
    assert sk.auto_slices(10, [300, 300]) == 4
    assert sk.auto_slices(7, [300]) == 7  # only 1 s slices divide both
    assert sk.auto_slices(30, [0.5]) == 8  # no alignment possible: the largest divisor <= 8
    assert sk.auto_slices(9, [300]) == 6  # 1.5 s slices (3 s would align too, but fewer than 4)
    with pytest.raises(ValueError, match="width"):
        sk.SketchConfig(width=0)
    assert sk.SketchConfig().bytes_per_slice() > 5 * 1024 * 8


def test_symmetric_error():
    assert sk.symmetric_error(110, 100) == pytest.approx(0.1)
    assert sk.symmetric_error(100, 110) == pytest.approx(0.1)
    assert sk.symmetric_error(0, 0) == 0 and sk.symmetric_error(-5, 10) == 10 and sk.symmetric_error(3, 0) == 10
