"""Airflow plugin: the api-server refuses a trigger or backfill of an mjoin DAG (tag ``mjoin``) whose
conf names a param the DAG does not declare: 400 with the unknown and the known names
(``mjoin.loop.trigger_checks``). Airflow itself validates the declared params' values (e.g. ``query`` must
be one of the specs present) but passes unknown keys through silently.

A root ASGI middleware: it reads the POST body of ``/api/v2/dags/<dag_id>/dagRuns`` and
``/api/v2/backfills[/dry_run]`` (the trigger form of the UI uses the same endpoints), looks the
DAG's params up in the serialized DAG, and either answers 400 or replays the body to Airflow.
"""
from __future__ import annotations

import json

import anyio
from airflow.plugins_manager import AirflowPlugin

from mjoin.loop.trigger_checks import trigger_target, unknown_params


def _declared_params(dag_id: str):
    """The params of a DAG tagged mjoin (None: another DAG, or not found: leave it to Airflow)."""
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        dag = SerializedDagModel.get_dag(dag_id, session=session)
    if dag is None or "mjoin" not in set(dag.tags or ()):
        return None
    return list(dag.params.keys())


class TriggerParamsCheck:
    """Refuse unknown conf keys of mjoin DAG runs before Airflow creates the run."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        headers = dict(scope.get("headers") or ())
        if scope.get("type") != "http" or scope.get("method") != "POST" or not (
                scope.get("path", "").startswith(("/api/v2/dags/", "/api/v2/backfills"))) or not (
                b"authorization" in headers or b"cookie" in headers):  # no credentials: Airflow answers 401
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            msg = await receive()
            messages.append(msg)
            body += msg.get("body", b"")
            if msg.get("type") != "http.request" or not msg.get("more_body"):
                break
        target = trigger_target(scope["path"], body)
        problem = None
        if target is not None:
            known = await anyio.to_thread.run_sync(_declared_params, target[0])
            if known is not None:
                problem = unknown_params(target[0], target[1], known)
        if problem:
            payload = json.dumps({"detail": problem}).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


class MjoinTriggerChecksPlugin(AirflowPlugin):
    name = "mjoin_trigger_checks"
    fastapi_root_middlewares = [{"middleware": TriggerParamsCheck, "name": "mjoin: refuse unknown run params"}]
