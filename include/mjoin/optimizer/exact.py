"""Exact probe-order optimisation by dynamic programming over subsets (ours; same optimum as dpPick,
docs/algorithms.md, "Probe-order optimizers", Eq. 67-70).

Under the model of ``mjoin.optimizer.cost`` (Eq. 65) the cost of the rest of a probe order depends on the set
``S`` of streams already joined, on the class of its first step and, when that step continues the class of
the step before, on ``m``: the partial results per surviving group that the run has built so far (the product
of ``u phi`` over the run). As a function of ``m`` it is affine for a fixed tail, so the cheapest tail is the
lower envelope of lines ``A + m B``. With

    L(c, S) = the lines (A, B) of the tails from S whose first step uses class c (only the useful ones)

the step ``S -> r`` through class ``c`` (terms ``g, u, phi`` of ``S``, ``r``, ``c``; ``q_r = alpha_q f(kappa_r)``)
followed by a tail gives the line

    continue in c with (A', B') of L(c, S + r):  ( q_r + g (alpha_m u + A'),  g u phi B' )
    change class:                                ( q_r + g alpha_m u,         g u phi F_other(c, S + r) )
    last step (S + r = V):                       ( q_r + g alpha_m u,         0 )

where ``F(c, S) = min over L(c, S) of A + B`` (a tail entered fresh, ``m = 1``) and ``F_other(c, S)`` the lowest
``F`` of the other classes. ``L(c, S)`` keeps the lines on the Pareto front of ``(A, B)`` (a line that another
one beats in both never is the minimum for any ``m >= 0``); the cost of stream ``s`` is ``min_c F(c, {s})``.
It runs one popcount layer at a time with numpy (all subsets of a layer at once, no Python object per state):
per class a table of up to ``W`` lines per subset, the front of each subset taken in ``W`` vectorised passes;
a front wider than ``W`` anywhere doubles ``W`` and runs again (so the result is exact whatever the width).
With one class every ``B`` is 0 and the DP is the classic subset DP for Eq. 8 (one line per subset).

Ties: after a step forecast empty (``g = 0``), where every tail costs the same, the order whose tail costs
least with ``gamma`` floored at ``mjoin.optimizer.cost.GAMMA_FLOOR`` (``gamma_floor``) wins, as in dppick
(``mjoin.optimizer.cost.search_with_gamma_floor``); what still ties (within ``mjoin.optimizer.cost.TIE_RTOL``)
goes to the lexicographically first order by ``(r_1, c_1, ...)`` (``mjoin.optimizer.cost.tie_key``): the order
is rebuilt step by step from the tables, taking at each step the smallest ``(r, c)`` whose best completion
costs the optimum. The returned cost is the unfloored cost of the chosen order.

Tables, per class ``c`` and member ``r``: ``G_c[r, S]``, ``U_c[r, S]`` = the representative (highest gamma,
then lowest mu) class-``c`` edge from ``S`` into ``r`` (gamma -inf: none), built by adding one stream (the
highest bit) at a time, and ``phi`` likewise per class and member. Memory about ``(3 sum_c |c| + 8 K) 2^n``
floats plus the lines (n = 16, two classes of 16: 35 MB).
"""
from __future__ import annotations

import numpy as np

from mjoin.optimizer.cost import GAMMA_FLOOR, TIE_RTOL, CostModel, JoinProblem, search_with_gamma_floor

#: above this many streams the tables get large (n = 20, several classes: about 1 GB)
MAX_STREAMS = 20


class ExactTooLarge(ValueError):
    """The subset DP would need too much memory."""


def class_tables(problem: JoinProblem, c: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``G[i, S], U[i, S]``: gamma and mu of the representative class-``c`` edge from ``S`` into ``rows[i]``
    (Eq. 21: the highest gamma, ties: the lowest mu; gamma -inf where ``S`` has no class-``c`` edge into it)."""
    n = problem.n
    N = 1 << n
    G = np.full((rows.size, N), -np.inf)
    U = np.full((rows.size, N), np.inf)
    for b in range(n):  # subsets whose highest member is b: [2^b, 2^(b+1)) = {b} + a subset below
        lo, hi = 1 << b, 1 << (b + 1)
        in_class = problem.cls[b, rows] == c
        vg = np.where(in_class, problem.gamma[b, rows], -np.inf)[:, None]
        vu = np.where(in_class, problem.mu[b, rows], np.inf)[:, None]
        pg, pu = G[:, :lo], U[:, :lo]
        better = (vg > pg) | ((vg == pg) & (vu < pu))
        G[:, lo:hi] = np.where(better, vg, pg)
        U[:, lo:hi] = np.where(better, vu, pu)
    return G, U


def exact_dp(problem: JoinProblem, model: CostModel, *, max_streams: int = MAX_STREAMS,
             gamma_floor: float = GAMMA_FLOOR) -> dict:
    """``{start: (pairs, cost)}``: a cheapest probe order of every stream under the model, ties broken by
    the cost with ``gamma`` floored at ``gamma_floor`` (0: no floor), then by :func:`mjoin.optimizer.cost.tie_key`."""
    n = problem.n
    if n > max_streams:
        raise ExactTooLarge(f"exact DP over subsets needs tables of 2^{n} entries per stream and class "
                            f"(limit n = {max_streams})")
    return search_with_gamma_floor(problem, model, lambda p: _search(p, model), gamma_floor)


class _Tables:
    """The DP's tables for one problem: terms per class and the lines of every (class, subset)."""

    def __init__(self, problem: JoinProblem, model: CostModel):
        n, K = problem.n, problem.K
        self.problem, self.n, self.K = problem, n, K
        self.q = np.asarray(model.query_cost(problem.kappa), dtype=float).reshape(n)
        self.am = model.alpha_m
        self.rows = [np.array([r for r in range(n) if (problem.cls[:, r] == c).any()], dtype=np.int64)
                     for c in range(K)]
        self.row_of = [{int(r): i for i, r in enumerate(self.rows[c])} for c in range(K)]
        self.terms = [class_tables(problem, c, self.rows[c]) for c in range(K)]
        # classes of r other than c, for the residual filters phi
        self.others = [[[cc for cc in range(K) if cc != c and int(r) in self.row_of[cc]] for r in self.rows[c]]
                       for c in range(K)]
        self.multi = sum(1 for r in self.rows if r.size) > 1  # one class: every B is 0
        # phis[c][i, S]: the residual factor of looking rows[c][i] up through c from S (Eq. 22)
        self.phis = [self.phi(c, slice(None)) for c in range(K)] if self.multi else None

    def phi(self, c: int, S) -> np.ndarray:
        """``phi`` of class ``c``'s members (rows) from the subsets ``S``: the product of the other classes'
        representative gammas (Eq. 22; no edge of a class: no filter)."""
        out = np.ones((self.rows[c].size, 1 << self.n) if isinstance(S, slice) else (self.rows[c].size,) + np.shape(S))
        for i, occ in enumerate(self.others[c]):
            for cc in occ:
                gr = self.terms[cc][0][self.row_of[cc][int(self.rows[c][i])], S]
                out[i] *= np.where(np.isfinite(gr), gr, 1.0)
        return out

    def ranges(self) -> None:
        """``lo[c, S], hi[c, S]``: the range of ``m`` (Eq. 69) at which ``L(c, S)`` is ever evaluated: the products
        of ``u phi`` over the class-``c`` runs whose last step enters ``S``, and 1 (a tail entered fresh)."""
        n, K = self.n, self.K
        N = 1 << n
        lo = self.lo = np.ones((K, N))
        hi = self.hi = np.ones((K, N))
        if not self.multi:
            return  # one class: every B is 0, the lines do not depend on m
        pop = np.bitwise_count(np.arange(N, dtype=np.int64))
        by_layer = np.argsort(pop, kind="stable")
        bounds = np.searchsorted(pop[by_layer], np.arange(n + 2))
        for p in range(2, n):
            S2 = by_layer[bounds[p]:bounds[p + 1]]  # the subsets entered, p members
            for c in range(K):
                R = self.rows[c]
                if R.size == 0:
                    continue
                bit = np.int64(1) << R[:, None]
                S = S2[None, :] & ~bit  # (|c|, m): the subset before the step into r
                has = (S2[None, :] & bit) != 0
                idx = np.arange(R.size)[:, None]
                ok = has & np.isfinite(self.terms[c][0][idx, S])
                with np.errstate(invalid="ignore", over="ignore"):
                    uphi = self.terms[c][1][idx, S] * self.phis[c][idx, S]
                    lo[c, S2] = np.minimum(np.where(ok, uphi * lo[c, S], np.inf).min(axis=0), 1.0)
                    hi[c, S2] = np.maximum(np.where(ok, uphi * hi[c, S], -np.inf).max(axis=0), 1.0)

    def run(self) -> None:
        """Fill the lines of every (class, subset) and ``F`` (Eq. 67-69), one popcount layer at a time."""
        n, K = self.n, self.K
        N = 1 << n
        self.starts = np.zeros((K, N), dtype=np.int64)  # where (c, S)'s lines begin in the store
        self.counts = np.zeros((K, N), dtype=np.int64)
        self.store_a, self.store_b, self.used = np.empty(4 * N), np.empty(4 * N), 0
        F = self.F = np.full((K, N), np.inf)
        # per subset: the lowest F over classes, its class, and the second lowest (F_other)
        best1 = self.best1 = np.full(N, np.inf)
        best2 = self.best2 = np.full(N, np.inf)
        arg1 = self.arg1 = np.full(N, -1, dtype=np.int64)
        pop = np.bitwise_count(np.arange(N, dtype=np.int64))
        by_layer = np.argsort(pop, kind="stable")
        bounds = np.searchsorted(pop[by_layer], np.arange(n + 2))
        with np.errstate(invalid="ignore", over="ignore"):
            for p in range(n - 1, 0, -1):
                S = by_layer[bounds[p]:bounds[p + 1]]  # (m,) subsets with p members
                for c in range(K):
                    if self.rows[c].size:
                        self._layer(c, S, p == n - 1)
                FS = F[:, S]
                cols = np.arange(S.size)
                a1 = np.argmin(FS, axis=0)
                arg1[S] = a1
                best1[S] = FS[a1, cols]
                FS[a1, cols] = np.inf
                best2[S] = FS.min(axis=0)

    def _layer(self, c: int, S: np.ndarray, last: bool) -> None:
        """The lines of ``(c, S)`` for the subsets ``S`` of one layer: every step into a class-``c`` member
        followed by a line of the member's subset (Eq. 67) or a class change (Eq. 68), then the lines that no
        other beats at both ends of the range of ``m`` (Eq. 69)."""
        R = self.rows[c]
        m, k = S.size, R.size
        Gc, Uc = self.terms[c]
        g = Gc[:, S].T  # (m, k): S-major, so that every subset's candidates are contiguous
        bit = np.int64(1) << R[None, :]
        valid = ((S[:, None] & bit) == 0) & np.isfinite(g)
        vi = np.flatnonzero(valid.ravel())  # the valid (S, r) pairs, S-major
        if not vi.size:
            return
        si, ri = np.divmod(vi, k)
        Sv = S[si]
        g = g.ravel()[vi]
        u = Uc[ri, Sv]
        nxt = Sv | (np.int64(1) << R[ri])
        base = self.q[R[ri]] + g * self.am * u
        if last or not self.multi:  # one line per subset: (base, 0) or the classic subset DP (one class)
            val = base if last else base + g * self.store_a[self.starts[c][nxt]]
            best = np.full(m, np.inf)
            np.minimum.at(best, si, val)
            has = np.flatnonzero(np.isfinite(best))
            self._keep(c, S, has, best[has], np.zeros(has.size))
            return
        gup = g * u * self.phis[c][ri, Sv]
        ncont = self.counts[c][nxt]
        a1 = self.arg1[nxt]
        other = np.where(a1 == c, self.best2[nxt], self.best1[nxt])
        sw = np.isfinite(other)
        tot = ncont + sw
        total = int(tot.sum())
        pair = np.repeat(np.arange(vi.size), tot)
        j = np.arange(total) - np.repeat(np.cumsum(tot) - tot, tot)  # candidate's rank within its (S, r)
        cont = j < ncont[pair]
        line = self.starts[c][nxt][pair] + np.where(cont, j, 0)
        basep, gupp = base[pair], gup[pair]
        ca = np.where(cont, basep + g[pair] * self.store_a[line], basep)
        cb = gupp * np.where(cont, self.store_b[line], other[pair])
        seg = si[pair]
        va, vb = ca + self.lo[c, S][seg] * cb, ca + self.hi[c, S][seg] * cb
        idx = np.arange(total)
        out = []
        while idx.size:  # one line of each subset's front per pass, by increasing value at lo
            sg, a_, b_ = seg[idx], va[idx], vb[idx]
            first = np.flatnonzero(np.concatenate(([True], sg[1:] != sg[:-1])))
            cnt = np.diff(np.append(first, sg.size))
            amin = np.repeat(np.minimum.reduceat(a_, first), cnt)
            at_min = a_ == amin
            bmin = np.repeat(np.minimum.reduceat(np.where(at_min, b_, np.inf), first), cnt)
            pi = np.flatnonzero(at_min & (b_ == bmin))
            pi = pi[np.concatenate(([True], sg[pi][1:] != sg[pi][:-1]))]  # the first pick of each subset
            out.append(idx[pi])
            idx = idx[b_ < bmin]
        # line t of a subset is its pick in pass t: store them per subset in pass order
        chosen = np.concatenate(out)
        osg = seg[chosen]
        counts = np.bincount(osg, minlength=m)
        rank = np.concatenate([np.full(o.size, t) for t, o in enumerate(out)])
        pos = (np.cumsum(counts) - counts)[osg] + rank
        a_out, b_out, s_out = (np.empty(chosen.size) for _ in range(3))
        a_out[pos], b_out[pos] = ca[chosen], cb[chosen]
        s_out = np.empty(chosen.size, dtype=np.int64)
        s_out[pos] = osg
        self._keep(c, S, s_out, a_out, b_out)

    def _keep(self, c: int, S: np.ndarray, seg: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """Store the lines ``(a, b)`` of the subsets ``S[seg]`` (``seg`` ascending) and their ``F`` (at m = 1)."""
        total = seg.size
        if self.used + total > self.store_a.size:
            size = max(2 * self.store_a.size, self.used + total)
            self.store_a = np.resize(self.store_a, size)
            self.store_b = np.resize(self.store_b, size)
        self.store_a[self.used:self.used + total] = a
        self.store_b[self.used:self.used + total] = b
        counts = np.bincount(seg, minlength=S.size)
        self.counts[c, S] = counts
        self.starts[c, S] = self.used + np.cumsum(counts) - counts
        if total:
            first = np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1])))
            f = np.full(S.size, np.inf)
            f[seg[first]] = np.minimum.reduceat(a + b, first)
            self.F[c, S] = f
        self.used += total

    # ---- one order, rebuilt step by step (ties: the lexicographically first) -----------------------------
    def tail(self, c: int, S: int, mult: float) -> float:
        """The cheapest tail from ``S`` whose first step uses class ``c`` and continues a run with ``mult``."""
        i, k = self.starts[c, S], self.counts[c, S]
        if not k:
            return np.inf
        return float((self.store_a[i:i + k] + mult * self.store_b[i:i + k]).min())

    def other(self, c: int, S: int) -> float:
        return float(self.best2[S] if self.arg1[S] == c else self.best1[S])

    def candidates(self, S: int, cprev: int | None, R: float, W: float, P: float):
        """``[(key, total, (r, c, g, u, phi, weight, m_in))]`` of every next step from ``S``."""
        problem, full = self.problem, (1 << self.n) - 1
        out = []
        for r in range(self.n):
            if S >> r & 1 or not problem.adj_mask[r] & S:
                continue
            for c in range(self.K):
                i = self.row_of[c].get(r)
                if i is None:
                    continue
                g = float(self.terms[c][0][i, S])
                if g == -np.inf:
                    continue
                u = float(self.terms[c][1][i, S])
                phi = 1.0
                for cc in self.others[c][i]:
                    gr = float(self.terms[cc][0][self.row_of[cc][r], S])
                    if gr > -np.inf:
                        phi *= gr
                same = cprev == c
                m_in, weight = (R, W) if same else (1.0, W * R)
                base = self.q[r] + g * self.am * u
                nxt = S | 1 << r
                if nxt == full:
                    value = base
                else:
                    mult = m_in * u * phi
                    best = self.tail(c, nxt, mult)
                    other = self.other(c, nxt) if self.multi else np.inf
                    if other < np.inf:
                        best = min(best, mult * other)
                    value = base + g * best if g else base
                out.append(((r, c), P + weight * value, (r, c, g, u, phi, weight, m_in, base)))
        return out

    def order(self, s: int) -> tuple[list, float]:
        problem, full = self.problem, (1 << self.n) - 1
        S, cprev, R, W, P = 1 << s, None, 1.0, 1.0, 0.0
        joined, pairs, opt = [s], [], None
        while S != full:
            cands = self.candidates(S, cprev, R, W, P)
            if opt is None:
                opt = min(t for _, t, _ in cands)
            ok = [x for x in cands if x[1] <= opt + TIE_RTOL * abs(opt)] or [min(cands, key=lambda x: x[1])]
            _, _, (r, c, g, u, phi, weight, m_in, base) = min(ok, key=lambda x: x[0])
            pairs.append((problem.representative(joined, r, c), r))
            joined.append(r)
            P += weight * base
            W, R, cprev = weight * g, m_in * u * phi, c
            S |= 1 << r
        return pairs, P


def _search(problem: JoinProblem, model: CostModel) -> dict:
    """The DP proper on ``problem``: ``{start: (pairs, cost)}``."""
    tables = _Tables(problem, model)
    tables.ranges()
    tables.run()
    return {s: tables.order(s) for s in range(problem.n)}
