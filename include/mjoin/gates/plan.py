"""Gate 4: the candidate plan (valid for the query, complete, cost finite, better than the active plan).

"Better" is hysteresis: ``improvement = (cost_active - cost_new) / cost_active`` with both
plans costed by the SAME ``cost_fn`` (the cost model under the forecast statistics).
Below ``improvement_threshold`` the outcome is ``no_change`` (keep the active plan;
the DAG skips the deploy), not a failure. No active plan: the first deploy passes.

``cost_fn(plan) -> float`` is how the DAG wires the cost model: e.g.
``lambda p: mjoin.optimizer.cost.plan_cost(query, forecast, p, cost_model)``. Without it the
plans' recorded ``estimated_cost`` values are compared, which is weaker (they may have
been computed under different statistics) and is said in the result's notes.
"""
from __future__ import annotations

import json
import math
import os
from typing import Callable, Mapping

import pandas as pd

from mjoin.gates.base import GateRun
from mjoin.gates.config import GateConfig
from mjoin.gates.result import GateResult
from mjoin.gates.suites import plan_document_suite, plan_orders_suite
from mjoin.model.plan import Plan, PlanError
from mjoin.model.schemas import SchemaError
from mjoin.optimizer.cost import plan_cost
from mjoin.runtime.fsutil import read_text

CostFn = Callable[[Plan], float]


def load_candidate(ref) -> tuple[Plan | None, str | None, dict]:
    """``(plan, problem, raw_doc)``: a Plan from itself, a JSON document or a path; problem says why not."""
    if isinstance(ref, Plan):
        return ref, None, ref.to_json()
    doc = ref
    if isinstance(ref, (str, os.PathLike)):
        text = read_text(ref)  # FileNotFoundError: the caller's mistake, not a gate failure
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            return None, f"{ref}: not JSON ({exc})", {}
    if not isinstance(doc, Mapping):
        return None, f"a plan is a JSON object, not {type(doc).__name__}", {}
    try:
        return Plan.from_json(doc), None, dict(doc)
    except (PlanError, SchemaError, KeyError, TypeError, ValueError) as exc:
        return None, str(exc), dict(doc)


def _cost(cost_fn: CostFn | None, plan: Plan) -> tuple[float, str | None]:
    """``(cost, error)``; NaN with the error when the cost cannot be computed."""
    try:
        c = cost_fn(plan) if cost_fn is not None else plan.estimated_cost
    except Exception as exc:  # the cost model may reject a plan; report, never crash the gate
        return math.nan, f"{type(exc).__name__}: {exc}"
    if c is None:
        return math.nan, "no estimated cost"
    try:
        return float(c), None
    except (TypeError, ValueError):
        return math.nan, f"cost {c!r} is not a number"


def model_cost_fn(query, stats, cost_model=None) -> CostFn:
    """``cost_fn`` costing a plan with the project's cost model under ``stats`` (docs/algorithms.md Eq. 1-8).

    Uses :func:`mjoin.optimizer.cost.plan_cost`."""
    if cost_model is None:
        return lambda p: plan_cost(query, stats, p)
    return lambda p: plan_cost(query, stats, p, cost_model)


def orders_frame(plan: Plan, query) -> pd.DataFrame:
    """One row per key group x stream of the query: the order and whether it reaches every other stream."""
    streams = query.stream_names
    rows = []
    for g in plan.group_ids or [0]:
        orders = plan.orders.get(g, {})
        for s in streams:
            pairs = orders.get(s)
            if pairs is None:
                rows.append({"where": f"[{s}] g{g}", "order": "(none)", "complete": False})
                continue
            reached = [s] + [p[1] for p in pairs if len(p) == 2]
            complete = len(pairs) == len(streams) - 1 and sorted(reached) == sorted(streams)
            rows.append({"where": f"[{s}] g{g}", "order": " ".join(f"[{p[0]},{p[1]}]" if len(p) == 2 else str(list(p))
                                                                     for p in pairs) or "(empty)",
                         "complete": complete})
    return pd.DataFrame(rows, columns=["where", "order", "complete"])


def check_plan(query, plan, *, active=None, cost_fn: CostFn | None = None,
               config: GateConfig | None = None) -> GateResult:
    """Check a candidate plan (``Plan``, JSON document or path) for ``query`` against the active plan."""
    cfg = config or GateConfig()
    run = GateRun("plan", query, cfg)
    candidate, schema_problem, doc = load_candidate(plan)
    row = {"where": "plan", "schema_problem": schema_problem, "plan_query": doc.get("query"),
           "fingerprint": doc.get("query_fingerprint"), "problems": None, "estimated_cost": None,
           "cost_is_finite": None, "active_cost": None, "improvement": None, "improvement_pct": None}

    if candidate is None:
        run.check(plan_document_suite(query, cfg, schema_only=True), pd.DataFrame([row]))
        run.skip(["plan.for_this_query", "plan.valid_for_query", "plan.every_stream_has_complete_order",
                  "plan.estimated_cost_finite", "plan.improves_on_active"], "the document is not a plan")
        return run.result()
    row["plan_query"] = candidate.query
    row["fingerprint"] = candidate.query_fingerprint
    run.details.update({"strategy": candidate.strategy, "plan_version": candidate.version})
    if candidate.query != query.name:
        run.check(plan_document_suite(query, cfg, for_query_only=True), pd.DataFrame([row]))
        run.skip(["plan.valid_for_query", "plan.every_stream_has_complete_order", "plan.estimated_cost_finite",
                  "plan.improves_on_active"], f"the plan is for query {candidate.query!r}")
        return run.result()

    try:
        problems = candidate.problems(query)
    except Exception as exc:  # a malformed partitioning rule etc.: report it, never crash the gate
        problems = [f"the plan cannot be checked against the query: {type(exc).__name__}: {exc}"]
    row["problems"] = "; ".join(problems) if problems else None
    with_cost = not problems
    if with_cost:
        cost_new, err = _cost(cost_fn, candidate)
        row["estimated_cost"] = cost_new
        row["cost_is_finite"] = math.isfinite(cost_new) and cost_new >= 0
        if err:
            run.note(f"candidate cost: {err}")
        if cost_fn is None:
            run.note("no cost function given: comparing the plans' recorded estimated_cost "
                     "(possibly computed under different statistics)")
        row.update(_improvement(run, query, candidate, active, cost_fn, cost_new))
    else:
        run.skip(["plan.estimated_cost_finite", "plan.improves_on_active"], "the plan is not valid for the query")

    run.check(plan_document_suite(query, cfg, with_cost=with_cost), pd.DataFrame([row]))
    run.check(plan_orders_suite(query, cfg), orders_frame(candidate, query))
    run.details.update({"estimated_cost": row["estimated_cost"], "active_cost": row["active_cost"],
                        "improvement": row["improvement"], "threshold": cfg.improvement_threshold})
    return run.result()


def _improvement(run: GateRun, query, candidate: Plan, active, cost_fn, cost_new: float) -> dict:
    """``active_cost`` and ``improvement`` (None where there is nothing valid to compare with)."""
    if active is None:
        run.note("no active plan: first deploy")
        run.details["active_version"] = None
        return {"active_cost": None, "improvement": None}
    if not isinstance(active, Plan):
        active, problem, _ = load_candidate(active)
        if active is None:
            run.note(f"the active plan cannot be read ({problem}); the candidate is not compared")
            return {"active_cost": None, "improvement": None}
    run.details["active_version"] = active.version
    run.details["diff"] = candidate.diff(active)
    # the whole plan is compared: a new key-to-group rule passes only with the orders' gain, by the same threshold
    rule_changed = (candidate.partitioning or None) != (active.partitioning or None)
    run.details["key_groups"] = {"active": active.partitioning, "candidate": candidate.partitioning,
                                 "changed": rule_changed, "active_groups": len(active.group_ids),
                                 "candidate_groups": len(candidate.group_ids)}
    if rule_changed:
        run.note(f"key groups change: {len(active.group_ids)} -> {len(candidate.group_ids)} "
                 f"({(active.partitioning or {}).get('method', 'one group')} -> "
                 f"{(candidate.partitioning or {}).get('method', 'one group')}); each plan costed under its own groups")
    if candidate.same_orders(active):
        run.note(f"the candidate has the same orders as the active plan v{active.version}")
    try:
        problems = active.problems(query)
    except Exception as exc:  # see check_plan
        problems = [f"{type(exc).__name__}: {exc}"]
    if problems:
        run.note(f"the active plan v{active.version} is not valid for the query any more "
                 f"({'; '.join(problems)}); the candidate is not compared")
        return {"active_cost": None, "improvement": None}
    cost_active, err = _cost(cost_fn, active)
    if err or not math.isfinite(cost_active):
        run.note(f"the active plan's cost is not finite ({err or cost_active}); the candidate is not compared")
        return {"active_cost": cost_active, "improvement": None}
    if not math.isfinite(cost_new):
        return {"active_cost": cost_active, "improvement": None}
    if cost_active <= 0:
        improvement = 0.0 if cost_new >= cost_active else math.inf
    else:
        improvement = (cost_active - cost_new) / cost_active
    return {"active_cost": cost_active, "improvement": improvement, "improvement_pct": f"{improvement:.2%}"}
