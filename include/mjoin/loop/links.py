"""Links a user can click: the Data Docs page of a gate's validation, a plan version, the evaluation report.

Every link points into the mjoin plugin of the Airflow api-server (plugins/mjoin_plugin.py, behind Airflow's
login), so it works from the task log, the plugin page, a run's ``outcome.json`` and the task's extra link
alike: ``<base>/mjoin/gx/<namespace>/<page>`` (a page of the namespace's Data Docs site; ``live`` is the live
lake, ``eval~backfill`` the namespace ``eval/backfill``), ``<base>/mjoin/plans/<query>/<version>`` (the plan
JSON), ``<base>/mjoin/reports/<query>/<file>`` (an evaluation report). ``<base>`` is Airflow's
``[api] base_url`` (``AIRFLOW__API__BASE_URL``), else ``http://localhost:<AIRFLOW__API__PORT or 8080>``.
No Airflow import here: the plugin and the DAG wire these functions.
"""
from __future__ import annotations

import html
import json
import os
import urllib.parse

from mjoin.lake.layout import Lake
from mjoin.runtime import fsutil

GATES = ("input", "stats", "forecast", "plan")
#: the DAG's gate tasks and the gate each runs (the extra link "Data Docs" of these tasks)
GATE_TASKS = {"check_input": "input", "check_statistics": "stats", "check_forecast": "forecast",
              "check_plan": "plan"}
LIVE = "live"
#: Data Docs pages sit this deep under the site (validations/<suite parts>/<run>/<time>/<batch>.html)
SITE = ("uncommitted", "data_docs", "local_site")


def base_url() -> str:
    base = os.environ.get("AIRFLOW__API__BASE_URL", "").strip()
    if base:
        return base.rstrip("/")
    return f"http://localhost:{os.environ.get('AIRFLOW__API__PORT', '8080')}"


def namespace_token(namespace: str) -> str:
    return (namespace or "").strip("/").replace("/", "~") or LIVE


def namespace_of(token: str) -> str:
    return "" if token == LIVE else token.replace("~", "/")


def _quote(path: str) -> str:
    return urllib.parse.quote(path, safe="/")


def data_docs_url(namespace: str, page: str = "index.html", base: str | None = None) -> str:
    return f"{base if base is not None else base_url()}/mjoin/gx/{namespace_token(namespace)}/{_quote(page)}"


def plan_url(query: str, version, base: str | None = None) -> str:
    return f"{base if base is not None else base_url()}/mjoin/plans/{_quote(query)}/{int(version)}"


def report_url(query: str, name: str, base: str | None = None, namespace: str = "") -> str:
    """A file of ``query``'s report folder: the live namespace's through ``/mjoin/reports``, another namespace's
    (``eval/evaluate``: mjoin_evaluate's reports) through ``/mjoin/files/live/<namespace>``."""
    base = base if base is not None else base_url()
    if namespace:
        return f"{base}/mjoin/files/{LIVE}/{namespace_token(namespace)}/{_quote(query)}/{_quote(name)}"
    return f"{base}/mjoin/reports/{_quote(query)}/{_quote(name)}"


def task_docs_url(dag_id: str, run_id: str, task_id: str, base: str | None = None) -> str:
    """The plugin's redirect from a gate task to the Data Docs page of its validation (the task's extra link)."""
    q = urllib.parse.quote
    return f"{base if base is not None else base_url()}/mjoin/task-docs/{q(dag_id, safe='')}/{q(run_id, safe='')}/" \
           f"{q(task_id, safe='')}"


def gate_pages(gate_doc: dict) -> dict:
    """``{suite: page}`` of a gate result (``gate_<name>.json``): the failing suites' pages first, then the rest."""
    docs = (gate_doc.get("details") or {}).get("data_docs") or {}
    pages = docs.get("pages") or {}
    results = gate_doc.get("gx_result") or {}
    failing = [s for s in pages if not (results.get(s) or {}).get("success", True)]
    return {s: pages[s] for s in failing + [s for s in pages if s not in failing]}


def gate_page(gate_doc: dict) -> str | None:
    """The page to open for a gate result: its first failing suite's, else its first suite's, else None."""
    pages = gate_pages(gate_doc)
    return next(iter(pages.values()), None)


def task_page(run_dir: str, gate: str) -> str | None:
    """The Data Docs page of ``gate``'s validation in a run folder (its ``gate_<gate>.json``), or None."""
    path = fsutil.join(run_dir, f"gate_{gate}.json")
    try:
        return gate_page(json.loads(fsutil.read_text(path))) if fsutil.exists(path) else None
    except (OSError, ValueError):
        return None


def newest_report(lake: Lake, query: str) -> tuple[str, str] | None:
    """The newest evaluation report of ``query`` in the lake, whichever namespace holds it (mjoin_evaluate writes
    to ``eval/evaluate``, the demo to its own): ``(namespace, name)``, ``name`` relative to that namespace's
    ``reports/<query>/`` (``evaluation/index.html``, or a ``*.html`` there), or None. Newest by modification
    time (on a lake on a URL, mjoin_evaluate's first)."""
    spaces = [""] + [f"eval/{n}" for n in sorted(fsutil.listdir(fsutil.join(lake.root, "eval"))) if not n.startswith(".")]
    found = []
    for ns in spaces:
        folder = Lake(lake.root, ns).reports(query)
        names = [n for n in fsutil.listdir(folder) if n.endswith(".html") and not n.startswith(".")]
        if fsutil.exists(fsutil.join(folder, "evaluation", "index.html")):
            names.append("evaluation/index.html")
        for name in names:
            path = fsutil.join(folder, name)
            when = float(ns == "eval/evaluate") if fsutil.is_url(path) else os.path.getmtime(path)
            found.append((when, ns, name))
    return max(found)[1:] if found else None


def run_links(lake: Lake, query: str, gate_docs: dict, version, base: str | None = None) -> dict:
    """The links of one run's outcome: each gate's Data Docs page, the plan version it deployed or left
    active, the newest evaluation report; ``warnings``: per gate, the expectations of severity ``warning`` that
    failed (the gate passed: its page is the one to open)."""
    out = {"data_docs": {}, "plan": None, "report": None, "warnings": {}}
    for gate, doc in gate_docs.items():
        page = gate_page(doc or {})
        if page:
            out["data_docs"][gate] = data_docs_url(lake.namespace, page, base)
        if (doc or {}).get("warning_expectations"):
            out["warnings"][gate] = list(doc["warning_expectations"])
    if version is not None:
        out["plan"] = plan_url(query, version, base)
    report = newest_report(lake, query)
    if report:
        out["report"] = report_url(query, report[1], base, namespace=report[0])
    return out


def from_plugin_page(url: str) -> str:
    """``url`` relative to the plugin page (``<base>/mjoin/``), so the page's links work whatever host, port or
    path prefix serves it (a run records absolute links with the base it ran under)."""
    _, sep, rest = url.partition("/mjoin/")
    return rest if sep else url


def links_html(outcomes: list[dict]) -> str:
    """The plugin page's link column: one row per run (newest first), its Data Docs, plan and report links."""
    rows = []
    for o in outcomes:
        links = o.get("links") or {}
        warned = links.get("warnings") or {}
        cells = []
        for gate, url in (links.get("data_docs") or {}).items():
            names = warned.get(gate)  # a gate that passed with warnings: say so beside its page
            title = f' title="{html.escape(", ".join(names))}"' if names else ""
            label = f"{gate} ({_warnings(names)})" if names else gate
            cells.append(f'<a href="{html.escape(from_plugin_page(url))}"{title}>{html.escape(label)}</a>')
        if links.get("plan"):
            version = o.get("active_version") if o.get("version") is None else o.get("version")
            cells.append(f'<a href="{html.escape(from_plugin_page(links["plan"]))}">plan v{html.escape(str(version))}</a>')
        if links.get("report"):
            cells.append(f'<a href="{html.escape(from_plugin_page(links["report"]))}">evaluation report</a>')
        if cells:
            rows.append(f"<tr><td>{html.escape(str(o.get('interval_end') or ''))}</td>"
                        f"<td>{html.escape(str(o.get('status') or ''))}</td><td>{' '.join(cells)}</td></tr>")
    if not rows:
        return ""
    return ("<h3>links of recent runs</h3><table class='mjoin-links'><thead><tr><th>interval_end</th><th>status</th>"
            "<th>Data Docs, plan, report</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _warnings(names: list) -> str:
    return f"{len(names)} warning" + ("s" if len(names) > 1 else "")


def data_docs_target(token: str, page: str, lake: Lake | None = None) -> str | None:
    """The local file of a Data Docs page of the namespace ``token``, or None: a bad token or name, a file
    outside the site (``..``, a symlink out of it), no such file, a lake on a URL."""
    lake = lake or Lake.default()
    if not token or any(c in token for c in "/\\") or token.startswith("."):
        return None
    parts = (page or "index.html").split("/")
    if any(p in ("", ".", "..") or p.startswith(".") or "\\" in p for p in parts):
        return None
    if fsutil.is_url(lake.root):
        return None
    site = os.path.realpath(os.path.join(Lake(lake.root, namespace_of(token)).gx(), *SITE))
    path = os.path.realpath(os.path.join(site, *parts))
    if not path.startswith(site + os.sep) or not os.path.isfile(path):
        return None
    return path
