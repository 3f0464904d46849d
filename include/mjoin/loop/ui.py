"""HTML and JSON views of the lake's plan registries and reports (for the Airflow plugin).

Pure rendering over files (no Airflow import): what queries have plans, which
version is active, each version's lineage, the recent re-optimization
outcomes (``<lake>/reports/<query>/runs/<interval end>/outcome.json``, one per
run, written by the DAG's record step) and the evaluation reports
(``<lake>/reports/<query>/*.html``).
"""
from __future__ import annotations

import html
import json
import os
import re

from mjoin.engine.metrics import read_metrics
from mjoin.engine.quarantine import per_batch
from mjoin.evaluation.report import html_table
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.loop.links import links_html
from mjoin.loop.params import query_choices
from mjoin.runtime import fsutil

OUTCOME = "outcome.json"


def _lake(lake: Lake | None) -> Lake:
    return lake or Lake.default()


def queries_with_plans(lake: Lake | None = None) -> list[str]:
    lake = _lake(lake)
    root = fsutil.join(lake.root, "plans")
    names = set(fsutil.listdir(root))
    names |= set(fsutil.listdir(fsutil.join(lake.root, "reports")))
    names |= set(fsutil.listdir(fsutil.join(lake.root, "metrics")))  # a join job running, no plan yet
    return sorted(n for n in names if not n.startswith("."))


def read_outcomes(lake: Lake, query: str, limit: int | None = None) -> list[dict]:
    """The re-optimization outcomes, oldest interval first (the last ``limit`` ones).

    One file per run (``runs/<YYYYmmddTHHMMSSZ>/outcome.json``, written atomically), so two
    runs recording at once never lose each other's outcome; folder names sort by time."""
    root = fsutil.join(lake.reports(query), "runs")
    stamps = [n for n in fsutil.listdir(root) if not n.startswith(".")]
    rows = []
    for stamp in reversed(stamps):
        if limit and len(rows) >= limit:
            break
        path = fsutil.join(root, stamp, OUTCOME)
        if fsutil.exists(path):
            rows.append(json.loads(fsutil.read_text(path)))
    return sorted(rows, key=lambda r: (r.get("interval_end") or "", r.get("recorded_at") or ""))


def registry_json(lake: Lake | None = None) -> dict:
    lake = _lake(lake)
    out = {}
    for q in queries_with_plans(lake):
        reg = PlanRegistry(lake, q)
        out[q] = {"active": reg.active_version(), "versions": reg.history(), "activations": reg.activations(),
                  "outcomes": read_outcomes(lake, q, limit=50),
                  "reports": [n for n in fsutil.listdir(lake.reports(q)) if n.endswith(".html")],
                  "quarantine": quarantine_rows(lake, q)}
    return out


def quarantine_rows(lake: Lake, query: str, limit: int = 20) -> list[dict]:
    """The join job's quarantine counts per batch, stream and reason over its newest ``limit`` batches."""
    try:
        return per_batch(read_metrics(lake, query), limit)
    except (OSError, ValueError):
        return []


#: what a query name may look like in a URL (spec names, folder names under the lake's plans/ and reports/)
QUERY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def known_queries(lake: Lake | None = None) -> set[str]:
    """The query names the plugin serves: the specs present (``$MJOIN_QUERIES``, include/queries/) and the
    queries the lake holds plans, reports or a join job's metrics of."""
    return {q for q in set(query_choices()) | set(queries_with_plans(_lake(lake))) if QUERY_NAME.match(q)}


def report_target(query: str, name: str, lake: Lake | None = None) -> str | None:
    """The path or URL of report file ``name`` of ``query``, or None: an unknown query (``..`` is none),
    a name with empty, ``.``/``..`` or hidden parts, a file outside ``<lake>/reports/<query>/`` (a symlink
    out of it included) or no such file."""
    lake = _lake(lake)
    if not QUERY_NAME.match(query or "") or query not in known_queries(lake):
        return None
    parts = (name or "").split("/")
    if any(p in ("", ".", "..") or p.startswith(".") or "\\" in p for p in parts):
        return None
    base = lake.reports(query)
    if fsutil.is_url(base):
        path = fsutil.join(base, *parts)
        return path if fsutil.exists(path) and not fsutil.is_dir(path) else None
    base = os.path.realpath(base)
    path = os.path.realpath(os.path.join(base, *parts))
    if not path.startswith(base + os.sep) or not os.path.isfile(path):
        return None
    return path


def report_file(query: str, name: str, lake: Lake | None = None) -> str | None:
    """The local path of a report file, or None (see :func:`report_target`; None too on a URL lake)."""
    path = report_target(query, name, lake)
    return None if path is None or fsutil.is_url(path) else path


def _table(rows: list[dict], columns: list[str]) -> str:
    return html_table(rows, columns, _fmt)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


def registry_page(lake: Lake | None = None) -> str:
    lake = _lake(lake)
    data = registry_json(lake)
    parts = [f"<h1>mjoin</h1><p>lake <code>{html.escape(lake.root)}</code></p>"]
    if not data:
        parts.append("<p>No plans yet. Run <code>make demo</code> or trigger <code>mjoin_reoptimize</code>.</p>")
    for q, info in data.items():
        parts.append(f"<h2>{html.escape(q)}</h2><p>active version: <b>{info['active'] or 'none'}</b></p>")
        if info["reports"]:
            links = " ".join(f'<a href="reports/{html.escape(q)}/{html.escape(n)}">{html.escape(n)}</a>' for n in info["reports"])
            parts.append(f"<p>reports: {links}</p>")
        parts.append("<h3>versions</h3>" + _table(info["versions"], ["version", "active", "strategy", "created_at",
                                                                    "estimated_cost", "run"]))
        if info.get("quarantine"):
            parts.append("<h3>quarantined by the join job (newest batches)</h3>"
                         + _table(list(reversed(info["quarantine"])), ["batch_id", "stream", "reason", "rows"]))
        if info["outcomes"]:
            parts.append("<h3>recent re-optimizations</h3>" + _table(list(reversed(info["outcomes"])), [
                "interval_end", "status", "reason", "strategy", "version", "active_version", "estimated_gain", "threshold",
                "gates", "changes"]))
            parts.append(links_html(list(reversed(info["outcomes"]))))
    style = ("body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;margin-bottom:1em}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}th{background:#eee}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>mjoin</title><style>{style}</style></head><body>{''.join(parts)}</body></html>"
