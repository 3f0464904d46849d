"""Airflow plugin: an "mjoin" page in the Airflow UI with every query's plan registry
(versions, lineage, the active pointer, recent re-optimization outcomes with their reasons, what the
join job quarantined, backfill runs) and links to the evaluation reports and the runs' full errors.
Read-only; served by the api-server under /mjoin/ (mjoin.loop.ui renders it).

Behind Airflow's login: every endpoint needs an authenticated Airflow user (a JWT from
``POST /auth/token`` as ``Authorization: Bearer``, or the UI's ``_token`` cookie, checked by
Airflow's own ``get_user``) whom the auth manager allows the custom view ``mjoin``
(``is_authorized_custom_view(method="GET", resource_name="mjoin")``, the access check for
plugin views). No user: 401 (a browser asking for HTML is sent to the login page); a user
without access: 403. A file's ``lake`` must be one the page lists (the live lake ``MJOIN_LAKE``, or one
registered with Airflow's home, like the demo's), its namespace one that lake has, its ``query`` a known
query, its ``name`` a file inside that query's report folder (mjoin.loop.ui.report_target).

Links a user clicks (mjoin.loop.links): ``/mjoin/gx/<namespace>/<page>`` serves the Data Docs site of the
lake's GX context (the gates' stored validations), ``/mjoin/plans/<query>/<version>`` one plan version with
its lineage, ``/mjoin/task-docs/<dag>/<run>/<task>`` redirects a gate task (its "Data Docs" extra link,
plugins/mjoin_links.py) to the page of its validation in that run.
"""
from __future__ import annotations

import mimetypes

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import get_user
from airflow.configuration import AIRFLOW_HOME
from airflow.models.xcom import XComModel
from airflow.plugins_manager import AirflowPlugin
from airflow.utils.session import create_session
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry, RegistryError
from mjoin.loop import links
from mjoin.loop.airflow_env import registered_lakes
from mjoin.loop.ui import LIVE, known_queries, lakes, namespace_of, registry_json, registry_page, report_target
from mjoin.runtime import fsutil

RESOURCE = "mjoin"


def require_mjoin_access(user=Depends(get_user)):
    """An authenticated user (401 otherwise, from get_user) whom the auth manager lets see the mjoin view."""
    if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name=RESOURCE, user=user):
        raise HTTPException(status_code=403, detail=f"user {user.get_name()!r} may not access the mjoin view")
    return user


app = FastAPI(title="mjoin", description="mjoin plan registry and reports (Airflow login required)",
              dependencies=[Depends(require_mjoin_access)])


@app.exception_handler(StarletteHTTPException)
async def _login_redirect(request: Request, exc: StarletteHTTPException):
    """A browser without a session is sent to Airflow's login page (and back here after it)."""
    if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(get_auth_manager().get_url_login(next_url=str(request.url)), status_code=303)
    return await http_exception_handler(request, exc)


def _where(lake: str, ns: str):
    """``(lake name, Lake, namespace, every lake)`` of a page or file request; 404 for a lake or namespace the
    page does not list."""
    every = lakes(registered_lakes(AIRFLOW_HOME))
    if lake not in every:
        raise HTTPException(status_code=404, detail=f"no lake {lake!r}; known: {', '.join(every)}")
    namespace = namespace_of(ns, every[lake])
    if namespace is None:
        raise HTTPException(status_code=404, detail=f"no namespace {ns!r} in the {lake} lake")
    return lake, every[lake], namespace, every


def _serve(path: str | None, name: str, query: str):
    if path is None:
        raise HTTPException(status_code=404, detail=f"no report file {name!r} for {query!r}")
    media = mimetypes.guess_type(name)[0] or ("text/plain" if name.endswith(".log") else "application/octet-stream")
    if not fsutil.is_url(path):
        return FileResponse(path, media_type=media)
    return Response(fsutil.read_bytes(path), media_type=media)  # a lake on HDFS / an object store


@app.get("/", response_class=HTMLResponse)
def index(lake: str = LIVE, ns: str = LIVE):
    name, root, namespace, every = _where(lake, ns)
    return registry_page(root, namespace, name, every)


@app.get("/api/plans")
def plans(lake: str = LIVE, ns: str = LIVE):
    _, root, namespace, _ = _where(lake, ns)
    return JSONResponse(registry_json(root, namespace))


@app.get("/reports/{query}/{name:path}")
def report(query: str, name: str):
    """A file of the live lake's live namespace (the page's links before it listed other lakes)."""
    return _serve(report_target(query, name), name, query)


@app.get("/files/{lake}/{ns}/{query}/{name:path}")
def files(lake: str, ns: str, query: str, name: str):
    """A file of a query's report folder (an evaluation report, a run's full error) in a lake and namespace."""
    _, root, namespace, _ = _where(lake, ns)
    return _serve(report_target(query, name, root, namespace), name, query)


@app.get("/gx/{namespace}/{page:path}")
def data_docs(namespace: str, page: str):
    """A page of the Data Docs site of the lake's GX context (``live``, or a namespace with ``~`` for ``/``)."""
    path = links.data_docs_target(namespace, page or "index.html")
    if path is None:
        raise HTTPException(status_code=404, detail=f"no Data Docs page {page!r} in {namespace!r}")
    return FileResponse(path)


@app.get("/plans/{query}/{version}")
def plan_version(query: str, version: int):
    """One version of a query's plan registry: the plan JSON and its lineage."""
    if query not in known_queries():
        raise HTTPException(status_code=404, detail=f"no query {query!r}")
    reg = PlanRegistry(Lake.default(), query)
    try:
        plan = reg.get(version)
    except RegistryError as exc:
        raise HTTPException(status_code=404, detail=str(exc))
    return JSONResponse({"query": query, "version": version, "active": reg.active_version_or_none()[0] == version,
                         "plan": plan.to_json(), "lineage": reg.lineage(version)})


@app.get("/task-docs/{dag_id}/{run_id}/{task_id}")
def task_docs(dag_id: str, run_id: str, task_id: str):
    """The extra link of a gate task: the Data Docs page of its validation in that run (in the run folder
    ``prepare`` pushed to XCom), else 404 saying why."""
    gate = links.GATE_TASKS.get(task_id)
    if gate is None:
        raise HTTPException(status_code=404, detail=f"{task_id} is not a gate task")
    pushed = {}
    with create_session() as session:
        for key in ("run_dir", "namespace"):
            row = session.scalars(XComModel.get_many(run_id=run_id, key=key, task_ids="prepare", dag_ids=dag_id)).first()
            pushed[key] = XComModel.deserialize_value(row) if row is not None else None
    page = links.task_page(pushed["run_dir"], gate) if pushed["run_dir"] else None
    if page is None:
        raise HTTPException(status_code=404, detail=f"no Data Docs for {task_id} of {run_id}: the gate did not run "
                                                    "or stored no results (gates param results_store off)")
    return RedirectResponse(links.data_docs_url(pushed["namespace"] or "", page, base=""), status_code=307)


class MjoinPlugin(AirflowPlugin):
    name = "mjoin"
    fastapi_apps = [{"app": app, "url_prefix": "/mjoin", "name": "mjoin plans and reports"}]
    external_views = [{"name": "mjoin plans", "href": "mjoin/", "destination": "nav", "url_route": "mjoin"}]
