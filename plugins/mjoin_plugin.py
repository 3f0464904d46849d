"""Airflow plugin: an "mjoin" page in the Airflow UI with every query's plan registry
(versions, lineage, the active pointer, recent re-optimization outcomes) and links
to the evaluation reports. Read-only; served by the api-server under /mjoin/.

FastAPI plugin endpoints are not behind Airflow's login (Airflow 3.1+ plugin
model); they only expose plans and reports. Put the api-server behind your
usual proxy auth if that matters in your deployment.
"""
from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse

from mjoin.ui import registry_page, report_file, registry_json

app = FastAPI(title="mjoin", description="mjoin plan registry and reports")


@app.get("/", response_class=HTMLResponse)
def index():
    return registry_page()


@app.get("/api/plans")
def plans():
    return JSONResponse(registry_json())


@app.get("/reports/{query}/{name:path}")
def report(query: str, name: str):
    path = report_file(query, name)
    if path is None:
        raise HTTPException(status_code=404, detail=f"no report file {name!r} for {query!r}")
    return FileResponse(path)


class MjoinPlugin(AirflowPlugin):
    name = "mjoin"
    fastapi_apps = [{"app": app, "url_prefix": "/mjoin", "name": "mjoin plans and reports"}]
    external_views = [{"name": "mjoin plans", "href": "mjoin/", "destination": "nav", "url_route": "mjoin"}]
