"""The driver's interval routing sorts its rows by (batch, class, bucket, stream, key) with NULLs first and
stable: ``interval.sort_order`` packs the columns into one int64 where they fit and must give exactly
Arrow's multi-key sort, including where they do not fit (Arrow's sort then)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from mjoin.engine.interval import sort_order


def _arrow_order(columns):
    t = pa.table({str(i): c for i, c in enumerate(columns)})
    return pc.sort_indices(t, sort_keys=[(str(i), "ascending", "at_start") for i in range(len(columns))])


@pytest.mark.parametrize("key_range", [(0, 50), (-10**6, 10**6), (-2**62, 2**62)])
def test_sort_order_equals_arrows_stable_sort_with_nulls_first(key_range):
    rng = np.random.default_rng(3)
    n = 5000
    cols = [pa.array(rng.integers(0, 5, n).astype(np.int32)), pa.array(np.zeros(n, np.int32)),
            pa.array(rng.integers(0, 16, n).astype(np.int32), mask=rng.random(n) < 0.05),
            pa.array(rng.integers(0, 4, n).astype(np.int32)),
            pa.chunked_array([pa.array(rng.integers(*key_range, n // 2), mask=rng.random(n // 2) < 0.1),
                              pa.array(rng.integers(*key_range, n - n // 2))])]
    got = sort_order(cols)
    assert got.to_pylist() == _arrow_order(cols).to_pylist()
    # the order is stable: equal rows keep their input order
    assert got.to_pylist() == sorted(range(n), key=lambda i: tuple(
        (0, 0) if c[i].as_py() is None else (1, c[i].as_py()) for c in cols) + (i,))


def test_sort_order_of_all_null_and_empty_columns():
    cols = [pa.array([2, 1, 2, 1], pa.int32()), pa.nulls(4, pa.int64())]
    assert sort_order(cols).to_pylist() == [1, 3, 0, 2]
    assert sort_order([pa.array([], pa.int32())]).to_pylist() == []
