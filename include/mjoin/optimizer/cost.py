"""The probe-order cost model (docs/algorithms.md, "Cost model", Eq. 1-8, 20-23 and 65-66).

Expected cost of the probe order ``o_1..o_{n-1}`` of one new tuple of stream ``s``, as the engine runs it
(docs/engine.md, "How a batch runs"): the order is cut into *runs* of consecutive steps through one attribute
class. Within a run the engine probes factorised: the new tuple (or each partial result the previous run
materialised) is one *group* that looks its key up once per step, and a group without a match dies; at the
end of the run every surviving group's matches are materialised (their cross product, with the residual
predicates of other classes checked), and each partial result looks up its own key in the next run. So, per
step ``k`` (backward, affine in ``m``, the partial results per surviving group that the run has built so far)::

    C(o_k; m) = A_k + m B_k,   C = A_1 + B_1
    last step:               A_k = q_k + g_k alpha_m u_k,                    B_k = 0
    next step in the class:  A_k = q_k + g_k (alpha_m u_k + A_{k+1}),        B_k = g_k u_k phi_k B_{k+1}
    next step changes class: A_k = q_k + g_k alpha_m u_k,                    B_k = g_k u_k phi_k (A_{k+1} + B_{k+1})

i.e. ``C(o_k) = q_k + g_k (alpha_m u_k + R_k C(o_{k+1}))`` with ``R_k = 1`` inside a run and, at a class change,
the product of ``u phi`` over the run that ends there (``R_k = prod_{j in the run} u_j phi_j``): what the engine
materialises. With one class this is exactly the paper's Eq. 8.

- ``q_k = alpha_q f(kappa[r_k])`` with ``f(kappa) = c + kappa / (2 m_slots)`` for a hash state (Eq. 5) and
  ``f(kappa) = c + log2(max(kappa, 1))`` for a sorted-array state (Eq. 6; see :meth:`CostModel.f`).
- ``g_k, u_k``: ``gamma`` and ``mu`` of the lookup. A lookup from the partial result ``S`` into ``r`` goes
  through one attribute class ``c``; every stream of ``S`` in class ``c`` holds the same key value there, so all
  class-``c`` edges from ``S`` to ``r`` fetch exactly the same tuples. The estimate uses the edge with the
  *highest* ``gamma`` (ties: lowest ``mu``): a key that every class-``c`` member of ``S`` holds is at least as
  likely to be found in ``r`` as the best of their own keys when key presence is positively correlated across
  streams (hot keys, shared filters); against the engine's work per batch it ranked the orders of the two-class
  drift preset better than the lowest gamma did (docs/optimizer.md, "The class-change price").
- ``phi_k``: residual filters. Edges from ``S`` to ``r`` in *other* classes are checked when the run is
  materialised; assuming independence between classes, each other class multiplies the partial results that
  survive by its representative edge's ``gamma`` (the same rule). They filter no lookup inside the run (the
  engine checks them only when it materialises), so ``phi`` enters only through ``R``. The match cost
  ``alpha_m u_k`` is not filtered: every fetched tuple is examined.

A pair ``[l, r]`` joined by edges of two classes (possible through transitivity) is looked up through its first
edge (``Query.edge(l, r)``); the statistics hold one ``gamma``/``mu`` per directed pair, so the second predicate
is not counted as a filter.

The expected cost per second of an order set is ``sum_s lambda_s * C_s`` (per key group; summed over groups).
Pure Python + numpy: no Spark, no Airflow.

Ties after an empty step (what :data:`GAMMA_FLOOR` is for): the tail ``C(o_{k+1})`` enters only through the
product ``g_k R_k``. When a step's ``g_k`` is 0 (a forecast that says the partial result finds nothing in
``r_k``: an empty window, or an edge never matched; the statistics also give ``gamma = 0`` to an edge with no
lookups in the cycle), ``C(o_k) = q_k`` whatever follows, so every order of the remaining streams has the same
cost. The engine pays that tail whenever the step is not quite empty. The optimizers (dppick, exact, so the
oracle too) therefore break such ties lexicographically, by ``(C(o_1), C_eps(o_1))``: ``C_eps`` is the cost
with ``g_k -> max(g_k, eps)`` on every edge, ``eps = GAMMA_FLOOR`` (:meth:`JoinProblem.with_gamma_floor`), and
:func:`search_with_gamma_floor` runs the search on the floored problem and keeps its order where the order's
own ``C`` equals the unfloored optimum (to 1e-12 relative), else the unfloored search's order. Plans carry
``C``, never ``C_eps``.

- A tie of ``C`` after an empty step ``k`` is broken by ``C_eps(o_1) = C(o_1) + eps P_k (alpha_m u_k + R_k
  C(o_{k+1})) + O(eps^2)`` (``P_k``: the weight of step ``k``): among equal-cost orders the one whose tail would
  cost least if step ``k`` were not quite empty wins.
- No plan changes where there is no tie: when every ``gamma >= eps`` the floored problem is the problem itself
  (one search, the same plans bit for bit); otherwise the floored search's order is kept only if it costs the
  unfloored optimum, so a ``gamma`` below ``eps`` but above 0 can never trade model cost for the tie-break.
- ``eps = 1e-6``: one match in a million lookups, far above the rounding of the cost (about 1e-16 relative).
- What still ties exactly (several empty steps in a row, symmetric streams) both searches break the same way:
  the lexicographically first order by ``(r_1, c_1, r_2, c_2, ...)`` among those within :data:`TIE_RTOL` of the
  optimum (:func:`tie_key`).

Key groups (PMJoin): each group has its own ``gamma``, ``mu`` and ``lambda``, but a lookup searches the engine's
whole window state of the stream, which is kept by key bucket and not by group (a rule change touches no
state), so ``f(kappa)`` is taken at the stream's ``kappa`` summed over the groups (its distinct keys: the groups
partition them). A plan with ``D`` groups also runs up to ``D`` probe chains per stream, bucket and batch instead
of one: :func:`group_overhead` prices those extra chains (:class:`GroupOverhead`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from mjoin.model.keygroups import num_groups, rule_problems
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StatisticsError, StreamStats
from mjoin.runtime.fsutil import atomic_write_text, read_text
from mjoin.stats.cells import cell_map

STATES = ("sorted", "hash")

#: the floor on ``gamma`` while dppick and exact search (see the module docstring, "Ties after an empty
#: step"): breaks the ties of Eq. 8 after a step forecast empty by the cost of the tail; 0 = no floor
GAMMA_FLOOR = 1e-6
#: orders whose cost is within this relative distance of the optimum tie; dppick and exact both keep the
#: lexicographically first of them (:func:`tie_key`)
TIE_RTOL = 1e-12
MODEL_KIND = "mjoin.cost_model"
MODEL_VERSION = 1


class CostModelError(ValueError):
    """A cost model (file) that cannot be used; the message names the field."""


@dataclass(frozen=True)
class CostModel:
    """The coefficients of Eq. 4-8 in one object.

    The defaults (``alpha_q = alpha_m = c = 1``, sorted state) are UNCALIBRATED: they only
    fix the units (cost of one key comparison = cost of one matched tuple). Run
    ``python -m mjoin calibrate`` on engine metrics and pass the result with
    ``--cost-model``; ``calibrated`` says which one a plan used.
    """

    alpha_q: float = 1.0  # cost per lookup, per unit of f(kappa)  (Eq. 4)
    alpha_m: float = 1.0  # cost per matched state tuple           (Eq. 7)
    state: str = "sorted"  # "sorted" (the mjoin engine: searchsorted arrays) or "hash"
    c: float = 1.0  # fixed part of f: one comparison / hash computation  (Eq. 5)
    m_slots: float | None = 65536.0  # hash slots (Eq. 5); None = resizing table, f = c
    calibrated: bool = False
    calibration: dict = field(default_factory=dict, compare=False)  # fit summary (R^2, n, source)

    def __post_init__(self):
        for name in ("alpha_q", "alpha_m", "c"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise CostModelError(f"cost model {name} = {v!r}: must be a finite number >= 0")
            object.__setattr__(self, name, float(v))
        if self.state not in STATES:
            raise CostModelError(f"cost model state = {self.state!r}: must be one of {', '.join(STATES)}")
        if self.m_slots is not None:
            v = self.m_slots
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise CostModelError(f"cost model m_slots = {v!r}: must be a number > 0 (or null)")
            object.__setattr__(self, "m_slots", float(v))

    # ---- Eq. 4-7 --------------------------------------------------------------
    def f(self, kappa):
        """Eq. 5 (hash: ``c + kappa/(2 m_slots)``) or Eq. 6 (sorted: ``c + log2(max(kappa, 1))``).

        Sorted: a binary search over ``kappa`` keys makes about ``1 + log2(kappa)``
        comparisons, so with the default ``c = 1`` f counts comparisons; the guard keeps
        a lookup into an empty or one-key state at cost ``c`` instead of 0 or -inf. The
        paper's ``log(kappa)`` is ``c = 0`` (the log base only rescales ``alpha_q``).
        Accepts a number or a numpy array."""
        k = np.maximum(np.asarray(kappa, dtype=float), 0.0)
        if self.state == "sorted":
            out = self.c + np.log2(np.maximum(k, 1.0))
        elif self.m_slots is None:
            out = self.c + 0.0 * k
        else:
            out = self.c + k / (2.0 * self.m_slots)
        return float(out) if out.ndim == 0 else out

    def query_cost(self, kappa):
        """Eq. 4: ``C_q = alpha_q f(kappa)``."""
        return self.alpha_q * self.f(kappa)

    def match_cost(self, mu):
        """Eq. 7: ``C_m = alpha_m mu``."""
        return self.alpha_m * mu

    # ---- ablations (paper section 5.3) ----------------------------------------
    def query_only(self) -> "CostModel":
        """dpPick_queryCost: the match cost set to 0 (``alpha_m = 0``)."""
        return replace(self, alpha_m=0.0)

    def match_only(self) -> "CostModel":
        """dpPick_matchCost: the query cost set to 0 (``alpha_q = 0``)."""
        return replace(self, alpha_q=0.0)

    def ablation(self, name: str | None) -> "CostModel":
        if not name:
            return self
        if name == "query":
            return self.query_only()
        if name == "match":
            return self.match_only()
        raise CostModelError(f"unknown ablation {name!r} (query, match)")

    # ---- JSON -------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "kind": MODEL_KIND, "version": MODEL_VERSION,
            "alpha_q": self.alpha_q, "alpha_m": self.alpha_m, "state": self.state,
            "c": self.c, "m_slots": self.m_slots,
            "calibrated": self.calibrated, "calibration": dict(self.calibration),
        }

    @classmethod
    def from_json(cls, doc) -> "CostModel":
        if not isinstance(doc, dict):
            raise CostModelError("a cost model is a JSON object with alpha_q, alpha_m, state, ...")
        if doc.get("kind", MODEL_KIND) != MODEL_KIND:
            raise CostModelError(f"kind = {doc.get('kind')!r}: not a cost model ({MODEL_KIND})")
        if doc.get("version", MODEL_VERSION) != MODEL_VERSION:
            raise CostModelError(f"version = {doc.get('version')!r}: this mjoin reads cost model version {MODEL_VERSION}")
        known = {"kind", "version", "alpha_q", "alpha_m", "state", "c", "m_slots", "calibrated", "calibration"}
        unknown = set(doc) - known
        if unknown:
            raise CostModelError(f"unknown field(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
        default = cls()
        calibration = doc.get("calibration") or {}
        if not isinstance(calibration, dict):
            raise CostModelError("calibration must be an object")
        return cls(alpha_q=doc.get("alpha_q", default.alpha_q), alpha_m=doc.get("alpha_m", default.alpha_m),
                   state=doc.get("state", default.state), c=doc.get("c", default.c),
                   m_slots=doc.get("m_slots", default.m_slots), calibrated=bool(doc.get("calibrated", False)),
                   calibration=calibration)

    def save(self, path) -> Path:
        atomic_write_text(path, json.dumps(self.to_json(), indent=2) + "\n")
        return Path(path)

    @classmethod
    def load(cls, path) -> "CostModel":
        try:
            doc = json.loads(read_text(path))
        except FileNotFoundError:
            raise CostModelError(f"{path}: no such cost model file") from None
        except json.JSONDecodeError as exc:
            raise CostModelError(f"{path}: not JSON ({exc})") from None
        try:
            return cls.from_json(doc)
        except CostModelError as exc:
            raise CostModelError(f"{path}: {exc}") from None

    def describe(self) -> str:
        f = ("c + log2(kappa)" if self.state == "sorted" else
             "c" if self.m_slots is None else f"c + kappa/(2*{self.m_slots:g})")
        tag = "calibrated" if self.calibrated else "UNCALIBRATED defaults"
        return f"alpha_q={self.alpha_q:.4g} alpha_m={self.alpha_m:.4g} state={self.state} f={f} c={self.c:.4g} ({tag})"


def resolve_cost_model(model) -> CostModel:
    """``None`` -> defaults; a path -> :meth:`CostModel.load`; a dict -> from_json; a model as is."""
    if model is None:
        return CostModel()
    if isinstance(model, CostModel):
        return model
    if isinstance(model, dict):
        return CostModel.from_json(model)
    return CostModel.load(model)


# ---- one key group as arrays --------------------------------------------------------

@dataclass
class JoinProblem:
    """The join graph and the statistics of one key group, indexed ``0..n-1`` in the
    query's stream order: what every optimizer and the cost evaluation read.

    ``cls[l, r]``: index of the attribute class of the lookup ``l -> r`` (-1: no edge).
    ``gamma[l, r]``, ``mu[l, r]``: per directed edge; ``lam``, ``kappa``, ``window``: per stream.
    """

    names: tuple
    classes: tuple
    cls: np.ndarray
    gamma: np.ndarray
    mu: np.ndarray
    lam: np.ndarray
    kappa: np.ndarray
    window: np.ndarray
    group: int = 0

    def __post_init__(self):
        n = len(self.names)
        self.n = n
        self.K = max(len(self.classes), 1)
        self.index = {s: i for i, s in enumerate(self.names)}
        # class_members[c][r]: streams m with an edge m -> r of class c, ascending
        self.class_members = [[[m for m in range(n) if self.cls[m, r] == c] for r in range(n)] for c in range(self.K)]
        self.adj_mask = [sum(1 << m for m in range(n) if self.cls[m, r] >= 0) for r in range(n)]

    @classmethod
    def from_statistics(cls, query, stats, group: int = 0) -> "JoinProblem":
        """Compile ``query``'s graph with the statistics of key group ``group``."""
        names = tuple(query.stream_names)
        classes = tuple(query.all_classes)  # band classes (PSP) too: a step into one changes class
        cidx = {c: i for i, c in enumerate(classes)}
        n = len(names)
        cl = np.full((n, n), -1, dtype=np.int64)
        gamma = np.zeros((n, n))
        mu = np.zeros((n, n))
        first_edge = {}  # the edge Query.edge(l, r) returns: the first listed for the pair
        for e in query.edges:
            first_edge.setdefault(frozenset((e.a, e.b)), e)
        for pair, e in first_edge.items():
            for l, r in ((e.a, e.b), (e.b, e.a)):
                i, j = names.index(l), names.index(r)
                cl[i, j] = cidx[e.attr_class]
                gamma[i, j] = stats.gamma(l, r, group)
                mu[i, j] = stats.mu(l, r, group)
        lam = np.array([stats.lam(s, group) for s in names], dtype=float)
        # a lookup searches the stream's whole state (kept by key bucket, not by group): every group's keys
        kappa = np.array([sum(stats.kappa(s, g) for g in stats.groups) for s in names], dtype=float)
        window = np.array([stats.window_tuples(s, group) for s in names], dtype=float)
        return cls(names, classes, cl, gamma, mu, lam, kappa, window, group)

    @classmethod
    def from_query(cls, query) -> "JoinProblem":
        """The join graph alone (statistics zero): enough to enumerate probe orders."""
        g = GroupStats(streams={s: StreamStats(lam=0.0, kappa=0.0, window_tuples=0.0) for s in query.stream_names},
                       edges={e: EdgeStats(gamma=0.0, mu=0.0) for e in query.directed_edges})
        return cls.from_statistics(query, Statistics(query=query.name, groups={0: g}))

    def with_gamma_floor(self, floor: float = GAMMA_FLOOR) -> "JoinProblem":
        """The same problem with ``gamma`` raised to ``floor`` on every edge (``self`` itself when no
        edge's gamma is below it): what dppick and exact search on, so that a tie of Eq. 8 after an
        empty step goes to the cheapest tail (module docstring, "Ties after an empty step")."""
        floor = float(floor)
        if not floor > 0.0:
            return self
        edge = self.cls >= 0
        if not np.any(edge & (self.gamma < floor)):
            return self
        return replace(self, gamma=np.where(edge, np.maximum(self.gamma, floor), self.gamma))

    # ---- the step of the model ------------------------------------------------------
    def step_classes(self, joined_mask: int, r: int) -> list[int]:
        """Attribute classes through which ``r`` can be looked up from the partial result."""
        return [c for c in range(self.K) if any(joined_mask >> m & 1 for m in self.class_members[c][r])]

    def step_terms(self, joined_mask: int, r: int, c: int) -> tuple[float, float, float]:
        """``(g, u, phi)`` of looking ``r`` up through class ``c`` from ``joined_mask`` (Eq. 21-22): gamma and mu
        of the class-``c`` edge with the highest gamma (ties: lowest mu) and the residual factor of the other
        classes (the product of their representative edges' gammas, independence assumption)."""
        best = None
        phi = 1.0
        for cc in range(self.K):
            members = [m for m in self.class_members[cc][r] if joined_mask >> m & 1]
            if not members:
                continue
            rep = max(((self.gamma[m, r], -self.mu[m, r]) for m in members))
            if cc == c:
                best = (rep[0], -rep[1])
            else:
                phi *= rep[0]
        if best is None:
            raise ValueError(f"{self.names[r]} cannot be looked up through class {self.classes[c]} from the partial result")
        return float(best[0]), float(best[1]), float(phi)

    def representative(self, joined: Sequence[int], r: int, c: int) -> int:
        """The ``l`` recorded in the plan for a lookup of ``r`` through class ``c``: the earliest
        joined class-``c`` neighbour (the rule of ``orders_from_permutation``). Every class-``c``
        edge fetches the same tuples, so the choice does not change the cost; a stable choice
        keeps plans from changing when only gamma noise moves."""
        for m in joined:
            if self.cls[m, r] == c:
                return m
        raise ValueError(f"{self.names[r]} has no class-{self.classes[c]} neighbour in the partial result")


def order_steps(problem: JoinProblem, model: CostModel, start: int, pairs: Sequence[Sequence[int]]) -> list:
    """``[(q, g, u, phi, c)]`` per step of a probe order (index pairs), checked to be a connected expansion."""
    mask = 1 << start
    steps = []
    for l, r in pairs:
        c = int(problem.cls[l, r])
        if c < 0 or not mask >> l & 1 or mask >> r & 1:
            raise ValueError(f"[{problem.names[l]}, {problem.names[r]}] is not a valid step here")
        g, u, phi = problem.step_terms(mask, r, c)
        steps.append((float(model.query_cost(problem.kappa[r])), g, u, phi, c))
        mask |= 1 << r
    if mask != (1 << problem.n) - 1:
        raise ValueError("the order does not reach every stream")
    return steps


def step_line(q: float, g: float, u: float, phi: float, same: bool | None, am: float, a: float = 0.0,
              b: float = 0.0) -> tuple[float, float]:
    """Eq. 65: ``(A_k, B_k)`` of a step from its terms and the next step's ``(A_{k+1}, B_{k+1}) = (a, b)``;
    ``same``: the next step keeps the class (None: this is the last step)."""
    if same is None:
        return q + g * am * u, 0.0
    if same:
        return q + g * (am * u + a), g * u * phi * b
    return q + g * am * u, g * u * phi * (a + b)


def order_line(steps, am: float) -> tuple[float, float]:
    """``(A_1, B_1)`` of an order's steps (:func:`order_steps`): its cost is ``A_1 + B_1``."""
    a = b = 0.0
    nxt = None
    for q, g, u, phi, c in reversed(steps):
        a, b = step_line(q, g, u, phi, None if nxt is None else nxt == c, am, a, b)
        nxt = c
    return a, b


def order_cost(problem: JoinProblem, model: CostModel, start: int, pairs: Sequence[Sequence[int]]) -> float:
    """Eq. 65-66 (Eq. 8 with one class): the expected cost of one probe order (index pairs) of ``start``."""
    a, b = order_line(order_steps(problem, model, start, pairs), model.alpha_m)
    return a + b


def tie_key(problem: JoinProblem, pairs: Sequence[Sequence[int]]) -> tuple:
    """``(r_1, c_1, r_2, c_2, ...)``: among orders within :data:`TIE_RTOL` of the optimum both searches keep the
    one with the smallest key."""
    return tuple(x for l, r in pairs for x in (int(r), int(problem.cls[l, r])))


def search_with_gamma_floor(problem: JoinProblem, model: CostModel, search, floor: float = GAMMA_FLOOR,
                            search_both=None) -> dict:
    """``{start: (pairs, C)}``: the orders of ``search(problem) -> {start: (pairs, cost)}`` with ties of Eq. 8 broken
    by the cost with ``gamma`` floored at ``floor`` (module docstring, "Ties after an empty step"): the floored
    search's order where its unfloored cost ``C`` is the unfloored optimum (1e-12 relative), else the unfloored
    search's. One search when no gamma is below ``floor`` (or ``floor`` is 0); ``C``: the unfloored search's own
    cost, or :func:`order_cost`'s for a floored search's order that differs. ``search_both(problem, floored) -> (plain,
    floored)``, where given, runs the two searches as one (exact's DP shares the states the floor does not reach)."""
    floored = problem.with_gamma_floor(floor)
    if floored is problem:
        return search(problem)
    plain, found = search_both(problem, floored) if search_both else (search(problem), search(floored))
    out = {}
    for s, (pairs, _) in found.items():
        if pairs == plain[s][0]:  # no tie to break (most starts)
            out[s] = plain[s]
            continue
        cost, base = order_cost(problem, model, s, pairs), plain[s][1]
        out[s] = (pairs, cost) if cost <= base + 1e-12 * abs(base) else plain[s]
    return out


def pairs_to_index(problem: JoinProblem, pairs) -> list[tuple[int, int]]:
    return [(problem.index[l], problem.index[r]) for l, r in pairs]


def pairs_to_names(problem: JoinProblem, pairs) -> list[tuple[str, str]]:
    return [(problem.names[l], problem.names[r]) for l, r in pairs]


def evaluate_orders(query, stats, orders: dict, cost_model=None, group: int = 0) -> tuple[dict, float]:
    """Cost every stream's order (``{stream: [(l, r), ...]}``) in one key group:
    ``({stream: C_s}, sum_s lambda_s C_s)``."""
    model = resolve_cost_model(cost_model)
    problem = JoinProblem.from_statistics(query, stats, group)
    costs = {}
    for s, pairs in orders.items():
        why = query.expansion_error(s, pairs)
        if why:
            raise ValueError(f"order of {s}: {why}")
        costs[s] = order_cost(problem, model, problem.index[s], pairs_to_index(problem, pairs))
    total = float(sum(problem.lam[problem.index[s]] * c for s, c in costs.items()))
    return costs, total


def resolve_groups(query, stats, partitioning=None) -> tuple[dict | None, list[int]]:
    """The partitioning rule and key groups to plan or cost for: ``partitioning=None`` follows
    the statistics (their rule, or one group); a given rule must be the one the statistics
    were computed under (when they say) and the statistics must hold each of its groups."""
    stats_rule = stats.partitioning or None
    rule = stats_rule if partitioning is None else (partitioning or None)
    if rule:
        problems = rule_problems(rule, query)
        if problems:
            raise ValueError("partitioning: " + "; ".join(problems))
    if stats_rule is not None and rule != stats_rule:
        raise StatisticsError(f"the statistics were computed per key group of {stats_rule}, "
                              f"not of {rule}: recompute them under the plan's partitioning")
    groups = list(range(num_groups(rule)))
    missing = [g for g in groups if g not in stats.groups]
    if missing:
        raise StatisticsError(f"statistics of {stats.query} have no key group(s) {missing} "
                              f"(they have {sorted(stats.groups)}; partitioning {rule})")
    if not rule and len(stats.groups) > 1:
        raise StatisticsError(f"statistics of {stats.query} have key groups {sorted(stats.groups)} but no "
                              "partitioning rule says which keys they hold; pass the rule")
    return rule, groups


def plan_costs(query, stats, plan, cost_model=None) -> tuple[dict, dict]:
    """``({group: {stream: C_s}}, {group: sum_s lambda_s C_s})`` of ``plan`` under ``stats``.

    A plan without partitioning runs the same orders for every key, so under per-group
    statistics it is costed in every statistics group (keys: the statistics' groups)."""
    stats.check(query)
    plan.validate(query)
    if plan.partitioning or not stats.partitioning:
        _, groups = resolve_groups(query, stats, plan.partitioning or {})
        pick = {g: g for g in groups}
    else:
        _, groups = resolve_groups(query, stats, None)
        pick = {g: 0 for g in groups}
    costs, totals = {}, {}
    for g in groups:
        costs[g], totals[g] = evaluate_orders(query, stats, plan.orders[pick[g]], cost_model, g)
    return costs, totals


def plan_cost(query, stats, plan, cost_model=None, overhead: "GroupOverhead | None" = None, cells=None) -> float:
    """Expected cost per second of ``plan`` under ``stats``: ``sum_g sum_s lambda_s C_s``, plus, with
    ``overhead``, the cost of its extra probe chains (:func:`group_overhead`, ``cells`` as there; 0 for one group).

    What the plan gate compares (active plan vs candidate, each under statistics of its own key groups)."""
    total = float(sum(plan_costs(query, stats, plan, cost_model)[1].values()))
    if overhead is not None and plan.partitioning:
        total += group_overhead(query, stats, overhead, cost_model, cells=cells)
    return total


# ---- the per-group overhead (PMJoin) ------------------------------------------------------------

#: seconds of one unit of the uncalibrated model (one key comparison): the engine's measured alpha_q
#: (docs/optimizer.md, "Calibration": 3.5e-9 s per unit of f), so that an overhead measured in seconds
#: can be added to uncalibrated costs
SECONDS_PER_UNIT = 3.5e-9


@dataclass(frozen=True)
class GroupOverhead:
    """What one more probe chain costs the engine, and how often it runs one.

    The engine probes a batch's new tuples of a stream in one key bucket (``pmod(key, buckets)``) as one
    chain per key group present among them (docs/engine.md, "Partitioned plans"): each chain pays its
    ``n - 1`` vectorised lookups' fixed cost (``per_call`` seconds each, the calibration's
    ``overhead_seconds_per_call``) and the chain's own fixed cost (``per_chain`` seconds: building its
    groups, gathering, its metrics), whatever its size. ``batch_seconds`` and ``buckets`` say how many
    (bucket, batch) pairs a second of input is cut into."""

    per_chain: float = 150e-6  # s; measured on this engine (bench/partition), refit from metrics in the loop
    per_call: float = 54e-6  # s; the calibration's per-call overhead (docs/optimizer.md)
    batch_seconds: float = 10.0
    buckets: int = 16

    def chain_seconds(self, n_streams: int) -> float:
        return self.per_chain + max(n_streams - 1, 0) * self.per_call

    def to_json(self) -> dict:
        return {"per_chain": self.per_chain, "per_call": self.per_call, "batch_seconds": self.batch_seconds,
                "buckets": self.buckets}

    @classmethod
    def for_model(cls, model, **kw) -> "GroupOverhead":
        """The defaults with the per-call cost of a calibrated model (its ``calibration`` summary)."""
        model = resolve_cost_model(model)
        per_call = (model.calibration or {}).get("overhead_seconds_per_call")
        if model.calibrated and per_call is not None and math.isfinite(float(per_call)):
            kw.setdefault("per_call", float(per_call))
        return cls(**kw)


def expected_chains(lam, batch_seconds: float) -> float:
    """Expected probe chains per second for the rates ``lam[bucket, group]`` (tuples/s of one stream): per
    (bucket, batch), one chain per group with at least one new tuple there, ``1 - exp(-lambda T)`` (Poisson)."""
    lam = np.maximum(np.asarray(lam, dtype=float), 0.0)
    return float(np.sum(-np.expm1(-lam * float(batch_seconds)))) / float(batch_seconds)


def bucket_group_rates(query, stats, buckets: int, cells=None) -> dict:
    """``{stream: lambda[engine bucket, group]}``. With ``cells`` (``(cell statistics, cell rule)`` of
    ``pmod(key, B)`` buckets, ``buckets | B``, and ``stats.partitioning``'s groups unions of them), exact: a
    cell lies in one engine bucket. Otherwise each group's rate spread evenly over the buckets (as for a range
    rule, whose key ranges span every bucket)."""
    groups = sorted(stats.groups)
    nb = max(int(buckets), 1)
    if cells is not None:
        cstats, crule = cells
        mapping = cell_map(crule, stats.partitioning) if crule.get("method") == "hash" else None
        if mapping is not None and int(crule["groups"]) % nb == 0:
            out = {}
            for s in query.stream_names:
                m = np.zeros((nb, len(groups)))
                for c, gs in cstats.groups.items():
                    m[c % nb, groups.index(int(mapping[c]))] += gs.streams[s].lam if s in gs.streams else 0.0
                out[s] = m
            return out
    return {s: np.tile(np.array([stats.lam(s, g) for g in groups]) / nb, (nb, 1)) for s in query.stream_names}


def group_overhead(query, stats, overhead: GroupOverhead, cost_model=None, cells=None) -> float:
    """The extra chains of ``stats``' key groups over one group, per second, times a chain's cost, in the cost
    model's units (seconds when it is calibrated, else units of :data:`SECONDS_PER_UNIT`). ``cells``: see
    :func:`bucket_group_rates` (a hash rule with ``D | buckets`` then puts one group in each engine bucket:
    no extra chain at all)."""
    model = resolve_cost_model(cost_model)
    extra = 0.0
    for m in bucket_group_rates(query, stats, overhead.buckets, cells).values():
        extra += expected_chains(m, overhead.batch_seconds) - expected_chains(m.sum(axis=1), overhead.batch_seconds)
    seconds = max(extra, 0.0) * overhead.chain_seconds(len(query.stream_names))
    return seconds if model.calibrated else seconds / SECONDS_PER_UNIT
