"""dpPick (runtime-optimization paper, Algorithms 3-4): enumerate every connected probe
sequence by DFS (``getSequences``), cost each with the recursion of Eq. 8, memoising
suffix costs (``subMemo``), keep the cheapest per stream (``costDict``). O(n!) sequences.

Paper-faithful except for two things, both said where they happen:

- ``get_sequences(..., dedupe=True)`` (what :func:`dp_pick` uses) yields one sequence per
  choice of ``(r, attribute class)`` at each step instead of one per edge ``(l, r)``:
  every class-``c`` edge from the partial result into ``r`` fetches the same tuples and
  has the same cost under the model (``mjoin.optimizer.cost``), so the paper's DFS would only
  repeat equal-cost sequences ((n-1)! times more of them on a one-class query).
  ``dedupe=False`` is the paper's edge-by-edge DFS; the tests check both give the
  same minimum.
- ``subMemo`` is cleared between start streams (memory: a memo over all starts holds
  about e*n! suffixes). In a one-class query every ``l`` is the start stream, so no
  suffix of one start is a suffix of another and nothing is recomputed; in sparser
  multi-class graphs a few shared suffixes may be computed twice (same result).
- ``(n-1)!`` in the ``(n-1)! times more`` above is for one class: the paper's DFS picks
  ``l`` among all joined streams, 1 * 2 * ... * (n-1) choices per order.
- ``subMemo`` holds a suffix's cost as the pair ``(A, B)`` of Eq. 65 (the cost is ``A + m B`` when the step
  before the suffix continues its first step's class with ``m`` partial results per group, ``A + B`` when it
  does not), not one number: under the class-change price of ``mjoin.optimizer.cost`` a suffix's cost depends on
  the run it continues. With one attribute class ``B = 0`` and ``A`` is the paper's memoised Eq. 8 cost, so
  there the memo is the paper's; with several classes the pair keeps dpPick exact.
- Ties: among sequences of equal cost (Eq. 8 after a step forecast empty, ``gamma = 0``:
  every tail costs the same) the one whose tail costs least with ``gamma`` floored at
  ``mjoin.optimizer.cost.GAMMA_FLOOR`` (``gamma_floor``) wins, as for the exact DP
  (``mjoin.optimizer.cost.search_with_gamma_floor``: a second search on the floored problem when a
  gamma is below the floor); the paper's rule keeps the first such sequence the DFS
  finds, whatever its tail (``mjoin.optimizer.cost``, "Ties after an empty step"). Sequences whose costs are
  still equal (within ``mjoin.optimizer.cost.TIE_RTOL``: ties below the floor's resolution, symmetric
  streams) go to the lexicographically first by ``(r_1, c_1, r_2, c_2, ...)`` (``mjoin.optimizer.cost.tie_key``),
  the rule the subset DP follows, so that dppick and exact return the same orders.
"""
from __future__ import annotations

from typing import Iterator

from mjoin.optimizer.cost import GAMMA_FLOOR, TIE_RTOL, CostModel, JoinProblem, search_with_gamma_floor, step_line, tie_key

#: above this many streams dp_pick refuses: (n-1)! sequences per stream and a suffix memo of
#: about e (n-1)! entries (n = 10: ~2 min and ~1 M memo entries per stream; n = 11: 10x that)
MAX_STREAMS = 10


class DpPickTooLarge(ValueError):
    """dpPick would enumerate too many sequences; use the exact subset DP."""


def get_sequences(problem: JoinProblem, start: int | None = None, *, dedupe: bool = True) -> Iterator[tuple]:
    """Algorithm 4 (getSequences): every connected expansion from ``start`` (every stream if
    None) as a tuple of index pairs ``(l, r)``, by depth-first search."""
    n = problem.n
    full = (1 << n) - 1
    edges = [(l, r) for l in range(n) for r in range(n) if problem.cls[l, r] >= 0]

    def dfs(joined: list, mask: int, seq: list):
        if mask == full:
            yield tuple(seq)
            return
        if dedupe:
            for r in range(n):
                if mask >> r & 1 or not problem.adj_mask[r] & mask:
                    continue
                for c in problem.step_classes(mask, r):
                    seq.append((problem.representative(joined, r, c), r))
                    joined.append(r)
                    yield from dfs(joined, mask | 1 << r, seq)
                    joined.pop()
                    seq.pop()
        else:  # the paper's loop over G.edges
            for l, r in edges:
                if mask >> l & 1 and not mask >> r & 1:
                    seq.append((l, r))
                    joined.append(r)
                    yield from dfs(joined, mask | 1 << r, seq)
                    joined.pop()
                    seq.pop()

    for s in (range(n) if start is None else [start]):
        yield from dfs([s], 1 << s, [])


def dp_pick(problem: JoinProblem, model: CostModel, *, dedupe: bool = True,
            max_streams: int = MAX_STREAMS, gamma_floor: float = GAMMA_FLOOR) -> dict:
    """Algorithm 3 (optimizeProbeOrder_dpPick): ``{start: (pairs, cost)}`` with the cheapest
    sequence of every stream under Eq. 8, ties broken by the cost with ``gamma`` floored at
    ``gamma_floor`` (0: no floor) and then as the exact DP breaks them."""
    n = problem.n
    if n > max_streams:
        raise DpPickTooLarge(f"dppick enumerates about (n-1)! = {_fact(n - 1):,} probe sequences per stream "
                             f"for n = {n} streams (limit {max_streams}); use the exact strategy, which "
                             "returns the same optimum")
    return search_with_gamma_floor(problem, model, lambda p: _search(p, model, dedupe), gamma_floor)


def _search(problem: JoinProblem, model: CostModel, dedupe: bool) -> dict:
    """Algorithm 3 proper on ``problem``: ``{start: (pairs, cost)}``."""
    n = problem.n
    full = (1 << n) - 1
    qcost = [float(model.query_cost(k)) for k in problem.kappa]
    am = model.alpha_m
    cls = problem.cls
    cost_dict: dict = {}

    for start in range(n):
        sub_memo: dict = {(): (0.0, 0.0)}  # suffix -> (A, B) of Eq. 65
        # rights mask of each memoised suffix (the streams it joins), to derive the partial result
        rights: dict = {(): 0}

        def calculate_cost(pair, sub):
            """Lines 3-14: ``(A, B)`` of ``pair`` followed by ``sub``, the suffix's memoised."""
            if sub in sub_memo:
                a, b = sub_memo[sub]
            else:
                a, b = calculate_cost(sub[0], sub[1:])
                sub_memo[sub] = (a, b)
                rights[sub] = rights[sub[1:]] | 1 << sub[0][1]
            l, r = pair
            joined_before = full & ~(rights[sub] | 1 << r)
            c = cls[l, r]
            g, u, phi = problem.step_terms(joined_before, r, c)
            return step_line(qcost[r], g, u, phi, None if not sub else bool(cls[sub[0]] == c), am, a, b)

        best = float("inf")
        near: list = []  # (sequence, cost) within TIE_RTOL of the running minimum, in the order found
        for seq in get_sequences(problem, start, dedupe=dedupe):
            a, b = calculate_cost(seq[0], seq[1:])
            cost = a + b
            if best == float("inf") or cost <= best + TIE_RTOL * abs(best):
                near.append((seq, cost))
                if cost < best:
                    best = cost
                    near = [(s_, c_) for s_, c_ in near if c_ <= best + TIE_RTOL * abs(best)]
        seq, cost = min(near, key=lambda sc: tie_key(problem, sc[0]))
        cost_dict[start] = (list(seq), cost)
    return cost_dict


def _fact(k: int) -> int:
    out = 1
    for i in range(2, k + 1):
        out *= i
    return out
