"""Airflow plugin: an "mjoin" page in the Airflow UI with every query's plan registry
(versions, lineage, the active pointer, recent re-optimization outcomes) and links
to the evaluation reports. Read-only; served by the api-server under /mjoin/.

Behind Airflow's login: every endpoint needs an authenticated Airflow user (a JWT from
``POST /auth/token`` as ``Authorization: Bearer``, or the UI's ``_token`` cookie, checked by
Airflow's own ``get_user``) whom the auth manager allows the custom view ``mjoin``
(``is_authorized_custom_view(method="GET", resource_name="mjoin")``, the access check for
plugin views). No user: 401 (a browser asking for HTML is sent to the login page); a user
without access: 403. A report's ``query`` must be a known query (a spec present or a query
the lake holds), its ``name`` a file inside that query's report folder (mjoin.loop.ui.report_target).

Links a user clicks (mjoin.loop.links): ``/mjoin/gx/<namespace>/<page>`` serves the Data Docs site of the
lake's GX context (the gates' stored validations), ``/mjoin/plans/<query>/<version>`` one plan version with
its lineage, ``/mjoin/task-docs/<dag>/<run>/<task>`` redirects a gate task (its "Data Docs" extra link,
plugins/mjoin_links.py) to the page of its validation in that run.
"""
from __future__ import annotations

import mimetypes

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import get_user
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
from mjoin.loop.ui import known_queries, registry_json, registry_page, report_target
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


@app.get("/", response_class=HTMLResponse)
def index():
    return registry_page()


@app.get("/api/plans")
def plans():
    return JSONResponse(registry_json())


@app.get("/reports/{query}/{name:path}")
def report(query: str, name: str):
    path = report_target(query, name)
    if path is None:
        raise HTTPException(status_code=404, detail=f"no report file {name!r} for {query!r}")
    if not fsutil.is_url(path):
        return FileResponse(path)
    media = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return Response(fsutil.read_bytes(path), media_type=media)  # a lake on HDFS / an object store


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
    return JSONResponse({"query": query, "version": version, "active": reg.active_version() == version,
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
