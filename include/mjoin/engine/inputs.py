"""Resolving what a run is given: the query, the plan (registry, file, or the spec's fixed order), lakes."""
from __future__ import annotations

import logging

from mjoin.engine.compiled import CompiledPlan
from mjoin.lake.layout import Lake
from mjoin.model.plan import Plan, PlanError, load_plan, make_plan, orders_from_permutation
from mjoin.model.query import Query, load_query

log = logging.getLogger(__name__)


def as_query(query) -> Query:
    return load_query(query)


def as_lake(lake) -> Lake:
    return lake if isinstance(lake, Lake) else Lake(str(lake))


def default_plan(query: Query) -> Plan:
    """The paper's fixed order in the spec's stream order: what runs when no plan is given."""
    return make_plan(query, orders_from_permutation(query, query.stream_names), "fixedOrder",
                     source={"made_by": "mjoin.engine default: spec stream order"})


def as_plan(query: Query, plan) -> tuple[Plan, str]:
    """(validated plan, where it came from): a Plan, a plan file path, or None (the default)."""
    if plan is None:
        return default_plan(query), "default"
    if isinstance(plan, Plan):
        return plan.validate(query), "cli"
    return load_plan(plan, query), "cli"


def compile_plan(query: Query, plan, config, source: str | None = None) -> CompiledPlan:
    p, src = as_plan(query, plan)
    if src == "default":
        log.info("no plan given: using the fixed order of the spec's stream order (%s)", ",".join(query.stream_names))
    return CompiledPlan.from_plan(query, p, source=source or src, prefilter=config.prefilter)


__all__ = ["as_query", "as_lake", "as_plan", "compile_plan", "default_plan", "PlanError"]
