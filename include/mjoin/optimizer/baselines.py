"""The baselines of the paper's experiment: fixedOrder, selectivityFirst (MJoin, GrubJoin)
and greedy_MSJ (MultiStream). Each returns ``{start: [(l, r), ...]}`` in stream indices;
their cost is evaluated afterwards under the full model like every other strategy."""
from __future__ import annotations

from typing import Callable, Sequence

from mjoin.model.plan import orders_from_permutation
from mjoin.optimizer.cost import CostModel, JoinProblem


def fixed(problem: JoinProblem, query, initial_order: Sequence[str]) -> dict:
    """fixedOrder: stream X probes the others in the order of ``initial_order``, skipping
    itself (``mjoin.plan.orders_from_permutation``, the paper's experiment); never changed."""
    orders = orders_from_permutation(query, initial_order)
    return {problem.index[s]: [(problem.index[l], problem.index[r]) for l, r in pairs] for s, pairs in orders.items()}


def _greedy_walk(problem: JoinProblem, start: int, score: Callable[[int, int, int], float]) -> list:
    """Grow the partial result one lookup at a time, taking the candidate ``(r, class)`` with
    the lowest ``score(joined_mask, r, c)`` (ties: stream order, then class order)."""
    joined, mask, pairs = [start], 1 << start, []
    full = (1 << problem.n) - 1
    while mask != full:
        best = None
        for r in range(problem.n):
            if mask >> r & 1 or not problem.adj_mask[r] & mask:
                continue
            for c in problem.step_classes(mask, r):
                key = (score(mask, r, c), r, c)
                if best is None or key < best:
                    best = key
        _, r, c = best
        pairs.append((problem.representative(joined, r, c), r))
        joined.append(r)
        mask |= 1 << r
    return pairs


def selectivity_first(problem: JoinProblem, model: CostModel) -> dict:
    """selectivityFirst: probe the adjacent stream with the lowest join selectivity
    ``sigma = gamma * mu / |W_r|`` (fraction of r's window matched per lookup; the
    residual factor of other classes included)."""

    def sigma(mask, r, c):
        g, u, phi = problem.step_terms(mask, r, c)
        matched = g * phi * u
        w = float(problem.window[r])
        if matched == 0:
            return 0.0
        return matched / w if w > matched * 1e-300 else float("inf")  # no overflow on tiny windows

    return {s: _greedy_walk(problem, s, sigma) for s in range(problem.n)}


def greedy(problem: JoinProblem, model: CostModel) -> dict:
    """greedy_MSJ: probe the pair with the lowest immediate cost
    ``alpha_q f(kappa_r) + gamma (alpha_m mu)`` (Eq. 8 without the tail)."""

    def immediate(mask, r, c):
        g, u, _ = problem.step_terms(mask, r, c)
        return model.query_cost(problem.kappa[r]) + g * model.alpha_m * u

    return {s: _greedy_walk(problem, s, immediate) for s in range(problem.n)}
