"""PMJoin key groups chosen from the statistics (docs/algorithms.md, "Key groups (PMJoin)"; PMJoin paper, section 3.3).

Candidate key-to-group rules for ``D`` groups, built from per-cell statistics (the statistics
job's per-bucket ``pmod(key, B)`` and per-key-range cells, :mod:`mjoin.stats.cells`):

- ``hash``: ``key mod D`` (``D`` divides ``B``);
- ``range``: bounds at the ``k / D`` quantiles of the tuples over the key ranges (to the
  resolution of the range cells);
- ``rate``: per bucket, the rank vector ``V_b`` of the streams' rates; the vectors clustered
  into ``D`` groups with k-means (``scipy.cluster.vq.kmeans2``, fixed seed), as a ``table`` rule;
- ``cost`` (the cost-aware variant): per bucket the order set that is best for it alone
  (the optimizer on the bucket's statistics); then ``D`` of those order sets chosen greedily
  (facility location) to minimise ``sum_b min_o cost_b(o)``, each bucket in the group of its
  cheapest chosen set, as a ``table`` rule.

Each candidate is priced like the plan it would become: its groups' statistics are the unions
of their cells' (exact), the optimizer picks every group's orders, the cost model sums
``lambda_s C_s`` over the groups (lookups searching the whole state: ``mjoin.optimizer.cost``), plus the
engine's per-group overhead (``mjoin.optimizer.cost.group_overhead``: the extra probe chains). Prices
are out of sample: the cycles are split in two folds (even, odd); rule and orders are fit on
one and costed on the other, both ways, averaged. In sample, more groups always fit the noise
of per-bucket statistics better; out of sample only real differences between keys pay.
``D = 1`` (no rule) is a candidate too and wins unless partitioning pays.

Only queries on one attribute class are partitioned (a cell is then a function of every join
key); for others :func:`choose` returns one group and says why. Pure Python + numpy/scipy.
"""
from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy.cluster.vq import kmeans2
from scipy.optimize import nnls

from mjoin.model.keygroups import num_groups
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StatisticsError, StreamStats, aggregate_rows
from mjoin.optimizer.cost import GroupOverhead, JoinProblem, order_cost, plan_cost, resolve_cost_model
from mjoin.optimizer.strategies import optimize, search_orders
from mjoin.stats.cells import regroup

log = logging.getLogger(__name__)

METHODS = ("hash", "range", "rate", "cost")
GROUP_COUNTS = (1, 2, 4, 8, 16)
SEED = 17  # kmeans2's seed: the same statistics give the same rule
#: which cells a method is built from
CELLS_OF = {"hash": "buckets", "range": "ranges", "rate": "buckets", "cost": "buckets"}


@dataclass
class Cells:
    """Statistics per key cell (groups = cells, under ``rule``), aggregated over some cycles, with two folds
    (even and odd cycles) for out-of-sample pricing (None when there are fewer than two cycles)."""

    kind: str  # "buckets" | "ranges"
    rule: dict  # the cell rule: {"method": "hash", "groups": B} or {"method": "range", "bounds": [...]}
    stats: Statistics
    folds: tuple | None = None  # (even cycles, odd cycles)
    cycles: int = 0
    _cost_matrix: tuple | None = field(default=None, repr=False)  # cost_rule's per-bucket costs (cached)
    _fold_cells: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_rows(cls, kind: str, rule: dict, rows) -> "Cells":
        """From tidy per-cell rows (``mjoin.stats.history.read_cells``) of one cell rule."""
        if rows is None or len(rows) == 0:
            raise StatisticsError(f"no per-cell ({kind}) statistics to choose key groups from")
        recs = rows.to_dict("records")
        starts = sorted(pd.to_datetime(rows["cycle_start"], utc=True).unique())
        stats = _snapshot(recs, rule)
        folds = None
        if len(starts) >= 2:
            pos = {t: i % 2 for i, t in enumerate(starts)}
            which = pd.to_datetime(rows["cycle_start"], utc=True).map(pos).to_numpy()
            folds = tuple(_snapshot([r for r, w in zip(recs, which) if w == k], rule) for k in (0, 1))
        return cls(kind, rule, stats, folds, len(starts))


def _snapshot(recs: list, rule: dict) -> Statistics:
    st = aggregate_rows(recs, kind="measured")
    st.partitioning = rule
    n = num_groups(rule)
    if sorted(st.groups) != list(range(n)):  # cells without any row: no tuples

        names = {s for g in st.groups.values() for s in g.streams}
        pairs = {e for g in st.groups.values() for e in g.edges}
        for c in range(n):
            if c not in st.groups:
                st.groups[c] = GroupStats(streams={s: StreamStats(0.0, 0.0, 0.0, 0.0) for s in names},
                                          edges={e: EdgeStats(0.0, 1.0, 0.0, 0.0, 0.0) for e in pairs})
    return st


@dataclass
class Candidate:
    method: str  # "none" for one group
    requested: int  # D asked for
    rule: dict | None  # built on all cycles
    groups: int = 1
    price: float = math.nan  # out of sample (two folds), or in sample when there are no folds
    in_sample: float = math.nan
    note: str = ""
    fold_prices: tuple = ()  # (fit on even, priced on odd cycles; fit on odd, priced on even)

    def to_json(self) -> dict:
        return {"method": self.method, "requested": self.requested, "groups": self.groups, "rule": self.rule,
                "price": _finite(self.price), "in_sample": _finite(self.in_sample), "note": self.note,
                "fold_prices": [_finite(v) for v in self.fold_prices]}


@dataclass
class Choice:
    """The chosen rule (None: one group) and every candidate's price."""

    rule: dict | None
    method: str
    groups: int
    price: float
    baseline: float  # the price of one group
    candidates: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    out_of_sample: bool = True

    @property
    def gain(self) -> float:
        return 0.0 if not self.baseline else (self.baseline - self.price) / self.baseline

    def to_json(self) -> dict:
        return {"rule": self.rule, "method": self.method, "groups": self.groups, "price": _finite(self.price),
                "baseline": _finite(self.baseline), "gain": _finite(self.gain), "out_of_sample": self.out_of_sample,
                "candidates": [c.to_json() for c in self.candidates], "notes": list(self.notes)}

    def describe(self) -> str:
        lines = [f"key groups: {self.method} D={self.groups} (price {self.price:.6g}/s, one group {self.baseline:.6g}/s, "
                 f"gain {self.gain:+.1%}; {'out of sample' if self.out_of_sample else 'IN SAMPLE'})"]
        for c in sorted(self.candidates, key=lambda c: (c.method != "none", c.method, c.requested)):
            lines.append(f"  {c.method:<5} D={c.requested:<3} groups {c.groups:<3} price {c.price:.6g}"
                         + (f"  ({c.note})" if c.note else ""))
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def _finite(v):
    return None if v is None or not math.isfinite(float(v)) else float(v)


# ---- candidate rules ----------------------------------------------------------------------------------

def hash_rule(cells: Cells, D: int) -> dict | None:
    """``key mod D``; exact to price only when ``D`` divides the bucket count ``B``."""
    B = int(cells.rule["groups"])
    if D < 2 or B % D:
        return None
    return {"method": "hash", "attr_class": cells.rule["attr_class"], "groups": int(D)}


def range_rule(cells: Cells, D: int) -> dict | None:
    """Bounds at the ``k / D`` quantiles of all streams' tuples over the range cells (cell edges only)."""
    edges = [int(b) for b in cells.rule["bounds"]]
    w = np.array([sum(st.tuples or 0.0 for st in cells.stats.groups[c].streams.values())
                  for c in range(len(edges) + 1)])
    if D < 2 or w.sum() <= 0:
        return None
    cum = np.cumsum(w) / w.sum()
    bounds = []
    for k in range(1, D):
        i = int(np.searchsorted(cum, k / D - 1e-12))  # the cell where the quantile falls: bound after it
        if i < len(edges):
            bounds.append(edges[i])
    bounds = sorted(set(bounds))
    if not bounds:
        return None
    return {"method": "range", "attr_class": cells.rule["attr_class"], "bounds": bounds}


def _table(cells: Cells, labels: np.ndarray) -> dict | None:
    """A table rule from one label per bucket, labels renumbered 0.. in order of first appearance."""
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    assignment = order[inv.reshape(-1)].astype(int)
    g = int(assignment.max()) + 1
    if g < 2:
        return None
    return {"method": "table", "attr_class": cells.rule["attr_class"], "modulus": len(assignment),
            "assignment": assignment.tolist(), "groups": g}


def rate_matrix(cells: Cells, streams) -> np.ndarray:
    """``lambda[b, s]``: each stream's rate in each bucket."""
    return np.array([[cells.stats.groups[b].streams[s].lam for s in streams] for b in range(num_groups(cells.rule))])


def rank_vectors(lam: np.ndarray) -> np.ndarray:
    """Per row, the rank (1 = slowest) of each stream's rate; tied rates share their mean rank."""
    srt = np.sort(lam, axis=1)
    out = np.empty_like(lam, dtype=float)
    for i in range(len(lam)):
        lo = np.searchsorted(srt[i], lam[i], side="left")
        hi = np.searchsorted(srt[i], lam[i], side="right")
        out[i] = (lo + hi + 1) / 2.0
    return out


def rate_rule(cells: Cells, D: int, streams, seed: int = SEED) -> dict | None:
    """PMJoin's rate-based rule: per bucket the rank vector of the streams' rates (ties: mean rank),
    clustered into ``D`` groups by k-means (``kmeans2``, k-means++ start, fixed seed); buckets without
    tuples join the largest group."""
    lam = rate_matrix(cells, streams)
    busy = lam.sum(axis=1) > 0
    if D < 2 or busy.sum() < 2:
        return None
    ranks = rank_vectors(lam[busy]) / lam.shape[1]
    k = min(D, len(np.unique(ranks, axis=0)))
    if k < 2:
        return None
    with warnings.catch_warnings():  # an empty cluster only means fewer groups
        warnings.simplefilter("ignore")
        _, lab = kmeans2(ranks, k, minit="++", seed=np.random.default_rng(seed))
    labels = np.full(len(lam), -1)
    labels[busy] = lab
    labels[~busy] = np.bincount(lab).argmax()
    return _table(cells, labels)


def best_orders(query, problem: JoinProblem, strategy, model) -> dict:
    """``{start index: index pairs}`` of ``strategy`` for one problem."""

    return search_orders(problem, strategy, model, query=query)


def cost_rule(cells: Cells, D: int, query, strategy, model) -> dict | None:
    """The cost-aware rule: per bucket its own best order set; ``D`` of them chosen greedily to minimise the sum
    over buckets of the cheapest chosen set's cost (``lambda``-weighted, Eq. 1-8); each bucket in the group of
    its cheapest chosen set."""
    n = num_groups(cells.rule)
    if D < 2:
        return None
    key = (strategy, model)
    if cells._cost_matrix is None or cells._cost_matrix[0] != key:  # the same for every D: computed once
        problems = [JoinProblem.from_statistics(query, cells.stats, b) for b in range(n)]
        busy = [b for b in range(n) if problems[b].lam.sum() > 0]
        sets, index = [], {}
        for b in busy:
            o = best_orders(query, problems[b], strategy, model)
            sig = tuple(tuple(map(tuple, o[s])) for s in range(problems[b].n))
            if sig not in index:
                index[sig] = len(sets)
                sets.append(o)
        M = np.array([[sum(problems[b].lam[s] * order_cost(problems[b], model, s, o[s])
                           for s in range(problems[b].n)) for o in sets] for b in busy]) if len(sets) > 1 else None
        cells._cost_matrix = (key, busy, M)
    _, busy, M = cells._cost_matrix
    if M is None or len(busy) < 2:
        return None
    chosen = [int(M.sum(axis=0).argmin())]
    best = M[:, chosen[0]].copy()
    while len(chosen) < D:
        gains = np.array([np.minimum(best, M[:, u]).sum() for u in range(M.shape[1])])
        u = int(gains.argmin())
        if u in chosen or gains[u] >= best.sum() * (1 - 1e-9):
            break
        chosen.append(u)
        best = np.minimum(best, M[:, u])
    labels = np.zeros(n, dtype=int)
    pick = M[:, chosen].argmin(axis=1)
    labels[busy] = pick
    labels[[b for b in range(n) if b not in set(busy)]] = int(np.bincount(pick).argmax())
    return _table(cells, labels)


def build_rule(method: str, D: int, cells: Cells, query, strategy, model, seed: int = SEED) -> dict | None:
    """The rule of ``method`` for ``D`` groups from ``cells`` (None: not possible or one group)."""
    if D < 2:
        return None
    if method == "hash":
        return hash_rule(cells, D)
    if method == "range":
        return range_rule(cells, D)
    if method == "rate":
        return rate_rule(cells, D, query.stream_names, seed)
    if method == "cost":
        return cost_rule(cells, D, query, strategy, model)
    raise ValueError(f"unknown partitioning method {method!r} ({', '.join(METHODS)})")


# ---- pricing ---------------------------------------------------------------------------------------

def price(query, rule: dict | None, fit: Cells, evaluate: Statistics, cell_rule: dict, strategy, model,
          overhead: GroupOverhead | None) -> float:
    """Cost per second (Eq. 1-8 summed over the groups, plus the per-group overhead) of the plan made for
    ``rule`` on ``fit``'s statistics, under ``evaluate``'s (both per cell of ``cell_rule``)."""

    plan = optimize(query, regroup(fit.stats, cell_rule, rule), strategy, partitioning=rule or {}, cost_model=model)
    return plan_cost(query, regroup(evaluate, cell_rule, rule), plan, model, overhead, cells=(evaluate, cell_rule))


def _fold(cells: Cells, k: int) -> Cells:
    if k not in cells._fold_cells:
        cells._fold_cells[k] = Cells(cells.kind, cells.rule, cells.folds[k], None, 0)
    return cells._fold_cells[k]


#: a rule must price this much below one group to be chosen: smaller differences are within the noise of
#: out-of-sample prices on a few cycles (rules that cannot help, hash rules on keys alike or on striped keys, came
#: out up to 6% below one group on 12-cycle windows in tests/test_partition_choice.py, by the luck of the folds;
#: a hash rule whose groups never share an engine bucket costs no overhead that would offset it)
MIN_GAIN = 0.10


def pays(cand: Candidate, base: Candidate, min_gain: float = MIN_GAIN) -> bool:
    """A rule pays when it prices at least ``min_gain`` below one group on average and in each fold: on keys that
    are alike one fold's luck alone made a 16-group hash rule price 10.1% below one group on average (TPC-DS,
    folds +14.6% and +5.3%)."""
    if not cand.price < base.price * (1 - min_gain):
        return False
    return all(v < b * (1 - min_gain) for v, b in zip(cand.fold_prices, base.fold_prices))


def choose(query, cells: dict, strategy: str = "exact", *, methods=METHODS, counts=GROUP_COUNTS, cost_model=None,
           overhead: GroupOverhead | None = None, seed: int = SEED, forced: bool = False,
           min_gain: float = MIN_GAIN) -> Choice:
    """Price every candidate (``methods`` x ``counts``, and one group) on ``cells`` (``{kind: Cells}``) and return the
    cheapest that prices at least ``min_gain`` below one group, on average and in each of the two folds (else one
    group); ties go to fewer groups.
    ``forced``: the cheapest with more than one group where there is one (a fixed ``D`` asked for).
    ``overhead`` None: :meth:`GroupOverhead.for_model` of the cost model."""
    model = resolve_cost_model(cost_model)
    overhead = overhead or GroupOverhead.for_model(model)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown partitioning method(s) {unknown} ({', '.join(METHODS)})")
    notes = []
    base_kind = "buckets" if "buckets" in cells else next(iter(cells), None)
    if len(query.all_classes) != 1 or base_kind is None:
        why = (f"{query.name} joins on {len(query.all_classes)} attribute classes: key groups are chosen for "
               "queries on one" if len(query.all_classes) != 1 else "no per-cell statistics")
        return Choice(None, "none", 1, math.nan, math.nan, [], [why])
    oos = all(c.folds is not None for c in cells.values())
    if not oos:
        notes.append("fewer than two cycles of per-cell statistics: candidates priced in sample")

    def priced(method, D, kind):
        c = cells[kind]
        rule = build_rule(method, D, c, query, strategy, model, seed)
        if D > 1 and rule is None:
            return None
        cand = Candidate(method if D > 1 else "none", D, rule, num_groups(rule))
        cand.in_sample = price(query, rule, c, c.stats, c.rule, strategy, model, overhead)
        if oos:
            vals = []
            for k in (0, 1):
                fit = _fold(c, k)
                r = build_rule(method, D, fit, query, strategy, model, seed)
                if D > 1 and r is None:  # nothing to split in this fold: it runs as one group
                    r = None
                vals.append(price(query, r, fit, c.folds[1 - k], c.rule, strategy, model, overhead))
            cand.fold_prices = tuple(vals)
            cand.price = float(np.mean(vals))
        else:
            cand.price = cand.in_sample
        return cand

    cands = []
    base = priced("none", 1, base_kind)
    cands.append(base)
    for method in methods:
        kind = CELLS_OF[method]
        if kind not in cells:
            notes.append(f"{method}: no per-{kind[:-1]} statistics")
            continue
        seen = set()
        for D in counts:
            if D < 2:
                continue
            try:
                cand = priced(method, D, kind)
            except (ValueError, StatisticsError) as exc:
                notes.append(f"{method} D={D}: {exc}")
                continue
            if cand is None:
                continue
            sig = repr(cand.rule)
            if sig in seen:
                cand.note = "same rule as a smaller D"
            seen.add(sig)
            cands.append(cand)
    pool = [c for c in cands if c.groups > 1] if forced and any(c.groups > 1 for c in cands) else cands
    if forced and pool is cands:
        notes.append("no rule with more than one group could be built: one group")
    def key(c):
        return round(c.price, 12) if math.isfinite(c.price) else math.inf, c.groups

    best = min(pool, key=key)
    if not forced and best is not base and not pays(best, base, min_gain):
        paying = [c for c in cands if c is base or pays(c, base, min_gain)]
        folds = ", ".join(f"{1 - v / b:+.1%}" for v, b in zip(best.fold_prices, base.fold_prices))
        notes.append(f"{best.method} D={best.groups} prices {1 - best.price / base.price:+.1%} below one group"
                     + (f" (folds {folds})" if folds else "") + f", under the {min_gain:.0%} it takes to partition"
                     + (" in each fold" if folds else ""))
        best = min(paying, key=key)
    log.info("%s: key groups %s D=%d, price %.6g vs one group %.6g", query.name, best.method, best.groups,
             best.price, base.price)
    return Choice(best.rule, best.method, best.groups, best.price, base.price, cands, notes, oos)


# ---- the engine's per-group overhead from its metrics ------------------------------------------------

def chain_overhead_from_metrics(records, *, min_chains: int = 20) -> float | None:
    """Seconds of CPU one probe chain costs besides its steps: selecting its tuples and building their groups,
    the fixed part of materialising and of building its output tables, its metrics.

    A batch's metrics hold one chain record per (stream, group), summed over the buckets that ran it; its
    first step's ``calls`` counts those runs. Per record, its CPU less its steps' is ``per_chain runs + a rows_in
    + b rows_out`` (the tuples it selected and built groups of; its results and partial results, whose
    materialising grows with them): fitted by non-negative least squares over the records
    (``scipy.optimize.nnls``), ``per_chain`` returned: key groups split a stream's tuples among more chains, so
    only the fixed part is what a chain more adds. Not the materialising time subtracted whole: a materialising
    that builds small tables costs mostly per call. None with fewer than ``min_chains`` records."""
    rows, ys = [], []
    for r in records or ():
        for c in r.get("chains", []):
            steps = c.get("steps") or []
            steps = list(steps.values()) if isinstance(steps, dict) else steps
            runs = int((steps[0].get("calls") or 0) if steps else 0)
            if runs <= 0 or c.get("cpu_seconds") is None:
                continue
            out = float(c.get("results") or 0) + float(c.get("partials") or 0)
            rows.append((runs, float(c.get("rows_in") or 0), out))
            ys.append(float(c["cpu_seconds"]) - sum(float(st.get("cpu_seconds") or 0.0) for st in steps))
    if len(rows) < min_chains:
        return None
    X, y = np.asarray(rows, dtype=float), np.asarray(ys, dtype=float)
    scale = np.maximum(X.max(axis=0), 1.0)  # columns of similar size for nnls
    coef, _ = nnls(X / scale, y)
    return float(coef[0] / scale[0])


def overhead_from_metrics(records, model=None, **kw) -> tuple[GroupOverhead, dict]:
    """The per-group overhead with the chain cost measured in ``records`` (the engine's batch metrics) where
    there are enough, else the default; and how it was obtained."""
    base = GroupOverhead.for_model(model, **kw)
    per_chain = chain_overhead_from_metrics(records)
    if per_chain is None:
        return base, {"per_chain": "default", "chains": 0}

    return replace(base, per_chain=per_chain), {"per_chain": "metrics", "per_chain_seconds": per_chain}


def optimize_partitioned(query, cells: dict, strategy: str = "exact", *, methods=None, counts=None,
                         cost_model=None, overhead=None, stats_for=None, initial_order=None,
                         source: dict | None = None, forced: bool = False):
    """PMJoin: choose the key-to-group rule and ``D`` (:func:`choose` over
    ``methods`` x ``counts`` and one group, priced with the cost model summed over the groups plus the
    per-group ``overhead``), then optimize every group's orders with ``strategy``.

    - ``cells``: ``{kind: Cells}`` per-cell statistics (:class:`Cells`).
    - ``forced``: the cheapest rule with more than one group, even where one group prices lower.
    - ``stats_for(rule)``: the statistics to optimize the chosen rule's orders with (the loop passes the
      forecast of that rule's groups); default: ``cells`` regrouped into the rule's groups.
    Returns ``(plan, choice)``; ``plan.source["key_groups"]`` records the choice and every candidate's price."""
    choice = choose(query, cells, strategy, methods=methods or METHODS, counts=counts or GROUP_COUNTS,
                    cost_model=cost_model, overhead=overhead, forced=forced)
    if stats_for is not None:
        stats = stats_for(choice.rule)
    else:
        c = cells.get(CELLS_OF.get(choice.method, "buckets")) or next(iter(cells.values()))
        stats = regroup(c.stats, c.rule, choice.rule)
    plan = optimize(query, stats, strategy, initial_order=initial_order, cost_model=cost_model,
                    partitioning=choice.rule or {}, source={**(source or {}), "key_groups": choice.to_json()})
    return plan, choice
