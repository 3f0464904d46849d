"""Links a user clicks (mjoin.loop.links): URLs into the mjoin plugin, the page of a gate's validation, and the
Data Docs files the plugin serves (nothing outside the site: no ``..``, no symlink out, no hidden file)."""
from __future__ import annotations

import json
import os

from mjoin.lake.layout import Lake
from mjoin.loop import links


def test_urls_namespaces_and_base(monkeypatch):
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    monkeypatch.setenv("AIRFLOW__API__PORT", "8793")
    assert links.base_url() == "http://localhost:8793"
    assert links.data_docs_url("", "validations/a b/run:1+0/x.html") == \
        "http://localhost:8793/mjoin/gx/live/validations/a%20b/run%3A1%2B0/x.html"
    assert links.data_docs_url("eval/backfill", "index.html", base="") == "/mjoin/gx/eval~backfill/index.html"
    assert links.namespace_of(links.namespace_token("eval/backfill")) == "eval/backfill"
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example/af/")
    assert links.plan_url("q", 3) == "https://airflow.example/af/mjoin/plans/q/3"
    assert links.task_docs_url("mjoin_reoptimize", "manual__2026-01-01T00:00:00+00:00", "check_plan").endswith(
        "/mjoin/task-docs/mjoin_reoptimize/manual__2026-01-01T00%3A00%3A00%2B00%3A00/check_plan")


def test_the_page_of_a_gate_is_its_failing_suites(tmp_path):
    doc = {"gx_result": {"s.a": {"success": True}, "s.b": {"success": False}},
           "details": {"data_docs": {"pages": {"s.a": "validations/a.html", "s.b": "validations/b.html"}}}}
    assert links.gate_page(doc) == "validations/b.html"
    assert links.gate_page({"details": {}}) is None
    (tmp_path / "gate_stats.json").write_text(json.dumps(doc))
    assert links.task_page(str(tmp_path), "stats") == "validations/b.html"
    assert links.task_page(str(tmp_path), "plan") is None
    (tmp_path / "gate_plan.json").write_text("{ not json")
    assert links.task_page(str(tmp_path), "plan") is None


def test_only_files_inside_the_data_docs_site_are_served(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    site = os.path.join(lake.gx(), *links.SITE)
    os.makedirs(os.path.join(site, "validations"))
    with open(os.path.join(site, "validations", "p.html"), "w") as f:
        f.write("<html>page</html>")
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    os.symlink(secret, os.path.join(site, "validations", "link.html"))
    assert links.data_docs_target("live", "validations/p.html", lake) == os.path.realpath(
        os.path.join(site, "validations", "p.html"))
    for bad in ("../../../../secret.txt", "validations/../../x", "validations/link.html", ".hidden", "", "nope.html"):
        assert links.data_docs_target("live", bad or "index.html", lake) is None, bad
    for token in ("../x", "a/b", ".x", ""):
        assert links.data_docs_target(token, "validations/p.html", lake) is None, token


def test_links_html_escapes_and_lists_runs():
    rows = [{"interval_end": "2026-01-01T00:05:00Z", "status": "failed", "version": None, "active_version": 1,
             "links": {"data_docs": {"stats": 'http://x/mjoin/gx/live/v"<b>.html'}, "plan": "http://x/mjoin/plans/q/1"}},
            {"interval_end": "e", "status": "skipped", "links": {}}]
    out = links.links_html(rows)
    assert "plan v1" in out and "&lt;b&gt;" in out and "<b>" not in out and out.count("<tr><td>") == 1
    assert 'href="plans/q/1"' in out  # relative to the plugin page: any host, port or path prefix
    assert links.links_html([{"links": {}}]) == ""
