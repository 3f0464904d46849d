"""The evaluation's summary and report without Spark: ranked by the engine CPU measured over rounds (median of the
per-round totals, with the spread), probe work beside it; a distinct colour and marker for every strategy."""
from __future__ import annotations

import pytest

from mjoin.evaluation.evaluate import STRATEGIES, recent_range, summarize
from mjoin.evaluation.report import PALETTE, format_summary, styles


def _row(strategy: str, k: int, work: int, rounds: list[float]) -> dict:
    return {"initial_order": "cu,sr,wr,cr", "interval": k, "strategy": strategy, "probe_work": work, "lookups": work,
            "matches": 0, "batch_seconds": 1.0, "probe_seconds": 0.1, "orders": {"cu": ["sr"]}, "partitioning": None,
            "key_groups": 1, "engine_cpu_rounds": rounds, "engine_cpu_seconds": sorted(rounds)[1],
            "estimated_cost_oracle": float(work)}


def test_the_summary_ranks_by_engine_cpu_over_rounds_with_spread():
    """dppick does less probe work than fixed, yet fixed's plans took less CPU in every round: the summary ranks by
    the CPU (what the plans cost on the machine), the probe work stays beside it; the spread is over the rounds of
    the totals (per round, summed over the intervals), not of single intervals."""
    rows = [_row("oracle", 0, 90, [1.0, 1.2, 1.1]), _row("oracle", 1, 90, [1.0, 1.0, 1.0]),
            _row("dppick", 0, 100, [1.5, 1.4, 1.6]), _row("dppick", 1, 100, [1.4, 1.5, 1.3]),
            _row("fixed", 0, 130, [1.2, 1.1, 1.3]), _row("fixed", 1, 130, [1.0, 1.3, 1.1])]
    summary = summarize(rows)
    assert [s["strategy"] for s in summary] == ["oracle", "fixed", "dppick"]
    fixed = next(s for s in summary if s["strategy"] == "fixed")
    # its round totals: 1.2 + 1.0, 1.1 + 1.3, 1.3 + 1.1
    assert (fixed["engine_cpu_seconds"], fixed["engine_cpu_min"], fixed["engine_cpu_max"], fixed["rounds"]) == \
        (pytest.approx(2.4), pytest.approx(2.2), pytest.approx(2.4), 3)
    assert fixed["probe_work"] == 260 and fixed["regret_work"] == 80
    text = format_summary(summary)
    lines = text.splitlines()
    assert lines[0].split()[3:6] == ["engine", "CPU", "s"] and "probe work" in lines[0]
    assert [ln.split()[1] for ln in lines[1:4]] == ["oracle", "fixed", "dppick"]
    assert "2.200-2.400" in lines[2] and "ranked by the engine's CPU (median of 3 round(s)" in lines[-1]


def test_every_strategy_has_its_own_colour_and_marker():
    style = styles(STRATEGIES)
    assert len(STRATEGIES) == 11 and len(set(style.values())) == 11
    assert len({c for c, _ in style.values()}) == 11 and len({m for _, m in style.values()}) == 11
    assert len(set(PALETTE)) == len(PALETTE) >= 20


def test_an_evaluation_without_a_range_covers_the_periods_before_its_run():
    assert recent_range(None, None, "2026-01-01T01:00:07.5Z", 300, 10) == ("2026-01-01T00:30:00Z",
                                                                           "2026-01-01T01:00:00Z")
    assert recent_range("2026-01-01T00:10:00Z", "2026-01-01T00:20:00Z", "2026-01-02T00:00:00Z", 300, 10) == (
        "2026-01-01T00:10:00Z", "2026-01-01T00:20:00Z")
