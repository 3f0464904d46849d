"""Statistics as the engine holds its state under punctuations (pure: mjoin.stats.effective)."""
from __future__ import annotations

from mjoin.stats.effective import effective_statistics, engine_state_summary
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StreamStats


def _stats():
    streams = {s: StreamStats(lam=10.0, kappa=100.0, window_tuples=300.0, tuples=100.0) for s in "ab"}
    edges = {(l, r): EdgeStats(gamma=0.5, mu=2.0) for l in "ab" for r in "ab" if l != r}
    return Statistics(query="q", groups={0: GroupStats(streams=streams, edges=edges)}, kind="forecast")


def _rec(punct, keys=(40, 200), tuples=(90, 250), rows=(100, 100), skipped=None):
    return {"punctuation": punct and dict(promises_held=5, skipped_by_stream=skipped or {}),
            "state_keys": {"a": keys[0], "b": keys[1]}, "state_tuples": {"a": tuples[0], "b": tuples[1]},
            "rows_in": {"a": rows[0], "b": rows[1]}}


def test_no_punctuation_leaves_the_statistics_as_measured():
    s = _stats()
    assert engine_state_summary([_rec(False), _rec(False)]) is None
    assert effective_statistics(s, None) is s


def test_engine_keys_tuples_and_skips_replace_the_windows():
    summary = engine_state_summary([_rec(True, skipped={"a": 25}), _rec(True, skipped={"a": 15})])
    assert summary["a"] == {"keys": 40.0, "tuples": 90.0, "skipped_share": 0.2}
    e = effective_statistics(_stats(), summary)
    assert e.kappa("a") == 40.0 and e.window_tuples("a") == 90.0 and e.lam("a") == 8.0
    # b's engine state is larger than the data's window says (keys kept for a promise): not raised
    assert e.kappa("b") == 100.0 and e.window_tuples("b") == 250.0 and e.lam("b") == 10.0
    assert e.kappa("a") <= e.window_tuples("a") and e.meta["effective_state"] == summary
    assert _stats().kappa("a") == 100.0  # the input is not changed
