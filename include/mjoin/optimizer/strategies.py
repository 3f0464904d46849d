"""Optimize probe orders: statistics + cost model -> a plan (``mjoin.model.plan``), per key group.

``optimize(query, stats, "exact")`` is what the re-optimization DAG calls; ``STRATEGIES``
lists every strategy by name (the evaluation and the DAG params iterate it). Every
strategy returns one order per stream; all of them are then costed under the same full
cost model (``mjoin.optimizer.cost``), so estimated costs compare across strategies, ablations
included (an ablation changes the model used to *search*, not the one that *scores*).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

from mjoin.model.plan import Plan, make_plan
from mjoin.model.query import stream_order_from
from mjoin.optimizer import baselines
from mjoin.optimizer.ajosc import ajosc
from mjoin.optimizer.cost import CostModel, JoinProblem, order_cost, pairs_to_names, resolve_cost_model, resolve_groups
from mjoin.optimizer.dppick import DpPickTooLarge, dp_pick, get_sequences
from mjoin.optimizer.exact import ExactTooLarge, exact_dp

log = logging.getLogger(__name__)

#: relative tolerance when an optimizer's own cost is checked against the evaluation
_TOL = 1e-9


class OptimizerError(ValueError):
    """A request the optimizer cannot serve (unknown strategy, bad initial order, too large)."""


@dataclass(frozen=True)
class Strategy:
    name: str
    family: str  # fixed | selectivity_first | greedy | dppick | exact | ajosc
    description: str
    paper_name: str
    ablation: str | None = None  # "query" (alpha_m = 0) or "match" (alpha_q = 0) while searching
    uses_initial_order: bool = False


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("fixed", "fixed", "every stream probes the others in the initial order, skipping itself; never re-planned",
             "fixedOrder", uses_initial_order=True),
    Strategy("selectivity_first", "selectivity_first", "greedy: lowest join selectivity gamma*mu/|W_r| first (MJoin, GrubJoin)",
             "selectivityFirst"),
    Strategy("greedy", "greedy", "greedy: lowest immediate cost alpha_q f(kappa) + gamma alpha_m mu (MultiStream)",
             "greedy_MSJ"),
    Strategy("dppick", "dppick", "the paper's DFS over all connected sequences with a suffix-cost memo (O(n!))",
             "dpPick"),
    Strategy("exact", "exact", "dynamic program over subsets x attribute class, lines A + m B of the class-change "
             "price: the same optimum as dppick", "(ours)"),
    Strategy("dppick_query", "dppick", "dppick searching with the query cost only (alpha_m = 0)",
             "dpPick_queryCost", ablation="query"),
    Strategy("dppick_match", "dppick", "dppick searching with the match cost only (alpha_q = 0)",
             "dpPick_matchCost", ablation="match"),
    Strategy("exact_query", "exact", "exact searching with the query cost only (alpha_m = 0)",
             "(ours)", ablation="query"),
    Strategy("exact_match", "exact", "exact searching with the match cost only (alpha_q = 0)",
             "(ours)", ablation="match"),
)}


#: peers run side by side in the evaluation (``optimize`` takes their names), not offered to the loop
PEERS: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ajosc", "ajosc", "AJOSC's DP over connected sets, its own tuple-at-a-time cost (mjoin.optimizer.ajosc)",
             "AJOSC (SIGMOD 2025)"),
)}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name] if name in STRATEGIES else PEERS[name]
    except KeyError:
        raise OptimizerError(f"unknown strategy {name!r} (one of: {', '.join(STRATEGIES)})") from None


def probe_orders(query, start: str | None = None, *, dedupe: bool = False) -> Iterator[list[tuple[str, str]]]:
    """Every valid probe order (connected expansion) of ``start`` (of every stream if None):
    the paper's getSequences on the query's join graph, as lists of ``(l, r)`` pairs.
    ``dedupe=True`` keeps one order per choice of (stream, attribute class) at each step."""
    problem = JoinProblem.from_query(query)
    first = None if start is None else problem.index[start]
    for seq in get_sequences(problem, first, dedupe=dedupe):
        yield pairs_to_names(problem, seq)


def search_orders(problem: JoinProblem, strategy: str | Strategy, model: CostModel, *, query=None,
                  initial_order: Sequence[str] | None = None) -> dict:
    """``{start index: [(l, r) index pairs]}`` chosen by ``strategy`` for one key group."""
    st = strategy if isinstance(strategy, Strategy) else get_strategy(strategy)
    search_model = model.ablation(st.ablation)
    try:
        if st.family == "fixed":
            if query is None:
                raise OptimizerError("the fixed strategy needs the query (for its initial order)")
            return baselines.fixed(problem, query, initial_order or query.stream_names)
        if st.family == "selectivity_first":
            return baselines.selectivity_first(problem, search_model)
        if st.family == "greedy":
            return baselines.greedy(problem, search_model)
        if st.family == "dppick":
            return {s: pairs for s, (pairs, _) in dp_pick(problem, search_model).items()}
        if st.family == "exact":
            return {s: pairs for s, (pairs, _) in exact_dp(problem, search_model).items()}
        if st.family == "ajosc":
            return ajosc(problem)
    except (DpPickTooLarge, ExactTooLarge) as exc:
        raise OptimizerError(str(exc)) from None
    raise OptimizerError(f"strategy {st.name}: unknown family {st.family!r}")


def optimize(query, stats, strategy: str, *, initial_order: Sequence[str] | None = None, cost_model=None,
             partitioning=None, source: dict | None = None) -> Plan:
    """Probe orders for every stream (and key group) chosen by ``strategy``, as a validated plan.

    - ``stats``: a ``mjoin.model.statistics.Statistics`` (measured or forecast), checked first.
    - ``initial_order``: a permutation of the streams (``fixed`` only; default: spec order).
    - ``cost_model``: a ``CostModel``, a path to its JSON, a dict, or None (uncalibrated defaults).
    - ``partitioning``: None follows the statistics (their rule, else one group); a rule
      dict must match the statistics' key groups (one order set per group).
    - ``source``: extra lineage merged into ``plan.source`` (e.g. ``{"statistics": path}``).
    The plan's ``costs`` are ``C_s`` per new tuple, its ``estimated_cost`` ``sum lambda_s C_s``
    (expected cost per second), summed over groups."""
    st = get_strategy(strategy)
    model = resolve_cost_model(cost_model)
    stats.check(query)
    rule, groups = resolve_groups(query, stats, partitioning)
    perm = None
    if st.uses_initial_order:
        try:
            perm = stream_order_from(query, initial_order if initial_order is not None else query.stream_names)
        except ValueError as exc:
            raise OptimizerError(f"initial order: {exc}") from None
    t0 = time.perf_counter()
    orders, costs, group_costs = {}, {}, {}
    for g in groups:
        problem = JoinProblem.from_statistics(query, stats, g)
        chosen = search_orders(problem, st, model, query=query, initial_order=perm)
        orders[g], costs[g] = {}, {}
        for s in range(problem.n):
            pairs = chosen[s]
            costs[g][problem.names[s]] = order_cost(problem, model, s, pairs)
            orders[g][problem.names[s]] = pairs_to_names(problem, pairs)
        group_costs[g] = float(sum(problem.lam[i] * costs[g][name] for i, name in enumerate(problem.names)))
    seconds = time.perf_counter() - t0
    lineage = {"kind": stats.kind, "cycle_start": stats.cycle_start, "cycle_seconds": stats.cycle_seconds}
    if "as_of" in (stats.meta or {}):
        lineage["as_of"] = stats.meta["as_of"]
    if perm is not None:
        lineage["initial_order"] = list(perm)
    lineage["optimizer_seconds"] = round(seconds, 6)
    lineage.update(source or {})
    cm = model.to_json()
    if st.ablation:
        cm["search_ablation"] = st.ablation
        cm["search_model"] = model.ablation(st.ablation).to_json()
    plan = make_plan(query, orders, st.name, costs=costs, partitioning=rule, source=lineage, cost_model=cm,
                     estimated_cost=float(sum(group_costs.values())), group_costs=group_costs)
    log.debug("%s: %s plan, %d group(s), estimated cost %.6g/s in %.3f s", query.name, st.name, len(groups),
             plan.estimated_cost, seconds)
    return plan


def compare(query, stats, strategies: Sequence[str] | None = None, *, initial_order=None, cost_model=None,
            partitioning=None, source: dict | None = None) -> tuple[dict, dict]:
    """Run several strategies on the same statistics: ``({name: Plan}, {name: why skipped})``
    (dppick is skipped, with the reason, where it would enumerate too many sequences)."""
    plans, skipped = {}, {}
    for name in strategies or list(STRATEGIES):
        try:
            plans[name] = optimize(query, stats, name, initial_order=initial_order, cost_model=cost_model,
                                   partitioning=partitioning, source=source)
        except OptimizerError as exc:
            if name not in STRATEGIES:
                raise
            skipped[name] = str(exc)
    return plans, skipped
