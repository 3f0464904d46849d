"""Defaults and limits of the DAG params (the trigger form), importable at DAG-parse time.

Light on purpose: no numpy, pandas, Spark or statsmodels here, so the scheduler's
parsing of ``dags/`` stays cheap (tests check what parsing imports). The strategy
names must equal ``mjoin.optimize.STRATEGIES`` (a test checks it).
"""
from __future__ import annotations

import os

#: the re-optimization period = the DAG schedule (minutes); one run covers [logical_date - PERIOD, logical_date)
PERIOD_MINUTES = int(os.environ.get("MJOIN_PERIOD_MINUTES", "5"))
STRATEGY_NAMES = ("fixed", "selectivity_first", "greedy", "dppick", "exact", "dppick_query", "dppick_match")
DEFAULT_QUERY = os.environ.get("MJOIN_QUERY", "tpcds_returns_by_address")

#: name -> (default, JSON-schema type, extra schema, description)
REOPTIMIZE_PARAMS = {
    "query": (DEFAULT_QUERY, "string", {"minLength": 1}, "query spec: a name from include/queries/ or a YAML path"),
    "strategy": ("exact", "string", {"enum": list(STRATEGY_NAMES)}, "probe-order optimizer"),
    "length": (60, "integer", {"minimum": 2, "maximum": 10000}, "L: statistics cycles the forecast reads"),
    "cycle": (10, "integer", {"minimum": 1, "maximum": 3600}, "tau: statistics cycle in seconds"),
    "improvement_threshold": (0.05, "number", {"minimum": 0, "maximum": 1},
                              "deploy only if the estimated cost drops by at least this fraction"),
    "dry_run": (False, "boolean", {}, "optimize and gate, do not deploy"),
    "mode": ("cycle", "string", {"enum": ["cycle", "continuous"]},
             "cycle: join each interval in this run (availableNow); continuous: a running join job hot-reloads"),
    "workload": ("", "string", {}, "cycle mode: land each interval from this generated workload folder (demo)"),
    "lake": ("", "string", {}, "lake root (empty: MJOIN_LAKE or the project's .lake)"),
    "namespace": ("", "string", {}, "lake namespace (empty: live; backfills default to eval/backfill)"),
    "initial_order": ("", "string", {}, "comma-separated stream order for the fixed strategy / the first plan"),
}
