"""The cost model: f(kappa), the config object, and small cases computed by hand from
Eq. 1-8 of the runtime-optimization paper (plus our rho and residual rules)."""
import json
import math

import pytest

from mjoin.optimizer.cost import CostModel, CostModelError, JoinProblem, evaluate_orders, order_cost, plan_cost, plan_costs
from mjoin.optimizer.strategies import optimize
from mjoin.optimizer.dppick import get_sequences
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.model.query import parse_query
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StreamStats

# alpha_q = 0.5, alpha_m = 2, sorted state, c = 1: f(kappa) = 1 + log2(kappa), so with
# kappa = 4, 8, 16, 2, 32 (a, b, c, d, r) the query costs are q = 1.5, 2, 2.5, 1, 3.
MODEL = CostModel(alpha_q=0.5, alpha_m=2.0, state="sorted", c=1.0)
KAPPA = {"a": 4, "b": 8, "c": 16, "d": 2, "r": 32}


def spec(preds, keys):
    streams = [{"name": s, "event_time": "ts", "window": "1m", "columns": {"ts": "timestamp", **{k: "long" for k in ks}},
                "keys": list(ks)} for s, ks in keys.items()]
    return parse_query({"name": "hand", "streams": streams, "predicates": preds,
                        "output": [f"{s}.ts AS t_{s}" for s in keys]})


def stats_for(query, edges, lam=None, default=(1.0, 1.0)):
    g = GroupStats()
    for s in query.stream_names:
        g.streams[s] = StreamStats(lam=(lam or {}).get(s, 1.0), kappa=KAPPA[s], window_tuples=100.0)
    for l, r in query.directed_edges:
        gamma, mu = edges.get((l, r), default)
        g.edges[(l, r)] = EdgeStats(gamma=gamma, mu=mu)
    return Statistics(query=query.name, groups={0: g})


def cost(query, stats, start, pairs, model=MODEL):
    problem = JoinProblem.from_statistics(query, stats)
    return order_cost(problem, model, problem.index[start], [(problem.index[l], problem.index[r]) for l, r in pairs])


# ---- f and the config object ------------------------------------------------------------

def test_f_sorted_and_hash():
    m = CostModel()  # uncalibrated defaults: sorted, c = 1
    assert m.state == "sorted" and not m.calibrated
    assert m.f(1024) == pytest.approx(11.0)  # 1 + log2(1024) comparisons
    assert m.f(1) == m.f(0.5) == m.f(0) == pytest.approx(1.0)  # guard: an empty state still costs c
    h = CostModel(state="hash", c=2.0, m_slots=100)
    assert h.f(400) == pytest.approx(2.0 + 400 / 200)  # Eq. 5
    assert CostModel(state="hash", m_slots=None).f(10 ** 9) == pytest.approx(1.0)
    assert list(m.f([1, 2, 8])) == pytest.approx([1, 2, 4])
    assert m.query_cost(8) == pytest.approx(4.0) and m.match_cost(3) == pytest.approx(3.0)


def test_ablations():
    assert MODEL.query_only().alpha_m == 0 and MODEL.query_only().alpha_q == 0.5
    assert MODEL.match_only().alpha_q == 0 and MODEL.match_only().alpha_m == 2.0
    with pytest.raises(CostModelError, match="unknown ablation"):
        MODEL.ablation("both")


def test_json_roundtrip(tmp_path):
    m = CostModel(alpha_q=0.25, alpha_m=3, state="hash", c=1.5, m_slots=None, calibrated=True,
                  calibration={"r2": 0.9})
    back = CostModel.load(m.save(tmp_path / "cm.json"))
    assert back == m and back.calibration == {"r2": 0.9} and back.m_slots is None
    assert json.loads((tmp_path / "cm.json").read_text())["kind"] == "mjoin.cost_model"


@pytest.mark.parametrize("doc, words", [
    ({"alpha_q": -1}, "alpha_q = -1"),
    ({"alpha_m": "x"}, "alpha_m = 'x'"),
    ({"alpha_q": float("nan")}, "alpha_q = nan"),
    ({"state": "btree"}, "state = 'btree'"),
    ({"m_slots": 0}, "m_slots = 0"),
    ({"alpha": 1}, "unknown field(s) alpha"),
    ({"kind": "plan"}, "not a cost model"),
    ({"version": 7}, "version = 7"),
])
def test_bad_model_documents_name_the_field(doc, words):
    with pytest.raises(CostModelError) as info:
        CostModel.from_json(doc)
    assert words in str(info.value)


def test_bad_model_files(tmp_path):
    with pytest.raises(CostModelError, match="no such cost model file"):
        CostModel.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(CostModelError, match="not JSON"):
        CostModel.load(tmp_path / "bad.json")


# ---- hand-computed cases ------------------------------------------------------------------

def test_k3_one_class_is_the_papers_eq_8():
    # a.k = b.k = c.k: one attribute class, complete graph, rho = 1 everywhere (the paper).
    q = spec(["a.k = b.k", "b.k = c.k"], {"a": ["k"], "b": ["k"], "c": ["k"]})
    st = stats_for(q, {("a", "b"): (0.5, 2), ("a", "c"): (0.25, 4), ("b", "a"): (0.8, 1),
                       ("b", "c"): (0.1, 3), ("c", "a"): (1.0, 1), ("c", "b"): (0.5, 2)},
                   lam={"a": 10, "b": 20, "c": 5})
    # from a, probing b then c. Step 2 looks c up from {a, b}: both edges fetch the same key;
    # the estimate uses the higher gamma, a->c (0.25, mu 4):
    #   C2 = q_c + 0.25 * (2 * 4)            = 2.5 + 2  = 4.5
    #   C1 = q_b + 0.5 * (2 * 2 + C2)        = 2 + 0.5 * 8.5 = 6.25
    assert cost(q, st, "a", [("a", "b"), ("a", "c")]) == pytest.approx(6.25)
    assert cost(q, st, "a", [("a", "b"), ("b", "c")]) == pytest.approx(6.25)  # same lookup, same cost
    # from a, probing c then b: step 2 from {a, c}: a->b and c->b are both (0.5, 2):
    #   C2 = 2 + 0.5 * 4 = 4;   C1 = q_c + 0.25 * (2 * 4 + 4) = 2.5 + 3 = 5.5   (the cheaper one)
    assert cost(q, st, "a", [("a", "c"), ("a", "b")]) == pytest.approx(5.5)
    # from b: [b,c],[b,a]: C2 = q_a + max(0.8, 1.0) * 2 * 1 = 3.5; C1 = 2.5 + 0.1 * (6 + 3.5) = 3.45
    #         [b,a],[b,c]: C2 = q_c + max(0.1, 0.25) * 2 * 4 = 4.5; C1 = 1.5 + 0.8 * (2 + 4.5) = 6.7
    assert cost(q, st, "b", [("b", "c"), ("b", "a")]) == pytest.approx(3.45)
    assert cost(q, st, "b", [("b", "a"), ("b", "c")]) == pytest.approx(6.7)
    # from c: [c,b],[c,a]: C2 = 3.5, C1 = 2 + 0.5 * (4 + 3.5) = 5.75; [c,a],[c,b]: C1 = 1.5 + 1 * (2 + 4) = 7.5
    assert cost(q, st, "c", [("c", "a"), ("c", "b")]) == pytest.approx(7.5)
    assert cost(q, st, "c", [("c", "b"), ("c", "a")]) == pytest.approx(5.75)
    for strategy in ("exact", "dppick"):
        plan = optimize(q, st, strategy, cost_model=MODEL)
        assert plan.costs[0] == pytest.approx({"a": 5.5, "b": 3.45, "c": 5.75})
        assert plan.probe_sequence("a") == ["c", "b"] and plan.probe_sequence("b") == ["c", "a"]
        assert plan.probe_sequence("c") == ["b", "a"]
        # estimated cost = sum lambda_s C_s = 10 * 5.5 + 20 * 3.45 + 5 * 5.75
        assert plan.estimated_cost == pytest.approx(152.75)
        assert plan.group_costs == {0: pytest.approx(152.75)}


def test_two_class_chain_uses_rho_mu():
    # a.x = b.x (class c0), b.y = c.y (class c1): a chain; a step that changes class is
    # repeated for each of the mu partial results (rho = mu of the step before).
    q = spec(["a.x = b.x", "b.y = c.y"], {"a": ["x"], "b": ["x", "y"], "c": ["y"]})
    assert not q.has_edge("a", "c")
    st = stats_for(q, {("a", "b"): (0.5, 3), ("b", "a"): (0.4, 2), ("b", "c"): (0.2, 5), ("c", "b"): (1.0, 2)})
    # from a: C2 = q_c + 0.2 * (2 * 5) = 4.5;  C1 = q_b + 0.5 * (2 * 3 + mu[a][b]=3 * 4.5) = 2 + 9.75 = 11.75
    assert cost(q, st, "a", [("a", "b"), ("b", "c")]) == pytest.approx(11.75)
    # (the paper's rho = 1 would give 2 + 0.5 * (6 + 4.5) = 7.25)
    # from c: C2 = q_a + 0.4 * (2 * 2) = 3.1;   C1 = 2 + 1.0 * (2 * 2 + 2 * 3.1) = 12.2
    assert cost(q, st, "c", [("c", "b"), ("b", "a")]) == pytest.approx(12.2)
    # from b: [b,a],[b,c]: 1.5 + 0.4 * (2 * 2 + 2 * 4.5) = 6.7;  [b,c],[b,a]: 2.5 + 0.2 * (10 + 5 * 3.1) = 7.6
    assert cost(q, st, "b", [("b", "a"), ("b", "c")]) == pytest.approx(6.7)
    assert cost(q, st, "b", [("b", "c"), ("b", "a")]) == pytest.approx(7.6)
    for strategy in ("exact", "dppick"):
        plan = optimize(q, st, strategy, cost_model=MODEL)
        assert plan.costs[0] == pytest.approx({"a": 11.75, "b": 6.7, "c": 12.2})
        assert plan.order("b") == [("b", "a"), ("b", "c")]


def test_cycle_across_classes_applies_residual_filters():
    # a.x = b.x (c0), b.y = c.y (c1), a.z = c.z (c2), c.w = d.w (c3): the triangle a-b-c has
    # three classes, so the second edge into c is a residual filter (independence).
    q = spec(["a.x = b.x", "b.y = c.y", "a.z = c.z", "c.w = d.w"],
             {"a": ["x", "z"], "b": ["x", "y"], "c": ["y", "z", "w"], "d": ["w"]})
    st = stats_for(q, {("a", "b"): (0.5, 2), ("a", "c"): (0.4, 2), ("b", "c"): (0.2, 6), ("c", "d"): (0.5, 4)})
    # common tail [c,d]: C3 = q_d + 0.5 * (2 * 4) = 1 + 4 = 5
    # O1 = [a,b] (c0), [b,c] (c1; residual a->c: phi = 0.4), [c,d] (c3):
    #   C2 = q_c + 0.2 * (2 * 6 + phi 0.4 * rho mu[b][c]=6 * 5) = 2.5 + 0.2 * 24 = 7.3
    #   C1 = q_b + 0.5 * (2 * 2 + 1 * rho mu[a][b]=2 * 7.3) = 2 + 0.5 * 18.6 = 11.3
    assert cost(q, st, "a", [("a", "b"), ("b", "c"), ("c", "d")]) == pytest.approx(11.3)
    # O2 = [a,b] (c0), [a,c] (c2; residual b->c: phi = 0.2), [c,d] (c3):
    #   C2 = 2.5 + 0.4 * (2 * 2 + 0.2 * 2 * 5) = 2.5 + 0.4 * 6 = 4.9
    #   C1 = 2 + 0.5 * (4 + 2 * 4.9) = 8.9
    assert cost(q, st, "a", [("a", "b"), ("a", "c"), ("c", "d")]) == pytest.approx(8.9)
    for strategy in ("exact", "dppick"):
        plan = optimize(q, st, strategy, cost_model=MODEL)
        assert plan.cost("a") <= 8.9 + 1e-12


def test_residual_class_with_two_edges_uses_its_highest_gamma():
    # a.x = b.x = r.x (class X: a, b, r), b.v = c.v (V), c.y = r.y (Y), r.z = d.z (Z).
    # From a: [a,b] (X), [b,c] (V), then r from {a, b, c}: through Y (c->r) with the X edges
    # a->r, b->r as ONE residual filter (same key): its representative edge, the higher gamma 0.8.
    # Every step here changes class, so each step's run is itself: R = u phi (Eq. 65).
    q = spec(["a.x = b.x", "b.x = r.x", "b.v = c.v", "c.y = r.y", "r.z = d.z"],
             {"a": ["x"], "b": ["x", "v"], "c": ["v", "y"], "r": ["x", "y", "z"], "d": ["z"]})
    st = stats_for(q, {("a", "b"): (0.5, 2), ("b", "c"): (0.5, 2), ("c", "r"): (0.5, 2), ("a", "r"): (0.2, 3),
                       ("b", "r"): (0.8, 1), ("r", "d"): (0.5, 4)})
    # C4 = q_d + 0.5 * (2 * 4) = 5
    # C3 [c,r]: Y, next Z -> R = mu[c][r] phi = 2 * 0.8:  3 + 0.5 * (2 * 2 + 1.6 * 5) = 9
    # C2 [b,c]: V, next Y -> R = 2:  2.5 + 0.5 * (2 * 2 + 2 * 9) = 13.5
    # C1 [a,b]: X, next V -> R = 2:  2 + 0.5 * (4 + 2 * 13.5) = 17.5
    assert cost(q, st, "a", [("a", "b"), ("b", "c"), ("c", "r"), ("r", "d")]) == pytest.approx(17.5)
    # through X instead: the higher-gamma X edge b->r (0.8, mu 1), residual Y (c->r, 0.5):
    # C3 = 3 + 0.8 * (2 * 1 + 1 * 0.5 * 5) = 6.6; C2 = 2.5 + 0.5 * (4 + 2 * 6.6) = 11.1; C1 = 2 + 0.5 * (4 + 2 * 11.1) = 15.1
    assert cost(q, st, "a", [("a", "b"), ("b", "c"), ("a", "r"), ("r", "d")]) == pytest.approx(15.1)
    assert cost(q, st, "a", [("a", "b"), ("b", "c"), ("b", "r"), ("r", "d")]) == pytest.approx(15.1)
    exact, dppick = (optimize(q, st, s, cost_model=MODEL) for s in ("exact", "dppick"))
    problem = JoinProblem.from_statistics(q, st)
    every = min(order_cost(problem, MODEL, 0, seq) for seq in get_sequences(problem, 0, dedupe=False))
    assert exact.cost("a") == pytest.approx(every) and dppick.cost("a") == pytest.approx(every)
    assert every <= 15.1 + 1e-12


def test_a_class_change_prices_the_whole_run():
    # a.x = b.x = c.x (class X), c.y = d.y (Y). From a: [a,b], [a,c] run in X (factorised: one lookup per
    # surviving tuple of a), then the class change materialises every partial result of the run, u_b u_c per
    # surviving group, and each looks d up (Eq. 65):
    #   per new a: lookup b (q 2) + 0.5 * 2 matches (x alpha_m 2 = 2); 0.5 survive: lookup c (0.5 * 2.5) +
    #   0.5 * 0.5 * 3 matches (x 2 = 1.5); 0.25 survive with 2 * 3 = 6 partials each: 1.5 lookups of d, each
    #   q_d + 0.5 * 2 * 4 = 5  ->  2 + 2 + 1.25 + 1.5 + 7.5 = 14.25
    # step 2 looks c up from {a, b}: a->c (0.5, 3) has the higher gamma.
    q = spec(["a.x = b.x", "b.x = c.x", "c.y = d.y"], {"a": ["x"], "b": ["x"], "c": ["x", "y"], "d": ["y"]})
    st = stats_for(q, {("a", "b"): (0.5, 2), ("a", "c"): (0.5, 3), ("b", "c"): (0.4, 2), ("c", "d"): (0.5, 4)})
    assert cost(q, st, "a", [("a", "b"), ("a", "c"), ("c", "d")]) == pytest.approx(14.25)
    # the last step's mu alone (the model before the class-change price) would give 10.5:
    # C2 = 2.5 + 0.5 * (6 + 3 * 5) = 13, C1 = 2 + 0.5 * (4 + 13) = 10.5
    problem = JoinProblem.from_statistics(q, st)
    every = {s: min(order_cost(problem, MODEL, problem.index[s], seq)
                    for seq in get_sequences(problem, problem.index[s], dedupe=False)) for s in q.stream_names}
    for strategy in ("exact", "dppick"):
        assert optimize(q, st, strategy, cost_model=MODEL).costs[0] == pytest.approx(every)


def test_plan_cost_is_sum_of_lambda_times_c(seed_query):
    st = Statistics(query=seed_query.name, groups={0: GroupStats(
        streams={s: StreamStats(lam=lam, kappa=8, window_tuples=100) for s, lam in zip(seed_query.stream_names, (1, 2, 3, 4))},
        edges={e: EdgeStats(gamma=0.5, mu=2) for e in seed_query.directed_edges})})
    model = CostModel(alpha_q=1, alpha_m=1)
    plan = make_plan(seed_query, orders_from_permutation(seed_query, ["cu", "sr", "wr", "cr"]), "fixed")
    # uniform statistics: every order of 3 lookups costs, with q = 1 + log2(8) = 4, gamma 0.5, mu 2:
    #   C3 = 4 + 0.5 * 2 = 5;  C2 = 4 + 0.5 * (2 + 5) = 7.5;  C1 = 4 + 0.5 * (2 + 7.5) = 8.75
    costs, totals = plan_costs(seed_query, st, plan, model)
    assert costs[0] == pytest.approx({s: 8.75 for s in seed_query.stream_names})
    assert plan_cost(seed_query, st, plan, model) == pytest.approx(8.75 * (1 + 2 + 3 + 4))


def test_unpartitioned_plan_under_partitioned_statistics(seed_query):
    groups = {}
    for g, gamma in ((0, 0.5), (1, 0.1)):
        groups[g] = GroupStats(streams={s: StreamStats(lam=1, kappa=8, window_tuples=100) for s in seed_query.stream_names},
                               edges={e: EdgeStats(gamma=gamma, mu=2) for e in seed_query.directed_edges})
    st = Statistics(query=seed_query.name, groups=groups,
                    partitioning={"method": "hash", "attr_class": "c0", "groups": 2})
    plan = make_plan(seed_query, orders_from_permutation(seed_query, seed_query.stream_names), "fixed")
    costs, totals = plan_costs(seed_query, st, plan, CostModel())
    assert sorted(totals) == [0, 1]  # the same orders run in both key groups
    # a lookup searches the whole state, both groups' keys: f(8 + 8) = 1 + log2(16) = 5
    # group 1: C3 = 5 + 0.1 * 2 = 5.2; C2 = 5 + 0.1 * (2 + 5.2) = 5.72; C1 = 5 + 0.1 * (2 + 5.72) = 5.772
    assert totals[1] == pytest.approx(4 * 5.772)
    assert plan_cost(seed_query, st, plan, CostModel()) == pytest.approx(totals[0] + totals[1])


def test_evaluate_orders_rejects_invalid_orders(seed_query):
    st = Statistics(query=seed_query.name, groups={0: GroupStats(
        streams={s: StreamStats(lam=1, kappa=8, window_tuples=100) for s in seed_query.stream_names},
        edges={e: EdgeStats(gamma=0.5, mu=2) for e in seed_query.directed_edges})})
    with pytest.raises(ValueError, match="never reaches cr"):
        evaluate_orders(seed_query, st, {"cu": [("cu", "sr"), ("cu", "wr")]})


def test_costs_are_finite_with_extreme_statistics(two_class_query):
    g = GroupStats(streams={s: StreamStats(lam=0, kappa=0, window_tuples=0) for s in two_class_query.stream_names},
                   edges={e: EdgeStats(gamma=0.0, mu=0.0) for e in two_class_query.directed_edges})
    st = Statistics(query=two_class_query.name, groups={0: g})
    plan = optimize(two_class_query, st, "exact")
    assert all(math.isfinite(c) and c == pytest.approx(1.0) for c in plan.costs[0].values())  # one lookup, f = c
    assert plan.estimated_cost == 0.0  # no arrivals
