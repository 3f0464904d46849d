"""The gates as GX users know them (mjoin.gates.gxproject): a Checkpoint per gate in a file-backed context the
lake owns, stored validation results, Data Docs rebuilt by the checkpoint's action, severities; a missing or
broken context is recreated with a clear log line and never fails a gate."""
from __future__ import annotations

import json
import logging
import os
import re
import time
from pathlib import Path

import great_expectations as gx
import pytest

from mjoin.gates import gxproject
from mjoin.gates.config import GateConfig
from mjoin.gates.stats import check_statistics
from mjoin.gates.suites import severities
from test_gates_support import CYCLE, cycle_iso, history, select

SITE = ("uncommitted", "data_docs", "local_site")


@pytest.fixture
def bad_and_good(seed_query):
    good = history(seed_query, 12)
    bad = good.copy()
    bad.loc[select(bad, entity="edge", stream="wr", right="cu", cycle=cycle_iso(11)), "gamma"] = -0.1
    return bad, good


@pytest.fixture(autouse=True)
def fresh_projects():
    """Each test opens its contexts as a new process would."""
    gxproject._projects.clear()
    yield
    gxproject._projects.clear()


def stored(root: Path, run: str = "", **more) -> GateConfig:
    return GateConfig.from_dict({"results_store": str(root), "results_run": run, **more})


def run_stats(query, frame, cfg=None):
    return check_statistics(query, frame, cycle_iso(10), cycle_iso(12), CYCLE, config=cfg)


def page_text(result) -> str:
    docs = result.details["data_docs"]
    failing = [s for s, doc in result.gx_result.items() if not doc["success"]]
    return (Path(docs["site"]) / docs["pages"][failing[0]]).read_text()


def test_a_failed_gate_is_a_checkpoint_run_with_stored_results_and_its_data_docs_page(tmp_path, seed_query,
                                                                                   bad_and_good):
    bad, good = bad_and_good
    root = tmp_path / "lake" / "gx"
    fast = run_stats(seed_query, bad)
    res = run_stats(seed_query, bad, stored(root, "manual__2026-01-01T00:12:00+00:00"))
    # the verdict is the fast path's: the same failures, the same messages
    assert (res.status, res.failed_expectations) == (fast.status, fast.failed_expectations) == \
        ("failed", ["stats.gamma_in_unit_interval"])
    assert [f.rendered for f in res.failures] == [f.rendered for f in fast.failures]
    assert "data_docs" not in fast.details  # the fast path stores nothing
    docs = res.details["data_docs"]
    assert docs["checkpoint"] == f"mjoin.stats.{seed_query.name}" and docs["success"] is False
    assert docs["run_name"] == "manual__2026-01-01T00:12:00+00:00"
    # Data Docs name the failing expectation, its severity and the failing value
    text = page_text(res)
    assert "stats.gamma_in_unit_interval [critical]" in text and "-0.1" in text
    assert "data docs: " + str(Path(docs["site"]) / docs["pages"][f"mjoin.stats.values.{seed_query.name}"]) \
        in res.summary()
    index = (Path(docs["site"]) / "index.html").read_text()
    assert f"mjoin.stats.values.{seed_query.name}" in index

    # what a GX user sees opening the context: the checkpoint, its definitions, the stored results
    ctx = gx.get_context(mode="file", context_root_dir=str(root))
    cp = ctx.checkpoints.get(f"mjoin.stats.{seed_query.name}")
    assert sorted(d.name for d in cp.validation_definitions) == sorted(res.gx_result)
    assert [type(a).__name__ for a in cp.actions] == ["UpdateDataDocsAction"]
    keys = ctx.validation_results_store.list_keys()
    assert sorted(k.expectation_suite_identifier.name for k in keys) == sorted(res.gx_result)
    stored_doc = ctx.validation_results_store.get(next(k for k in keys if "values" in k.expectation_suite_identifier.name))
    assert stored_doc.meta["checkpoint_id"] == cp.id and stored_doc.success is False
    # a user can validate a frame with a stored definition: the suites are ours, severities included
    suite = ctx.suites.get(f"mjoin.stats.history.{seed_query.name}")
    assert [str(getattr(e.severity, "value", e.severity)) for e in suite.expectations] == ["warning"]

    # a gate that passes stores its results and, by default, renders no page (results_docs="failures")
    again = run_stats(seed_query, good, stored(root, "scheduled__2"))
    assert again.status == "passed" and again.details["data_docs"]["success"] is True
    assert again.details["data_docs"]["pages"] == {} and again.details["data_docs"]["stored"] == len(res.gx_result)
    assert len(gx.get_context(mode="file", context_root_dir=str(root)).validation_results_store.list_keys()) == \
        2 * len(res.gx_result)
    # only the failed validation's page was rendered for the failed run; "all" renders every one, "off" none
    assert list(docs["pages"]) == [f"mjoin.stats.values.{seed_query.name}"]
    every = run_stats(seed_query, good, stored(root, "all", results_docs="all")).details["data_docs"]["pages"]
    assert sorted(every) == sorted(res.gx_result) and all((Path(docs["site"]) / p).is_file() for p in every.values())
    assert run_stats(seed_query, bad, stored(root, "off", results_docs="off")).details["data_docs"]["pages"] == {}


def test_severities_critical_fails_warning_passes_and_both_are_in_data_docs(tmp_path, seed_query):
    sev = severities()
    assert {n for n, s in sev.items() if s == "warning"} == {"stats.history_long_enough", "forecast.has_recent_history"}
    assert set(sev.values()) == {"critical", "warning"}
    short = history(seed_query, 4, start=cycle_iso(8))
    res = run_stats(seed_query, short, stored(tmp_path / "gx"))
    assert (res.status, res.warning_expectations) == ("passed", ["stats.history_long_enough"])
    assert "stats.history_long_enough [warning]" in page_text(res)
    assert "data docs: " in res.summary()  # a warning is shown with its page, too


def test_a_warning_is_in_the_runs_links_and_on_the_mjoin_page(tmp_path, seed_query):
    from mjoin.lake.layout import Lake
    from mjoin.loop import links

    lake = Lake(str(tmp_path / "lake"))
    short = history(seed_query, 4, start=cycle_iso(8))
    warned = run_stats(seed_query, short, stored(Path(lake.gx())))
    clean = run_stats(seed_query, history(seed_query, 12), stored(Path(lake.gx()), results_docs="all"))
    assert (warned.status, clean.status, clean.warning_expectations) == ("passed", "passed", [])
    out = links.run_links(lake, seed_query.name, {"stats": warned.to_json(), "plan": clean.to_json()}, 1, base="")
    assert out["warnings"] == {"stats": ["stats.history_long_enough"]}  # the passed gate with pages: none
    assert set(out["data_docs"]) == {"stats", "plan"}
    page = links.links_html([{"interval_end": "e", "status": "deployed", "version": 1, "links": out}])
    assert 'title="stats.history_long_enough">stats (1 warning)</a>' in page and ">plan</a>" in page


def test_a_missing_context_is_created_and_one_deleted_under_a_process_is_recreated(tmp_path, seed_query, bad_and_good,
                                                                               caplog):
    bad, _ = bad_and_good
    root = tmp_path / "lake" / "gx"
    with caplog.at_level(logging.INFO, logger="mjoin.gates"):
        first = run_stats(seed_query, bad, stored(root))
    assert f"GX context created at {root}" in caplog.text and (root / "great_expectations.yml").is_file()
    import shutil

    shutil.rmtree(root)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="mjoin.gates"):
        second = run_stats(seed_query, bad, stored(root))
    assert f"the GX context at {root} is gone: a new one is created" in caplog.text
    assert second.status == first.status == "failed" and "error" not in second.details["data_docs"]
    assert "stats.gamma_in_unit_interval" in page_text(second)


@pytest.mark.parametrize("damage", ["config", "checkpoint", "suite"])
def test_a_corrupt_context_is_moved_aside_and_recreated_never_a_crashed_gate(tmp_path, seed_query, bad_and_good,
                                                                           caplog, damage):
    bad, _ = bad_and_good
    root = tmp_path / "lake" / "gx"
    run_stats(seed_query, bad, stored(root))
    gxproject._projects.clear()  # the next run is another process
    if damage == "config":
        (root / "great_expectations.yml").write_text("config_version: [\n  fluent_datasources: {{{")
    elif damage == "checkpoint":
        (root / "checkpoints" / f"mjoin.stats.{seed_query.name}.json").write_text('{"name": "mjoin.st')
    else:
        next((root / "expectations").rglob("*.json")).write_text("{ not json")
    with caplog.at_level(logging.INFO, logger="mjoin.gates"):
        res = run_stats(seed_query, bad, stored(root))
    assert res.status == "failed" and res.failed_expectations == ["stats.gamma_in_unit_interval"]
    assert "error" not in res.details["data_docs"], res.details["data_docs"]
    assert "stats.gamma_in_unit_interval" in page_text(res)
    moved = re.search(rf"the GX context at {re.escape(str(root))} could not be read \(\w+: .+\): moved to (\S+), "
                      "a new one is created", caplog.text)
    if damage == "checkpoint":  # only the checkpoint is written again: the context and its stored results stay
        assert f"the checkpoint mjoin.stats.{seed_query.name} in {root} could not be read" in caplog.text
        assert not moved and not list(root.parent.glob("gx.broken-*")), caplog.text
        kept = gx.get_context(mode="file", context_root_dir=str(root)).validation_results_store.list_keys()
        assert len(kept) == 2 * len(res.gx_result)  # the earlier run's results and this one's
    else:  # a context GX cannot read: moved aside, recreated, both said in the log
        assert moved and Path(moved.group(1)).is_dir() and "GX context recreated" in caplog.text
    # whatever was damaged, the context is readable by GX again
    ctx = gx.get_context(mode="file", context_root_dir=str(root))
    assert ctx.checkpoints.get(f"mjoin.stats.{seed_query.name}").validation_definitions


def test_a_context_that_cannot_be_written_leaves_the_verdict_and_says_why(tmp_path, seed_query, bad_and_good, caplog):
    bad, _ = bad_and_good
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the context's parent folder should be")
    with caplog.at_level(logging.ERROR, logger="mjoin.gates"):
        res = run_stats(seed_query, bad, stored(blocker / "gx"))
    assert res.status == "failed" and res.failed_expectations == ["stats.gamma_in_unit_interval"]
    assert res.details["data_docs"]["error"] and "the validation results were not stored" in caplog.text
    assert "data docs: not stored" in res.summary()


def test_old_results_are_pruned_and_their_pages_go_with_the_next_build(tmp_path, seed_query, bad_and_good):
    bad, good = bad_and_good
    root = tmp_path / "gx"
    old = run_stats(seed_query, bad, stored(root, "old"))
    old_page = Path(old.details["data_docs"]["site"]) / old.details["data_docs"]["pages"][
        f"mjoin.stats.values.{seed_query.name}"]
    assert old_page.is_file()
    project = gxproject.project(str(root))
    assert project.prune(keep_days=1, now=time.time() + 2 * 86400) == len(old.gx_result)
    assert project.prune(keep_days=1, now=time.time() + 2 * 86400 + 1) == 0  # at most once per PRUNE_EVERY ...
    assert gxproject.GXProject(str(root)).prune(keep_days=1, now=time.time() + 2 * 86400 + 2) == 0  # ... per context
    new = run_stats(seed_query, bad, stored(root, "new"))
    assert new.status == "failed" and not old_page.exists()  # the next build drops the page of a result that is gone
    keys = gx.get_context(mode="file", context_root_dir=str(root)).validation_results_store.list_keys()
    assert {k.run_id.run_name for k in keys} == {"new"}


def test_the_loop_stores_in_the_lake_and_can_be_turned_off(tmp_path, monkeypatch):
    from mjoin.lake.layout import Lake
    from mjoin.loop.config import LoopConfig

    lake = str(tmp_path / "lake")
    cfg = LoopConfig.from_params({"lake": lake}, run_id="scheduled__x")
    gc = cfg.gate_config()
    assert (gc.results_store, gc.results_run, gc.stores_results) == (Lake(lake).gx(), "scheduled__x", True)
    assert gc == GateConfig()  # storing is not a threshold: the suites stay shared (built once)
    back = LoopConfig.from_params({"lake": lake}, run_type="backfill").gate_config()
    assert back.results_store == Lake(lake, "eval/backfill").gx()
    assert not LoopConfig.from_params({"lake": lake, "gates": {"results_store": "off"}}).gate_config().stores_results
    monkeypatch.setenv("MJOIN_GATE_RESULTS", "off")
    assert not LoopConfig.from_params({"lake": lake}).gate_config().stores_results
