"""HTML and JSON views of the lakes' plan registries and reports (for the Airflow plugin, menu "mjoin plans").

Pure rendering over files (no Airflow import). A page shows one lake (the live one, ``MJOIN_LAKE``, or another
registered with Airflow's home, such as the demo's) and one namespace of it (the live deployment, or an
evaluation namespace such as ``eval/backfill``); per query, in this order:

- the recent re-optimizations (``<ns>/reports/<query>/runs/<interval end>/outcome.json``, one per run, written
  by the DAG's record step): status, a one-line reason with links to the whole error
  (``failed_<task>.log`` in the run folder) and to the task's log in Airflow, mode, version, estimated gain,
  and what the run covered: the cycles it caught up on, or a ``gap`` no run covered;
- what the join job quarantined: totals per stream and reason over the last hour of its batches;
- the backfill runs (namespace ``eval/backfill``) and every evaluation report of the lake, linked;
- the plan versions.

Files are served only from a query's report folder (:func:`report_target`), in a lake and namespace the page
lists (:func:`lakes`, :func:`namespaces`).
"""
from __future__ import annotations

import html
import json
import os
import re
import urllib.parse
from datetime import timedelta

from mjoin.engine.metrics import read_metrics
from mjoin.evaluation.report import html_table
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.loop.config import BACKFILL_NAMESPACE
from mjoin.loop.links import links_html
from mjoin.loop.params import query_choices
from mjoin.model.timeutil import iso, parse_time
from mjoin.runtime import fsutil

OUTCOME = "outcome.json"
LIVE = "live"  # the name of the live lake, and the URL token of the live namespace
#: the quarantine summary's window: the join job's batches that started within this much of its newest one
QUARANTINE_WINDOW = timedelta(hours=1)
#: what a query name may look like in a URL (spec names, folder names under the lake's plans/ and reports/)
QUERY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
#: a namespace folder name (one part of ``eval/<name>``)
NS_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
STATUS_COLOURS = {"deployed": "#2a7d2e", "no_change": "#555", "dry_run": "#555", "skipped": "#8a6d00",
                  "failed": "#b3261e", "rolled_back": "#b3261e"}


def _lake(lake: Lake | None) -> Lake:
    return lake or Lake.default()


# ---- lakes and namespaces -----------------------------------------------------------------------------

def lakes(registered: dict | None = None) -> dict:
    """``{name: Lake}``: the live lake (``MJOIN_LAKE``) as ``live``, then the lakes registered with Airflow's home
    (:func:`mjoin.loop.airflow_env.registered_lakes`: the demo's) that exist."""
    out = {LIVE: Lake.default()}
    for name, root in (registered or {}).items():
        if name != LIVE and NS_PART.match(name) and fsutil.exists(root):
            out[name] = Lake(root)
    return out


def namespaces(lake: Lake) -> list[str]:
    """The lake's namespaces with reports or plans: ``""`` (live), then ``eval/<name>`` (backfills, evaluations)."""
    out = [""]
    for name in sorted(fsutil.listdir(fsutil.join(lake.root, "eval"))):
        ns = f"eval/{name}"
        if NS_PART.match(name) and any(fsutil.exists(fsutil.join(lake.root, ns, d)) for d in ("reports", "plans")):
            out.append(ns)
    return out


def space(namespace: str) -> str:
    """A namespace as one URL path segment: ``live`` for the live one, ``eval~backfill`` for ``eval/backfill``."""
    return namespace.replace("/", "~") if namespace else LIVE


def namespace_of(token: str, lake: Lake) -> str | None:
    """The namespace a :func:`space` token names, if the lake has it (None otherwise)."""
    ns = "" if token == LIVE else (token or "").replace("~", "/")
    return ns if ns in namespaces(lake) else None


# ---- what the lake holds ------------------------------------------------------------------------------

def queries_with_plans(lake: Lake | None = None) -> list[str]:
    lake = _lake(lake)
    names = set()
    for folder in (lake.plans, lake.reports, lake.metrics):  # metrics: a join job running, no plan yet
        names |= set(fsutil.listdir(folder("_").rsplit("/", 1)[0]))  # the namespace's plans/, reports/, metrics/
    return sorted(n for n in names if not n.startswith(".") and QUERY_NAME.match(n))


def read_outcomes(lake: Lake, query: str, limit: int | None = None) -> list[dict]:
    """The re-optimization outcomes, oldest interval first (the last ``limit`` ones).

    One file per run (``runs/<YYYYmmddTHHMMSSZ>/outcome.json``, written atomically), so two
    runs recording at once never lose each other's outcome; folder names sort by time."""
    root = fsutil.join(lake.reports(query), "runs")
    stamps = sorted(n for n in fsutil.listdir(root) if not n.startswith("."))
    rows = []
    for stamp in reversed(stamps):
        if limit and len(rows) >= limit:
            break
        path = fsutil.join(root, stamp, OUTCOME)
        if fsutil.exists(path):
            rows.append({"run_folder": stamp, **json.loads(fsutil.read_text(path))})
    return sorted(rows, key=lambda r: (r.get("interval_end") or "", r.get("recorded_at") or ""))


def quarantine_summary(lake: Lake, query: str, window: timedelta = QUARANTINE_WINDOW) -> dict:
    """What the join job quarantined in its batches of the last ``window`` (up to its newest batch): rows per
    stream and reason (``rows``), files rejected whole, the batches counted and the window's start."""
    try:
        records = read_metrics(lake, query)
    except (OSError, ValueError):
        records = []
    if not records:
        return {"batches": 0, "rows": [], "total": 0, "files": 0, "since": None, "until": None}
    times = [parse_time(r["started_at"]) for r in records if r.get("started_at")]
    newest = max(times) if times else None
    since = newest - window if newest else None
    recent = [r for r in records if since is None or not r.get("started_at") or parse_time(r["started_at"]) > since]
    acc: dict = {}
    for r in recent:
        for stream, reasons in (r.get("quarantined") or {}).items():
            for reason, n in (reasons or {}).items():
                if n:
                    a = acc.setdefault((stream, reason), {"stream": stream, "reason": reason, "rows": 0, "batches": 0})
                    a["rows"] += int(n)
                    a["batches"] += 1
    rows = sorted(acc.values(), key=lambda a: (-a["rows"], a["stream"], a["reason"]))
    return {"batches": len(recent), "first_batch": recent[0].get("batch_id"), "last_batch": recent[-1].get("batch_id"),
            "rows": rows, "total": sum(a["rows"] for a in rows),
            "files": sum(len(r.get("quarantined_files") or []) for r in recent),
            "since": iso(since) if since else None, "until": iso(newest) if newest else None}


def evaluation_reports(lake: Lake, query: str) -> list[dict]:
    """Every evaluation report of ``query`` in the lake: ``<ns>/reports/<query>/evaluation/index.html`` of each
    namespace (``mjoin_evaluate``, the demo's, a backfill's), and any other ``*.html`` of a report folder; with
    the range and strategies it compared (its ``summary.json``)."""
    out = []
    for ns in namespaces(lake):
        base = Lake(lake.root, ns).reports(query)
        names = [n for n in fsutil.listdir(base) if n.endswith(".html")]
        if fsutil.exists(fsutil.join(base, "evaluation", "index.html")):
            names.append("evaluation/index.html")
        for name in names:
            entry = {"namespace": ns, "name": name, "space": space(ns), "range": None, "strategies": None,
                     "intervals": None}
            summary = fsutil.join(base, os.path.dirname(name), "summary.json")
            if name.endswith("evaluation/index.html") and fsutil.exists(summary):
                try:
                    doc = json.loads(fsutil.read_text(summary))
                    cfg = (doc.get("meta") or {}).get("config") or {}
                    entry.update(range=[cfg.get("start"), cfg.get("end")],
                                 strategies=len({s.get("strategy") for s in doc.get("summary") or []}),
                                 intervals=len((doc.get("meta") or {}).get("intervals") or []))
                except (OSError, ValueError):
                    pass
            out.append(entry)
    return out


def registry_json(lake: Lake | None = None, namespace: str = "") -> dict:
    lake = _lake(lake)
    ns_lake = Lake(lake.root, namespace)
    out = {}
    for q in queries_with_plans(ns_lake):
        reg = PlanRegistry(ns_lake, q)
        backfills = read_outcomes(Lake(lake.root, BACKFILL_NAMESPACE), q, limit=20) if not namespace else []
        active, damaged = reg.active_version_or_none()
        out[q] = {"active": active, "damaged_pointer": damaged, "versions": reg.history(), "activations": reg.activations(),
                  "outcomes": read_outcomes(ns_lake, q, limit=50),
                  "reports": [n for n in fsutil.listdir(ns_lake.reports(q)) if n.endswith(".html")],
                  "evaluation_reports": evaluation_reports(lake, q),
                  "backfill_outcomes": backfills,
                  "quarantine": quarantine_summary(ns_lake, q)}
    return out


def known_queries(lake: Lake | None = None) -> set[str]:
    """The query names the plugin serves: the specs present (``$MJOIN_QUERIES``, include/queries/) and the
    queries the lake holds plans, reports or a join job's metrics of (in any of its namespaces)."""
    lake = _lake(lake)
    held = {q for ns in namespaces(lake) for q in queries_with_plans(Lake(lake.root, ns))}
    return {q for q in set(query_choices()) | held if QUERY_NAME.match(q)}


def report_target(query: str, name: str, lake: Lake | None = None, namespace: str = "") -> str | None:
    """The path or URL of report file ``name`` of ``query`` in ``namespace``, or None: an unknown query (``..`` is
    none), a namespace the lake does not have, a name with empty, ``.``/``..`` or hidden parts, a file outside
    ``<lake>[/<ns>]/reports/<query>/`` (a symlink out of it included) or no such file."""
    lake = _lake(lake)
    if not QUERY_NAME.match(query or "") or query not in known_queries(lake) or namespace not in namespaces(lake):
        return None
    parts = (name or "").split("/")
    if any(p in ("", ".", "..") or p.startswith(".") or "\\" in p for p in parts):
        return None
    base = Lake(lake.root, namespace).reports(query)
    if fsutil.is_url(base):
        path = fsutil.join(base, *parts)
        return path if fsutil.exists(path) and not fsutil.is_dir(path) else None
    base = os.path.realpath(base)
    path = os.path.realpath(os.path.join(base, *parts))
    if not path.startswith(base + os.sep) or not os.path.isfile(path):
        return None
    return path


def report_file(query: str, name: str, lake: Lake | None = None, namespace: str = "") -> str | None:
    """The local path of a report file, or None (see :func:`report_target`; None too on a URL lake)."""
    path = report_target(query, name, lake, namespace)
    return None if path is None or fsutil.is_url(path) else path


# ---- the page -----------------------------------------------------------------------------------------

def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


def _table(rows: list[dict], columns: list[str]) -> str:
    return html_table(rows, columns, _fmt)


def _e(v) -> str:
    return html.escape(_fmt(v))


def file_url(lake_name: str, namespace: str, query: str, name: str) -> str:
    """The page-relative URL of a file of ``query``'s report folder (served by the plugin's ``files`` route)."""
    return "files/" + "/".join(urllib.parse.quote(p, safe="") for p in (lake_name, space(namespace), query)) + \
        "/" + "/".join(urllib.parse.quote(p, safe="") for p in name.split("/"))


def task_log_url(outcome: dict, task: str) -> str | None:
    """Airflow's page of the task instance (its log), relative to the mjoin page (served under ``/mjoin/``)."""
    if not (outcome.get("dag_id") and outcome.get("run_id")):
        return None
    return "../dags/" + "/".join(urllib.parse.quote(p, safe="") for p in (
        outcome["dag_id"], "runs", outcome["run_id"], "tasks", task))


def _gain(o: dict) -> str:
    g = o.get("estimated_gain")
    return f"{g:.1%}" if isinstance(g, (int, float)) else ""


def _coverage(o: dict) -> str:
    if o.get("gap"):
        gap = o["gap"]
        return (f"<span class='gap'>gap: {_e(gap.get('cycles'))} cycle(s) [{_e(gap.get('from'))}, {_e(gap.get('to'))}) "
                f"covered by no run</span>")
    if o.get("caught_up_from"):
        return f"also covered [{_e(o.get('interval_start'))}, {_e(o['caught_up_from'])}) (missed before)"
    return ""


def _reason(o: dict, lake_name: str, namespace: str) -> str:
    text = _e(o.get("reason"))
    links = []
    for task, log in (o.get("logs") or {}).items():
        if o.get("run_folder"):
            url = file_url(lake_name, namespace, o["query"], f"runs/{o['run_folder']}/{log}")
            links.append(f"<a class='errlog' href='{html.escape(url)}'>{html.escape(task)}: full error</a>")
    for task in (o.get("reasons") or {}):
        url = task_log_url(o, task)
        if url:
            links.append(f"<a class='tasklog' target='_top' href='{html.escape(url)}'>{html.escape(task)}: task log</a>")
    return text + (f"<br><small>{' · '.join(links)}</small>" if links else "")


def outcomes_table(rows: list[dict], lake_name: str, namespace: str) -> str:
    head = ["interval end", "run", "mode", "status", "reason", "version", "active", "est. gain", "covered", "changes"]
    body = []
    for o in reversed(rows):
        status = o.get("status") or ""
        colour = STATUS_COLOURS.get(status, "#000")
        changes = "; ".join(o.get("changes") or [])
        body.append(
            f"<tr class='outcome {html.escape(status)}'><td>{_e(o.get('interval_end'))}</td>"
            f"<td title='{_e(o.get('run_id'))}'>{_e(o.get('run_type'))}</td><td>{_e(o.get('mode'))}</td>"
            f"<td style='color:{colour};font-weight:bold'>{html.escape(status)}</td>"
            f"<td class='reason'>{_reason(o, lake_name, namespace)}</td><td>{_e(o.get('version'))}</td>"
            f"<td>{_e(o.get('active_version'))}</td><td>{_gain(o)}</td><td>{_coverage(o)}</td>"
            f"<td><small>{html.escape(changes[:300])}</small></td></tr>")
    return ("<table class='outcomes'><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


def _quarantine_html(summary: dict) -> str:
    window = f"{int(QUARANTINE_WINDOW.total_seconds() // 60)} minutes"
    if not summary.get("batches"):
        return ""
    head = (f"<h3>quarantined by the join job: last {window} of its batches</h3>"
            f"<p>batches {_e(summary.get('first_batch'))}-{_e(summary.get('last_batch'))} ({summary['batches']} "
            f"batches, {_e(summary.get('since'))} to {_e(summary.get('until'))}): <b>{summary['total']}</b> rows "
            f"quarantined, {summary['files']} file(s) rejected whole. Each row with its reason: "
            "<code>python -m mjoin quarantine list --query ...</code></p>")
    if not summary["rows"]:
        return head
    return head + _table(summary["rows"], ["stream", "reason", "rows", "batches"])


def _reports_html(reports: list[dict], lake_name: str, query: str) -> str:
    if not reports:
        return ""
    items = []
    for r in reports:
        url = file_url(lake_name, r["namespace"], query, r["name"])
        what = (f" ({r['strategies']} strategies, {r['intervals']} intervals, {_e(r['range'][0])} to "
                f"{_e(r['range'][1])})") if r.get("range") else ""
        items.append(f"<li><a class='report' href='{html.escape(url)}'>{html.escape(r['namespace'] or 'live')}: "
                     f"{html.escape(r['name'])}</a>{what}</li>")
    return "<h3>evaluation reports</h3><ul>" + "".join(items) + "</ul>"


def _nav(lake_name: str, namespace: str, all_lakes: dict, lake: Lake) -> str:
    def link(ln: str, ns: str, text: str) -> str:
        url = "?" + urllib.parse.urlencode({"lake": ln, "ns": space(ns)})
        here = ln == lake_name and ns == namespace
        return f"<b>{html.escape(text)}</b>" if here else f"<a href='{html.escape(url)}'>{html.escape(text)}</a>"

    lake_links = " | ".join(link(n, "", f"{n} lake") for n in all_lakes)
    ns_links = " | ".join(link(lake_name, ns, ns or "live runs") for ns in namespaces(lake))
    return f"<p class='nav'>{lake_links}</p><p class='nav'>namespaces: {ns_links}</p>"


def registry_page(lake: Lake | None = None, namespace: str = "", lake_name: str = LIVE,
                  all_lakes: dict | None = None) -> str:
    lake = _lake(lake)
    all_lakes = all_lakes or {lake_name: lake}
    data = registry_json(lake, namespace)
    where = f"{lake.root}/{namespace}" if namespace else lake.root
    parts = ["<h1>mjoin</h1>", _nav(lake_name, namespace, all_lakes, lake),
             f"<p>lake <code>{html.escape(where)}</code></p>"]
    if not data:
        parts.append("<p>No plans yet. Run <code>make demo</code> or trigger <code>mjoin_reoptimize</code>.</p>")
    for q, info in data.items():
        parts.append(f"<h2>{html.escape(q)}</h2><p>active version: <b>{info['active'] or 'none'}</b></p>")
        if info.get("damaged_pointer"):
            parts.append(f"<p class='gap'>{_e(info['damaged_pointer'])}</p>")
        gaps = [o for o in info["outcomes"] if o.get("gap")]
        if gaps:
            parts.append(f"<p class='gap'>{len(gaps)} run(s) report a gap: cycles with landed data that no run "
                         f"covered (runs overran their period by more than the catch-up of an hour, or Airflow was "
                         f"stopped); newest: {_e(gaps[-1]['gap'].get('message'))}</p>")
        if info["outcomes"]:
            parts.append("<h3>recent re-optimizations</h3>" + outcomes_table(info["outcomes"], lake_name, namespace))
            parts.append(links_html(list(reversed(info["outcomes"]))))
        parts.append(_quarantine_html(info["quarantine"]))
        if info["backfill_outcomes"]:
            url = "?" + urllib.parse.urlencode({"lake": lake_name, "ns": space(BACKFILL_NAMESPACE)})
            parts.append(f"<h3>backfill runs (<a href='{html.escape(url)}'>namespace {BACKFILL_NAMESPACE}</a>)</h3>"
                         + outcomes_table(info["backfill_outcomes"], lake_name, BACKFILL_NAMESPACE))
        parts.append(_reports_html(info["evaluation_reports"], lake_name, q))
        parts.append("<h3>versions</h3>" + _table(info["versions"], ["version", "active", "strategy", "created_at",
                                                                    "estimated_cost", "run"]))
    style = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1em}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}"
             "th{background:#eee}.gap{color:#b35c00;font-weight:bold}.nav{margin:0.3em 0}td.reason{max-width:60em}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>mjoin</title><style>{style}</style></head>"
            f"<body>{''.join(parts)}</body></html>")
