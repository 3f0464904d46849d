"""The loop's data as Airflow Assets: what a run produced, with the metadata of its events (no Airflow import:
the DAG makes ``Asset`` / ``AssetAlias`` objects of these names and adds the events, dags/mjoin_reoptimize.py).

Four assets per query, each an ``AssetAlias`` on the DAG (``mjoin.<kind>``) that a run resolves to the asset of its
query (``mjoin.<kind>.<query>``, URI ``x-mjoin://<query>/<kind>``), so the asset graph shows one lineage per query:

- ``statistics``: the statistics history, when the run's statistics passed their gate;
- ``forecast``: the forecast the run made, when it passed its gate;
- ``active_plan``: the plan registry's active plan, when the run deployed a new version;
- ``results``: the join results, when the run's join (cycle mode) succeeded.

Every event carries the run (id, type, interval), the gate outcomes, the plan version active after the run,
the strategy and the predicted gain (the plan gate's estimated improvement), and links (mjoin.loop.links).
Runs in an evaluation namespace (backfills) emit no events: their assets are not the live deployment's.
A drift event (mjoin.loop.drift) lands on ``mjoin.drift.<query>``; mjoin_reoptimize is scheduled on it.
"""
from __future__ import annotations

import os

KINDS = ("statistics", "forecast", "active_plan", "results")
#: the AssetAlias each kind is declared as on mjoin_reoptimize's record task
ALIASES = {k: f"mjoin.{k}" for k in KINDS}
GROUP = "mjoin"


def asset_name(kind: str, query: str) -> str:
    return f"mjoin.{kind}.{query}"


def asset_uri(kind: str, query: str) -> str:
    return f"x-mjoin://{query}/{kind}"


def drift_asset(query: str) -> dict:
    """The asset a drift event lands on (watched by mjoin.loop.drift's trigger)."""
    return {"name": asset_name("drift", query), "uri": asset_uri("drift", query), "group": GROUP}


def produced(outcome: dict) -> list[str]:
    """The kinds a run produced, from its outcome (``outcome.json``): see the module docstring."""
    tasks = outcome.get("tasks") or {}
    gates = outcome.get("gates") or {}
    kinds = []
    if gates.get("stats") == "passed":
        kinds.append("statistics")
    if gates.get("forecast") == "passed":
        kinds.append("forecast")
    if outcome.get("deployed"):
        kinds.append("active_plan")
    if tasks.get("join") == "success":
        kinds.append("results")
    return kinds


def events(outcome: dict) -> list[dict]:
    """``[{"alias", "name", "uri", "group", "extra"}]``: the asset events of a run (none for a namespace's run)."""
    if outcome.get("namespace"):
        return []
    query = outcome["query"]
    extra = {"run_id": outcome.get("run_id"), "run_type": outcome.get("run_type"),
             "interval": [outcome.get("interval_start"), outcome.get("interval_end")],
             "status": outcome.get("status"), "plan_version": outcome.get("active_version"),
             "deployed_version": outcome.get("version"), "strategy": outcome.get("strategy"),
             "predicted_gain": outcome.get("estimated_gain"), "gates": outcome.get("gates") or {},
             "links": outcome.get("links") or {}}
    return [{"alias": ALIASES[k], "name": asset_name(k, query), "uri": asset_uri(k, query), "group": GROUP,
             "extra": {"kind": k, **extra}} for k in produced(outcome)]


def drift_watch_settings(env=None) -> dict | None:
    """The drift watcher's settings from the environment (read when the DAG is parsed): None when
    ``MJOIN_DRIFT=off`` (the schedule alone runs the loop), else ``poll`` and ``debounce`` seconds
    (``MJOIN_DRIFT_POLL``, default 30; ``MJOIN_DRIFT_DEBOUNCE``, default 300: at most one drift-triggered run
    per 5 minutes) and ``k`` (``MJOIN_DRIFT_K``, spreads, default 4)."""
    env = os.environ if env is None else env
    if env.get("MJOIN_DRIFT", "on").strip().lower() in ("off", "false", "0", "no"):
        return None
    return {"poll": float(env.get("MJOIN_DRIFT_POLL", 30)), "debounce": float(env.get("MJOIN_DRIFT_DEBOUNCE", 300)),
            "k": float(env.get("MJOIN_DRIFT_K", 4))}
