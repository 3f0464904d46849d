"""Trigger-time checks of a run's conf against its DAG's params (no Airflow import).

Airflow validates each declared param's value when a run is triggered (a ``query`` that is not one
of the specs present is a 400 from the API and the trigger form), but it accepts any other key in
``conf`` silently: a typo like ``qurey`` or ``dryrun`` would run with the defaults. The api-server
middleware of ``plugins/mjoin_trigger_checks.py`` calls :func:`unknown_params` for the mjoin DAGs'
triggers and backfills and answers 400 with its message; the DAG's ``prepare`` checks again for runs
made without the API (``airflow dags test``, ``airflow dags trigger``, ``airflow backfill create``).
"""
from __future__ import annotations

import json
import re

#: POST paths whose body carries a run conf: (pattern, where the DAG id is, the conf key)
TRIGGER_PATHS = (
    (re.compile(r"^/api/v2/dags/(?P<dag_id>[^/]+)/dagRuns/?$"), "path", "conf"),
    (re.compile(r"^/api/v2/backfills(/dry_run)?/?$"), "body", "dag_run_conf"),
)


def trigger_target(path: str, body: bytes) -> tuple[str, dict] | None:
    """``(dag_id, conf)`` of a trigger or backfill request, or None for any other request (or no JSON body)."""
    for pattern, where, key in TRIGGER_PATHS:
        m = pattern.match(path)
        if not m:
            continue
        try:
            doc = json.loads(body or b"{}")
        except ValueError:
            return None  # not ours to judge: the API answers malformed JSON itself
        if not isinstance(doc, dict):
            return None
        dag_id = m.group("dag_id") if where == "path" else doc.get("dag_id")
        conf = doc.get(key)
        if not isinstance(dag_id, str) or not isinstance(conf, dict):
            return None
        return dag_id, conf
    return None


def unknown_params(dag_id: str, conf: dict, known) -> str | None:
    """The 400 message for conf keys the DAG does not declare, or None."""
    unknown = sorted(set(conf) - set(known))
    if not unknown:
        return None
    return (f"unknown param(s) {', '.join(unknown)} for {dag_id}; its params are: {', '.join(sorted(known))} "
            "(docs/orchestration.md)")
