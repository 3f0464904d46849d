"""Skimmed sketches (Ganguly, Garofalakis, Rastogi, EDBT 2004; docs/algorithms.md, "Skimmed sketches").

Pure numpy. A :class:`Skimmed` summary of a key-frequency vector ``f`` holds

- the *dense* keys exactly (``keys``, ``counts``): the heaviest keys, skimmed off;
- the *residual* ``f - dense`` in a hash sketch of ``depth`` tables x ``width``
  buckets: ``residual[i, h_i(k)] += xi_i(k) * f(k)`` with a sign ``xi_i(k)`` in {-1, +1}
  (a Count-Sketch / Fast-AGMS sketch, what the paper calls hash sketches);
- the exact total ``sum(f)``.

Summaries are linear, so the window state of a stream is a weighted sum of the
summaries of its time slices (:func:`combine`). From two summaries, the join size
``sum_k f_a(k) f_b(k)`` is estimated as in the paper's ESTSKIMJOINSIZE: dense x dense
exactly, dense x residual by point estimates (median over tables), residual x residual
as the median over tables of the bucket-wise inner products (:func:`join_size`).
:func:`matched` estimates ``sum_k f_a(k) [f_b(k) > 0]`` (the lookups that find a
match, Eq. 9's ``m``), which a linear sketch cannot give exactly; see its docstring
for the assumption it makes.

Why hand-written: the ``datasketches`` package (not in the environment) has
count-min and frequent-items sketches but no join-size estimator over signed
hash sketches, and Spark's ``count_min_sketch`` aggregate returns a serialized
Java object PySpark cannot read. The Spark job builds the same arrays with
``xxhash64`` (``mjoin.stats.sketchmode``); this module only does the arithmetic.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SketchConfig:
    """Sizes of the sketch mode; memory per stream slice is about :meth:`bytes_per_slice`."""

    depth: int = 5  # hash tables; estimates are medians over them (odd is best)
    width: int = 1024  # buckets per table
    dense_keys: int = 64  # heaviest keys per stream and interval held exactly (the skimmed part)
    sample_keys: int = 4096  # distinct keys per window the coordinated key sample aims at (for m)
    slices_per_cycle: int = 0  # time slices per statistics cycle; 0: auto (see auto_slices)
    hll_lg_k: int = 12  # HyperLogLog size (2^k registers) for kappa
    top_k_tracked: int = 1024  # items the heavy-hitter summary tracks to find the dense keys

    def __post_init__(self):
        for name in ("depth", "width", "dense_keys", "sample_keys", "top_k_tracked"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"sketch {name} must be >= 1, got {getattr(self, name)}")
        if int(self.slices_per_cycle) < 0:
            raise ValueError(f"sketch slices_per_cycle must be >= 0 (0: auto), got {self.slices_per_cycle}")
        if not 4 <= int(self.hll_lg_k) <= 21:
            raise ValueError(f"sketch hll_lg_k must be in 4..21, got {self.hll_lg_k}")
        if self.top_k_tracked < self.dense_keys:
            raise ValueError("sketch top_k_tracked must be >= dense_keys")

    def bytes_per_slice(self) -> int:
        return self.depth * self.width * 8 + (self.dense_keys + self.sample_keys) * 16 + (1 << self.hll_lg_k)


def auto_slices(cycle_seconds: float, windows, minimum: int = 4, cap: int = 8) -> int:
    """Slices per cycle: the smallest count >= ``minimum`` (at most ``cap``) whose slice divides the
    cycle and every window (in ms); else the largest such count <= ``cap``; else the largest divisor
    of the cycle <= ``cap``. More slices: less error from the time slicing, more memory
    (bench/stats/sketch_error.py)."""
    tau = int(round(cycle_seconds * 1000))
    ws = [int(round(w * 1000)) for w in windows]
    divisors = [s for s in range(1, cap + 1) if tau % s == 0]
    aligned = [s for s in divisors if all(w % (tau // s) == 0 for w in ws)]
    if aligned:
        big = [s for s in aligned if s >= minimum]
        return min(big) if big else max(aligned)
    return max(divisors)


# ---- hashing -----------------------------------------------------------------------

class NumpyHasher:
    """Bucket and sign of keys per table from splitmix64 (numpy stand-in for Spark's xxhash64)."""

    def __init__(self, depth: int, width: int, seed: int = 0):
        self.depth, self.width, self.seed = int(depth), int(width), int(seed)

    def lookup(self, keys) -> tuple[np.ndarray, np.ndarray]:
        keys = np.asarray(keys, dtype=np.int64).astype(np.uint64)
        tables = np.arange(self.depth, dtype=np.uint64)
        with np.errstate(over="ignore"):
            x = keys[:, None] * np.uint64(0x9E3779B97F4A7C15) + (tables[None, :] + np.uint64(self.seed + 1)) * np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
        buckets = (x % np.uint64(self.width)).astype(np.int64)
        signs = np.where((x >> np.uint64(63)) == 1, -1.0, 1.0)
        return buckets, signs

    def unit(self, keys) -> np.ndarray:
        """A hash of each key uniform in [0, 1), independent of the tables (coordinated sampling)."""
        b, _ = NumpyHasher(1, 1 << 30, self.seed + 7919).lookup(keys)
        return b[:, 0] / float(1 << 30)


class CellTable:
    """Buckets and signs of a known set of keys (computed elsewhere, e.g. by Spark's xxhash64)."""

    def __init__(self, keys, buckets, signs):
        keys = np.asarray(keys, dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.buckets = np.asarray(buckets, dtype=np.int64)[order]
        self.signs = np.asarray(signs, dtype=float)[order]

    def lookup(self, keys) -> tuple[np.ndarray, np.ndarray]:
        keys = np.asarray(keys, dtype=np.int64)
        pos = np.searchsorted(self.keys, keys)
        if len(keys) and (np.any(pos >= len(self.keys)) or np.any(self.keys[np.minimum(pos, len(self.keys) - 1)] != keys)):
            raise KeyError("key without hash cells (only dense keys have them)")
        return self.buckets[pos], self.signs[pos]


# ---- the summary -----------------------------------------------------------------------

@dataclass
class Skimmed:
    """Dense keys exact, the rest in a signed hash sketch, plus a hash-coordinated key sample.

    The sample holds the exact counts of the non-dense keys whose hash falls below
    ``sample_rate``; every summary built with the same rate samples the same keys, which
    is what makes presence (``matched``) estimable. ``sample_rate == 1``: every key."""

    keys: np.ndarray  # dense keys, sorted, unique (int64)
    counts: np.ndarray  # their exact (possibly weighted) counts
    residual: np.ndarray  # depth x width signed counters of the non-dense keys
    total: float  # exact sum of all counts
    sample_keys: np.ndarray = None  # sampled non-dense keys, sorted, unique
    sample_counts: np.ndarray = None
    sample_rate: float = 0.0

    def __post_init__(self):
        if self.sample_keys is None:
            self.sample_keys = np.zeros(0, np.int64)
            self.sample_counts = np.zeros(0)

    @classmethod
    def empty(cls, depth: int, width: int, sample_rate: float = 0.0) -> "Skimmed":
        return cls(np.zeros(0, np.int64), np.zeros(0), np.zeros((depth, width)), 0.0, sample_rate=sample_rate)

    @property
    def dense_total(self) -> float:
        return float(self.counts.sum())

    @property
    def residual_total(self) -> float:
        return max(self.total - self.dense_total, 0.0)

    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.counts.nbytes + self.residual.nbytes
                   + self.sample_keys.nbytes + self.sample_counts.nbytes)


def sampled(keys, hasher, rate: float) -> np.ndarray:
    """Which keys the coordinated sample at ``rate`` holds (the same keys for every stream)."""
    if rate >= 1:
        return np.ones(len(keys), bool)
    return hasher.unit(keys) < rate


def build(keys, hasher, *, dense_keys: int = 0, dense=None, sample_rate: float = 0.0, counts=None,
          depth: int | None = None, width: int | None = None) -> Skimmed:
    """Exact summary of a key multiset (tests and benchmarks; the Spark job builds the same in Spark).

    ``dense``: the dense key set (e.g. shared by all streams); else this multiset's
    ``dense_keys`` most frequent keys."""
    depth = depth or hasher.depth
    width = width or hasher.width
    keys = np.asarray(keys, dtype=np.int64)
    uk, c = np.unique(keys, return_counts=True)
    c = c.astype(float)
    if counts is not None:
        c = np.bincount(np.searchsorted(uk, keys), weights=np.asarray(counts, float), minlength=len(uk))
    if dense is not None:
        is_dense = np.isin(uk, np.asarray(dense, np.int64))
    else:
        is_dense = np.zeros(len(uk), bool)
        is_dense[np.argsort(-c, kind="stable")[:dense_keys]] = True
    res = np.zeros((depth, width))
    rest = ~is_dense
    if rest.any():
        b, sg = hasher.lookup(uk[rest])
        for i in range(depth):
            np.add.at(res[i], b[:, i], sg[:, i] * c[rest])
    smp = rest & sampled(uk, hasher, sample_rate) if sample_rate > 0 else np.zeros(len(uk), bool)
    return Skimmed(uk[is_dense], c[is_dense], res, float(c.sum()), uk[smp], c[smp], float(sample_rate))


def _merge(keys_list, counts_list):
    if not keys_list:
        return np.zeros(0, np.int64), np.zeros(0)
    k = np.concatenate(keys_list)
    c = np.concatenate(counts_list)
    uk, inv = np.unique(k, return_inverse=True)
    return uk, np.bincount(inv, weights=c, minlength=len(uk))


def combine(parts, weights=None) -> Skimmed:
    """The linear combination ``sum_i w_i part_i`` (e.g. the window state from time slices)."""
    parts = list(parts)
    if not parts:
        raise ValueError("combine needs at least one summary")
    weights = np.ones(len(parts)) if weights is None else np.asarray(weights, float)
    rates = {p.sample_rate for p in parts}
    if len(rates) > 1:
        raise ValueError(f"summaries with different sample rates {sorted(rates)} cannot be combined")
    res = np.zeros_like(parts[0].residual, dtype=float)
    dk, dc, sk, sc, total = [], [], [], [], 0.0
    for p, w in zip(parts, weights):
        if w == 0:
            continue
        res += w * p.residual
        dk.append(p.keys)
        dc.append(w * p.counts)
        sk.append(p.sample_keys)
        sc.append(w * p.sample_counts)
        total += w * p.total
    keys, counts = _merge(dk, dc)
    skeys, scounts = _merge(sk, sc)
    return Skimmed(keys, counts, res, total, skeys, scounts, parts[0].sample_rate)


def point(sk: Skimmed, keys, hasher) -> np.ndarray:
    """Estimated residual frequency of each key: median over tables of ``xi_i(k) residual[i, h_i(k)]``."""
    keys = np.asarray(keys, dtype=np.int64)
    if len(keys) == 0:
        return np.zeros(0)
    b, sg = hasher.lookup(keys)
    rows = np.arange(sk.residual.shape[0])[None, :]
    return np.median(sg * sk.residual[rows, b], axis=1)


def _count_of(keys_sorted, counts, keys) -> np.ndarray:
    keys = np.asarray(keys, dtype=np.int64)
    if len(keys_sorted) == 0 or len(keys) == 0:
        return np.zeros(len(keys))
    pos = np.minimum(np.searchsorted(keys_sorted, keys), len(keys_sorted) - 1)
    return np.where(keys_sorted[pos] == keys, counts[pos], 0.0)


def dense_of(sk: Skimmed, keys) -> np.ndarray:
    """The dense (exact) count of each key, 0 where the key is not dense in ``sk``."""
    return _count_of(sk.keys, sk.counts, keys)


def residual_join(a: Skimmed, b: Skimmed) -> float:
    """Median over tables of the bucket-wise inner product of the residual sketches."""
    return float(np.median(np.einsum("ij,ij->i", a.residual, b.residual)))


def join_size(a: Skimmed, b: Skimmed, hasher=None) -> float:
    """Skimmed estimate of ``sum_k f_a(k) f_b(k)`` (the paper's ESTSKIMJOINSIZE), clipped at 0.

    dense x dense exactly; dense x residual from point estimates (only with ``hasher``:
    when both summaries skimmed the same dense set, those terms are 0 by construction);
    residual x residual as the median over tables. With ``sample_rate == 1`` the sample
    holds every sparse key and the sparse part is exact too."""
    dd = float(np.dot(a.counts, dense_of(b, a.keys)))
    if a.sample_rate >= 1 and b.sample_rate >= 1:
        return dd + float(np.dot(a.sample_counts, _count_of(b.sample_keys, b.sample_counts, a.sample_keys)))
    cross = 0.0
    if hasher is not None:
        cross = float(np.dot(a.counts, point(b, a.keys, hasher))) + float(np.dot(b.counts, point(a, b.keys, hasher)))
    return max(dd + cross + residual_join(a, b), 0.0)


def matched(a: Skimmed, b: Skimmed) -> float:
    """Estimate of ``sum_k f_a(k) [f_b(k) > 0]``: ``a``'s tuples whose key is present in ``b``.

    A linear sketch cannot say whether a key is present, so: dense keys exactly
    (``a``'s count times ``b``'s presence), the other keys from the coordinated sample
    (the same hash decides for both summaries) scaled by ``1 / sample_rate``. ``b``'s
    count at a key may be fractional (time-slice weights); it is read as a presence
    probability, ``min(count, 1)``. Both summaries must share the dense set."""
    if a.sample_rate != b.sample_rate:
        raise ValueError("matched needs summaries sampled at the same rate")
    m = float(np.dot(a.counts, np.clip(dense_of(b, a.keys), 0.0, 1.0)))
    if a.sample_rate > 0 and len(a.sample_keys):
        pres = np.clip(_count_of(b.sample_keys, b.sample_counts, a.sample_keys), 0.0, 1.0)
        m += float(np.dot(a.sample_counts, pres)) / a.sample_rate
    return float(min(max(m, 0.0), a.total))


def window_weights(window: float, slice_width: float, max_offset: int | None = None) -> np.ndarray:
    """``w[k]``: fraction of (probe, state tuple) pairs with the probe in slice ``a`` and the
    tuple in slice ``a - k`` for which ``0 <= ts_u - ts_v < window``, both uniform in their slice.

    With ``D = (k + U1 - U2) * slice_width`` and ``U1 - U2`` triangular on (-1, 1):
    ``w[k] = F(window / slice_width - k) - F(-k)``."""
    x = window / slice_width
    kmax = int(np.ceil(x)) + 1 if max_offset is None else int(max_offset)
    k = np.arange(kmax + 1, dtype=float)
    return np.clip(_tri_cdf(x - k) - _tri_cdf(-k), 0.0, 1.0)


def _tri_cdf(x):
    x = np.asarray(x, float)
    return np.where(x <= -1, 0.0, np.where(x <= 0, (1 + x) ** 2 / 2, np.where(x <= 1, 1 - (1 - x) ** 2 / 2, 1.0)))


def symmetric_error(estimate: float, actual: float, cap: float = 10.0) -> float:
    """The skimmed-sketch paper's error: ``max(J/J', J'/J) - 1``; ``cap`` when exactly one side is 0 or J' < 0."""
    if actual == 0 and estimate == 0:
        return 0.0
    if actual <= 0 or estimate <= 0:
        return cap
    return min(max(actual / estimate, estimate / actual) - 1.0, cap)
