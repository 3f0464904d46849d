"""Ties of the cost model after a step forecast empty, and how dppick and exact break them (the drift evaluation, bench/evaluation/README.md).

Eq. 8: ``C(o_k) = alpha_q f(kappa_r) + gamma (alpha_m mu + rho C(o_{k+1}))``. With ``gamma = 0`` on a step every
tail after it costs the same, and before the gamma floor each optimizer's own tie-break chose the tail: dppick the
first sequence its DFS found, exact the tail that is optimal from the larger partial result (or, when that ties as
well, the lowest stream index). Both now break ties by the cost with gamma floored at ``mjoin.optimizer.cost.GAMMA_FLOOR``
(lexicographically: the model's cost first, so no plan changes where there is no tie): among equal-cost orders the
cheapest tail wins, and dppick breaks what still ties exactly as exact does, so the two agree. The situation is hot-rotate's after a step (bench/evaluation
README, "Drift"): the old hot stream ``s1`` falls back, its window forecast empty and ``gamma(s2 -> s1) = 0``, so
every order of a filter's tuples probes ``s1`` first, and then either the dense source ``s0`` or the other sparse
filter ``s3``.

Pure: the optimizers on hand-made statistics (no Spark).
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from mjoin.optimizer.cost import GAMMA_FLOOR, CostModel, JoinProblem, order_cost, search_with_gamma_floor
from mjoin.optimizer.strategies import optimize
from mjoin.optimizer.dppick import dp_pick
from mjoin.optimizer.exact import exact_dp
from mjoin.optimizer.synthetic import query_from_edges, random_edges, random_statistics
from mjoin.model.query import parse_query
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StreamStats
from mjoin.workloads.synthetic import query_document

NAMES = ("s0", "s1", "s2", "s3")


def _query():
    return parse_query(query_document("hot", {s: s for s in NAMES}, 60.0), source="<hot>")


def _stats(*, into_s1: float = 0.0, out_of_s1: float | None = None, kappa_s3: float = 14.0) -> Statistics:
    """s0 the dense source (12,000 tuples over 200 keys: every lookup hits, 60 tuples), s1 the old hot stream
    forecast empty (lookups into it match with ``into_s1``), s2 and s3 sparse filters (15 tuples: 7% of lookups
    hit one tuple). ``out_of_s1``: gamma of s1's own lookups (None: as everyone else's)."""
    window = {"s0": 12000.0, "s1": 0.0, "s2": 15.0, "s3": 15.0}
    kappa = {"s0": 200.0, "s1": 0.0, "s2": 14.0, "s3": kappa_s3}
    g = GroupStats()
    for s in NAMES:
        g.streams[s] = StreamStats(lam=window[s] / 60.0, kappa=kappa[s], window_tuples=window[s])
    for left in NAMES:
        for right in NAMES:
            if left == right:
                continue
            gamma, mu = ((into_s1, 1.0) if right == "s1" else (1.0, 60.0) if right == "s0" else (0.07, 1.0))
            if left == "s1" and out_of_s1 is not None and right != "s1":
                gamma = out_of_s1
            g.edges[(left, right)] = EdgeStats(gamma=gamma, mu=mu)
    return Statistics(query="hot", groups={0: g}, kind="forecast")


def _tail(plan, stream="s2"):
    return [r for _, r in plan.orders[0][stream]]


@pytest.mark.parametrize("model", [CostModel(), CostModel(alpha_q=3.5e-9, alpha_m=1.2e-8, calibrated=True)],
                         ids=["default", "seconds"])
def test_after_an_empty_step_both_take_the_cheaper_tail(model):
    """s2's tuples: both optimizers probe the empty s1 first (cost alpha_q f(0), nothing after it counts), then
    the other filter s3 before the source s0, the tail that costs less if s1 is not quite empty. Before the floor
    dppick kept its DFS's first sequence, s1, s0, s3, while exact took s1, s3, s0: same model cost, different plans."""
    q, stats = _query(), _stats()
    plans = {st: optimize(q, stats, st, cost_model=model) for st in ("dppick", "exact")}
    for st, plan in plans.items():
        assert _tail(plan, "s2") == ["s1", "s3", "s0"], st
        assert _tail(plan, "s3") == ["s1", "s2", "s0"], st
    assert plans["dppick"].orders == plans["exact"].orders
    # the cost the plans carry is the model's own (unfloored): the empty lookup's alone
    assert plans["dppick"].cost("s2") == pytest.approx(model.query_cost(0.0), rel=1e-12)
    assert plans["dppick"].estimated_cost == pytest.approx(plans["exact"].estimated_cost, rel=1e-12)
    # what the tie-break is for: once s1 matches now and then, the chosen tail is the cheaper one
    nearly = _stats(into_s1=0.01)
    problem = JoinProblem.from_statistics(q, nearly)
    ix = problem.index
    chosen = order_cost(problem, model, ix["s2"], [(ix["s2"], ix["s1"]), (ix["s2"], ix["s3"]), (ix["s2"], ix["s0"])])
    other = order_cost(problem, model, ix["s2"], [(ix["s2"], ix["s1"]), (ix["s2"], ix["s0"]), (ix["s2"], ix["s3"])])
    assert chosen < other * 0.9


def test_the_tie_inside_the_tail_as_well():
    """s1's own lookups forecast unmatched too (gamma(s1 -> .) = 0), and s3 with
    as many keys as s0: then the tail from {s2, s1} ties as well, and before the floor *both* optimizers took
    the lowest index, s0, first. With the floor the eps^2 term of the tail decides: s3 (one tuple) before s0 (60)."""
    q, stats = _query(), _stats(out_of_s1=0.0, kappa_s3=200.0)
    for st in ("dppick", "exact"):
        assert _tail(optimize(q, stats, st), "s2") == ["s1", "s3", "s0"], st


def test_what_each_half_of_the_tie_break_does():
    """``gamma_floor=0`` (no floor): every order after the empty s1 costs the same, and both optimizers keep the
    lexicographically first (``mjoin.optimizer.cost.tie_key``), the dense s0 first: only the floor's eps terms
    see that s3 fetches one tuple and s0 sixty."""
    model = CostModel()
    for stats, want in ((_stats(), ["s1", "s0", "s3"]), (_stats(out_of_s1=0.0, kappa_s3=200.0), ["s1", "s0", "s3"])):
        problem = JoinProblem.from_statistics(_query(), stats)
        s2 = problem.index["s2"]
        dp, ex = dp_pick(problem, model, gamma_floor=0.0), exact_dp(problem, model, gamma_floor=0.0)
        assert dp[s2][1] == ex[s2][1] == pytest.approx(model.query_cost(0.0))
        assert [problem.names[r] for _, r in dp[s2][0]] == [problem.names[r] for _, r in ex[s2][0]] == want
        # the floored search returns the same (unfloored) costs
        for s, (pairs, cost) in dp_pick(problem, model).items():
            assert cost == pytest.approx(dp[s][1], rel=1e-12)
            assert cost == pytest.approx(order_cost(problem, model, s, pairs), rel=1e-12)


def test_no_zero_gamma_no_change():
    """Every gamma at or above the floor: the search sees the very same problem, so the plans and costs are
    the old ones bit for bit (here: the hot preset's statistics with s1 matching now and then)."""
    q = _query()
    problem = JoinProblem.from_statistics(q, _stats(into_s1=0.01))
    assert problem.with_gamma_floor() is problem
    model = CostModel()
    for search in (dp_pick, exact_dp):
        assert search(problem, model) == search(problem, model, gamma_floor=0.0)
    plan = optimize(q, _stats(into_s1=0.01), "dppick")
    assert _tail(plan, "s2") == ["s1", "s3", "s0"]  # s1 is still the cheapest first probe: 1% of lookups hit


def test_the_floor_touches_edges_only():
    problem = JoinProblem.from_statistics(_query(), _stats())
    floored = problem.with_gamma_floor()
    assert floored is not problem
    edge = problem.cls >= 0
    assert np.all(floored.gamma[edge] >= GAMMA_FLOOR)
    assert np.array_equal(floored.gamma[~edge], problem.gamma[~edge])
    assert np.array_equal(floored.gamma[edge & (problem.gamma >= GAMMA_FLOOR)],
                          problem.gamma[edge & (problem.gamma >= GAMMA_FLOOR)])
    assert problem.with_gamma_floor(0.0) is problem


def test_a_gamma_below_the_floor_trades_no_cost():
    """gamma(s0 -> s1) = 1e-9, below the floor, with 1e5 tuples per match: probing s1 first costs 1.0001, s2
    first 1.01, but floored at 1e-6 s1 first would cost 1.1. Not a tie, so the plan is the unfloored optimum."""
    q = parse_query(query_document("three", {s: s for s in ("s0", "s1", "s2")}, 60.0), source="<three>")
    g = GroupStats()
    for s in ("s0", "s1", "s2"):
        g.streams[s] = StreamStats(lam=1.0, kappa=1.0, window_tuples=1.0)
    for left in ("s0", "s1", "s2"):
        for right in ("s0", "s1", "s2"):
            if left != right:
                g.edges[(left, right)] = EdgeStats(gamma=0.5, mu=1.0)
    g.edges[("s0", "s1")] = EdgeStats(gamma=1e-9, mu=1e5)
    g.edges[("s0", "s2")] = EdgeStats(gamma=5e-3, mu=1.0)
    stats = Statistics(query="three", groups={0: g}, kind="forecast")
    problem = JoinProblem.from_statistics(q, stats)
    model = CostModel()
    s1_first, s2_first = [(0, 1), (0, 2)], [(0, 2), (0, 1)]
    assert order_cost(problem, model, 0, s1_first) < order_cost(problem, model, 0, s2_first)
    floored = problem.with_gamma_floor()
    assert order_cost(floored, model, 0, s1_first) > order_cost(floored, model, 0, s2_first)
    for search in (dp_pick, exact_dp):
        assert search(problem, model)[0] == search(problem, model, gamma_floor=0.0)[0]
        assert search(problem, model)[0][0] == s1_first
        assert search(floored, model, gamma_floor=0.0)[0][0] == s2_first  # what the floor alone would pick
    for st in ("dppick", "exact"):
        assert _tail(optimize(q, stats, st), "s0") == ["s1", "s2"]


CASES = [(n, shape, classes, seed) for n in (4, 5, 6) for shape in ("complete", "star", "chain", "cycle", "random")
         for classes in (1, 2) for seed in range(3)]


@pytest.mark.parametrize("n,shape,classes,seed", CASES)
def test_random_problems_same_optimum_and_agreement(n, shape, classes, seed):
    """On random graphs and statistics (5% of gammas 0, some 1, a few more set to 0): the tie-break never gives up
    model cost (its orders cost what the unfloored optimum costs, to rounding), and dppick and exact pick the same
    orders."""
    rng = random.Random(1000 * n + 10 * seed + classes)
    q = query_from_edges(n, random_edges(n, shape, rng, classes=classes), name=f"t{n}{shape}")
    stats = random_statistics(q, rng)
    problem = JoinProblem.from_statistics(q, stats)
    # force a few zero gammas so that the case is exercised
    if not np.any((problem.cls >= 0) & (problem.gamma == 0)):
        edges = list(q.directed_edges)
        for l, r in rng.sample(edges, max(1, len(edges) // 5)):
            stats.groups[0].edges[(l, r)] = EdgeStats(gamma=0.0, mu=1.0)
        problem = JoinProblem.from_statistics(q, stats)
    model = CostModel()
    plain = exact_dp(problem, model, gamma_floor=0.0)
    dp, ex = dp_pick(problem, model), exact_dp(problem, model)
    for s in range(n):
        best = plain[s][1]
        for got in (dp[s], ex[s]):
            assert got[1] == pytest.approx(order_cost(problem, model, s, got[0]), rel=1e-12)
            assert got[1] <= best * (1 + 1e-12), (s, got, best)
        assert dp[s][1] == pytest.approx(ex[s][1], rel=1e-9)
        assert [r for _, r in dp[s][0]] == [r for _, r in ex[s][0]], s


@pytest.mark.parametrize("n,classes,seed", [(n, k, seed) for n in (7, 9, 11) for k in (1, 3) for seed in range(3)])
def test_exact_shares_the_floored_search_without_changing_it(n, classes, seed):
    """exact runs the floored search beside the unfloored one in one DP, computing only the subsets whose tails
    the floor reaches: its orders are those of the two searches run apart (``search_with_gamma_floor`` calling the
    unfloored DP twice), on random graphs with a fifth of the gammas 0 and a few below the floor."""
    rng = random.Random(7000 + 100 * n + 10 * classes + seed)
    q = query_from_edges(n, random_edges(n, "random", rng, classes=classes, p=0.4), name=f"share{n}")
    stats = random_statistics(q, rng)
    for l, r in rng.sample(list(q.directed_edges), max(1, len(q.directed_edges) // 5)):
        stats.groups[0].edges[(l, r)] = EdgeStats(gamma=rng.choice([0.0, 0.0, 3e-7]), mu=rng.uniform(1, 5))
    problem = JoinProblem.from_statistics(q, stats)
    model = CostModel()
    apart = search_with_gamma_floor(problem, model, lambda p: exact_dp(p, model, gamma_floor=0.0))
    shared = exact_dp(problem, model)
    for s in range(n):
        assert shared[s][0] == apart[s][0], s
        assert shared[s][1] == pytest.approx(apart[s][1], rel=1e-12)
