"""Exact probe-order optimisation by dynamic programming over subsets (ours; same optimum as dpPick,
docs/algorithms.md, "Probe-order optimizers", Eq. 30-32, 65, 67-68).

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
``F`` of the other classes; the cost of stream ``s`` is ``min_c F(c, {s})``. ``L(c, S)`` is only ever evaluated at
``m = 1`` and at the products of ``u phi`` over the class-``c`` runs that end with the step into ``S``: a forward
pass over the subsets gives their range ``[lo, hi]`` (Eq. 67), and a line that another one beats at both ends of
it is dropped (Eq. 31; affine lines: beaten at both ends is beaten in between), so the minimum over the kept lines
is exact on the whole range. It runs one popcount layer at a time with numpy, every class of a layer at once (no
Python object per state): the candidate lines of a layer in flat arrays, the lines kept for each ``(c, S)`` in a
ragged store (on the optimizer benchmark's several-class graphs 1-2 lines per state on average, at most a few
dozen). With one class every ``B`` is 0 and the DP is the classic subset DP for Eq. 8 (one line per subset).

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
#: subsets of a layer handled at once (their candidate lines' arrays stay within a few tens of MB)
CHUNK = 8192


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
        # every (class, member) as one row, grouped by class: one pass per layer covers all classes
        self.row_offset = np.cumsum([0] + [r.size for r in self.rows])
        total = int(self.row_offset[-1])
        self.GA, self.UA = np.empty((total, 1 << n)), np.empty((total, 1 << n))
        self.terms = []
        for c in range(K):
            lo, hi = self.row_offset[c], self.row_offset[c + 1]
            self.GA[lo:hi], self.UA[lo:hi] = class_tables(problem, c, self.rows[c])
            self.terms.append((self.GA[lo:hi], self.UA[lo:hi]))  # views
        # classes of r other than c, for the residual filters phi
        self.others = [[[cc for cc in range(K) if cc != c and int(r) in self.row_of[cc]] for r in self.rows[c]]
                       for c in range(K)]
        self.multi = sum(1 for r in self.rows if r.size) > 1  # one class: every B is 0
        # PA[row, S]: the residual factor of looking the row's member up through its class from S (Eq. 22)
        self.PA = np.vstack([self.phi(c, slice(None)) for c in range(K)]) if self.multi else None
        self.phis = [self.PA[self.row_offset[c]:self.row_offset[c + 1]] for c in range(K)] if self.multi else None
        self.row_class = np.concatenate([np.full(r.size, c, dtype=np.int64) for c, r in enumerate(self.rows)])
        self.row_stream = np.concatenate(self.rows)
        self.full = (1 << n) - 1
        # stream_rows[r]: (class, row) of every class r can be looked up through, by class
        self.stream_rows = [[(int(c), int(i)) for i, (c, rr) in enumerate(zip(self.row_class, self.row_stream))
                             if rr == r] for r in range(n)]

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
        """``lo[c, S], hi[c, S]``: the range of ``m`` (Eq. 67) at which ``L(c, S)`` is ever evaluated: the products
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
        for p, i in ((p, i) for p in range(2, n) for i in range(bounds[p], bounds[p + 1], CHUNK)):
            S2 = by_layer[i:min(i + CHUNK, bounds[p + 1])]  # subsets entered, p members (a chunk of them)
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
        """Fill the lines of every (class, subset) and ``F`` (Eq. 30-32, 67), one popcount layer at a time."""
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
                for i in range(0, S.size, CHUNK):  # the subsets of a layer are independent: bounded memory
                    self._layer(S[i:i + CHUNK], p == n - 1)
                FS = F[:, S]
                cols = np.arange(S.size)
                a1 = np.argmin(FS, axis=0)
                arg1[S] = a1
                best1[S] = FS[a1, cols]
                FS[a1, cols] = np.inf
                best2[S] = FS.min(axis=0)

    def _layer(self, S: np.ndarray, last: bool) -> None:
        """The lines of ``(c, S)`` for every class ``c`` and the subsets ``S`` of one layer: every step into a
        class-``c`` member followed by a line of the member's subset (Eq. 30), then the
        lines that no other beats at both ends of the range of ``m`` (Eq. 67). A segment is one ``(c, S)``:
        ``seg = c m + s`` for the ``s``-th subset; every segment's candidates are contiguous."""
        K, m = self.K, S.size
        g2 = self.GA[:, S]  # (rows, m)
        bit = np.int64(1) << self.row_stream[:, None]
        valid2 = ((S[None, :] & bit) == 0) & np.isfinite(g2)
        # (class, subset, member) order: each class's block transposed
        perm = np.concatenate([((self.row_offset[c] + np.arange(self.rows[c].size))[None, :] * m
                                + np.arange(m)[:, None]).ravel() for c in range(K)])
        vi = perm[valid2.ravel()[perm]]
        if not vi.size:
            return
        row, si = np.divmod(vi, m)
        cp = self.row_class[row]
        seg = cp * m + si
        Sv = S[si]
        g = g2.ravel()[vi]
        u = self.UA[row, Sv]
        nxt = Sv | (np.int64(1) << self.row_stream[row])
        base = self.q[self.row_stream[row]] + g * self.am * u
        if last or not self.multi:  # one line per segment: (base, 0) or the classic subset DP (one class)
            val = base if last else base + g * self.store_a[self.starts[cp, nxt]]
            best = np.full(K * m, np.inf)
            np.minimum.at(best, seg, val)
            has = np.flatnonzero(np.isfinite(best))
            self._keep(S, has, best[has], np.zeros(has.size))
            return
        gup = g * u * self.PA[row, Sv]
        ncont = self.counts[cp, nxt]
        other = np.where(self.arg1[nxt] == cp, self.best2[nxt], self.best1[nxt])
        tot = ncont + np.isfinite(other)
        total = int(tot.sum())
        pair = np.repeat(np.arange(vi.size), tot)
        j = np.arange(total) - np.repeat(np.cumsum(tot) - tot, tot)  # candidate's rank within its (S, r)
        cont = j < ncont[pair]
        line = self.starts[cp, nxt][pair] + np.where(cont, j, 0)
        basep = base[pair]
        ca = np.where(cont, basep + g[pair] * self.store_a[line], basep)
        cb = gup[pair] * np.where(cont, self.store_b[line], other[pair])
        sg_all = seg[pair]
        va = ca + self.lo[:, S].ravel()[sg_all] * cb
        vb = ca + self.hi[:, S].ravel()[sg_all] * cb
        # drop what the lowest line at lo or the lowest at hi beats at both ends (most of it: one pass for all)
        first = np.flatnonzero(np.concatenate(([True], sg_all[1:] != sg_all[:-1])))
        cnt = np.diff(np.append(first, total))
        lo_min = np.repeat(np.minimum.reduceat(va, first), cnt)
        hi_min = np.repeat(np.minimum.reduceat(vb, first), cnt)
        hi_of_lo = np.repeat(np.minimum.reduceat(np.where(va == lo_min, vb, np.inf), first), cnt)
        lo_of_hi = np.repeat(np.minimum.reduceat(np.where(vb == hi_min, va, np.inf), first), cnt)
        idx = np.flatnonzero(((va < lo_of_hi) | (vb <= hi_min)) & ((vb < hi_of_lo) | (va <= lo_min)))
        out = []
        while idx.size:  # one line of each segment's front per pass, by increasing value at lo
            sg, a_, b_ = sg_all[idx], va[idx], vb[idx]
            first = np.flatnonzero(np.concatenate(([True], sg[1:] != sg[:-1])))
            cnt = np.diff(np.append(first, sg.size))
            amin = np.repeat(np.minimum.reduceat(a_, first), cnt)
            at_min = a_ == amin
            bmin = np.repeat(np.minimum.reduceat(np.where(at_min, b_, np.inf), first), cnt)
            pi = np.flatnonzero(at_min & (b_ == bmin))
            pi = pi[np.concatenate(([True], sg[pi][1:] != sg[pi][:-1]))]  # the first pick of each segment
            out.append(idx[pi])
            idx = idx[b_ < bmin]
        # line t of a segment is its pick in pass t: store them per segment in pass order
        chosen = np.concatenate(out)
        osg = sg_all[chosen]
        counts = np.bincount(osg, minlength=K * m)
        rank = np.concatenate([np.full(o.size, t) for t, o in enumerate(out)])
        pos = (np.cumsum(counts) - counts)[osg] + rank
        a_out, b_out = np.empty(chosen.size), np.empty(chosen.size)
        s_out = np.empty(chosen.size, dtype=np.int64)
        a_out[pos], b_out[pos], s_out[pos] = ca[chosen], cb[chosen], osg
        self._keep(S, s_out, a_out, b_out)

    def _keep(self, S: np.ndarray, seg: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """Store the lines ``(a, b)`` of the segments ``seg`` (ascending; ``c m + s``) and their ``F`` (m = 1)."""
        K, m, total = self.K, S.size, seg.size
        if self.used + total > self.store_a.size:
            size = max(2 * self.store_a.size, self.used + total)
            self.store_a = np.resize(self.store_a, size)
            self.store_b = np.resize(self.store_b, size)
        self.store_a[self.used:self.used + total] = a
        self.store_b[self.used:self.used + total] = b
        counts = np.bincount(seg, minlength=K * m)
        self.counts[:, S] = counts.reshape(K, m)
        self.starts[:, S] = (self.used + np.cumsum(counts) - counts).reshape(K, m)
        if total:
            first = np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1])))
            f = np.full(K * m, np.inf)
            f[seg[first]] = np.minimum.reduceat(a + b, first)
            self.F[:, S] = f.reshape(K, m)
        self.used += total

    # ---- one order, rebuilt step by step (ties: the lexicographically first) -----------------------------
    def _tail(self, c: int, S: int, mult: float) -> float:
        """The cheapest tail from ``S`` whose first step uses class ``c`` and continues a run with ``mult``."""
        i, k = int(self.starts[c, S]), int(self.counts[c, S])
        if k == 1:
            return float(self.store_a[i] + mult * self.store_b[i])
        if not k:
            return np.inf
        return float((self.store_a[i:i + k] + mult * self.store_b[i:i + k]).min())

    def _step(self, S: int, r: int, c: int, row: int, cprev: int, R: float, W: float, P: float):
        """``(total, terms)`` of the step ``S -> r`` through ``c`` followed by its best completion (None: no edge)."""
        g = float(self.GA[row, S])
        if g == -np.inf:
            return None
        u = float(self.UA[row, S])
        phi = float(self.PA[row, S]) if self.multi else 1.0
        m_in, weight = (R, W) if cprev == c else (1.0, W * R)
        base = float(self.q[r]) + g * self.am * u
        nxt = S | 1 << r
        value = base
        if nxt != self.full and g:
            mult = m_in * u * phi
            best = self._tail(c, nxt, mult)
            if self.multi:
                other = float(self.best2[nxt] if self.arg1[nxt] == c else self.best1[nxt])
                if other < np.inf:
                    best = min(best, mult * other)
            value = base + g * best
        return P + weight * value, (g, u, phi, weight, m_in, base)

    def order(self, s: int) -> tuple[list, float]:
        """The order of stream ``s``: at each step the first ``(r, c)`` (lexicographically) whose best completion
        costs the optimum (to :data:`mjoin.optimizer.cost.TIE_RTOL`)."""
        problem, full = self.problem, self.full
        S, cprev, R, W, P = 1 << s, -1, 1.0, 1.0, 0.0
        opt = float(self.F[:, S].min())
        limit = opt + TIE_RTOL * abs(opt)
        joined, pairs = [s], []
        while S != full:
            pick, fallback = None, None
            for r in range(self.n):
                if S >> r & 1 or not problem.adj_mask[r] & S:
                    continue
                for c, row in self.stream_rows[r]:
                    got = self._step(S, r, c, row, cprev, R, W, P)
                    if got is None:
                        continue
                    if got[0] <= limit:
                        pick = (r, c, got[1])
                        break
                    if fallback is None or got[0] < fallback[0]:
                        fallback = (got[0], (r, c, got[1]))
                if pick is not None:
                    break
            r, c, (g, u, phi, weight, m_in, base) = pick if pick is not None else fallback[1]
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
