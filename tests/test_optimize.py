"""The optimizer entry point: strategies by name, plans (lineage, ablations, key groups),
getSequences, size limits and the ``python -m mjoin optimize`` command."""
import json
import random
from itertools import permutations

import pytest

from mjoin.cli import main
from mjoin.optimizer.cost import CostModel, JoinProblem, order_cost, plan_cost
from mjoin.optimizer.strategies import STRATEGIES, OptimizerError, compare, optimize, probe_orders
from mjoin.optimizer.dppick import dp_pick, get_sequences
from mjoin.optimizer.exact import exact_dp
from mjoin.optimizer.synthetic import query_from_edges, random_edges, random_statistics
from mjoin.model.plan import PlanError, load_plan
from mjoin.model.statistics import Statistics, StatisticsError


@pytest.fixture
def seed_stats(seed_query):
    return random_statistics(seed_query, random.Random(7))


def test_registry_lists_every_strategy_of_the_issue():
    assert {"fixed", "selectivity_first", "greedy", "dppick", "exact", "dppick_query", "dppick_match"} <= set(STRATEGIES)
    assert STRATEGIES["dppick_query"].ablation == "query" and STRATEGIES["dppick_match"].ablation == "match"
    assert STRATEGIES["fixed"].uses_initial_order and not STRATEGIES["exact"].uses_initial_order
    with pytest.raises(OptimizerError, match="unknown strategy 'best'"):
        optimize(None, None, "best")


def test_get_sequences_is_the_papers_dfs(seed_query, seed_stats):
    problem = JoinProblem.from_statistics(seed_query, seed_stats)
    # K4: edge by edge (Algorithm 4) every start has 3! orders x 1*2*3 choices of l = 36
    assert len(list(get_sequences(problem, 0, dedupe=False))) == 36
    # one per (r, class): every l of a class fetches the same key, so 3! = 6 remain
    deduped = list(get_sequences(problem, 0, dedupe=True))
    assert len(deduped) == 6 and len(list(get_sequences(problem))) == 24
    assert sorted(tuple(r for _, r in seq) for seq in deduped) == sorted(permutations([1, 2, 3]))
    model = CostModel()
    for s in range(4):
        full = min(order_cost(problem, model, s, seq) for seq in get_sequences(problem, s, dedupe=False))
        assert dp_pick(problem, model)[s][1] == pytest.approx(full)
        assert dp_pick(problem, model, dedupe=False)[s][1] == pytest.approx(full)


def test_probe_orders_from_the_query_alone(seed_query, two_class_query):
    orders = list(probe_orders(seed_query, "cu", dedupe=False))
    assert len(orders) == 36 and all(seed_query.expansion_error("cu", o) is None for o in orders)
    assert len(list(probe_orders(seed_query))) == 4 * 36
    # sr joins only cu (class c0); wr, cu, cr share class c1 (complete): from sr, cu comes
    # first, then wr and cr in either order, each through cu, or cr through wr (and vice versa)
    from_sr = list(probe_orders(two_class_query, "sr"))
    assert sorted(from_sr) == sorted([
        [("sr", "cu"), ("cu", "wr"), ("cu", "cr")], [("sr", "cu"), ("cu", "wr"), ("wr", "cr")],
        [("sr", "cu"), ("cu", "cr"), ("cu", "wr")], [("sr", "cu"), ("cu", "cr"), ("cr", "wr")]])
    assert len(list(probe_orders(two_class_query, "sr", dedupe=True))) == 2


def test_plan_lineage_and_validation(seed_query, seed_stats, tmp_path):
    plan = optimize(seed_query, seed_stats, "exact", source={"statistics": "s.json"})
    assert plan.source["statistics"] == "s.json" and plan.source["kind"] == "synthetic"
    assert plan.cost_model == CostModel().to_json() and plan.cost_model["calibrated"] is False
    assert plan.query_fingerprint == seed_query.fingerprint and plan.partitioning is None
    back = load_plan(plan.save(tmp_path / "p.json"), seed_query)
    assert back.same_orders(plan) and back.costs == plan.costs and back.group_costs == plan.group_costs
    assert back.estimated_cost == pytest.approx(sum(seed_stats.lam(s) * plan.cost(s) for s in seed_query.stream_names))
    assert plan_cost(seed_query, seed_stats, back) == pytest.approx(plan.estimated_cost)
    # a plan made for one query does not load for another
    with pytest.raises(PlanError, match="not 'tpcds_returns_by_customer_and_address'"):
        from mjoin.model.query import load_query
        load_plan(tmp_path / "p.json", load_query("tpcds_returns_by_customer_and_address"))


def test_fixed_uses_the_initial_order_and_records_it(seed_query, seed_stats):
    plan = optimize(seed_query, seed_stats, "fixed", initial_order=["wr", "cu", "cr", "sr"])
    assert plan.probe_sequence("cu") == ["wr", "cr", "sr"] and plan.probe_sequence("wr") == ["cu", "cr", "sr"]
    assert plan.source["initial_order"] == ["wr", "cu", "cr", "sr"]
    default = optimize(seed_query, seed_stats, "fixed")
    assert default.source["initial_order"] == seed_query.stream_names
    with pytest.raises(OptimizerError, match="initial order: cu,sr is not a permutation"):
        optimize(seed_query, seed_stats, "fixed", initial_order=["cu", "sr"])


def test_ablations_search_with_a_reduced_model_but_score_with_the_full_one(seed_query, seed_stats):
    model = CostModel(alpha_q=1.0, alpha_m=5.0)
    plan = optimize(seed_query, seed_stats, "dppick_query", cost_model=model)
    assert plan.cost_model["alpha_m"] == 5.0 and plan.cost_model["search_model"]["alpha_m"] == 0.0
    problem = JoinProblem.from_statistics(seed_query, seed_stats)
    for s in seed_query.stream_names:
        pairs = [(problem.index[l], problem.index[r]) for l, r in plan.order(s)]
        assert plan.cost(s) == pytest.approx(order_cost(problem, model, problem.index[s], pairs))
    # the order is optimal for the reduced model
    reduced = optimize(seed_query, seed_stats, "exact", cost_model=model.query_only())
    for s in seed_query.stream_names:
        pairs = [(problem.index[l], problem.index[r]) for l, r in plan.order(s)]
        assert order_cost(problem, model.query_only(), problem.index[s], pairs) == pytest.approx(reduced.cost(s))


def test_partitioned_statistics_give_one_order_set_per_group(seed_query):
    stats = random_statistics(seed_query, random.Random(3), groups=3)
    plan = optimize(seed_query, stats, "exact")
    assert plan.partitioning == stats.partitioning and plan.group_ids == [0, 1, 2]
    for g in range(3):
        problem = JoinProblem.from_statistics(seed_query, stats, g)
        best = exact_dp(problem, CostModel())
        for s in seed_query.stream_names:
            assert plan.cost(s, g) == pytest.approx(best[problem.index[s]][1])
        assert plan.group_costs[g] == pytest.approx(sum(stats.lam(s, g) * plan.cost(s, g) for s in seed_query.stream_names))
    assert plan.estimated_cost == pytest.approx(sum(plan.group_costs.values()))
    assert plan_cost(seed_query, stats, plan) == pytest.approx(plan.estimated_cost)
    # plans per group differ when the groups' statistics differ (they do here)
    assert len({json.dumps(plan.orders[g], sort_keys=True) for g in range(3)}) > 1


def test_partitioning_must_match_the_statistics(seed_query):
    stats = random_statistics(seed_query, random.Random(3), groups=2)
    with pytest.raises(StatisticsError, match="not of"):
        optimize(seed_query, stats, "exact", partitioning={"method": "hash", "attr_class": "c0", "groups": 3})
    stats.partitioning = None
    with pytest.raises(StatisticsError, match="no partitioning rule says"):
        optimize(seed_query, stats, "exact")
    plan = optimize(seed_query, stats, "exact", partitioning={"method": "hash", "attr_class": "c0", "groups": 2})
    assert plan.group_ids == [0, 1]
    with pytest.raises(StatisticsError, match=r"no key group\(s\) \[2\]"):
        optimize(seed_query, stats, "exact", partitioning={"method": "hash", "attr_class": "c0", "groups": 3})


def test_bad_statistics_are_rejected_by_name(seed_query, seed_stats):
    del seed_stats.groups[0].edges[("wr", "cr")]
    with pytest.raises(StatisticsError, match="edge wr->cr missing"):
        optimize(seed_query, seed_stats, "exact")


def test_dppick_refuses_large_graphs_and_compare_says_so():
    rng = random.Random(1)
    q = query_from_edges(12, random_edges(12, "complete", rng))
    stats = random_statistics(q, rng)
    with pytest.raises(OptimizerError, match="use the exact strategy"):
        optimize(q, stats, "dppick")
    plans, skipped = compare(q, stats)
    assert set(skipped) == {"dppick", "dppick_query", "dppick_match"} and "exact" in plans
    assert all(p.estimated_cost >= plans["exact"].estimated_cost * (1 - 1e-9) for p in plans.values())


def test_exact_handles_sixteen_streams_with_many_classes():
    rng = random.Random(5)
    for shape, labels in (("complete", 1), ("chain", 3), ("random", 3)):
        q = query_from_edges(16, random_edges(16, shape, rng, labels))
        stats = random_statistics(q, rng)
        plan = optimize(q, stats, "exact")
        assert plan.problems(q) == []
        greedy = optimize(q, stats, "greedy")
        assert all(plan.cost(s) <= greedy.cost(s) * (1 + 1e-9) for s in q.stream_names)


# ---- the command ------------------------------------------------------------------------------

def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def stats_file(seed_query, seed_stats, tmp_path):
    return str(seed_stats.save(tmp_path / "stats.json"))


def test_cli_writes_the_plan_and_prints_orders(capsys, seed_query, stats_file, tmp_path):
    out_path = tmp_path / "plan.json"
    rc, out, _ = run_cli(capsys, "optimize", "--query", "tpcds_returns_by_address", "--stats", stats_file,
                         "--strategy", "exact", "--out", str(out_path))
    assert rc == 0
    plan = load_plan(out_path, seed_query)
    for s in seed_query.stream_names:
        assert f"{s}  {','.join(plan.probe_sequence(s))}" in out
    assert f"estimated cost {plan.estimated_cost:.6g}/s" in out and "UNCALIBRATED" in out
    assert plan.source["statistics"] == stats_file


def test_cli_compare_lists_every_strategy(capsys, stats_file):
    rc, out, _ = run_cli(capsys, "optimize", "--query", "tpcds_returns_by_address", "--stats", stats_file,
                         "--compare", "--initial-order", "sr,cu,cr,wr")
    assert rc == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and not line.startswith("   ")}
    assert set(STRATEGIES) <= set(rows)
    assert "+0.0%" in rows["exact"] and "+0.0%" in rows["dppick"]


def test_cli_reads_a_cost_model(capsys, stats_file, tmp_path):
    model = CostModel(alpha_q=0.0, alpha_m=1.0)
    path = model.save(tmp_path / "cm.json")
    rc, out, _ = run_cli(capsys, "optimize", "--query", "tpcds_returns_by_address", "--stats", stats_file,
                         "--strategy", "greedy", "--cost-model", str(path), "--json")
    assert rc == 0
    doc = json.loads(out[out.index("{"):])
    assert doc["cost_model"]["alpha_q"] == 0.0 and doc["source"]["cost_model"] == str(path)


@pytest.mark.parametrize("extra, words", [
    (["--strategy", "fixed", "--initial-order", "cu,sr,xx,cr"], "not a permutation"),
    (["--strategy", "exact", "--cost-model", "/nonexistent/cm.json"], "no such cost model file"),
    (["--out", "x.json"], "give --strategy"),
])
def test_cli_user_errors_exit_2(capsys, stats_file, extra, words):
    rc, _, err = run_cli(capsys, "optimize", "--query", "tpcds_returns_by_address", "--stats", stats_file, *extra)
    assert rc == 2 and words in err


def test_cli_rejects_statistics_of_another_query(capsys, two_class_query, tmp_path):
    path = random_statistics(two_class_query, random.Random(1)).save(tmp_path / "s.json")
    rc, _, err = run_cli(capsys, "optimize", "--query", "tpcds_returns_by_address", "--stats", str(path),
                         "--strategy", "exact")
    assert rc == 2 and "statistics are for query 'tpcds_returns_by_customer_and_address'" in err


def test_cli_partitioning_rule_file(capsys, seed_query, tmp_path):
    stats = random_statistics(seed_query, random.Random(2), groups=2)
    stats_path = stats.save(tmp_path / "s.json")
    rule = tmp_path / "rule.json"
    rule.write_text(json.dumps(stats.partitioning))
    rc, out, _ = run_cli(capsys, "optimize", "--query", "tpcds_returns_by_address", "--stats", str(stats_path),
                         "--strategy", "exact", "--partitioning", str(rule), "--out", str(tmp_path / "p.json"))
    assert rc == 0 and "group 1:" in out
    assert load_plan(tmp_path / "p.json", seed_query).group_ids == [0, 1]
    assert Statistics.load(stats_path).partitioning == stats.partitioning
