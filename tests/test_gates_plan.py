"""Plan gate: valid and better plans pass, not-better plans are "no change", bad plans fail exactly."""
from __future__ import annotations

import copy
import math
from itertools import permutations

import pytest

from mjoin.gates.config import GateConfig
from mjoin.gates.result import GateFailed
from mjoin.gates.plan import check_plan
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.lake.registry import PlanRegistry
from test_gates_support import cycle_iso, snapshot


def paper_cost(query, stats):
    """Cost of a plan under ``stats`` (docs/algorithms.md Eq. 1-8, one attribute class, rho = 1, sorted-array
    state f = log): sum over streams of lambda_s x C(order of s), per group. Written here, independently
    of the optimizer's module, to drive the gate's improvement rule."""
    def order_cost(pairs, g):
        c = 0.0
        for l, r in reversed(pairs):
            c = math.log(max(stats.kappa(r, g), 2.0)) + stats.gamma(l, r, g) * (0.5 * stats.mu(l, r, g) + c)
        return c

    def cost(plan):
        return sum(stats.lam(s, g) * order_cost(pairs, g) for g in plan.group_ids for s, pairs in plan.orders[g].items())
    return cost


@pytest.fixture(scope="module")
def stats(seed_query):
    return snapshot(seed_query, cycle_iso(12), kind="forecast")


@pytest.fixture(scope="module")
def cost_fn(seed_query, stats):
    return paper_cost(seed_query, stats)


@pytest.fixture(scope="module")
def ranked(seed_query, cost_fn):
    """All 24 fixed-order plans, cheapest first (an exhaustive optimizer, for the test)."""
    plans = [make_plan(seed_query, orders_from_permutation(seed_query, p), "fixedOrder") for p in
             permutations(seed_query.stream_names)]
    return sorted(plans, key=cost_fn)


def test_first_deploy_passes(seed_query, ranked, cost_fn):
    res = check_plan(seed_query, ranked[0], active=None, cost_fn=cost_fn)
    assert res.status == "passed", res.summary()
    assert res.details["improvement"] is None and "first deploy" in " ".join(res.details["notes"])
    assert res.details["estimated_cost"] == pytest.approx(cost_fn(ranked[0]))


def test_better_plan_passes_with_its_improvement(seed_query, ranked, cost_fn):
    best, worst = ranked[0], ranked[-1]
    res = check_plan(seed_query, best, active=worst, cost_fn=cost_fn)
    expected = (cost_fn(worst) - cost_fn(best)) / cost_fn(worst)
    assert expected > 0.05  # the data makes the orders differ
    assert res.status == "passed", res.summary()
    assert res.details["improvement"] == pytest.approx(expected)
    assert res.details["diff"]  # the changed orders are listed


def test_same_plan_is_no_change_not_failure(seed_query, ranked, cost_fn):
    res = check_plan(seed_query, ranked[0], active=copy.deepcopy(ranked[0]), cost_fn=cost_fn)
    assert res.status == "no_change" and res.ok and not res.passed
    assert res.failed_expectations == []
    assert res.no_change_expectations == ["plan.improves_on_active"]
    assert res.raise_for_status() is res  # no_change does not raise
    assert "no change: plan.improves_on_active" in res.summary()
    assert "same orders as the active plan" in " ".join(res.details["notes"])


def test_small_improvement_is_no_change_until_threshold_lowered(seed_query, ranked, cost_fn):
    costs = [cost_fn(p) for p in ranked]
    # the cheapest plan whose improvement over the next more expensive one is below 5 %
    i = next(i for i in range(len(ranked) - 1) if 0 < (costs[i + 1] - costs[i]) / costs[i + 1] < 0.05)
    improvement = (costs[i + 1] - costs[i]) / costs[i + 1]
    res = check_plan(seed_query, ranked[i], active=ranked[i + 1], cost_fn=cost_fn)
    assert res.status == "no_change"
    assert res.failures[0].values[0]["improvement"] == pytest.approx(improvement)
    lower = GateConfig.from_dict({"improvement_threshold": improvement / 2})
    assert check_plan(seed_query, ranked[i], active=ranked[i + 1], cost_fn=cost_fn, config=lower).status == "passed"


def test_worse_plan_is_no_change(seed_query, ranked, cost_fn):
    res = check_plan(seed_query, ranked[-1], active=ranked[0], cost_fn=cost_fn)
    assert res.status == "no_change" and res.details["improvement"] < 0


def _doc(plan):
    return copy.deepcopy(plan.to_json())


def test_invalid_order_fails(seed_query, ranked, cost_fn):
    doc = _doc(ranked[0])
    doc["groups"][0]["orders"]["cu"] = [["sr", "wr"], ["cu", "sr"], ["cu", "cr"]]  # sr not yet joined at step 1
    res = check_plan(seed_query, doc, active=ranked[-1], cost_fn=cost_fn)
    assert res.failed_expectations == ["plan.valid_for_query"]
    assert "sr is not yet in the partial result" in res.failures[0].rendered[0]
    assert {s["expectation"] for s in res.details["skipped"]} == {"plan.estimated_cost_finite", "plan.improves_on_active"}
    with pytest.raises(GateFailed) as exc:
        res.raise_for_status()
    assert exc.value.result is res


def test_incomplete_and_missing_orders_fail(seed_query, ranked, cost_fn):
    doc = _doc(ranked[0])
    doc["groups"][0]["orders"]["wr"] = doc["groups"][0]["orders"]["wr"][:2]
    del doc["groups"][0]["orders"]["cr"]
    res = check_plan(seed_query, doc, active=None, cost_fn=cost_fn)
    assert res.failed_expectations == ["plan.every_stream_has_complete_order", "plan.valid_for_query"]
    orders = next(f for f in res.failures if f.expectation == "plan.every_stream_has_complete_order")
    assert orders.count == 2
    assert sorted(v["where"] for v in orders.values) == ["[cr] g0", "[wr] g0"]
    assert "order[cr] g0 = (none)" in orders.rendered


def test_plan_for_another_query(seed_query, two_class_query):
    other = make_plan(two_class_query, orders_from_permutation(two_class_query, ["sr", "cu", "wr", "cr"]), "fixedOrder",
                      estimated_cost=1.0)
    res = check_plan(seed_query, other)
    assert res.failed_expectations == ["plan.for_this_query"]
    assert res.failures[0].rendered == [f"plan is for query {two_class_query.name}"]


def test_plan_for_another_version_of_the_spec(seed_query, ranked, cost_fn):
    doc = _doc(ranked[0])
    doc["query_fingerprint"] = "0123456789abcdef"
    res = check_plan(seed_query, doc, cost_fn=cost_fn)
    assert res.failed_expectations == ["plan.same_spec_version"]


def test_not_a_plan(seed_query, ranked, tmp_path):
    doc = _doc(ranked[0])
    doc["groups"][0]["orders"]["cu"] = "cu,sr,wr,cr"
    res = check_plan(seed_query, doc)
    assert res.failed_expectations == ["plan.schema_valid"]
    assert res.evaluated == ["plan.schema_valid"]
    p = tmp_path / "plan.json"
    p.write_text("[1, 2")
    assert check_plan(seed_query, str(p)).failed_expectations == ["plan.schema_valid"]


def test_non_finite_or_failing_cost(seed_query, ranked, cost_fn):
    res = check_plan(seed_query, ranked[0], active=ranked[-1], cost_fn=lambda p: float("nan"))
    assert res.failed_expectations == ["plan.estimated_cost_finite"]

    def broken(plan):
        raise KeyError("kappa of cu")

    res = check_plan(seed_query, ranked[0], active=ranked[-1], cost_fn=broken)
    assert res.failed_expectations == ["plan.estimated_cost_finite"]
    assert any("KeyError" in n for n in res.details["notes"])
    # no cost model and no recorded estimate: nothing to compare, so the plan cannot pass
    assert check_plan(seed_query, ranked[0]).failed_expectations == ["plan.estimated_cost_finite"]


def test_recorded_estimates_when_no_cost_function(seed_query):
    a = make_plan(seed_query, orders_from_permutation(seed_query, ["cu", "sr", "wr", "cr"]), "x", estimated_cost=10.0)
    b = make_plan(seed_query, orders_from_permutation(seed_query, ["wr", "sr", "cu", "cr"]), "y", estimated_cost=8.0)
    res = check_plan(seed_query, b, active=a)
    assert res.status == "passed" and res.details["improvement"] == pytest.approx(0.2)
    assert any("recorded estimated_cost" in n for n in res.details["notes"])


def test_active_plan_from_the_registry(seed_query, ranked, cost_fn, lake):
    reg = PlanRegistry(lake, seed_query.name)
    reg.activate(reg.publish(ranked[0]), by="test")
    active = reg.active(seed_query)
    assert check_plan(seed_query, ranked[0], active=active, cost_fn=cost_fn).status == "no_change"
    assert check_plan(seed_query, ranked[-1], active=active, cost_fn=cost_fn).status == "no_change"
    reg.activate(reg.publish(ranked[-1]), by="test")
    assert check_plan(seed_query, ranked[0], active=reg.active(seed_query), cost_fn=cost_fn).status == "passed"


def test_active_plan_no_longer_valid_does_not_block(seed_query, ranked, cost_fn):
    stale = copy.deepcopy(ranked[0])
    stale.orders[0]["cu"] = stale.orders[0]["cu"][:1]
    res = check_plan(seed_query, ranked[0], active=stale, cost_fn=cost_fn)
    assert res.status == "passed"
    assert any("not valid for the query any more" in n for n in res.details["notes"])


def test_partitioned_plan(seed_query):
    stats = snapshot(seed_query, cycle_iso(12), kind="forecast", groups=(0, 1))
    cost = paper_cost(seed_query, stats)
    orders = {0: orders_from_permutation(seed_query, ["cu", "sr", "wr", "cr"]),
              1: orders_from_permutation(seed_query, ["cr", "wr", "sr", "cu"])}
    rule = {"method": "hash", "attr_class": "c0", "groups": 2}
    plan = make_plan(seed_query, orders, "pmjoin", partitioning=rule)
    res = check_plan(seed_query, plan, cost_fn=cost)
    assert res.status == "passed", res.summary()
    doc = _doc(plan)
    doc["groups"] = doc["groups"][:1]  # group 1 lost
    res = check_plan(seed_query, doc, cost_fn=cost)
    assert res.failed_expectations == ["plan.valid_for_query"]
    assert "key groups [0]" in res.failures[0].rendered[0]


def test_prefilter_on_two_classes_is_invalid(two_class_query):
    plan = make_plan(two_class_query, orders_from_permutation(two_class_query, ["sr", "cu", "wr", "cr"]), "smj",
                     estimated_cost=1.0)
    assert check_plan(two_class_query, plan).status == "passed"
    plan.options = {"prefilter": True}
    res = check_plan(two_class_query, plan)
    assert res.failed_expectations == ["plan.valid_for_query"]
    assert "single attribute class" in res.failures[0].rendered[0]
