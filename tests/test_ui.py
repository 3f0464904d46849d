"""The plugin's pages render the registry from the lake, and never serve files outside the report folder."""
import json

from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.lake.layout import Lake
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


def _metrics(lake, query: str, batches: list[tuple[int, str, dict]]) -> None:
    """Batch metrics records as the join job writes them (batch id, start time, quarantined counts)."""
    import os

    folder = lake.metrics(query)
    os.makedirs(folder, exist_ok=True)
    for b, started, quarantined in batches:
        with open(os.path.join(folder, f"batch={b}.json"), "w") as f:
            json.dump({"query": query, "batch_id": b, "started_at": started, "quarantined": quarantined,
                       "quarantined_files": []}, f)


def test_the_page_puts_outcomes_first_then_the_quarantine_summed_over_the_last_hour(lake, seed_query):
    """The quarantine is one row per stream and reason with totals over the batches of the last hour (not a row per
    batch), below the outcomes; backfill runs and every evaluation report of the lake are listed and linked."""
    import os

    from mjoin.loop.config import LoopConfig, fallback_context
    from mjoin.loop.outcome import record
    from mjoin.loop.ui import quarantine_summary, registry_page, report_target

    q = seed_query.name
    _metrics(lake, q, [(1, "2026-01-01T00:00:00Z", {"sr": {"null_key": 50}}),  # older than the hour: not counted
                       (2, "2026-01-01T00:30:00Z", {"sr": {"null_key": 3, "late": 0}, "wr": {"bad_type": 1}}),
                       (3, "2026-01-01T01:00:00Z", {"sr": {"null_key": 2}})])
    s = quarantine_summary(lake, q)
    assert (s["batches"], s["total"], s["since"]) == (2, 6, "2026-01-01T00:00:00Z")
    assert s["rows"] == [{"stream": "sr", "reason": "null_key", "rows": 5, "batches": 2},
                         {"stream": "wr", "reason": "bad_type", "rows": 1, "batches": 1}]
    for ns, run in (("", "scheduled__1"), ("eval/backfill", "backfill__2")):
        cfg = LoopConfig.from_params({"query": q, "lake": lake.root, "namespace": ns, "period": 60, "cycle": 10},
                                     run_id=run, run_type=run.split("__")[0])
        record(cfg, fallback_context(cfg, "2026-01-01T00:05:00Z"), {"prepare": "success"}, dag_id="mjoin_reoptimize")
    report = os.path.join(Lake(lake.root, "eval/evaluate").reports(q), "evaluation")
    os.makedirs(report)
    with open(os.path.join(report, "index.html"), "w") as f:
        f.write("<html>report</html>")
    with open(os.path.join(report, "summary.json"), "w") as f:
        json.dump({"summary": [{"strategy": "dppick"}, {"strategy": "fixed"}], "meta": {
            "config": {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:10:00Z"}, "intervals": [[0, 1], [1, 2]]}}, f)
    page = registry_page(lake)
    assert page.index("recent re-optimizations") < page.index("quarantined by the join job") < page.index("versions")
    assert "<b>6</b> rows quarantined" in page and "<td>null_key</td><td>5</td><td>2</td>" in page
    assert "backfill runs" in page and "backfill__" not in page.split("backfill runs")[0]
    link = f"files/live/eval~evaluate/{q}/evaluation/index.html"
    assert link in page and "2 strategies, 2 intervals" in page
    assert report_target(q, "evaluation/index.html", lake, "eval/evaluate").endswith("index.html")
    assert report_target(q, "evaluation/index.html", lake, "eval/nope") is None  # a namespace the lake lacks
    assert report_target(q, "evaluation/index.html", lake) is None  # not in the live namespace
    backfills = registry_page(lake, "eval/backfill")
    assert "backfill" in backfills and "lake <code>" in backfills


def test_other_lakes_are_the_registered_ones_that_exist(tmp_path, lake):
    from mjoin.loop.airflow_env import register_lake, registered_lakes
    from mjoin.loop.ui import lakes, namespace_of, space

    env = {"AIRFLOW_HOME": str(tmp_path / "home")}
    (tmp_path / "demo").mkdir()
    register_lake(env, "demo", str(tmp_path / "demo"))
    register_lake(env, "gone", str(tmp_path / "gone"))
    assert registered_lakes(env["AIRFLOW_HOME"]) == {"demo": str(tmp_path / "demo"), "gone": str(tmp_path / "gone")}
    assert list(lakes(registered_lakes(env["AIRFLOW_HOME"]))) == ["live", "demo"]
    assert (space(""), space("eval/backfill")) == ("live", "eval~backfill")
    assert namespace_of("live", lake) == "" and namespace_of("eval~..", lake) is None
