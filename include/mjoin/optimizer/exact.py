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
costs the optimum (every start's order at once, one step of all of them per numpy pass). The returned cost is the unfloored cost of the chosen order. The floored search runs in the
same DP as the unfloored one, as a second copy of the subsets: it computes only the subsets from which some step
(of theirs or of a superset's) has other terms once floored, and shares the plain copy's lines everywhere else,
both copies pruned over one range of ``m`` that covers either (on the optimizer benchmark's graphs it computes
0-75% of the subsets; the two searches' orders are the same as run apart).

Tables, one row per subset (a layer gathers whole rows) and one column per (class, member) pair:
``GA[S, i], UA[S, i]`` = the representative (highest gamma, then lowest mu) edge from ``S`` of column ``i``'s class
into its member (gamma -inf: none; NaN: the member is in ``S``, no step), built by adding one stream (the highest
bit) at a time; ``phi`` of a step is the product of ``GA`` over its member's other columns, taken where a step
needs it. Memory about ``(2 sum_c |c| + 8 K) 2^n`` floats per copy plus the lines (n = 16, two classes of 16:
42 MB per copy).
"""
from __future__ import annotations

import numpy as np

from mjoin.optimizer.cost import GAMMA_FLOOR, TIE_RTOL, CostModel, JoinProblem, search_with_gamma_floor

#: above this many streams the tables get large (n = 20, several classes: about 1 GB per copy)
MAX_STREAMS = 20
#: subsets of a layer handled at once (their candidate lines' arrays stay within a few tens of MB)
CHUNK = 8192


class ExactTooLarge(ValueError):
    """The subset DP would need too much memory."""


def class_tables(problem: JoinProblem, row_class: np.ndarray, row_stream: np.ndarray, G: np.ndarray,
                 U: np.ndarray) -> None:
    """Fill ``G[S, i], U[S, i]``: gamma and mu of the representative class-``row_class[i]`` edge from ``S`` into
    ``row_stream[i]`` (Eq. 21: the highest gamma, ties: the lowest mu; gamma -inf where ``S`` has no such edge, NaN
    where ``row_stream[i]`` is in ``S``: no step)."""
    G[0], U[0] = -np.inf, np.inf
    at = [np.flatnonzero(row_stream == b) for b in range(problem.n)]
    for b in range(problem.n):  # subsets whose highest member is b: [2^b, 2^(b+1)) = {b} + a subset below
        lo, hi = 1 << b, 1 << (b + 1)
        in_class = problem.cls[b, row_stream] == row_class
        vg = np.where(in_class, problem.gamma[b, row_stream], -np.inf)[None, :]
        vu = np.where(in_class, problem.mu[b, row_stream], np.inf)[None, :]
        pg, pu = G[:lo], U[:lo]
        np.copyto(U[lo:hi], pu)
        np.copyto(U[lo:hi], vu, where=(vg > pg) | ((vg == pg) & (vu < pu)))
        np.maximum(pg, vg, out=G[lo:hi])  # NaN stays NaN in the subsets above
        G[lo:hi, at[b]] = np.nan


def exact_dp(problem: JoinProblem, model: CostModel, *, max_streams: int = MAX_STREAMS,
             gamma_floor: float = GAMMA_FLOOR) -> dict:
    """``{start: (pairs, cost)}``: a cheapest probe order of every stream under the model, ties broken by
    the cost with ``gamma`` floored at ``gamma_floor`` (0: no floor), then by :func:`mjoin.optimizer.cost.tie_key`."""
    n = problem.n
    if n > max_streams:
        raise ExactTooLarge(f"exact DP over subsets needs tables of 2^{n} entries per stream and class "
                            f"(limit n = {max_streams})")
    return search_with_gamma_floor(problem, model, lambda p: _search([p], model)[0], gamma_floor,
                                   search_both=lambda p, f: tuple(_search([p, f], model)))


class _Tables:
    """The DP's tables for one problem, or for a problem and its floored copy side by side (copy ``k``'s subset
    ``S`` at index ``S + k 2^n``): terms per subset and (class, member) row, and the lines of every (subset, class).
    A subset's row of every table is contiguous: a layer gathers whole rows."""

    def __init__(self, problems: list, model: CostModel):
        problem = problems[0]
        n, K = problem.n, problem.K
        self.problem, self.n, self.K = problem, n, K
        self.copies, self.N = len(problems), 1 << n
        NN = self.copies * self.N
        self.q = np.asarray(model.query_cost(problem.kappa), dtype=float).reshape(n)
        self.am = model.alpha_m
        self.rows = [np.array([r for r in range(n) if (problem.cls[:, r] == c).any()], dtype=np.int64)
                     for c in range(K)]
        # every (class, member) as one row, grouped by class
        self.row_offset = np.cumsum([0] + [r.size for r in self.rows])
        self.R = R = int(self.row_offset[-1])
        self.row_class = np.concatenate([np.full(r.size, c, dtype=np.int64) for c, r in enumerate(self.rows)])
        self.row_stream = np.concatenate(self.rows)
        self.GA, self.UA = np.empty((NN, R)), np.empty((NN, R))
        for k, pr in enumerate(problems):
            at = slice(k * self.N, (k + 1) * self.N)
            class_tables(pr, self.row_class, self.row_stream, self.GA[at], self.UA[at])
        self.multi = sum(1 for r in self.rows if r.size) > 1  # one class: every B is 0
        # phi of a step (Eq. 22): the product of the other classes' representative gammas into the row's member
        # (no edge of a class: no filter), from the rows of the same member in the other classes (ascending)
        others = [[j for j in range(R) if self.row_stream[j] == self.row_stream[i] and j != i] for i in range(R)]
        width = max(len(o) for o in others) if self.multi else 0
        self.phi_rows = [np.array([o[w] if w < len(o) else -1 for o in others], dtype=np.int64) for w in range(width)]
        self.row_bit = np.int64(1) << self.row_stream
        self.q_row = self.q[self.row_stream]
        self.full = self.N - 1
        if self.copies > 1:
            self.shared_from()

    def phi(self, fi: np.ndarray, row: np.ndarray) -> np.ndarray:
        """phi of the steps at the flat ``(S, row)`` indices ``fi`` (``S R + row``) of the row tables."""
        out = np.ones(fi.size)
        ga, at = self.GA.ravel(), fi - row
        for other in self.phi_rows:
            j = other[row]
            g = ga[at + np.maximum(j, 0)]
            out *= np.where((j >= 0) & np.isfinite(g), g, 1.0)
        return out

    def shared_from(self) -> None:
        """``own[S]``: the floored copy's lines of ``S`` may differ from the plain copy's, because a step from ``S``
        or from a superset of it has other terms there (a floored ``gamma``, the ``mu`` or ``phi`` that comes
        with it). Every other subset's lines are the plain copy's (the same steps over the same tails, pruned
        over the same range of ``m``), so the floored copy computes only these and shares the rest."""
        N = self.N
        differs = (self.GA[:N] != self.GA[N:]) | (self.UA[:N] != self.UA[N:])
        # (phi differs only where another class's gamma into the same member does: counted there)
        differs &= (np.arange(N, dtype=np.int64)[:, None] >> self.row_stream[None, :] & 1) == 0  # steps out of S
        own = differs.any(axis=1)
        for b in range(self.n):  # own[S] |= own[S + b]: every superset (superset-OR over the bits)
            v = own.reshape(-1, 2, 1 << b)
            v[:, 0, :] |= v[:, 1, :]
        self.own = own

    def ranges(self) -> None:
        """``lo[S, c], hi[S, c]``: the range of ``m`` (Eq. 67) at which ``L(c, S)`` is ever evaluated: the products
        of ``u phi`` over the class-``c`` runs whose last step enters ``S``, and 1 (a tail entered fresh). One
        range for both copies (what either can reach): a shared subset's lines serve both."""
        n, K, N = self.n, self.K, self.N
        self.lo = self.hi = np.ones((self.copies * N, K))
        if not self.multi:
            return  # one class: every B is 0, the lines do not depend on m
        R = self.R
        lo, hi = np.ones(N * K), np.ones(N * K)  # flat (S, c)
        pop = np.bitwise_count(np.arange(N, dtype=np.int64))
        by_layer = np.argsort(pop, kind="stable")
        bounds = np.searchsorted(pop[by_layer], np.arange(n + 2))
        with np.errstate(invalid="ignore", over="ignore"):
            ua = self.UA.ravel()
            for p in range(1, n - 1):  # every step out of a subset of p members (into one of p + 1 < n)
                S = by_layer[bounds[p]:bounds[p + 1]]
                vi = np.flatnonzero(np.isfinite(self.GA[S]))  # the steps (not finite: none)
                si = vi // R
                row = vi - si * R
                Sv, c = S[si], self.row_class[row]
                fi, fk = Sv * R + row, Sv * K + c
                to = (Sv | self.row_bit[row]) * K + c
                ulo = uhi = ua[fi] * self.phi(fi, row)  # u phi, the lowest and highest over the copies
                if self.copies > 1:
                    uf = ua[fi + N * R] * self.phi(fi + N * R, row)
                    ulo, uhi = np.minimum(ulo, uf), np.maximum(uhi, uf)
                np.minimum.at(lo, to, ulo * lo[fk])
                np.maximum.at(hi, to, uhi * hi[fk])
        lo, hi = lo.reshape(N, K), hi.reshape(N, K)
        self.lo, self.hi = np.tile(lo, (self.copies, 1)), np.tile(hi, (self.copies, 1))

    def run(self) -> None:
        """Fill the lines of every (subset, class) and ``F`` (Eq. 30-32, 67), one popcount layer at a time."""
        n, K, N = self.n, self.K, self.N
        NN = self.copies * N
        self.starts = np.zeros((NN, K), dtype=np.int64)  # where (S, c)'s lines begin in the store
        self.counts = np.zeros((NN, K), dtype=np.int64)
        # room for 8 lines per subset and copy up front (np.empty: pages are only taken when written)
        self.store_a, self.store_b, self.used = np.empty(8 * NN), np.empty(8 * NN), 0
        F = self.F = np.full((NN, K), np.inf)
        # other[S, c]: the lowest F of the classes other than c (F_other)
        other = self.other = np.full((NN, K), np.inf)
        classes = np.arange(K)[:, None]
        pop = np.bitwise_count(np.arange(N, dtype=np.int64))
        by_layer = np.argsort(pop, kind="stable")
        bounds = np.searchsorted(pop[by_layer], np.arange(n + 2))
        with np.errstate(invalid="ignore", over="ignore"):
            for p in range(n - 1, 0, -1):
                S = plain = by_layer[bounds[p]:bounds[p + 1]]  # (m,) subsets with p members
                if self.copies > 1:  # the floored copy's own subsets; the others share the plain copy's lines
                    S = np.concatenate([plain, plain[self.own[plain]] + N])
                for i in range(0, S.size, CHUNK):  # the subsets of a layer are independent: bounded memory
                    self._layer(S[i:i + CHUNK], p == n - 1)
                FS = F[S].T  # (K, m): the lowest, its class (the first of equal ones) and the second lowest
                a1 = np.argmin(FS, axis=0)
                cols = np.arange(S.size)
                best1 = FS[a1, cols]
                FS[a1, cols] = np.inf
                other[S] = np.where(classes == a1, FS.min(axis=0), best1).T
                if self.copies > 1:
                    shared = plain[~self.own[plain]]
                    for table in (self.starts, self.counts, F, other):
                        table[shared + N] = table[shared]

    def _layer(self, S: np.ndarray, last: bool) -> None:
        """The lines of ``(S, c)`` for the subsets ``S`` of one layer and every class ``c``: every step into a
        class-``c`` member followed by a line of the member's subset (Eq. 30), then the lines that no other beats
        at both ends of the range of ``m`` (Eq. 67). A segment is one ``(S, c)``: ``seg = s K + c`` for the
        ``s``-th subset; the steps come in (subset, class, member) order, so every segment's candidates are
        contiguous."""
        K, m, R = self.K, S.size, self.R
        g2 = self.GA[S]  # (m, rows); not finite: no step (-inf: no edge, NaN: the member is in S)
        vi = np.flatnonzero(np.isfinite(g2))
        if not vi.size:
            return
        si = vi // R
        row = vi - si * R
        cp = self.row_class[row]
        seg = si * K + cp
        Sv = S[si]
        fi = Sv * R + row  # (S, row) in the row tables, flat
        g = g2.ravel()[vi]
        u = self.UA.ravel()[fi]
        nxt = Sv | self.row_bit[row]
        fk = nxt * K + cp  # (S + r, c) in the class tables, flat
        base = self.q_row[row] + g * self.am * u
        if last or not self.multi:  # one line per segment: (base, 0) or the classic subset DP (one class)
            val = base if last else base + g * self.store_a[self.starts.ravel()[fk]]
            best = np.full(K * m, np.inf)
            np.minimum.at(best, seg, val)
            has = np.flatnonzero(np.isfinite(best))
            self._keep(S, has, best[has], np.zeros(has.size))
            return
        gup = g * u * self.phi(fi, row)
        ncont = self.counts.ravel()[fk]
        other = self.other.ravel()[fk]
        has = np.isfinite(other)
        tot = ncont + has
        ends = np.cumsum(tot)
        total = int(ends[-1])
        if not total:
            return
        # the candidates: per step its continuations (lines of (S + r, c)), then its class change (if any)
        pair = np.repeat(np.arange(vi.size), tot)
        line = np.repeat(self.starts.ravel()[fk] - (ends - tot), tot) + np.arange(total)
        sa = self.store_a.take(line, mode="clip")
        sb = self.store_b.take(line, mode="clip")
        change = ends[has] - 1
        sa[change] = 0.0  # base + g 0 = base
        sb[change] = other[has]
        ca = base[pair] + g[pair] * sa
        cb = gup[pair] * sb
        sg_all = seg[pair]
        va = ca + self.lo[S].ravel()[sg_all] * cb
        vb = ca + self.hi[S].ravel()[sg_all] * cb
        # drop what the lowest line at lo or the lowest at hi beats at both ends (most of it: one pass for all)
        first = np.flatnonzero(np.concatenate(([True], sg_all[1:] != sg_all[:-1])))
        cnt = np.diff(np.append(first, total))
        lo_min = np.repeat(np.minimum.reduceat(va, first), cnt)
        hi_min = np.repeat(np.minimum.reduceat(vb, first), cnt)
        hi_of_lo = np.repeat(np.minimum.reduceat(np.where(va == lo_min, vb, np.inf), first), cnt)
        lo_of_hi = np.repeat(np.minimum.reduceat(np.where(vb == hi_min, va, np.inf), first), cnt)
        idx = np.flatnonzero(((va < lo_of_hi) | (vb <= hi_min)) & ((vb < hi_of_lo) | (va <= lo_min)))
        sg = sg_all[idx]
        alone = np.ones(idx.size, dtype=bool)  # a segment with one line left keeps it
        alone[1:] &= sg[1:] != sg[:-1]
        alone[:-1] &= sg[:-1] != sg[1:]
        single, idx = idx[alone], idx[~alone]
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
        chosen = np.concatenate([single] + out)
        osg = sg_all[chosen]
        counts = np.bincount(osg, minlength=K * m)
        rank = np.concatenate([np.zeros(single.size, dtype=np.int64)] + [np.full(o.size, t) for t, o in enumerate(out)])
        pos = (np.cumsum(counts) - counts)[osg] + rank
        a_out, b_out = np.empty(chosen.size), np.empty(chosen.size)
        s_out = np.empty(chosen.size, dtype=np.int64)
        a_out[pos], b_out[pos], s_out[pos] = ca[chosen], cb[chosen], osg
        self._keep(S, s_out, a_out, b_out)

    def _keep(self, S: np.ndarray, seg: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        """Store the lines ``(a, b)`` of the segments ``seg`` (ascending; ``s K + c``) and their ``F`` (m = 1)."""
        K, m, total = self.K, S.size, seg.size
        if self.used + total > self.store_a.size:
            size = max(2 * self.store_a.size, self.used + total)
            for name in ("store_a", "store_b"):
                grown = np.empty(size)
                grown[:self.used] = getattr(self, name)[:self.used]
                setattr(self, name, grown)
        self.store_a[self.used:self.used + total] = a
        self.store_b[self.used:self.used + total] = b
        counts = np.bincount(seg, minlength=K * m)
        self.counts[S] = counts.reshape(m, K)
        self.starts[S] = (self.used + np.cumsum(counts) - counts).reshape(m, K)
        if total:
            first = np.flatnonzero(np.concatenate(([True], seg[1:] != seg[:-1])))
            f = np.full(K * m, np.inf)
            f[seg[first]] = np.minimum.reduceat(a + b, first)
            self.F[S] = f.reshape(m, K)
        self.used += total

    # ---- the orders, rebuilt step by step (ties: the lexicographically first) -----------------------------
    def orders(self, jobs: list) -> list:
        """``[(pairs, cost)]``: the order of stream ``s`` in copy ``copy`` for each ``(s, copy)`` of ``jobs``, all
        of them one step at a time: at each step the first ``(r, c)`` (lexicographically) whose best completion
        costs the optimum (to :data:`mjoin.optimizer.cost.TIE_RTOL`), else the cheapest. A step ``S -> r`` through
        ``c`` (terms ``g, u, phi``) after ``W`` (the product of the gammas so far), ``P`` (the cost so far) and a
        run with ``m`` partial results per group (class ``cprev``) costs ``P + w (base + g best)``: ``base = q_r +
        g alpha_m u``; in the same class ``w = W`` and the tail continues the run with ``mult = m u phi``, else
        ``w = W m`` and ``mult = u phi``; ``best`` the cheapest tail from ``S + r`` at ``mult`` (none after the last
        step or an empty one)."""
        problem, n, N, K = self.problem, self.n, self.N, self.K
        O = len(jobs)
        start = np.array([s for s, _ in jobs], dtype=np.int64)
        copy = np.array([k for _, k in jobs], dtype=np.int64)
        full = self.full | copy * N
        S = (np.int64(1) << start) | copy * N
        cprev = np.full(O, -1, dtype=np.int64)
        m_run, W, P = np.ones(O), np.ones(O), np.zeros(O)
        opt = self.F[S].min(axis=1)
        limit = opt + TIE_RTOL * np.abs(opt)
        # the rows by (member, class): the order in which the candidates of a step are tried
        by_member = np.argsort(self.row_stream, kind="stable")
        r_of, c_of = self.row_stream[by_member], self.row_class[by_member]
        q_of, bit_of = self.q[r_of], self.row_bit[by_member]
        picked = []
        with np.errstate(invalid="ignore", over="ignore"):
            for _ in range(n - 1):
                g2 = self.GA[S][:, by_member]  # (O, rows); not finite: no step
                oi, k = np.nonzero(np.isfinite(g2))
                row = by_member[k]
                Sv = S[oi]
                g = g2[oi, k]
                u = self.UA[Sv, row]
                phi = self.phi(Sv * self.R + row, row)
                c = c_of[k]
                same = cprev[oi] == c
                m_in = np.where(same, m_run[oi], 1.0)
                weight = np.where(same, W[oi], W[oi] * m_run[oi])
                base = q_of[k] + g * self.am * u
                nxt = Sv | bit_of[k]
                mult = m_in * u * phi
                tail = (nxt != full[oi]) & (g != 0)
                best = np.full(oi.size, np.inf)
                ti = np.flatnonzero(tail)
                cnt = self.counts[nxt[ti], c[ti]]
                if cnt.sum():
                    ends = np.cumsum(cnt)
                    line = np.repeat(self.starts[nxt[ti], c[ti]] - (ends - cnt), cnt) + np.arange(ends[-1])
                    owner = np.repeat(np.arange(ti.size), cnt)
                    vals = self.store_a[line] + mult[ti][owner] * self.store_b[line]
                    tb = np.full(ti.size, np.inf)
                    np.minimum.at(tb, owner, vals)
                    best[ti] = tb
                if self.multi:
                    other = self.other[nxt[ti], c[ti]]
                    fin = other < np.inf
                    best[ti[fin]] = np.minimum(best[ti[fin]], mult[ti[fin]] * other[fin])
                value = np.where(tail, base + g * best, base)
                total = P[oi] + weight * value
                # per order: the first candidate within the limit, else the first cheapest
                first = np.flatnonzero(np.concatenate(([True], oi[1:] != oi[:-1])))
                pos = np.arange(oi.size)
                big = np.int64(oi.size)
                within = np.minimum.reduceat(np.where(total <= limit[oi], pos, big), first)
                low = np.repeat(np.minimum.reduceat(total, first), np.diff(np.append(first, oi.size)))
                cheapest = np.minimum.reduceat(np.where(total == low, pos, big), first)
                at = np.where(within < big, within, cheapest)
                at = np.where(at < big, at, first)
                P = P + weight[at] * base[at]
                W, m_run, cprev = weight[at] * g[at], mult[at], c[at]
                S = S | bit_of[k[at]]
                picked.append((r_of[k[at]].tolist(), c[at].tolist()))
        cls = problem.cls.tolist()
        out = []
        for o in range(O):
            joined, pairs = [int(start[o])], []
            for rs, cs in picked:
                r, c = rs[o], cs[o]
                pairs.append((next(m for m in joined if cls[m][r] == c), r))
                joined.append(r)
            out.append((pairs, float(P[o])))
        return out


def _search(problems: list, model: CostModel) -> list:
    """The DP proper on ``problems`` (one, or a problem and its floored copy): ``[{start: (pairs, cost)}]``."""
    tables = _Tables(problems, model)
    tables.ranges()
    tables.run()
    n = problems[0].n
    jobs = [(s, 0) for s in range(n)]
    if len(problems) > 1:  # a start whose subsets the floor does not reach has the plain copy's order there too
        jobs += [(s, 1) for s in range(n) if tables.own[1 << s]]
    found = dict(zip(jobs, tables.orders(jobs)))
    plain = {s: found[s, 0] for s in range(n)}
    if len(problems) == 1:
        return [plain]
    return [plain, {s: found.get((s, 1), plain[s]) for s in plain}]
