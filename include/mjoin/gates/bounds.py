"""The input gate's statistical bounds (scipy.stats): what a healthy stream may deliver in a sample.

A fraction rule (NULL keys, late, future) judges a cycle of ``n`` checked rows holding ``k`` bad ones
against the stream's **tolerated share** ``p``: its own history's share (the one-sided Clopper-Pearson
upper bound at the gate's confidence, times ``fraction_slack``), at most the configured cap
(``*_fraction_max``), or the cap itself without history. It fails when ``k`` exceeds the binomial
upper bound of ``n`` rows at ``p``, i.e. when a share above ``p`` is established at that confidence,
not when ``k / n`` of a small sample happens to exceed a fixed fraction (6 NULL keys in 55 rows of a
3.5 % stream is ordinary: P(X >= 6) = 1.2 %).

The flow rule holds a stream to its Poisson lower bound of rows at its history's rate divided by the
slack (never more than ``min_rows_per_cycle`` per cycle): a sparse stream may skip a cycle (no arrival
folder is then no rows, not a failure) but not go quiet for a whole interval.

Many rows are judged per gate run, so each is judged at ``alpha = (1 - confidence) / rows``
(Bonferroni): a healthy run fails with probability at most ``1 - confidence`` per rule.
"""
from __future__ import annotations

import math

from scipy import stats


def row_alpha(confidence: float, rows: int) -> float:
    """Per-row error rate so that ``rows`` judgements together err with probability <= 1 - confidence."""
    return (1.0 - float(confidence)) / max(1, int(rows))


def share_upper(k: int, n: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper bound of a share observed as ``k`` of ``n`` (1.0 when k = n)."""
    if n <= 0:
        return 1.0
    if k >= n:
        return 1.0
    return float(stats.beta.ppf(confidence, k + 1, n - k))


def tolerated_share(k: int | None, n: int | None, cap: float, confidence: float, slack: float) -> tuple[float, str]:
    """``(p, basis)``: the history's upper bound x slack, at most ``cap``; without history the cap."""
    if not n:
        return float(cap), "config"
    p = min(float(cap), float(slack) * share_upper(int(k or 0), int(n), confidence))
    return p, "history" if p < cap else "cap"


def count_limit(n: float, p: float, alpha: float) -> float:
    """The most bad rows ``n`` rows may hold at share ``p``: the smallest k with P(X > k) <= alpha,
    X ~ Binomial(n, p) (NaN for n = 0: nothing to judge)."""
    if not n or (isinstance(n, float) and math.isnan(n)):
        return math.nan
    return float(stats.binom.isf(alpha, int(n), min(1.0, max(0.0, float(p)))))


def rows_floor(mean: float, alpha: float) -> int:
    """The fewest rows a Poisson(``mean``) count may show: the largest f with P(X < f) <= alpha."""
    if mean <= 0:
        return 0
    return int(stats.poisson.ppf(alpha, float(mean)))
