"""The plan format: JSON Schema, validation against the query, the fixed-order rule."""
import json
from itertools import permutations

import pytest

from mjoin.model.plan import Plan, PlanError, load_plan, make_plan, orders_from_permutation

PERM = ["cu", "sr", "wr", "cr"]


def test_fixed_orders_follow_the_permutation(seed_query):
    orders = orders_from_permutation(seed_query, ["sr", "cr", "cu", "wr"])
    assert [r for _, r in orders["cu"]] == ["sr", "cr", "wr"]
    assert [r for _, r in orders["sr"]] == ["cr", "cu", "wr"]
    assert all(l == "sr" for l, _ in orders["sr"])  # the new tuple's own stream joins everything in K4


def test_all_24_fixed_plans_are_valid(seed_query):
    for perm in permutations(PERM):
        plan = make_plan(seed_query, orders_from_permutation(seed_query, perm), "fixed")
        assert plan.problems(seed_query) == []


def test_fixed_order_defers_streams_not_yet_adjacent(two_class_query):
    orders = orders_from_permutation(two_class_query, ["wr", "cr", "sr", "cu"])
    # sr only joins cu: from sr, wr and cr must wait until cu is in the partial result
    assert orders["sr"] == [("sr", "cu"), ("cu", "wr"), ("cu", "cr")]
    assert orders["wr"] == [("wr", "cr"), ("wr", "cu"), ("cu", "sr")]


def test_json_roundtrip_and_schema(seed_query, tmp_path):
    plan = make_plan(seed_query, orders_from_permutation(seed_query, PERM), "fixed",
                     costs={"cu": 1.5, "sr": 2.0, "wr": 0.5, "cr": 1.0}, source={"statistics": "x.json"},
                     estimated_cost=5.0)
    path = plan.save(tmp_path / "p.json")
    back = load_plan(path, seed_query)
    assert back.orders == plan.orders and back.costs == plan.costs
    assert back.query_fingerprint == seed_query.fingerprint
    assert back.same_orders(plan)
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 1 and doc["groups"][0]["orders"]["cu"][0] == ["cu", "sr"]


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(schema_version=2), "schema_version"),
    (lambda d: d.pop("strategy"), "'strategy' is a required property"),
    (lambda d: d["groups"][0]["orders"]["cu"].__setitem__(0, ["cu"]), "groups/0/orders/cu/0"),
    (lambda d: d.update(colour="red"), "Additional properties"),
])
def test_schema_errors(seed_query, mutate, words):
    doc = make_plan(seed_query, orders_from_permutation(seed_query, PERM), "fixed").to_json()
    mutate(doc)
    with pytest.raises(PlanError, match=words):
        Plan.from_json(doc)


@pytest.mark.parametrize("mutate, words", [
    (lambda p: p.orders[0].pop("wr"), "no probe order for stream wr"),
    (lambda p: p.orders[0].__setitem__("zz", [("zz", "cu")]), "unknown stream 'zz'"),
    (lambda p: p.orders[0].__setitem__("cu", [("cu", "sr"), ("cu", "sr"), ("cu", "cr")]), "already in the partial result"),
    (lambda p: p.orders[0].__setitem__("cu", [("cu", "sr"), ("cu", "wr")]), "never reaches cr"),
    (lambda p: setattr(p, "query", "other_query"), "plan is for query 'other_query'"),
    (lambda p: setattr(p, "partitioning", {"method": "hash", "attr_class": "c0", "groups": 2}), "defines [0, 1]"),
    (lambda p: setattr(p, "partitioning", {"method": "hash", "attr_class": "c9", "groups": 1}), "not a class"),
])
def test_invalid_plans_name_the_problem(seed_query, mutate, words):
    plan = make_plan(seed_query, orders_from_permutation(seed_query, PERM), "fixed")
    mutate(plan)
    with pytest.raises(PlanError) as info:
        plan.validate(seed_query)
    assert words in str(info.value)


def test_order_through_missing_edge_is_rejected(two_class_query):
    orders = orders_from_permutation(two_class_query, ["sr", "cu", "wr", "cr"])
    orders["sr"] = [("sr", "wr"), ("sr", "cu"), ("cu", "cr")]
    with pytest.raises(PlanError, match="no join predicate connects sr and wr"):
        make_plan(two_class_query, orders, "manual")


def test_prefilter_needs_one_class(two_class_query, seed_query):
    orders = orders_from_permutation(two_class_query, ["sr", "cu", "wr", "cr"])
    with pytest.raises(PlanError, match="single attribute class"):
        make_plan(two_class_query, orders, "fixed", options={"prefilter": True})
    assert make_plan(seed_query, orders_from_permutation(seed_query, PERM), "fixed", options={"prefilter": True}).prefilter


def test_partitioned_plan_and_diff(seed_query):
    base = orders_from_permutation(seed_query, PERM)
    other = orders_from_permutation(seed_query, list(reversed(PERM)))
    plan = make_plan(seed_query, {0: base, 1: other}, "exact",
                     partitioning={"method": "hash", "attr_class": "c0", "groups": 2})
    assert plan.group_ids == [0, 1]
    assert plan.probe_sequence("cu", 1) == ["cr", "wr", "sr"]
    flat = make_plan(seed_query, base, "fixed")
    changes = flat.diff(make_plan(seed_query, other, "fixed"))
    assert "group 0 cu: cr,wr,sr -> sr,wr,cr" in changes
    assert flat.diff(flat) == []


def test_load_plan_file_errors(tmp_path, seed_query):
    with pytest.raises(PlanError, match="no such plan file"):
        load_plan(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(PlanError, match="not JSON"):
        load_plan(bad)
