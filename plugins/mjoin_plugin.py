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
"""
from __future__ import annotations

import mimetypes

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import get_user
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from mjoin.runtime import fsutil
from mjoin.loop.ui import registry_json, registry_page, report_target

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


class MjoinPlugin(AirflowPlugin):
    name = "mjoin"
    fastapi_apps = [{"app": app, "url_prefix": "/mjoin", "name": "mjoin plans and reports"}]
    external_views = [{"name": "mjoin plans", "href": "mjoin/", "destination": "nav", "url_route": "mjoin"}]
