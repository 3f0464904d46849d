"""Data Docs, links, assets and drift-triggered runs as a user sees them: real Airflow (`airflow dags test` for
two runs, then api-server, scheduler, dag-processor and triggerer) and a real browser (headless Chromium driven
by Selenium through the Debian chromedriver).

- run 1 deploys a plan; its record task emits asset events with the run's metadata;
- run 2 gets impossible statistics: check_statistics fails, the failing expectation is named in the task log,
  the outcome's links and the task's "Data Docs" extra link open its Data Docs page, which names it too;
- the mjoin plugin page lists the runs' links (Data Docs, plan version); the Airflow UI's asset page shows the
  loop's assets and their DAG;
- a step change after the newest forecast: the drift watcher (an AssetWatcher in the triggerer) emits an
  event on mjoin.drift.<query> and Airflow starts an asset-triggered mjoin_reoptimize run, once (debounced).

The browser helper is this module's own (a small wrapper over Selenium's Chrome driver with the flags below).
``MJOIN_SCREENSHOTS=docs/images`` writes the screenshots the docs show (docs/gates.md, docs/orchestration.md).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.parse
from pathlib import Path

import pandas as pd
import pytest

from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.model.timeutil import iso, parse_time
from mjoin.runtime import fsutil

from airflow_helpers import api, dags_test, services
from dags_world import CYCLE, PERIOD, QUERY, START, logical, make_world

selenium = pytest.importorskip("selenium", reason="selenium (requirements.txt) drives the browser")
from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1100")


class Browser:
    """Headless Chromium (Debian's chromium and chromium-driver) with a new empty profile, logged in to Airflow
    by the token cookie the UI itself uses."""

    def __init__(self, shots: Path):
        if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
            pytest.skip("the Debian packages chromium and chromium-driver are not installed")
        self.profile = tempfile.mkdtemp(prefix="mjoin-chromium-")
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for flag in FLAGS + (f"--user-data-dir={self.profile}",):
            opts.add_argument(flag)
        self.driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
        self.driver.set_page_load_timeout(120)
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)

    def login(self, base: str, token: str) -> None:
        self.driver.get(f"{base}/api/v2/version")
        self.driver.add_cookie({"name": "_token", "value": token, "path": "/"})

    def open(self, url: str, *, expect: tuple = (), timeout: float = 90.0) -> str:
        """Open ``url`` and wait until the page text holds every string of ``expect``; the page text."""
        self.driver.get(url)
        deadline = time.monotonic() + timeout
        while True:
            text = self.driver.find_element("tag name", "body").text
            if all(e in text for e in expect) or time.monotonic() > deadline:
                return text
            time.sleep(1)

    def show(self, text: str) -> None:
        """Scroll the first element holding ``text`` into the middle of the window."""
        el = self.driver.find_element("xpath", f"//*[contains(text(), '{text}')]")
        self.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", el)

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def close(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)


def stats_history(lake: Lake, cycles: int, *, bad_from: int | None = None) -> None:
    """Plausible statistics of the seed query for 5-s cycles from START (what the Spark job would write), with an
    impossible match rate from cycle ``bad_from`` on."""
    from mjoin.model.query import load_query
    from mjoin.stats.history import history_root, write_cycle
    from test_gates_support import snapshot

    q = load_query(QUERY)
    for k in range(cycles):
        t = START.timestamp() + k * CYCLE
        st = snapshot(q, iso(t), seed=k)
        st.cycle_seconds = CYCLE
        if bad_from is not None and k >= bad_from:
            st.groups[0].edges[("cu", "sr")].gamma = 1.7
        write_cycle(history_root(lake), QUERY, iso(t), pd.DataFrame(st.to_rows()).assign(cycle_start=pd.Timestamp(iso(t))))


def run_id_of(env, k: int) -> str:
    runs = api_runs(env)
    return next(r["dag_run_id"] for r in runs if (r.get("logical_date") or "").startswith(logical(k)[:19]))


def api_runs(env, port=None) -> list:
    from airflow_helpers import list_runs

    return [{"dag_run_id": r["run_id"], "logical_date": r["logical_date"], "state": r["state"]}
            for r in list_runs(env, "mjoin_reoptimize")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("gxui"))


def test_data_docs_links_assets_and_a_drift_triggered_run_in_the_browser(world, tmp_path):
    env, lake = world["env"], Lake(str(world["lake"]))
    shots = Path(os.environ.get("MJOIN_SCREENSHOTS") or tmp_path / "shots")
    per_period = PERIOD // CYCLE

    # run 1 (interval [2, 3) periods): good statistics, the Spark jobs marked success -> v1 deployed, assets emitted
    stats_history(lake, 3 * per_period)
    # an evaluation report where mjoin_evaluate writes it (its own namespace): each run's outcome links to it
    report = Path(Lake(lake.root, "eval/evaluate").reports(QUERY)) / "evaluation" / "index.html"
    report.parent.mkdir(parents=True)
    report.write_text("<html><body><h1>mjoin evaluation report</h1><p>strategies ranked by engine CPU</p></body></html>")
    proc = dags_test(env, "mjoin_reoptimize", logical(3), world["conf"], mark_success="^(join|collect_statistics)$",
                     log=world["log"])
    first = json.loads(fsutil.read_text(fsutil.join(lake.reports(QUERY), "runs",
                                                    parse_time(logical(3)).strftime("%Y%m%dT%H%M%SZ"), "outcome.json")))
    assert first["status"] == "deployed", (first, proc.stdout[-3000:])
    assert first["links"]["plan"].endswith(f"/mjoin/plans/{QUERY}/1")
    assert first["links"]["data_docs"] == {}  # every gate passed: results stored, no page rendered (the default)
    assert first["links"]["report"].endswith(f"/mjoin/files/live/eval~evaluate/{QUERY}/evaluation/index.html")

    # run 2 (interval [3, 4)): impossible statistics -> the statistics gate fails, named in the log's last lines
    stats_history(lake, 4 * per_period, bad_from=3 * per_period)
    proc = dags_test(env, "mjoin_reoptimize", logical(4), world["conf"], mark_success="^(join|collect_statistics)$",
                     log=world["log"])
    folder = fsutil.join(lake.reports(QUERY), "runs", parse_time(logical(4)).strftime("%Y%m%dT%H%M%SZ"))
    second = json.loads(fsutil.read_text(fsutil.join(folder, "outcome.json")))
    assert second["status"] == "failed" and "check_statistics" in second["failed_tasks"]
    reason = second["reasons"]["check_statistics"]
    assert "stats.gamma_in_unit_interval failed" in reason and "(Data Docs: http" in reason
    assert PlanRegistry(lake, QUERY).active_version() == 1  # the last good plan stays
    stats_history(lake, 4 * per_period)  # the statistics job re-run: good cycles again (no drift yet)

    env_live = dict(env, MJOIN_PERIOD_MINUTES="600", MJOIN_DRIFT_POLL="3")  # only the drift watcher starts runs
    with services(env_live, tmp_path, components=("api-server", "scheduler", "dag-processor", "triggerer")) as (
            senv, port):
        base = f"http://localhost:{port}"
        from mjoin.loop.airflow_env import admin_password
        import urllib.request

        req = urllib.request.Request(f"{base}/auth/token", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"username": "admin", "password": admin_password(senv)}).encode())
        token = json.loads(urllib.request.urlopen(req, timeout=30).read())["access_token"]
        browser = Browser(shots)
        try:
            browser.login(base, token)
            run2 = run_id_of(senv, 4)

            # the failed task's extra link -> the Data Docs page of its validation, naming the failing expectation
            links = api(port, f"/api/v2/dags/mjoin_reoptimize/dagRuns/{urllib.parse.quote(run2)}/taskInstances/"
                              "check_statistics/links", senv)["extra_links"]
            assert links["Data Docs"].startswith(f"{base}/mjoin/task-docs/mjoin_reoptimize/"), links
            text = browser.open(links["Data Docs"], expect=("stats.gamma_in_unit_interval",))
            assert "stats.gamma_in_unit_interval [critical]" in text and "1.7" in text and "Failed" in text
            browser.show("stats.gamma_in_unit_interval [critical]")
            browser.shot("gx-data-docs-failed-gate")
            assert api(port, f"/api/v2/dags/mjoin_reoptimize/dagRuns/{urllib.parse.quote(run2)}/taskInstances/"
                             "prepare/links", senv)["extra_links"] == {"Data Docs": None}

            # the plugin page: every run's links; the plan version behind its link
            text = browser.open(f"{base}/mjoin/", expect=("links of recent runs",))
            assert "links of recent runs" in text and "plan v1" in text and "stats" in text
            browser.shot("gx-plugin-links")
            anchors = {a.text: a.get_attribute("href") for a in browser.driver.find_elements("css selector",
                                                                                             "table.mjoin-links a")}
            assert anchors["plan v1"].endswith(f"/mjoin/plans/{QUERY}/1")
            text = browser.open(anchors["evaluation report"], expect=("mjoin evaluation report",))
            assert "strategies ranked by engine CPU" in text
            text = browser.open(anchors["plan v1"], expect=('"version"',))
            assert '"version": 1' in text.replace('":1', '": 1') and '"active": true' in text.replace('":true', '": true')
            # the outcome's link (recorded with the base the run had: the path is what a user follows here)
            text = browser.open(f"{base}/mjoin/" + second["links"]["data_docs"]["stats"].split("/mjoin/", 1)[1],
                                expect=("stats.gamma_in_unit_interval",))
            assert "stats.gamma_in_unit_interval [critical]" in text

            # assets: the events of run 1 carry its metadata; the UI's asset page shows the asset and its DAG
            found = api(port, "/api/v2/assets?name_pattern=mjoin.&limit=100&only_active=false", senv)["assets"]
            by_name = {a["name"]: a for a in found}
            assert {f"mjoin.{k}.{QUERY}" for k in ("statistics", "forecast", "active_plan", "results", "drift")} <= \
                set(by_name), sorted(by_name)
            events = api(port, f"/api/v2/assets/events?asset_id={by_name[f'mjoin.active_plan.{QUERY}']['id']}",
                         senv)["asset_events"]
            extra = events[0]["extra"]
            assert (extra["plan_version"], extra["strategy"], extra["gates"]["plan"]) == (1, "exact", "passed")
            assert "predicted_gain" in extra and extra["links"]["plan"].endswith("/1")
            text = browser.open(f"{base}/assets/{by_name[f'mjoin.active_plan.{QUERY}']['id']}",
                                expect=(f"mjoin.active_plan.{QUERY}", "mjoin_reoptimize"))
            assert f"mjoin.active_plan.{QUERY}" in text and "mjoin_reoptimize" in text
            browser.shot("gx-asset-graph")

            # drift: measured cycles after run 1's forecast step up; the watcher's event starts one run
            drift_asset = by_name[f"mjoin.drift.{QUERY}"]
            assert api(port, f"/api/v2/assets/events?asset_id={drift_asset['id']}", senv)["asset_events"] == []
            before = {r["dag_run_id"] for r in api_runs(senv)}
            from mjoin.model.statistics import Statistics
            from mjoin.stats.history import history_root, write_cycle

            fc_path = fsutil.join(lake.reports(QUERY), "runs", parse_time(logical(4)).strftime("%Y%m%dT%H%M%SZ"),
                                  "forecast.json")
            assert not fsutil.exists(fc_path)  # run 2 failed before its forecast: run 1's is the newest
            fc = Statistics.load(fsutil.join(lake.reports(QUERY), "runs",
                                             parse_time(logical(3)).strftime("%Y%m%dT%H%M%SZ"), "forecast.json"))
            for k in range(4 * per_period, 4 * per_period + 3):  # after the bad cycles: three cycles, cu's rate x8
                t = START.timestamp() + k * CYCLE
                st = Statistics.from_json(fc.to_json())
                st.cycle_start, st.kind = iso(t), "measured"
                st.groups[0].streams["cu"].lam *= 8
                write_cycle(history_root(lake), QUERY, iso(t), pd.DataFrame(st.to_rows()).assign(
                    cycle_start=pd.Timestamp(iso(t))))
            deadline = time.monotonic() + 300
            triggered = []
            while time.monotonic() < deadline and not triggered:
                time.sleep(5)
                triggered = [r for r in api(port, "/api/v2/dags/mjoin_reoptimize/dagRuns?limit=50", senv)["dag_runs"]
                             if r["dag_run_id"] not in before and r["run_type"] == "asset_triggered"]
            assert triggered, "no asset-triggered run within 300 s of the drift"
            events = api(port, f"/api/v2/assets/events?asset_id={drift_asset['id']}", senv)["asset_events"]
            assert len(events) == 1 and "lambda[cu]" in json.dumps(events[0]["extra"])
            time.sleep(20)  # the watcher keeps polling: the debounce (300 s) holds back a second event
            assert len(api(port, f"/api/v2/assets/events?asset_id={drift_asset['id']}", senv)["asset_events"]) == 1
            state = json.loads(fsutil.read_text(fsutil.join(lake.reports(QUERY), "drift", "state.json")))
            assert state["event"]["series"][0] == "lambda[cu]"
        finally:
            browser.close()
