"""The plan format: one JSON document, versioned by ``schema_version``, validated on load.

A plan gives, per key group and per stream ``s``, the probe order of ``s``'s new
tuples: a list of probe pairs ``[l, r]`` (docs/algorithms.md, "Notation"): at step
``k`` the partial result, which already holds ``s`` and ``r_1..r_{k-1}``, looks
up the window state of ``r`` through the edge ``(l, r)``. Without partitioning
there is one group, 0. Schema: ``schemas/plan.schema.json``.

Everything that makes, stores, checks or executes plans uses this module:
the optimizer, the registry, the gates and the engine.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

from mjoin.model.keygroups import num_groups, rule_problems
from mjoin.model.query import stream_order_from
from mjoin.model.schemas import SchemaError, validate_document
from mjoin.model.timeutil import iso
from mjoin.runtime.fsutil import atomic_write_text, read_text

SCHEMA_VERSION = 1


class PlanError(ValueError):
    """A plan that cannot be used for a query; the message names the problem."""


Pair = tuple  # (l, r)


@dataclass
class Plan:
    query: str
    strategy: str
    orders: dict  # group -> {stream -> [(l, r), ...]}
    costs: dict = field(default_factory=dict)  # group -> {stream -> expected cost per new tuple}
    group_costs: dict = field(default_factory=dict)  # group -> sum_s lambda_s * cost (expected cost per second)
    created_at: str = ""
    partitioning: dict | None = None
    source: dict = field(default_factory=dict)
    cost_model: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    estimated_cost: float | None = None
    query_fingerprint: str | None = None
    version: int | None = None

    def __post_init__(self):
        if not self.created_at:
            self.created_at = iso(datetime.now(timezone.utc))
        self.orders = {int(g): {s: [tuple(p) for p in pairs] for s, pairs in o.items()} for g, o in self.orders.items()}
        self.costs = {int(g): dict(c) for g, c in self.costs.items()}
        self.group_costs = {int(g): c for g, c in self.group_costs.items()}

    # ---- reading -----------------------------------------------------------
    @property
    def group_ids(self) -> list[int]:
        return sorted(self.orders)

    def order(self, stream: str, group: int = 0) -> list[Pair]:
        try:
            return self.orders[group][stream]
        except KeyError:
            raise PlanError(f"plan has no order for stream {stream!r} in group {group}") from None

    def probe_sequence(self, stream: str, group: int = 0) -> list[str]:
        """The streams ``r_1..r_{n-1}`` probed by ``stream``, in order."""
        return [r for _, r in self.order(stream, group)]

    def cost(self, stream: str, group: int = 0) -> float | None:
        return self.costs.get(group, {}).get(stream)

    @property
    def prefilter(self) -> bool:
        return bool(self.options.get("prefilter", False))

    def same_orders(self, other: "Plan") -> bool:
        return self.orders == other.orders and (self.partitioning or None) == (other.partitioning or None)

    def diff(self, other: "Plan | None") -> list[str]:
        """Human-readable changes from ``other`` (the plan before) to this plan."""
        if other is None:
            return ["(no previous plan)"]
        out = []
        if (self.partitioning or None) != (other.partitioning or None):
            out.append(f"partitioning {other.partitioning} -> {self.partitioning}")
        for g in sorted(set(self.orders) | set(other.orders)):
            for s in sorted(set(self.orders.get(g, {})) | set(other.orders.get(g, {}))):
                new = self.orders.get(g, {}).get(s)
                old = other.orders.get(g, {}).get(s)
                if new != old:
                    fmt = lambda o: "-" if o is None else ",".join(r for _, r in o)
                    out.append(f"group {g} {s}: {fmt(old)} -> {fmt(new)}")
        if self.options != other.options:
            out.append(f"options {other.options} -> {self.options}")
        return out

    def describe(self) -> str:
        lines = [f"plan {self.query} strategy={self.strategy}" + (f" v{self.version}" if self.version else "")
                 + (f" estimated_cost={self.estimated_cost:.6g}" if self.estimated_cost is not None else "")]
        for g in self.group_ids:
            for s, pairs in self.orders[g].items():
                c = self.cost(s, g)
                lines.append(f"  group {g} {s:<6} " + " ".join(f"[{l},{r}]" for l, r in pairs)
                             + ("" if c is None else f"   cost {c:.6g}"))
        return "\n".join(lines)

    # ---- JSON -----------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "query": self.query,
            "query_fingerprint": self.query_fingerprint,
            "strategy": self.strategy,
            "created_at": self.created_at,
            "version": self.version,
            "source": self.source,
            "cost_model": self.cost_model,
            "options": self.options,
            "estimated_cost": _finite_or_none(self.estimated_cost),
            "partitioning": self.partitioning,
            "groups": [
                {
                    "group": g,
                    "orders": {s: [list(p) for p in pairs] for s, pairs in self.orders[g].items()},
                    "costs": {s: _finite_or_none(c) for s, c in self.costs.get(g, {}).items()},
                    **({"estimated_cost": _finite_or_none(self.group_costs[g])} if g in self.group_costs else {}),
                }
                for g in self.group_ids
            ],
        }

    @classmethod
    def from_json(cls, doc: Mapping) -> "Plan":
        try:
            validate_document(doc, "plan")
        except SchemaError as exc:
            raise PlanError(str(exc)) from None
        groups = doc["groups"]
        ids = [g["group"] for g in groups]
        if len(set(ids)) != len(ids):
            raise PlanError(f"plan lists key group(s) {sorted({i for i in ids if ids.count(i) > 1})} twice")
        return cls(
            query=doc["query"], strategy=doc["strategy"], created_at=doc["created_at"],
            orders={g["group"]: g["orders"] for g in groups},
            costs={g["group"]: g.get("costs") or {} for g in groups},
            group_costs={g["group"]: g["estimated_cost"] for g in groups if g.get("estimated_cost") is not None},
            partitioning=doc.get("partitioning"), source=doc.get("source") or {}, cost_model=doc.get("cost_model") or {},
            options=doc.get("options") or {}, estimated_cost=doc.get("estimated_cost"),
            query_fingerprint=doc.get("query_fingerprint"), version=doc.get("version"),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def save(self, path) -> Path:
        atomic_write_text(path, self.dumps())
        return Path(path)

    # ---- checking ----------------------------------------------------------------
    def problems(self, query) -> list[str]:
        """Why this plan cannot run ``query`` (empty: it can)."""
        out = []
        if self.query != query.name:
            return [f"plan is for query {self.query!r}, not {query.name!r}"]
        out += rule_problems(self.partitioning, query)
        try:
            expected = list(range(num_groups(self.partitioning)))
        except (KeyError, ValueError, TypeError) as exc:
            return out + [f"partitioning unreadable: {exc}"]
        if self.group_ids != expected:
            out.append(f"plan has key groups {self.group_ids}, its partitioning defines {expected}")
        for g in self.group_ids:
            orders = self.orders[g]
            for s in query.stream_names:
                if s not in orders:
                    out.append(f"group {g}: no probe order for stream {s}")
            for s, pairs in orders.items():
                if s not in query.stream_names:
                    out.append(f"group {g}: unknown stream {s!r} (streams: {', '.join(query.stream_names)})")
                    continue
                why = query.expansion_error(s, pairs)
                if why:
                    out.append(f"group {g}: order of {s} is not a connected expansion: {why}")
        if self.prefilter and not query.single_class:
            out.append("options.prefilter (SMJ synopsis filter) needs a single attribute class; "
                       f"{query.name} has {len(query.attribute_classes)}")
        return out

    def validate(self, query) -> "Plan":
        problems = self.problems(query)
        if problems:
            raise PlanError(f"plan ({self.strategy}) is not valid for {query.name}: " + "; ".join(problems))
        return self


def load_plan(path, query=None) -> Plan:
    """Read a plan file; with ``query``, also check that it can run that query."""
    try:
        doc = json.loads(read_text(path))
    except FileNotFoundError:
        raise PlanError(f"{path}: no such plan file") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"{path}: not JSON ({exc})") from None
    plan = Plan.from_json(doc)
    return plan.validate(query) if query is not None else plan


def orders_from_permutation(query, permutation: Sequence[str]) -> dict:
    """The paper's fixed order: stream X probes the others in the order they appear in
    ``permutation``, skipping itself. Each pair's ``l`` is the earliest member of the
    partial result adjacent to ``r``; a stream not yet adjacent to the partial result
    (possible only in sparse graphs) is deferred until it is."""
    perm = stream_order_from(query, permutation)
    orders = {}
    for x in query.stream_names:
        joined, pending, pairs = [x], [s for s in perm if s != x], []
        while pending:
            for r in pending:
                left = next((m for m in joined if query.has_edge(m, r)), None)
                if left is not None:
                    pairs.append((left, r))
                    joined.append(r)
                    pending.remove(r)
                    break
            else:  # unreachable for a connected graph
                raise PlanError(f"{', '.join(pending)} cannot be reached from {x}")
        orders[x] = pairs
    return orders


def make_plan(query, orders: Mapping, strategy: str, *, costs: Mapping | None = None, partitioning=None,
              source=None, cost_model=None, options=None, estimated_cost=None, group_costs=None) -> Plan:
    """Build and validate a plan. ``orders`` is ``{stream: pairs}`` (one group) or ``{group: {stream: pairs}}``;
    ``group_costs`` is ``{group: expected cost per second}``."""
    if orders and all(isinstance(k, str) for k in orders):
        orders = {0: orders}
        costs = {0: costs} if costs else {}
    plan = Plan(query=query.name, strategy=strategy, orders=dict(orders), costs=dict(costs or {}),
                partitioning=partitioning, source=dict(source or {}), cost_model=dict(cost_model or {}),
                options=dict(options or {}), estimated_cost=estimated_cost, query_fingerprint=query.fingerprint,
                group_costs=dict(group_costs or {}))
    return plan.validate(query)


def _finite_or_none(v):
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None
