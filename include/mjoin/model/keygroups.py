"""Key-to-group rules of PMJoin partitioning (docs/algorithms.md, "Key groups (PMJoin)").

A plan may split the key domain of one attribute class into ``D`` groups and
carry one order set per group. The rule is data, computable identically in
numpy (the engine, the optimizer's tools) and in Spark SQL (the statistics
job), so the two can never disagree on which group a key is in:

- ``{"method": "hash", "attr_class": "c0", "groups": D}``: ``g = key mod D``
  (non-negative modulo; identity hash, which spreads surrogate keys evenly);
- ``{"method": "range", "attr_class": "c0", "bounds": [b1, ..., b_{D-1}]}``:
  ``g`` = number of bounds ``<= key``;
- ``{"method": "table", "attr_class": "c0", "modulus": B, "assignment": [...]}``:
  ``g = assignment[key mod B]``; what rate-based clustering produces (keys are
  bucketed ``mod B`` and each bucket's rank vector is clustered).

No rule (``None``) means one group, 0.
"""
from __future__ import annotations

import numpy as np


def num_groups(rule: dict | None) -> int:
    if not rule:
        return 1
    method = rule["method"]
    if method == "hash":
        return int(rule["groups"])
    if method == "range":
        return len(rule["bounds"]) + 1
    if method == "table":
        return int(rule.get("groups") or (max(rule["assignment"]) + 1))
    raise ValueError(f"unknown partitioning method {method!r} (hash, range, table)")


def group_of(keys, rule: dict | None) -> np.ndarray:
    """Group id of every key (int64 array); the one definition the engine uses."""
    keys = np.asarray(keys, dtype=np.int64)
    if not rule:
        return np.zeros(keys.shape, dtype=np.int64)
    method = rule["method"]
    if method == "hash":
        return np.mod(keys, int(rule["groups"]))
    if method == "range":
        return np.searchsorted(np.asarray(rule["bounds"], dtype=np.int64), keys, side="right").astype(np.int64)
    if method == "table":
        table = np.asarray(rule["assignment"], dtype=np.int64)
        return table[np.mod(keys, int(rule["modulus"]))]
    raise ValueError(f"unknown partitioning method {method!r} (hash, range, table)")


def sql_group_expr(column: str, rule: dict | None) -> str:
    """The same rule as a Spark SQL expression over ``column`` (a bigint); NULL keys give NULL."""
    if not rule:
        return "CAST(0 AS BIGINT)"
    method = rule["method"]
    if method == "hash":
        return f"pmod({column}, {int(rule['groups'])})"
    if method == "range":
        bounds = [int(b) for b in rule["bounds"]]
        if not bounds:
            return "CAST(0 AS BIGINT)"
        # NULL keys belong to no group (NULL), as with pmod / element_at for the other rules
        return (f"(CASE WHEN {column} IS NULL THEN NULL ELSE "
                + " + ".join(f"CASE WHEN {column} >= {b} THEN 1 ELSE 0 END" for b in bounds) + " END)")
    if method == "table":
        arr = ", ".join(str(int(a)) for a in rule["assignment"])
        return (f"CASE WHEN {column} IS NULL THEN NULL ELSE "
                f"CAST(element_at(array({arr}), CAST(pmod({column}, {int(rule['modulus'])}) AS INT) + 1) AS BIGINT) END")
    raise ValueError(f"unknown partitioning method {method!r} (hash, range, table)")


def rule_problems(rule: dict | None, query) -> list[str]:
    """Why ``rule`` cannot partition ``query`` (empty: it can)."""
    if not rule:
        return []
    out = []
    method = rule.get("method")
    cls = rule.get("attr_class")
    if cls not in query.attribute_classes:
        out.append(f"partitioning attr_class {cls!r} is not a class of {query.name} ({', '.join(query.attribute_classes)})")
    else:
        outside = [s for s in query.stream_names if query.key_column(s, cls) is None]
        if outside:
            out.append(f"partitioning on {cls} needs every stream in that class; {', '.join(outside)} are not")
    if method == "hash":
        if int(rule.get("groups", 0)) < 1:
            out.append("hash partitioning needs groups >= 1")
    elif method == "range":
        bounds = rule.get("bounds")
        if not isinstance(bounds, list) or any(b >= c for b, c in zip(bounds, bounds[1:])):
            out.append("range partitioning needs strictly increasing bounds")
    elif method == "table":
        if int(rule.get("modulus", 0)) < 1 or len(rule.get("assignment", [])) != int(rule.get("modulus", 0)):
            out.append("table partitioning needs modulus >= 1 and one assignment per bucket")
        elif min(rule["assignment"]) < 0:
            out.append("table partitioning assignments must be >= 0")
    else:
        out.append(f"unknown partitioning method {method!r} (hash, range, table)")
    return out
