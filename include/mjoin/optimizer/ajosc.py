"""AJOSC's join-order selection, ported (docs/optimizer.md, "AJOSC side by side"; docs/algorithms.md, Eq. 69-70).

AJOSC (Xinyi Ye, Xiangyang Gou, Lei Zou, Wenjie Zhang: "AJOSC: Adaptive Join Order Selection for Continuous
Queries", Proc. ACM Manag. Data 3(3), SIGMOD 2025, https://doi.org/10.1145/3725263; code: the GitHub
repository pkumod/AJOSC, files CDG/*.cpp, Exec/DB.cpp) orders the probes of a continuous multi-way join by a
dynamic program over its *cost decision graph* (CDG): a node per connected set ``P`` of joined relations, an
edge ``(P, u)`` per relation ``u`` adjacent to ``P``. Its cost is tuple-at-a-time (every partial result extends
on its own) and counts candidate tuples:

    cost_val(P, u) = sum over p in P adjacent to u of deg(p, u)        (candidates fetched from each parent)
    value(P, u) = cost_val(P, u) + cost_val(P, u) w(P, u) value(P + u)  (value(V) = 0: the last edge is cost_val)
    value(P) = min over u of value(P, u)                                (its ``opt_child``; the order follows it)

with ``deg(p, u)`` the mean number of ``u``'s tuples matching a tuple of ``p`` and ``w(P, u)`` the fraction of the
fetched candidates that survive the intersection over the parents (AJOSC measures both while it runs; the
statistics per joined set ``P`` are its ``w``). Re-optimization is incremental (``CDG::IncrDecideOrder``): only
a statistic that changed "dramatically" (``TestChanged``: by more than 0.4 and by a factor above 1.5, or to or
from 0) is refreshed; its edges are recomputed, a decrease is propagated up eagerly
(``IncrementalUpdateWithLowerBound``), an increase only marks the nodes whose optimal child it was as lower
bounds (``PropagateLowerBoundTag``), and the roots' values are then made exact lazily (``CompExactValue``: the
children in increasing order of their possibly stale values, stopping once the best exact value is at most the
next lower bound).

This port runs the same program on mjoin's statistics: ``deg(p, u) = gamma[p][u] mu[p][u]`` and ``w(P, u) =
g u phi / cost_val`` with ``g, u, phi`` the terms of ``mjoin.optimizer.cost`` for the lookup through the class
of ``u``'s first joined neighbour (the expected size of the intersection; a single parent gives ``w = g u /
deg``, which is 1 when that parent's edge is the representative). What differs from the C++, said where it
happens: the CDG is a table over subsets (arrays indexed by the bit mask, not objects with pointers); the
statistics arrive once per cycle (AJOSC smooths per tuple with ``theta = 0.04``, ``delta = 0.05``, and waits 200
operations before acting on a changed degree: a cycle's statistics are already aggregated and the forecast is
smoothed, so each cycle's values are taken as they are); its epsilon-exploration of random orders is not
needed (every edge's statistics are measured each cycle). An order becomes a plan with the earliest joined
neighbour as each step's ``l`` (``mjoin.model.plan.orders_from_permutation``'s rule).
"""
from __future__ import annotations

import numpy as np

from mjoin.optimizer.cost import JoinProblem

#: TestChanged: a statistic counts as changed when it moved by more than this ...
ABS_CHANGE = 0.4
#: ... and by more than this factor (or to or from 0)
RATIO_CHANGE = 1.5


def changed(new: float, old: float) -> bool:
    """AJOSC's ``TestChanged`` (CDG/MonitorStat.cpp)."""
    if abs(old - new) > ABS_CHANGE:
        if new == 0 or old == 0 or old / new > RATIO_CHANGE or new / old > RATIO_CHANGE:
            return True
    return False


def connected_subsets(problem: JoinProblem) -> np.ndarray:
    """``conn[S]``: S is a set AJOSC's CDG holds (reachable from a single relation by adding neighbours)."""
    n = problem.n
    N = 1 << n
    conn = np.zeros(N, dtype=bool)
    for s in range(n):
        conn[1 << s] = True
    pop = np.bitwise_count(np.arange(N, dtype=np.int64))
    for S in np.argsort(pop, kind="stable"):
        S = int(S)
        if not conn[S]:
            continue
        for u in range(n):
            if not S >> u & 1 and problem.adj_mask[u] & S:
                conn[S | 1 << u] = True
    return conn


def ajosc_statistics(problem: JoinProblem) -> tuple[np.ndarray, np.ndarray]:
    """``(deg[p, u], inter[S, u])`` on mjoin's statistics: ``deg = gamma mu`` per directed edge (0: none) and
    ``inter``, the expected size of the intersection of the parents' candidates (``g u phi`` of the lookup
    through the class of ``u``'s first joined neighbour; 0 where ``u`` is in ``S`` or not adjacent)."""
    n = problem.n
    N = 1 << n
    edge = problem.cls >= 0
    deg = np.where(edge, problem.gamma * problem.mu, 0.0)
    inter = np.zeros((N, n))
    for S in range(1, N):
        for u in range(n):
            if S >> u & 1 or not problem.adj_mask[u] & S:
                continue
            first = next(m for m in range(n) if S >> m & 1 and edge[m, u])
            g, mu, phi = problem.step_terms(S, u, int(problem.cls[first, u]))
            inter[S, u] = g * mu * phi
    return deg, inter


class CDG:
    """AJOSC's cost decision graph over the subsets of one problem, with its full and incremental decisions."""

    def __init__(self, problem: JoinProblem):
        n = problem.n
        self.problem, self.n, self.N = problem, n, 1 << n
        self.full = self.N - 1
        self.conn = connected_subsets(problem)
        adj = np.array([[bool(problem.cls[p, u] >= 0) for u in range(n)] for p in range(n)])
        self.adj = adj
        masks = np.arange(self.N, dtype=np.int64)
        # edge (S, u) exists when S is a node, u outside it and adjacent to it
        self.has_edge = np.zeros((self.N, n), dtype=bool)
        for u in range(n):
            out = (masks >> u & 1) == 0
            near = (masks & problem.adj_mask[u]) != 0
            self.has_edge[:, u] = self.conn & out & near
        self.deg = np.zeros((n, n))  # deg_current of every tracker
        self.w = np.zeros((self.N, n))  # w_current of every edge
        self.cost_val = np.zeros((self.N, n))
        self.edge_value = np.full((self.N, n), np.inf)
        self.edge_exact = np.ones((self.N, n), dtype=bool)
        self.value = np.full(self.N, np.inf)
        self.value[self.full] = 0.0
        self.opt = np.full(self.N, -1, dtype=np.int64)
        self.exact = np.ones(self.N, dtype=bool)
        self.pop = np.bitwise_count(masks)

    # ---- statistics --------------------------------------------------------------------------------------
    def _cost_vals(self, deg: np.ndarray) -> np.ndarray:
        """``cost_val[S, u] = sum over p in S adjacent to u of deg[p, u]`` for every subset (highest bit first)."""
        n, N = self.n, self.N
        cv = np.zeros((N, n))
        for b in range(n):
            lo, hi = 1 << b, 1 << (b + 1)
            cv[lo:hi] = cv[:lo] + np.where(self.adj[b], deg[b], 0.0)[None, :]
        return cv

    @staticmethod
    def _w(cost_val: np.ndarray, inter: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(cost_val > 0, inter / cost_val, 0.0)

    # ---- DecideOrder: every edge and node recomputed (CDG::Update) -----------------------------------------
    def decide(self, deg: np.ndarray, inter: np.ndarray) -> None:
        """``CDG::DecideOrder`` on statistics ``(deg, inter)`` (:func:`ajosc_statistics`): every value exact."""
        self.deg = deg.copy()
        self.cost_val = self._cost_vals(self.deg)
        self.w = self._w(self.cost_val, inter)
        n = self.n
        masks = np.arange(self.N, dtype=np.int64)
        for p in range(n - 1, 0, -1):  # layers by decreasing size, as layered_cdg_edges / nodes
            S = masks[(self.pop == p) & self.conn]
            if not S.size:
                continue
            bit = np.int64(1) << np.arange(n)[None, :]
            dst = S[:, None] | bit
            cv = self.cost_val[S]
            dv = np.where(dst == self.full, 0.0, self.value[dst])
            with np.errstate(invalid="ignore"):
                ev = np.where(self.has_edge[S], cv + cv * self.w[S] * dv, np.inf)
            self.edge_value[S] = ev
            self.opt[S] = np.argmin(ev, axis=1)
            self.value[S] = ev[np.arange(S.size), self.opt[S]]
        self.edge_exact[:] = True
        self.exact[:] = True

    # ---- IncrDecideOrder ---------------------------------------------------------------------------------
    def changed_edges(self, deg: np.ndarray, inter: np.ndarray) -> tuple:
        """``MonitorStat``: the edges whose statistics changed dramatically, and the new degrees (only the
        changed trackers take their new value; the others keep ``deg_current``)."""
        n = self.n
        new_deg = self.deg.copy()
        edges = set()
        for p in range(n):
            for u in range(n):
                if self.adj[p, u] and changed(float(deg[p, u]), float(self.deg[p, u])):
                    new_deg[p, u] = deg[p, u]
                    # related_cdg_edges: every edge (S, u) with p in S
                    for S in np.flatnonzero(self.has_edge[:, u] & ((np.arange(self.N) >> p & 1) == 1)):
                        edges.add((int(S), u))
        cv_new = self._cost_vals(new_deg)
        w_new = self._w(cv_new, inter)
        rows, cols = np.nonzero(self.has_edge)
        for S, u in zip(rows.tolist(), cols.tolist()):
            if changed(float(w_new[S, u]), float(self.w[S, u])):
                edges.add((S, u))
        return edges, new_deg, cv_new, w_new

    def incremental(self, deg: np.ndarray, inter: np.ndarray) -> int:
        """``CDG::IncrDecideOrder`` on new statistics; returns how many edges it refreshed."""
        edges, new_deg, cv_new, w_new = self.changed_edges(deg, inter)
        self.deg = new_deg
        for S, u in sorted(edges, key=lambda e: (-int(self.pop[e[0]]), e)):
            self.cost_val[S, u] = cv_new[S, u]  # UpdStat
            self.w[S, u] = w_new[S, u]
            old = self.edge_value[S, u]
            self._local_update_edge(S, u)
            self._lower_bound_update(S, u, self.edge_value[S, u], old)
        for s in range(self.n):
            self._comp_exact_node(1 << s)
        return len(edges)

    def _local_update_edge(self, S: int, u: int) -> None:
        cv = self.cost_val[S, u]
        dst = S | 1 << u
        self.edge_value[S, u] = cv if dst == self.full else cv + cv * self.w[S, u] * self.value[dst]

    def _local_update_node(self, S: int) -> None:
        ev = self.edge_value[S]
        self.opt[S] = int(np.argmin(ev))
        self.value[S] = ev[self.opt[S]]

    def _parent_edges(self, S: int):
        """Edges whose destination is ``S``: ``(S - p, p)``."""
        for p in range(self.n):
            if S >> p & 1:
                src = S & ~(1 << p)
                if src and self.has_edge[src, p]:
                    yield src, p

    def _lower_bound_update(self, S: int, u: int, new: float, old: float) -> None:
        """``CDG::LowerBoundUpdate`` for edge ``(S, u)``."""
        if new == old:
            return
        if new > old:  # mark lower bounds along the optimal children, up to the roots
            if not self.exact[S]:
                return
            queue = [("node", S, u)]
            while queue:
                kind, x, child = queue.pop(0)
                if kind == "node":
                    if self.opt[x] != child:
                        continue
                    self.exact[x] = False
                    for src, p in self._parent_edges(x):
                        if self.edge_exact[src, p]:
                            queue.append(("edge", (src, p), x))
                else:
                    src, p = x
                    self.edge_exact[src, p] = False
                    if self.exact[src]:
                        queue.append(("node", src, p))
            return
        # a decrease: propagate eagerly
        visited, twice = set(), set()
        queue = [("node", S, new, u)]
        while queue:
            kind, x, val, child = queue.pop(0)
            if kind == "node":
                visited.discard(x)
                if x in twice:  # visited_more_than_once: the minimum over every child again
                    twice.discard(x)
                    before, before_opt = self.value[x], self.opt[x]
                    self._local_update_node(x)
                    if self.value[x] < before:
                        self.exact[x] = self.edge_exact[x, self.opt[x]]
                        go = True
                    else:
                        self.value[x], self.opt[x] = before, before_opt
                        go = False
                elif val < self.value[x]:
                    self.value[x], self.opt[x] = val, child
                    self.exact[x] = self.edge_exact[x, child]
                    go = True
                else:
                    go = False
                if go:
                    for src, p in self._parent_edges(x):
                        key = ("edge", src, p)
                        if key not in visited:
                            visited.add(key)
                            queue.append(("edge", (src, p), None, x))
                        else:
                            twice.add(key)
            else:
                src, p = x
                visited.discard(("edge", src, p))
                self._local_update_edge(src, p)
                self.edge_exact[src, p] = bool(self.exact[src | 1 << p]) if (src | 1 << p) != self.full else True
                if src not in visited:
                    visited.add(src)
                    queue.append(("node", src, self.edge_value[src, p], p))
                else:
                    twice.add(src)

    def _comp_exact_edge(self, S: int, u: int) -> None:
        if self.edge_exact[S, u]:
            return
        dst = S | 1 << u
        if dst != self.full:
            self._comp_exact_node(dst)
        self._local_update_edge(S, u)
        self.edge_exact[S, u] = True

    def _comp_exact_node(self, S: int) -> None:
        """``CDGNode::CompExactValue``: children by their (lower-bound) values, stop once exact is enough."""
        if self.exact[S]:
            return
        us = np.flatnonzero(self.has_edge[S])
        ranked = sorted(((float(self.edge_value[S, u]), int(u)) for u in us))
        best, opt = np.inf, -1
        for i, (_, u) in enumerate(ranked):
            self._comp_exact_edge(S, u)
            if self.edge_value[S, u] < best:
                best, opt = float(self.edge_value[S, u]), u
            if i + 1 == len(ranked) or best <= ranked[i + 1][0]:
                break
        self.value[S], self.opt[S], self.exact[S] = best, opt, True

    # ---- orders ------------------------------------------------------------------------------------------
    def order(self, s: int) -> list[int]:
        """``GetMatchingOrder``: the relations after ``s``, following each node's optimal child."""
        S, out = 1 << s, []
        while S != self.full:
            u = int(self.opt[S])
            out.append(u)
            S |= 1 << u
        return out

    def pairs(self, s: int) -> list[tuple[int, int]]:
        """The order of ``s`` as index pairs, each step's ``l`` its earliest joined neighbour."""
        joined, out = [s], []
        for u in self.order(s):
            out.append((next(m for m in joined if self.adj[m, u]), u))
            joined.append(u)
        return out


def ajosc_cost(problem: JoinProblem, deg: np.ndarray, inter: np.ndarray, start: int, sequence) -> float:
    """AJOSC's cost of one order (the streams after ``start``): ``value`` along it."""
    n = problem.n
    full = (1 << n) - 1
    edge = problem.cls >= 0
    S, steps = 1 << start, []
    for u in sequence:
        cv = float(sum(deg[p, u] for p in range(n) if S >> p & 1 and edge[p, u]))
        w = inter[S, u] / cv if cv > 0 else 0.0
        steps.append((cv, w))
        S |= 1 << u
    assert S == full
    value = 0.0
    for cv, w in reversed(steps):
        value = cv + cv * w * value
    return value


def ajosc(problem: JoinProblem) -> dict:
    """``{start: pairs}``: AJOSC's orders from scratch (``DecideOrder``) on the problem's statistics."""
    cdg = CDG(problem)
    cdg.decide(*ajosc_statistics(problem))
    return {s: cdg.pairs(s) for s in range(problem.n)}
