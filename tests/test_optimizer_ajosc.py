"""AJOSC's ordering algorithm as ported (``mjoin.optimizer.ajosc``): its DP finds the minimum of its own cost
over every connected order, its incremental re-optimization is exact for the statistics it holds, refreshes only
what moved by its threshold, and gives the from-scratch orders when everything moved; its plans are valid plans.

Pure: random graphs and statistics (no Spark). The brute force costs every order edge by edge with AJOSC's
recursion written out here: ``value = cost_val (1 + w value_next)``, ``cost_val`` the sum of the parents' degrees."""
from __future__ import annotations

import random

import numpy as np
import pytest

from mjoin.optimizer.ajosc import CDG, ajosc_cost, ajosc_statistics, changed
from mjoin.optimizer.cost import JoinProblem
from mjoin.optimizer.dppick import get_sequences
from mjoin.optimizer.strategies import OptimizerError, STRATEGIES, optimize
from mjoin.optimizer.synthetic import query_from_edges, random_edges, random_statistics

CASES = [(seed, shape) for seed in range(4) for shape in ("complete", "star", "chain", "cycle", "random")]


def _problem(seed, shape, n=None):
    rng = random.Random(seed * 31 + len(shape))
    n = n or rng.randint(3, 6)
    q = query_from_edges(n, random_edges(n, shape, rng, classes=rng.randint(1, 3)), name=f"a{shape}{n}")
    return q, JoinProblem.from_statistics(q, random_statistics(q, rng)), rng


def _brute(problem, deg, inter, s):
    n = problem.n
    best = np.inf
    for seq in get_sequences(problem, s):
        S, value, steps = 1 << s, 0.0, []
        for _, u in seq:
            cv = sum(deg[p, u] for p in range(n) if S >> p & 1 and problem.cls[p, u] >= 0)
            steps.append((cv, inter[S, u] / cv if cv else 0.0))
            S |= 1 << u
        for cv, w in reversed(steps):
            value = cv + cv * w * value
        best = min(best, value)
    return best


@pytest.mark.parametrize("seed,shape", CASES)
def test_decide_finds_the_minimum_of_its_own_cost(seed, shape):
    q, problem, _ = _problem(seed, shape)
    deg, inter = ajosc_statistics(problem)
    cdg = CDG(problem)
    cdg.decide(deg, inter)
    for s in range(problem.n):
        best = _brute(problem, deg, inter, s)
        assert cdg.value[1 << s] == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert ajosc_cost(problem, deg, inter, s, cdg.order(s)) == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert q.expansion_error(problem.names[s], [(problem.names[l], problem.names[r]) for l, r in cdg.pairs(s)]) is None


@pytest.mark.parametrize("seed,shape", CASES)
def test_incremental_is_exact_for_the_statistics_it_holds(seed, shape):
    """After IncrDecideOrder on new statistics every root's value is the minimum over the orders of the CDG's own
    (partly refreshed) edge statistics, and an edge whose statistics did not move dramatically kept them."""
    q, problem, rng = _problem(seed, shape)
    deg, inter = ajosc_statistics(problem)
    cdg = CDG(problem)
    cdg.decide(deg, inter)
    before_cv, before_w = cdg.cost_val.copy(), cdg.w.copy()
    new = JoinProblem.from_statistics(q, random_statistics(q, rng))
    deg2, inter2 = ajosc_statistics(new)
    refreshed = cdg.incremental(deg2, inter2)
    assert refreshed >= 0
    n = problem.n
    for s in range(n):
        best = np.inf
        for seq in get_sequences(problem, s):
            S, steps = 1 << s, []
            for _, u in seq:
                steps.append((cdg.cost_val[S, u], cdg.w[S, u]))
                S |= 1 << u
            value = 0.0
            for cv, w in reversed(steps):
                value = cv + cv * w * value
            best = min(best, value)
        assert cdg.exact[1 << s]
        assert cdg.value[1 << s] == pytest.approx(best, rel=1e-9, abs=1e-12)
    # what did not move by the threshold is as it was
    for S, u in zip(*np.nonzero(cdg.has_edge)):
        if not any(changed(float(deg2[p, u]), float(deg[p, u])) for p in range(n) if S >> p & 1
                   and problem.cls[p, u] >= 0) and not changed(
                float(inter2[S, u] / cdg._cost_vals(deg2)[S, u]) if cdg._cost_vals(deg2)[S, u] else 0.0,
                float(before_w[S, u])):
            assert cdg.cost_val[S, u] == before_cv[S, u]


def test_incremental_equals_scratch_when_everything_moved():
    q, problem, rng = _problem(1, "complete", n=5)
    deg, inter = ajosc_statistics(problem)
    cdg = CDG(problem)
    cdg.decide(deg, inter)
    # every degree and every survivor count 10x (all dramatic: > 0.4 and > 1.5x): the incremental step refreshes all
    deg2, inter2 = deg * 10 + 1, inter * 10 + 1
    cdg.incremental(deg2, inter2)
    ref = CDG(problem)
    ref.decide(deg2, inter2)
    for s in range(problem.n):
        assert cdg.value[1 << s] == pytest.approx(ref.value[1 << s], rel=1e-12)
        assert cdg.order(s) == ref.order(s)


def test_small_moves_change_nothing():
    q, problem, _ = _problem(2, "random", n=6)
    deg, inter = ajosc_statistics(problem)
    cdg = CDG(problem)
    cdg.decide(deg, inter)
    orders = {s: cdg.order(s) for s in range(problem.n)}
    assert cdg.incremental(deg * 1.2, inter * 1.2) == 0  # 20%: below AJOSC's factor of 1.5
    assert {s: cdg.order(s) for s in range(problem.n)} == orders


def test_changed_is_ajoscs_rule():
    assert changed(2.0, 1.0) and changed(0.0, 0.5) and changed(0.5, 0.0)
    assert not changed(1.3, 1.0)  # moved 0.3: not more than 0.4
    assert not changed(10.0, 7.0)  # moved 3 but by 1.43x: not above 1.5


def test_ajosc_is_a_peer_optimize_takes_not_a_loop_strategy():
    q, problem, _ = _problem(3, "random", n=5)
    stats = random_statistics(q, random.Random(9))
    plan = optimize(q, stats, "ajosc")
    assert plan.strategy == "ajosc" and plan.problems(q) == []
    assert "ajosc" not in STRATEGIES  # the DAG's choices stay mjoin's strategies
    exact = optimize(q, stats, "exact")
    assert plan.estimated_cost >= exact.estimated_cost * (1 - 1e-9)  # costed under mjoin's model
    with pytest.raises(OptimizerError):
        optimize(q, stats, "no-such-peer")
