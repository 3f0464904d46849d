"""The Airflow UI as a user drives it, in headless Chromium (Debian's chromium and chromium-driver, through
Selenium) against a running api-server, scheduler and dag-processor on SQLite.

One setup, shared in order: `make demo` as a user runs it (`python -m mjoin demo`, small: sf 0.01, two 1-minute
periods, 5-s cycles) into this Airflow home, then Airflow started on it. The live lake (MJOIN_LAKE) is empty, and
the Spark connection names a master URL Spark cannot parse (a misconfiguration a user can make): runs triggered
here fail, one at `prepare` (nothing has landed), one in its Spark `join`. The tests then log in, trigger
mjoin_reoptimize from its form with the defaults and with edited values (both runs start), read the grid of the
demo's DAG (run durations of seconds, not months), read the mjoin page (the demo's deployed runs and the failed
runs with their one-line reasons, each with its whole error a click away) and open the evaluation report from it.
Skipped, with the reason printed, where Chromium, chromedriver or Selenium is absent.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_helpers import api, make_env, services
from browser_helpers import chromium, chromium_or_skip, login, type_into, wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
QUERY = "tpcds_returns_by_address"
DEMO_END = "2026-01-01T00:02:00Z"  # two 1-minute periods from the demo's simulated start


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    chromium_or_skip()
    root = tmp_path_factory.mktemp("browser")
    env = make_env(root / "airflow", root / "lake", period_minutes=5)
    (root / "lake").mkdir()
    demo = subprocess.run([sys.executable, "-m", "mjoin", "demo", "--sf", "0.01", "--periods", "2", "--period-minutes",
                           "1", "--cycle", "5", "--workdir", str(root / "demo")], env=env, capture_output=True, text=True,
                          timeout=1800)
    (root / "demo.out").write_text(demo.stdout + demo.stderr)
    assert demo.returncode == 0, (demo.stdout + demo.stderr)[-4000:]
    services_env = {**env, "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[x]"})}
    with services(services_env, root) as (senv, port):
        password = json.loads((root / "airflow" / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        with chromium() as driver:
            yield {"root": root, "env": senv, "port": port, "base": f"http://localhost:{port}", "driver": driver,
                   "password": password, "demo": demo.stdout, "demo_lake": root / "demo" / "lake"}


def _by():
    from selenium.webdriver.common.by import By

    return By


def _runs(world, dag_id: str) -> list[dict]:
    return api(world["port"], f"/api/v2/dags/{dag_id}/dagRuns?order_by=run_after&limit=100", world["env"])["dag_runs"]


def _trigger_form(world):
    """Open the DAG's Trigger dialog as a user does (the button on the DAG page)."""
    By, d = _by(), world["driver"]
    d.get(f"{world['base']}/dags/mjoin_reoptimize")
    wait_for(d, lambda d: d.find_element(By.CSS_SELECTOR, "button[aria-label='Trigger Dag']"), what="Trigger").click()
    dialog = wait_for(d, lambda d: next(x for x in d.find_elements(By.CSS_SELECTOR, "[role=dialog]")
                                        if "Trigger Dag" in x.text), what="the trigger form")
    wait_for(d, lambda d: dialog.find_element(By.ID, "element_lake"), what="the form's params")
    return dialog


def _submit(dialog):
    By = _by()
    button = next(b for b in dialog.find_elements(By.CSS_SELECTOR, "button") if b.text.strip() == "Trigger")
    assert button.is_enabled(), "the form's Trigger button is disabled"
    button.click()


def _new_run(world, before: set, timeout: float = 60) -> dict:
    return wait_for(world["driver"], lambda d: next((r for r in _runs(world, "mjoin_reoptimize")
                                                     if r["dag_run_id"] not in before and r["run_type"] == "manual"),
                                                    None), timeout=timeout, what="a new run")


def _finished(world, run_id: str, timeout: float = 600) -> dict:
    return wait_for(world["driver"], lambda d: next(r for r in _runs(world, "mjoin_reoptimize") if r["dag_run_id"] == run_id
                                                    and r["state"] in ("success", "failed")),
                    timeout=timeout, poll=3, what=f"run {run_id} to finish")


def test_login_and_the_dag_list(world):
    By, d = _by(), world["driver"]
    login(d, world["base"], world["password"])
    d.get(f"{world['base']}/dags")
    names = wait_for(d, lambda d: {"mjoin_reoptimize", "mjoin_demo", "mjoin_evaluate", "mjoin_join_job"} <= set(
        re.findall(r"mjoin_\w+", d.find_element(By.TAG_NAME, "body").text)), what="the DAG list")
    assert names


def test_trigger_with_the_defaults_and_with_edited_values(world):
    """The form submits with its defaults (the optional text params empty); edited values reach the run's conf.
    Both runs start and end with an outcome (the live lake is empty; the edited run's Spark master is bad)."""
    from selenium.webdriver.common.keys import Keys

    By, d = _by(), world["driver"]
    before = {r["dag_run_id"] for r in _runs(world, "mjoin_reoptimize")}
    _submit(_trigger_form(world))
    plain = _new_run(world, before)
    assert plain["conf"]["lake"] is None and plain["conf"]["mode"] == "auto" and plain["conf"]["strategy"] == "exact"
    before.add(plain["dag_run_id"])

    dialog = _trigger_form(world)
    select = dialog.find_element(By.CSS_SELECTOR, "#element_strategy input[role=combobox]")
    select.send_keys("dppick")
    select.send_keys(Keys.ENTER)
    type_into(dialog.find_element(By.ID, "element_lake"), str(world["demo_lake"]))
    type_into(dialog.find_element(By.ID, "element_interval_end"), DEMO_END)
    dry = dialog.find_element(By.CSS_SELECTOR, "input[name=element_dry_run]")
    d.execute_script("arguments[0].scrollIntoView({block: 'center'})", dry)
    dry.find_element(By.XPATH, "./..").click()
    _submit(dialog)
    edited = _new_run(world, before)
    conf = edited["conf"]
    assert (conf["strategy"], conf["lake"], conf["interval_end"], conf["dry_run"]) == (
        "dppick", str(world["demo_lake"]), DEMO_END, True), conf
    for run in (plain, edited):
        assert _finished(world, run["dag_run_id"])["state"] == "failed"  # started, ran its tasks, recorded
    world["runs"] = {"plain": plain["dag_run_id"], "edited": edited["dag_run_id"]}


def test_the_demo_runs_stay_out_of_the_live_dag_and_its_grid_draws_seconds(world):
    """`make demo`'s runs are in mjoin_demo, started at the time they ran: the grid's duration scale is minutes at
    most (a simulated logical date in January drew bars of 331 days); mjoin_reoptimize holds none of them."""
    By, d = _by(), world["driver"]
    demo_runs = _runs(world, "mjoin_demo")
    assert len(demo_runs) == 2 and all(r["conf"].get("workload") for r in demo_runs)
    assert not any(r["conf"].get("workload") for r in _runs(world, "mjoin_reoptimize"))
    d.get(f"{world['base']}/dags/mjoin_demo")
    scale = wait_for(d, lambda d: [p.text for p in d.find_elements(By.TAG_NAME, "p")
                                   if re.fullmatch(r"(\d+d)?\d\d:\d\d:\d\d(\.\d+)?", p.text.strip())],
                     what="the grid's duration scale")
    longest = scale[0]
    assert "d" not in longest and longest < "00:30:00", scale  # the longest run's bar: minutes, not days
    d.save_screenshot(str(world["root"] / "grid_mjoin_demo.png"))


def _mjoin_page(world, query: str = ""):
    By, d = _by(), world["driver"]
    d.get(f"{world['base']}/mjoin/{query}")
    return wait_for(d, lambda d: d.find_element(By.TAG_NAME, "h1").text == "mjoin" and d.find_element(By.TAG_NAME, "body"),
                    what="the mjoin page")


def test_the_mjoin_page_shows_deployed_and_failed_runs_with_one_line_reasons(world):
    By, d = _by(), world["driver"]
    body = _mjoin_page(world)  # the live lake: the run triggered with the defaults failed at prepare
    rows = d.find_elements(By.CSS_SELECTOR, "table.outcomes tr.outcome.failed")
    plain = next(r for r in rows if "nothing has landed for tpcds_returns_by_address" in r.text)
    assert "Traceback" not in body.text
    plain.find_element(By.CSS_SELECTOR, "a.errlog").click()
    text = wait_for(d, lambda d: d.find_element(By.TAG_NAME, "body").text, what="the whole error")
    assert "nothing has landed for tpcds_returns_by_address" in text

    # the demo's lake: its runs deployed; the edited run failed in its Spark join with the error's own line
    body = _mjoin_page(world, "?lake=demo&ns=live")
    deployed = d.find_elements(By.CSS_SELECTOR, "table.outcomes tr.outcome.deployed")
    assert deployed and ("active version: 1" in body.text or "active version: 2" in body.text)
    failed = next(r for r in d.find_elements(By.CSS_SELECTOR, "table.outcomes tr.outcome.failed")
                  if "spark-submit exit" in r.text)
    reason = failed.find_element(By.CSS_SELECTOR, "td.reason").text.splitlines()[0]
    assert reason == "spark-submit exit 1: org.apache.spark.SparkException: Could not parse Master URL: 'local[x]'"
    task_log = failed.find_element(By.CSS_SELECTOR, "a.tasklog").get_attribute("href")
    assert f"/dags/mjoin_reoptimize/runs/" in task_log and task_log.endswith("/tasks/join")
    failed.find_element(By.CSS_SELECTOR, "a.errlog").click()
    text = wait_for(d, lambda d: d.find_element(By.TAG_NAME, "body").text, what="the whole error")
    assert "Last spark-submit output" in text and "Could not parse Master URL" in text and len(text) > len(reason) * 3
    d.get(task_log)  # Airflow's page of the task: its log
    wait_for(d, lambda d: "join" in d.find_element(By.TAG_NAME, "body").text, what="the task's page")


def test_the_report_link_opens_the_evaluation_report(world):
    By, d = _by(), world["driver"]
    _mjoin_page(world, "?lake=demo&ns=live")
    link = next(a for a in d.find_elements(By.CSS_SELECTOR, "a.report") if "evaluation/index.html" in a.text)
    assert "eval/demo" in link.text
    link.click()
    wait_for(d, lambda d: d.find_element(By.TAG_NAME, "h1").text.startswith("mjoin evaluation"), what="the report")
    images = d.find_elements(By.TAG_NAME, "img")
    assert images and all(d.execute_script("return arguments[0].naturalWidth", img) > 0 for img in images)
    d.save_screenshot(str(world["root"] / "report.png"))
