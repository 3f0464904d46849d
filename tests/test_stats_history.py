"""mjoin.stats.history without Spark: atomic per-cycle folders, range reads, snapshots."""
from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from mjoin.lake.layout import Lake
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StatisticsError, StreamStats
from mjoin.stats import history
from test_stats_helpers import canon

T0 = 1_767_225_600


def cycle_rows(query, epoch, lam=1.0):
    g = GroupStats()
    for s in query.stream_names:
        g.streams[s] = StreamStats(lam=lam, kappa=3.0, window_tuples=7.0, tuples=lam * 10)
    for l, r in query.directed_edges:
        g.edges[(l, r)] = EdgeStats.from_counts(10, 4, 6)
    st = Statistics(query.name, {0: g}, cycle_start=pd.Timestamp(epoch, unit="s", tz="UTC"), cycle_seconds=10.0)
    return pd.DataFrame(st.to_rows()), st


def test_write_read_snapshot_roundtrip(seed_query, tmp_path):
    root = str(tmp_path / "stats")
    for j in range(5):
        rows, _ = cycle_rows(seed_query, T0 + 10 * j, lam=float(j))
        history.write_cycle(root, seed_query.name, T0 + 10 * j, rows, meta={"mode": "exact", "partitioning": None})
    h = history.read_history(root, seed_query.name)
    assert list(h.columns) == list(history.HISTORY_SCHEMA.names)
    assert len(h) == 5 * 16 and h["cycle_start"].is_monotonic_increasing
    part = history.read_history(root, seed_query.name, start=T0 + 10, end=T0 + 30, meta=True)
    assert sorted(part["cycle_start"].unique()) == [pd.Timestamp(T0 + 10, unit="s", tz="UTC"),
                                                    pd.Timestamp(T0 + 20, unit="s", tz="UTC")]
    _, want = cycle_rows(seed_query, T0 + 20, lam=2.0)
    snap = history.snapshot(part, T0 + 20)
    assert canon(snap) == canon(want) and snap.kind == "measured"
    assert snap.meta["mode"] == "exact" and snap.cycle_start == "2026-01-01T00:00:20Z"
    with pytest.raises(StatisticsError, match="no cycle starting at 2026-01-01T00:01:00Z"):
        history.snapshot(part, T0 + 60)
    # the query folder itself also works as the root, and so does the root with one query
    assert len(history.read_history(os.path.join(root, seed_query.name))) == 80
    assert len(history.read_history(root)) == 80


def test_rewrite_replaces_and_leaves_nothing_behind(seed_query, tmp_path):
    root = str(tmp_path / "stats")
    rows, _ = cycle_rows(seed_query, T0, lam=1.0)
    history.write_cycle(root, seed_query.name, T0, rows, histogram=pd.DataFrame(columns=history.HISTOGRAM_COLUMNS))
    rows2, _ = cycle_rows(seed_query, T0, lam=9.0)
    history.write_cycle(root, seed_query.name, T0, rows2)
    h = history.read_history(root, seed_query.name)
    assert len(h) == 16 and set(h[h.entity == "stream"]["lambda"]) == {9.0}
    qdir = os.path.join(root, seed_query.name)
    assert sorted(os.listdir(qdir)) == ["_histogram", f"cycle={T0}"]
    # half-written folders (a crashed writer) are invisible to readers
    os.makedirs(os.path.join(qdir, ".tmp-cycle=123-abc"))
    rows3, _ = cycle_rows(seed_query, T0 + 10)
    rows3.to_parquet(os.path.join(qdir, ".tmp-cycle=123-abc", "part-00000.parquet"))
    assert len(history.read_history(root, seed_query.name)) == 16


def test_wrong_query_rows_and_grid_conflicts(seed_query, two_class_query, tmp_path):
    root = str(tmp_path / "stats")
    rows, _ = cycle_rows(seed_query, T0)
    with pytest.raises(history.HistoryError, match="written to the history of"):
        history.write_cycle(root, two_class_query.name, T0, rows)
    history.write_cycle(root, seed_query.name, T0, rows, meta={"cycle_seconds": 10.0})
    history.check_grid(root, seed_query.name, T0 + 10, T0 + 50, 10)  # adjacent, same grid: fine
    history.check_grid(root, seed_query.name, T0, T0 + 50, 10)  # re-run: fine
    with pytest.raises(history.HistoryError, match="another grid"):
        history.check_grid(root, seed_query.name, T0 + 5, T0 + 25, 10)
    with pytest.raises(history.HistoryError, match="one cycle length"):
        history.check_grid(root, seed_query.name, T0, T0 + 60, 30)
    with pytest.raises(history.HistoryError, match="one cycle length"):  # adjacent, other length
        history.check_grid(root, seed_query.name, T0 + 10, T0 + 70, 30)
    with pytest.raises(history.HistoryError, match="no statistics history for query"):
        history.read_history(root, "nope")
    history.write_cycle(root, two_class_query.name, T0, cycle_rows(two_class_query, T0)[0])
    with pytest.raises(history.HistoryError, match="several queries"):
        history.read_history(root)


def test_history_root_and_no_spark_import(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    assert history.history_root(lake) == str(tmp_path / "lake" / "stats")
    assert history.history_root(lake.with_namespace("eval/r1")) == str(tmp_path / "lake" / "eval" / "r1" / "stats")
    code = ("import sys, mjoin.stats.history, mjoin.forecast.holt; "
            "bad = [m for m in sys.modules if m.startswith(('pyspark', 'airflow'))]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})
