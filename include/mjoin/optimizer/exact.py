"""Exact probe-order optimisation by dynamic programming over subsets (ours; same optimum as
dpPick, docs/algorithms.md, "Probe-order optimizers").

Under the model of ``mjoin.optimizer.cost`` the cost of the tail of a probe order depends only on
the set ``S`` of streams already joined and on the first step of the tail. With

    T(c, S) = min cost of completing the order from S with a first step of class c

the step ``S -> r`` through class ``c`` (terms ``g, u, phi`` of ``S``, ``r``, ``c``) costs

    q_r + g ( alpha_m u + phi M ),   M = min( T(c, S+r),  u * min_{c' != c} T(c', S+r) )

because ``rho = 1`` when the next step keeps the class and ``u`` when it changes it, and
``g, phi, u >= 0`` let the minimum over tails move inside the product. ``T(., V) = 0``;
the cost of stream ``s`` is ``min_c T(c, {s})``. ``T(c, S)`` is the minimum over the
streams ``r`` of class ``c`` outside ``S``: ``2^n * sum_c |c|`` transitions in all
(``n 2^n`` for one class), computed one popcount layer at a time with numpy, every
subset of a layer at once, no Python object per state.

Ties: after a step forecast empty (``g = 0``), where Eq. 8 gives every tail the same cost,
the order whose tail costs least with ``gamma`` floored at ``mjoin.optimizer.cost.GAMMA_FLOOR``
(``gamma_floor``) wins, as in dppick (``mjoin.optimizer.cost.search_with_gamma_floor``: the DP run
again on the floored problem when a gamma is below the floor; ``mjoin.optimizer.cost``, "Ties after
an empty step"). The returned cost is the unfloored Eq. 8 cost of the chosen order.

Tables, per class ``c`` and member ``r``: ``G_c[r, S]``, ``U_c[r, S]`` = the lowest
(gamma, mu) over class-``c`` edges from ``S`` into ``r`` (inf: none), built by adding one
stream (the highest bit) at a time. Memory ``(2 sum_c |c| + 2 K) * 2^n`` floats
(n = 16, one class: 17 MB).
"""
from __future__ import annotations

import numpy as np

from mjoin.optimizer.cost import GAMMA_FLOOR, CostModel, JoinProblem, search_with_gamma_floor

#: above this many streams the tables get large (n = 20, one class: 350 MB)
MAX_STREAMS = 20


class ExactTooLarge(ValueError):
    """The subset DP would need too much memory."""


def _class_tables(problem: JoinProblem, c: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``G[i, S], U[i, S]`` for the class-``c`` members ``rows[i]``."""
    n = problem.n
    N = 1 << n
    G = np.full((rows.size, N), np.inf)
    U = np.full((rows.size, N), np.inf)
    for b in range(n):  # subsets whose highest member is b: [2^b, 2^(b+1)) = {b} + a subset below
        lo, hi = 1 << b, 1 << (b + 1)
        in_class = problem.cls[b, rows] == c
        vg = np.where(in_class, problem.gamma[b, rows], np.inf)[:, None]
        vu = np.where(in_class, problem.mu[b, rows], np.inf)[:, None]
        pg, pu = G[:, :lo], U[:, :lo]
        better = (vg < pg) | ((vg == pg) & (vu < pu))
        G[:, lo:hi] = np.where(better, vg, pg)
        U[:, lo:hi] = np.where(better, vu, pu)
    return G, U


def exact_dp(problem: JoinProblem, model: CostModel, *, max_streams: int = MAX_STREAMS,
             gamma_floor: float = GAMMA_FLOOR) -> dict:
    """``{start: (pairs, cost)}``: a cheapest probe order of every stream under the model, ties broken by
    the cost with ``gamma`` floored at ``gamma_floor`` (0: no floor)."""
    n = problem.n
    if n > max_streams:
        raise ExactTooLarge(f"exact DP over subsets needs tables of 2^{n} entries per stream and class "
                            f"(limit n = {max_streams})")
    return search_with_gamma_floor(problem, model, lambda p: _search(p, model), gamma_floor)


def _search(problem: JoinProblem, model: CostModel) -> dict:
    """The DP proper on ``problem``: ``{start: (pairs, cost)}``."""
    n, K = problem.n, problem.K
    N = 1 << n
    full = N - 1
    q = np.asarray(model.query_cost(problem.kappa), dtype=float).reshape(n)
    am = model.alpha_m

    rows = [np.array([r for r in range(n) if (problem.cls[:, r] == c).any()], dtype=np.int64) for c in range(K)]
    row_of = [{int(r): i for i, r in enumerate(rows[c])} for c in range(K)]
    tables = [_class_tables(problem, c, rows[c]) for c in range(K)]
    # classes of r other than c, for the residual filters phi
    others = [[[cc for cc in range(K) if cc != c and int(r) in row_of[cc]] for r in rows[c]] for c in range(K)]

    T = np.full((K, N), np.inf)
    T[:, full] = 0.0
    choice = np.full((K, N), -1, dtype=np.int8)
    # per subset: the lowest tail over classes, its class, and the second lowest
    best1 = np.full(N, np.inf)
    best2 = np.full(N, np.inf)
    arg1 = np.full(N, -1, dtype=np.int64)
    best1[full] = best2[full] = 0.0

    subsets = np.arange(N, dtype=np.int64)
    pop = np.bitwise_count(subsets)
    by_layer = np.argsort(pop, kind="stable")
    bounds = np.searchsorted(pop[by_layer], np.arange(n + 2))

    with np.errstate(invalid="ignore", over="ignore"):
        for p in range(n - 1, 0, -1):
            S = by_layer[bounds[p]:bounds[p + 1]]  # (m,) subsets with p members
            m = S.size
            cols = np.arange(m)
            for c in range(K):
                R = rows[c]
                if R.size == 0:
                    continue
                Gc, Uc = tables[c]
                g, u = Gc[:, S], Uc[:, S]  # (|c|, m)
                bit = np.int64(1) << R[:, None]
                nxt = S[None, :] | bit
                valid = ((S[None, :] & bit) == 0) & np.isfinite(g)
                same = T[c, nxt]
                if K > 1:
                    other = np.where(arg1[nxt] == c, best2[nxt], best1[nxt])
                    M = np.minimum(same, np.where(np.isfinite(other), u * other, np.inf))
                    phi = np.ones_like(g)
                    for i, occ in enumerate(others[c]):
                        for cc in occ:
                            gr = tables[cc][0][row_of[cc][int(R[i])], S]
                            phi[i] *= np.where(np.isfinite(gr), gr, 1.0)  # no edge of that class: no filter
                    val = q[R][:, None] + g * (am * u + phi * M)
                else:
                    val = q[R][:, None] + g * (am * u + same)
                val = np.where(valid, val, np.inf)
                best = np.argmin(val, axis=0)
                Tc = val[best, cols]
                T[c, S] = Tc
                choice[c, S] = np.where(np.isfinite(Tc), R[best], -1)
            if K > 1:
                TS = T[:, S]
                a1 = np.argmin(TS, axis=0)
                arg1[S] = a1
                best1[S] = TS[a1, cols]
                TS[a1, cols] = np.inf
                best2[S] = TS.min(axis=0)

    out = {}
    for s in range(n):
        S0 = 1 << s
        c = int(np.argmin(T[:, S0]))
        cost = float(T[c, S0])
        joined, mask, pairs = [s], S0, []
        while mask != full:
            r = int(choice[c, mask])
            pairs.append((problem.representative(joined, r, c), r))
            u = tables[c][1][row_of[c][r], mask]
            joined.append(r)
            mask |= 1 << r
            if mask != full:
                tails = T[:, mask]
                mult = np.where(np.arange(K) == c, 1.0, u)
                with np.errstate(invalid="ignore"):  # 0 * inf where a class has no tail: masked
                    c = int(np.argmin(np.where(np.isfinite(tails), mult * tails, np.inf)))  # the M of the DP
        out[s] = (pairs, cost)
    return out
