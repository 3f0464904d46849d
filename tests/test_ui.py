"""The plugin's pages render the registry from the lake, and never serve files outside the report folder."""
import json

from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.lake.registry import PlanRegistry
from mjoin.loop.ui import registry_json, registry_page, report_file


def test_registry_page_and_json(lake, seed_query):
    reg = PlanRegistry(lake, seed_query.name)
    v = reg.publish(make_plan(seed_query, orders_from_permutation(seed_query, ["cu", "sr", "wr", "cr"]), "fixed"),
                    {"run": "manual__1"})
    reg.activate(v)
    data = registry_json(lake)
    assert data[seed_query.name]["active"] == 1
    assert data[seed_query.name]["versions"][0]["run"] == "manual__1"
    page = registry_page(lake)
    assert seed_query.name in page and "active version: <b>1</b>" in page


def test_report_file_stays_inside_reports(lake, seed_query, tmp_path):
    import os

    reports = lake.reports(seed_query.name)
    os.makedirs(reports)
    with open(os.path.join(reports, "index.html"), "w") as f:
        f.write("<html></html>")
    (tmp_path / "secret.txt").write_text("no")
    assert report_file(seed_query.name, "index.html", lake).endswith("index.html")
    assert report_file(seed_query.name, "../../../secret.txt", lake) is None
    assert report_file(seed_query.name, "missing.html", lake) is None
    assert json.dumps(registry_json(lake))  # JSON-serialisable
