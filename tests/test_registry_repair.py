"""A plan registry that validates and repairs, and a join job that survives a damaged one.

The reproduction: ``ACTIVE = {}`` (or ``{"version": null}``) killed the job with ``KeyError: 'version'`` at
every restart; ``plans activate`` and ``plans rollback`` crashed with the same traceback; ``plans activate``
took a plan ``plans publish`` refuses; one malformed version file made ``plans list`` exit 2. Now: activate and
rollback check the target as publish does, a damaged pointer is a clear error that ``plans repair`` (or an
activate) fixes, ``plans list`` marks what is damaged and lists the rest, and the streaming job keeps its last
good plan (logged once per change) with results equal to the interval run's.
"""
from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

from engine_helpers import TPCDS_TABLES, no_leaked_queries, replay_tpcds
from hostile_helpers import same_results
from mjoin import cli
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.runs import run_interval, run_stream
from mjoin.lake.layout import Lake
from mjoin.lake.registry import DamagedPointer, PlanRegistry, RegistryError
from mjoin.model.plan import PlanError, make_plan, orders_from_permutation

_ = no_leaked_queries
QUERY = "tpcds_returns_by_address"
DAMAGED = {"empty object": "{}", "null version": '{"version": null}', "string version": '{"version": "2"}',
           "a list": "[1]", "not JSON": "v2 please", "empty file": ""}


def plan_for(query, perm):
    return make_plan(query, orders_from_permutation(query, perm), "fixed")


def registry(lake: Lake, query, n: int = 3) -> PlanRegistry:
    reg = PlanRegistry(lake, query.name)
    perms = [["cu", "sr", "wr", "cr"], ["cr", "wr", "sr", "cu"], ["sr", "cu", "cr", "wr"]]
    for k in range(n):
        reg.activate(reg.publish(plan_for(query, perms[k % 3]), query=query), by="test")
    return reg


def damage(reg: PlanRegistry, text: str | None) -> None:
    path = os.path.join(reg.root, "ACTIVE")
    os.remove(path)
    if text is None:  # unreadable: a folder where the file should be
        os.makedirs(path)
    else:
        open(path, "w").write(text)


def invalid_version(reg: PlanRegistry, query) -> int:
    """A version file written by hand (no publish): valid JSON, but no probe order for stream cr."""
    doc = plan_for(query, ["cu", "sr", "wr", "cr"]).to_json()
    for g in doc["groups"]:
        g["orders"].pop("cr")
    v = reg.versions()[-1] + 1
    open(os.path.join(reg.root, f"v{v:06d}.json"), "w").write(json.dumps({**doc, "version": v}))
    return v


def plans(lake: Lake, *args) -> int:
    return cli.main(["plans", *args, "--query", QUERY, "--lake", lake.root])


@pytest.mark.parametrize("kind", list(DAMAGED) + ["unreadable"])
def test_a_damaged_pointer_is_a_clear_error_and_is_repaired(lake, seed_query, kind):
    reg = registry(lake, seed_query)
    damage(reg, DAMAGED.get(kind))
    with pytest.raises(DamagedPointer, match="ACTIVE pointer"):
        reg.active_version()
    assert "plans repair" in reg.pointer_problem() or kind == "unreadable"
    assert [h["version"] for h in reg.history()] == [1, 2, 3] and not any(h["active"] for h in reg.history())
    if kind == "unreadable":
        os.rmdir(os.path.join(reg.root, "ACTIVE"))
        return
    rec, changed = reg.repair(by="test", query=seed_query)  # the newest valid activation of the log
    assert (rec.version, rec.action, changed) == (3, "repair", True) and reg.active_version() == 3
    assert reg.repair(by="test", query=seed_query) == (rec, False)  # nothing to repair any more: kept
    assert reg.rollback(query=seed_query).version == 2  # the stack goes on from the repaired version


def test_activate_over_a_damaged_pointer_and_rollback_by_the_log(lake, seed_query):
    reg = registry(lake, seed_query)
    damage(reg, "{}")
    rec = reg.rollback(by="test", query=seed_query)  # the log says v3 was active: back to v2
    assert (rec.version, rec.previous) == (2, 3) and reg.active_version() == 2
    damage(reg, '{"version": null}')
    rec = reg.activate(1, by="test", query=seed_query)
    assert (rec.version, rec.previous) == (1, None) and reg.active_version() == 1


def test_activate_and_rollback_check_the_plan_as_publish_does(lake, seed_query):
    reg = registry(lake, seed_query, n=2)
    bad = invalid_version(reg, seed_query)
    with pytest.raises(PlanError, match="no probe order for stream cr"):
        reg.activate(bad, query=seed_query)
    with pytest.raises(PlanError, match="no probe order"):
        reg.publish(reg.get(bad), query=seed_query)  # (what publish says)
    assert reg.active_version() == 2
    open(os.path.join(reg.root, "v000001.json"), "w").write("{ torn")  # the version rollback would go to
    with pytest.raises(RegistryError, match="cannot roll back to v1"):
        reg.rollback(query=seed_query)
    assert reg.active_version() == 2
    # ACTIVE naming a version that cannot run: repair goes down the stack to a valid one, or removes ACTIVE
    damage(reg, json.dumps({"version": bad}))
    assert reg.repair(query=seed_query)[0].version == 2
    os.remove(os.path.join(reg.root, "v000002.json"))
    assert reg.repair(query=seed_query) == (None, True) and reg.active_record() is None  # nothing valid: no active plan


def test_plans_cli_lists_repairs_and_refuses(lake, seed_query, capsys):
    reg = registry(lake, seed_query)
    open(os.path.join(reg.root, "v000002.json"), "w").write("not a plan")
    with open(os.path.join(reg.root, "activations.jsonl"), "a") as fh:
        fh.write("{torn line\n")
    damage(reg, '{"version": null}')
    assert plans(lake, "list") == 0
    out = capsys.readouterr().out
    assert "v1 " in out and "v3 " in out and "v2    DAMAGED" in out and "ACTIVE DAMAGED" in out
    assert plans(lake, "list", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["active"] is None and "damaged" in doc["active_damaged"]
    assert [v["damaged"] is not None for v in doc["versions"]] == [False, True, False]
    assert len(doc["activations"]) == 3  # the torn line skipped
    assert plans(lake, "activate", "--version", "2") == 2  # a damaged version is refused, with the reason
    assert "not JSON" in capsys.readouterr().err
    assert plans(lake, "repair") == 0
    assert "ACTIVE -> v3" in capsys.readouterr().out and reg.active_version() == 3
    assert plans(lake, "rollback") == 2  # to v2, which is damaged: refused
    assert "cannot roll back to v2" in capsys.readouterr().err and reg.active_version() == 3
    damage(reg, "{}")
    assert plans(lake, "activate", "--version", "1") == 0 and reg.active_version() == 1
    assert "v1 (no valid ACTIVE before)" in capsys.readouterr().out  # (it said "was vNone")
    bad = invalid_version(reg, seed_query)
    assert plans(lake, "activate", "--version", str(bad)) == 2
    assert "no probe order for stream cr" in capsys.readouterr().err and reg.active_version() == 1


# ---- the streaming job ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    stage = Lake(str(tmp_path_factory.mktemp("staging") / "lake"))
    info = replay_tpcds(stage, 0.01, rate=10.0, arrival_cycle=60)
    return stage, info


@pytest.mark.spark
def test_the_job_keeps_its_last_good_plan_and_logs_once(spark, staged, seed_query, tmp_path, monkeypatch, caplog):
    """ACTIVE damaged after the first batch: every later batch runs v2 (recorded as ``plan_error``, logged once);
    a restart with the pointer still damaged runs the plan of the last committed batch; ``plans repair`` fixes the
    pointer. The results are the interval run's."""
    from mjoin.engine import stream

    stage, info = staged
    lake = Lake(str(tmp_path / "lake"))
    shutil.copytree(stage.streams(), lake.streams())
    reg = registry(lake, seed_query, n=2)
    process = stream.StreamJob.process

    def damage_after_first(self, df, batch_id):
        process(self, df, batch_id)
        if batch_id == 0:
            damage(reg, '{"version": null}')

    monkeypatch.setattr(stream.StreamJob, "process", damage_after_first)
    n_files = sum(len(lake.stream_files(t)) for t in TPCDS_TABLES)
    cap = -(-n_files // 6)
    caplog.set_level(logging.ERROR, logger="mjoin.engine.stream")
    half = [a for a in lake.arrivals("customer")][len(lake.arrivals("customer")) // 2:]
    held = tmp_path / "held"  # the second half lands after a restart
    for t in TPCDS_TABLES:
        for a in lake.arrivals(t):
            if a >= half[0]:
                (held / t).mkdir(parents=True, exist_ok=True)
                shutil.move(lake.arrival_dir(t, a), held / t / f"arrival={a}")
    s1 = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=cap))
    first = read_metrics(lake, seed_query.name)
    assert len(s1.batches) >= 2 and first[0]["plan_error"] is None
    assert all(r["plan_version"] == 2 and r["plan_source"] == "registry" for r in first)
    assert all("ACTIVE pointer" in r["plan_error"] for r in first[1:])
    logged = [m for m in caplog.messages if "ACTIVE pointer" in m]
    assert len(logged) == 1, logged  # once, not per batch

    monkeypatch.setattr(stream.StreamJob, "process", process)
    for t in TPCDS_TABLES:  # the rest lands; the job restarts with the pointer still damaged
        for d in sorted((held / t).iterdir()) if (held / t).exists() else ():
            shutil.move(str(d), lake.arrival_dir(t, int(d.name.split("=")[1])))
    caplog.clear()
    run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=cap // 2 + 1))
    after = [r for r in read_metrics(lake, seed_query.name) if r["batch_id"] > first[-1]["batch_id"]]
    assert after and all(r["plan_version"] == 2 and r["plan_error"] for r in after)
    assert len([m for m in caplog.messages if "ACTIVE pointer" in m]) == 1
    # repaired from the CLI: v2, the newest valid activation on the log
    assert plans(lake, "repair") == 0 and reg.active_version() == 2
    out = tmp_path / "interval"
    start, end = info["start"] - 3600, info["end"] + 60
    run_interval(spark, seed_query, None, lake, start, end, end - start, str(out), config=EngineConfig(buckets=4))
    same_results(lake, str(out), seed_query, "a damaged ACTIVE while streaming, a restart")


def test_readers_of_the_registry_report_a_damaged_pointer_and_go_on(lake, seed_query):
    """The mjoin page, its JSON, the drift watcher and a run's outcome read ACTIVE only to report it: a damaged
    one is shown with how to repair it, never a crashed page or task."""
    from mjoin.loop import drift, ui

    reg = registry(lake, seed_query)
    damage(reg, "{}")
    assert reg.active_version_or_none() == (None, reg.pointer_problem())
    info = ui.registry_json(lake)[QUERY]
    assert info["active"] is None and "plans repair" in info["damaged_pointer"]
    assert [v["version"] for v in info["versions"]] == [1, 2, 3]
    page = ui.registry_page(lake)
    assert "ACTIVE pointer" in page and "plans repair" in page
    found = drift.detect(lake, QUERY)
    assert found["active_version"] is None and "plans repair" in found["damaged_pointer"] and not found["drift"]
    reg.repair(by="test", query=seed_query)
    assert ui.registry_json(lake)[QUERY]["damaged_pointer"] is None and reg.active_version_or_none() == (3, None)
