"""Plan registry: versions, lineage, atomic ACTIVE, rollback, concurrent publishers."""
import json
import multiprocessing as mp

import pytest

from mjoin.lake.layout import Lake
from mjoin.model.plan import PlanError, make_plan, orders_from_permutation
from mjoin.lake.registry import PlanRegistry, RegistryError


def plan_for(query, perm):
    return make_plan(query, orders_from_permutation(query, perm), "fixed")


def test_publish_activate_rollback(lake, seed_query):
    reg = PlanRegistry(lake, seed_query.name)
    assert reg.active() is None and reg.versions() == []
    v1 = reg.publish(plan_for(seed_query, ["cu", "sr", "wr", "cr"]), {"run": "r1", "statistics": "s1"})
    v2 = reg.publish(plan_for(seed_query, ["cr", "wr", "sr", "cu"]), {"run": "r2"})
    assert (v1, v2) == (1, 2)
    assert reg.active() is None  # publishing does not activate
    reg.activate(1, by="r1")
    reg.activate(2, by="r2")
    assert reg.active(seed_query).version == 2
    assert reg.lineage(1)["statistics"] == "s1"
    rec = reg.rollback(by="test")
    assert rec.version == 1 and rec.previous == 2
    assert reg.active_version() == 1
    assert [a["version"] for a in reg.activations()] == [1, 2, 1]
    hist = reg.history()
    assert [h["active"] for h in hist] == [True, False]


def test_errors(lake, seed_query, two_class_query):
    reg = PlanRegistry(lake, seed_query.name)
    with pytest.raises(RegistryError, match="nothing to roll back"):
        reg.rollback()
    with pytest.raises(RegistryError, match="no such version"):
        reg.activate(3)
    with pytest.raises(PlanError, match="registry is for"):
        reg.publish(plan_for(two_class_query, ["sr", "cu", "wr", "cr"]))


def test_namespaces_are_separate(tmp_path, seed_query):
    live = PlanRegistry(Lake(str(tmp_path)), seed_query.name)
    evaluation = PlanRegistry(Lake(str(tmp_path), namespace="eval/backfill1"), seed_query.name)
    live.activate(live.publish(plan_for(seed_query, ["cu", "sr", "wr", "cr"])))
    evaluation.publish(plan_for(seed_query, ["cr", "wr", "sr", "cu"]))
    assert live.versions() == [1] and evaluation.versions() == [1]
    assert evaluation.active() is None and live.active_version() == 1


def _publish_many(root, name, n, out):
    from mjoin.model.query import load_query

    q = load_query(name)
    reg = PlanRegistry(Lake(root), q.name)
    got = []
    for _ in range(n):
        v = reg.publish(plan_for(q, ["cu", "sr", "wr", "cr"]))
        reg.activate(v, by=str(v))
        got.append(v)
    out.put(got)


def test_concurrent_publishers_never_collide(tmp_path, seed_query):
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_publish_many, args=(str(tmp_path), seed_query.name, 15, out)) for _ in range(3)]
    for p in procs:
        p.start()
    versions = sorted(v for _ in procs for v in out.get(timeout=60))
    for p in procs:
        p.join()
    assert versions == list(range(1, 46))  # every publish got its own version
    reg = PlanRegistry(Lake(str(tmp_path)), seed_query.name)
    assert len(reg.activations()) == 45  # no activation lost
    active = json.loads((tmp_path / "plans" / seed_query.name / "ACTIVE").read_text())
    assert active["version"] in versions


def test_rolling_back_twice_never_returns_to_a_rolled_back_version(lake, seed_query):
    reg = PlanRegistry(lake, seed_query.name)
    for perm in (["cu", "sr", "wr", "cr"], ["cr", "wr", "sr", "cu"], ["sr", "cu", "wr", "cr"]):
        reg.activate(reg.publish(plan_for(seed_query, perm)), by="run")
    assert reg.active_version() == 3
    first = reg.rollback(by="op")
    assert (first.version, first.previous, first.action) == (2, 3, "rollback")
    second = reg.rollback(by="op")
    assert (second.version, second.previous) == (1, 2)  # not back to the bad v3
    with pytest.raises(RegistryError, match="nothing to roll back to"):
        reg.rollback()
    assert reg.active_version() == 1
    # a new activation after rollbacks: rollback undoes it, back to v1 (v2 and v3 were undone)
    reg.activate(3, by="op", reason="fixed after all")
    assert reg.rollback().version == 1
    assert [(a["action"], a["version"]) for a in reg.activations()] == [
        ("activate", 1), ("activate", 2), ("activate", 3), ("rollback", 2), ("rollback", 1), ("activate", 3),
        ("rollback", 1)]


def test_manual_activation_in_between_is_not_undone_by_an_expected_rollback(lake, seed_query):
    reg = PlanRegistry(lake, seed_query.name)
    v1 = reg.publish(plan_for(seed_query, ["cu", "sr", "wr", "cr"]))
    v2 = reg.publish(plan_for(seed_query, ["cr", "wr", "sr", "cu"]))
    reg.activate(v1)
    reg.activate(v2, by="dag run")  # what a run deployed
    reg.activate(v1, by="operator", reason="manual")  # an operator changed it meanwhile
    with pytest.raises(RegistryError, match="not rolled back: the active version is v1, not v2"):
        reg.rollback(by="dag run", expect_active=v2)
    assert reg.active_version() == v1 and len(reg.activations()) == 3
    assert reg.rollback(expect_active=v1).version == v2  # still undoes the last activation when it matches


def test_activating_the_active_version_again_is_not_a_new_rollback_step(lake, seed_query):
    reg = PlanRegistry(lake, seed_query.name)
    v1 = reg.publish(plan_for(seed_query, ["cu", "sr", "wr", "cr"]))
    v2 = reg.publish(plan_for(seed_query, ["cr", "wr", "sr", "cu"]))
    reg.activate(v1)
    reg.activate(v2)
    reg.activate(v2)
    assert reg.activation_stack() == [1, 2]
    assert reg.rollback().version == v1


def test_rollback_trusts_active_when_the_log_missed_the_last_change(lake, seed_query):
    """ACTIVE is replaced before the log is appended; a crash in between leaves the log one change behind."""
    reg = PlanRegistry(lake, seed_query.name)
    v1 = reg.publish(plan_for(seed_query, ["cu", "sr", "wr", "cr"]))
    v2 = reg.publish(plan_for(seed_query, ["cr", "wr", "sr", "cu"]))
    reg.activate(v1)
    reg.activate(v2)
    log = lake.plans(seed_query.name) + "/activations.jsonl"
    lines = open(log).read().splitlines()
    open(log, "w").write(lines[0] + "\n")  # the v2 line was lost
    assert reg.rollback().version == v1 and reg.active_version() == v1


def test_plans_rollback_command_twice_and_with_expected_version(lake, seed_query, capsys):
    from mjoin.cli import main

    reg = PlanRegistry(lake, seed_query.name)
    for perm in (["cu", "sr", "wr", "cr"], ["cr", "wr", "sr", "cu"], ["sr", "cu", "wr", "cr"]):
        reg.activate(reg.publish(plan_for(seed_query, perm)))
    common = ["--query", seed_query.name, "--lake", lake.root]
    assert main(["plans", "rollback", *common, "--version", "2"]) == 2  # v3 is active, not v2: refused
    assert "not rolled back: the active version is v3, not v2" in capsys.readouterr().err
    assert main(["plans", "rollback", *common]) == 0 and main(["plans", "rollback", *common]) == 0
    assert "back to v1 (was v2)" in capsys.readouterr().out and reg.active_version() == 1
