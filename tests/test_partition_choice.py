"""PMJoin key groups chosen from per-cell statistics (no Spark): candidate rules, regrouping, pricing with the
per-group overhead, the choice (one group unless partitioning pays), the loop's params, the striped generator."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mjoin.optimizer.cost import CostModel, GroupOverhead, expected_chains, group_overhead, plan_cost
from mjoin.optimizer.partitioning import optimize_partitioned
from mjoin.optimizer.strategies import optimize
from mjoin.optimizer.partitioning import (Candidate, Cells, chain_overhead_from_metrics, choose, cost_rule, pays,
                                           range_rule, rate_rule)
from mjoin.model.keygroups import group_of, num_groups
from mjoin.model.query import parse_query
from mjoin.loop.config import LoopConfig
from mjoin.stats.cells import cell_map, regroup, regroup_rows
from mjoin.workloads.synthetic import query_document

#: the engine's measured coefficients (docs/optimizer.md): a matched tuple costs ~15 units of f
MODEL = CostModel(alpha_q=3.5e-9, alpha_m=5.3e-8, c=0.0, calibrated=True)
B = 64


@pytest.fixture(scope="module")
def k4():
    return parse_query(query_document("k4", {f"s{i}": f"s{i}" for i in range(4)}, 60), source="test")


def cell_rows(query, rho, rate, *, cycles=12, tau=10.0, keys_per_cell=8, seed=0) -> pd.DataFrame:
    """Tidy per-cell rows of ``cycles`` cycles: ``rho[c][s]`` tuples per key in a window, ``rate[c][s]`` tuples/s of
    stream s in cell c (Poisson counts per cycle); an edge l -> r looks up r: gamma = 1 - exp(-rho), mu = rho/gamma."""
    rng = np.random.default_rng(seed)
    rows = []
    for j in range(cycles):
        t = pd.Timestamp("2026-01-01", tz="UTC") + pd.Timedelta(seconds=j * tau)
        for c in range(len(rho)):
            tup = {s: float(rng.poisson(rate[c][i] * tau)) for i, s in enumerate(query.stream_names)}
            base = {"query": query.name, "cycle_start": t, "cycle_seconds": tau, "group": c}
            for i, s in enumerate(query.stream_names):
                kap = keys_per_cell * (1 - math.exp(-rho[c][i]))
                rows.append({**base, "entity": "stream", "stream": s, "right": None, "lambda": tup[s] / tau,
                             "kappa": kap, "window_tuples": rho[c][i] * keys_per_cell, "tuples": tup[s],
                             "gamma": np.nan, "mu": np.nan, "q": np.nan, "m": np.nan, "s": np.nan})
            for l, r in query.directed_edges:
                i = query.stream_names.index(r)
                g = 1 - math.exp(-rho[c][i])
                q = tup[l]
                m = float(rng.binomial(int(q), g))
                s_ = m * (rho[c][i] / g if g > 0 else 1.0)
                rows.append({**base, "entity": "edge", "stream": l, "right": r, "lambda": np.nan, "kappa": np.nan,
                             "window_tuples": np.nan, "tuples": np.nan, "gamma": m / q if q else 0.0,
                             "mu": s_ / m if m else 1.0, "q": q, "m": m, "s": s_})
    return pd.DataFrame(rows)


def bucket_cells(query, rho, rate, **kw) -> Cells:
    rule = {"method": "hash", "attr_class": "c0", "groups": len(rho)}
    return Cells.from_rows("buckets", rule, cell_rows(query, rho, rate, **kw))


def striped(split=16, dense=300.0, uniform=450.0, sparse=1.5):
    """Per bucket of key mod 64: s1 hot where bucket mod 32 < split, s2 elsewhere; s0 dense and s3 sparse uniform."""
    rho, rate = [], []
    for b in range(B):
        hot1 = (b % 32) < split
        r = [uniform, dense if hot1 else 0.0, 0.0 if hot1 else dense, sparse]
        rho.append(r)
        rate.append([x * 8 / 120 for x in r])
    return rho, rate


def uniform_cells(query, seed=0):
    rho = [[3.0, 2.0, 1.0, 0.5]] * B
    return bucket_cells(query, rho, [[x * 8 / 60 for x in r] for r in rho], seed=seed)


# ---- candidate rules ------------------------------------------------------------------------------------

def test_rate_and_cost_rules_find_the_buckets_that_favour_other_orders(k4):
    cells = bucket_cells(k4, *striped())
    truth = np.array([int(b % 32 >= 16) for b in range(B)])
    for rule in (rate_rule(cells, 2, k4.stream_names), cost_rule(cells, 2, k4, "exact", MODEL)):
        assert rule["method"] == "table" and rule["modulus"] == B and num_groups(rule) == 2
        got = np.asarray(rule["assignment"])
        assert (got == truth).all() or (got == 1 - truth).all()  # the two halves, whatever the labels
        keys = np.arange(5000)
        assert (group_of(keys, rule) == got[keys % B]).all()
    # more groups asked than there are: the rank vectors only tell two kinds of buckets apart
    assert num_groups(rate_rule(cells, 8, k4.stream_names)) == 2


def test_rate_rule_is_deterministic_and_range_bounds_follow_the_tuples(k4):
    cells = bucket_cells(k4, *striped())
    assert rate_rule(cells, 4, k4.stream_names) == rate_rule(cells, 4, k4.stream_names)  # fixed seed
    # range cells over [0, 1024): all tuples in the first quarter -> the bounds cut it, not the empty rest
    edges = list(range(16, 1024, 16))
    rho = [[2.0] * 4 if i < 16 else [0.0] * 4 for i in range(64)]
    rows = cell_rows(k4, rho, [[x for x in r] for r in rho])
    rcells = Cells.from_rows("ranges", {"method": "range", "attr_class": "c0", "bounds": edges}, rows)
    rule = range_rule(rcells, 4)
    assert rule["bounds"] and max(rule["bounds"]) <= 256 and set(rule["bounds"]) <= set(edges)


def test_regrouping_cells_is_exact_for_unions_of_cells(k4):
    rows = cell_rows(k4, *striped(), cycles=3)
    cell = {"method": "hash", "attr_class": "c0", "groups": B}
    rule = {"method": "table", "attr_class": "c0", "modulus": 32, "assignment": [0] * 10 + [1] * 12 + [2] * 10}
    mapping = cell_map(cell, rule)
    assert mapping.tolist() == [rule["assignment"][b % 32] for b in range(B)]
    assert cell_map(cell, {"method": "hash", "attr_class": "c0", "groups": 3}) is None  # 3 does not divide 64
    assert cell_map(cell, {"method": "range", "attr_class": "c0", "bounds": [5]}) is None
    out = regroup_rows(rows, mapping, 3)
    for (cyc, g), part in out.groupby(["cycle_start", "group"]):
        src = rows[(rows["cycle_start"] == cyc) & (mapping[rows["group"]] == g)]
        for entity, cols in (("stream", ["tuples", "kappa", "window_tuples"]), ("edge", ["q", "m", "s"])):
            a = part[part["entity"] == entity].groupby(["stream", "right"], dropna=False)[cols].sum()
            b = src[src["entity"] == entity].groupby(["stream", "right"], dropna=False)[cols].sum()
            pd.testing.assert_frame_equal(a, b.reindex(a.index), check_dtype=False)
        e = part[part["entity"] == "edge"]
        assert np.allclose(e["gamma"], np.where(e["q"] > 0, e["m"] / e["q"], 0))
    snap = regroup(bucket_cells(k4, *striped()).stats, cell, rule)
    assert sorted(snap.groups) == [0, 1, 2] and snap.partitioning == rule
    rcell = {"method": "range", "attr_class": "c0", "bounds": [10, 20, 30]}
    assert cell_map(rcell, {"method": "range", "attr_class": "c0", "bounds": [20]}).tolist() == [0, 0, 1, 1]
    assert cell_map(rcell, {"method": "range", "attr_class": "c0", "bounds": [25]}) is None


# ---- the choice --------------------------------------------------------------------------------------

def test_one_group_wins_where_no_key_group_favours_another_order(k4):
    """Keys alike (TPC-DS-like): the per-bucket differences are noise; out of sample no rule pays its overhead."""
    for seed in (0, 1):
        choice = choose(k4, {"buckets": uniform_cells(k4, seed)}, "exact", cost_model=MODEL)
        assert (choice.rule, choice.groups, choice.method) == (None, 1, "none"), choice.describe()
        assert choice.out_of_sample and len(choice.candidates) > 4


def test_the_partitioned_plan_wins_where_groups_favour_other_orders(k4):
    cells = {"buckets": bucket_cells(k4, *striped())}
    choice = choose(k4, cells, "exact", cost_model=MODEL)
    assert choice.method in ("rate", "cost") and choice.groups == 2, choice.describe()
    assert choice.gain > 0.5  # the wrong half of s0's tuples fetched a hot key list
    by = {(c.method, c.requested): c for c in choice.candidates}
    # hash mixes both halves: nothing to gain (its price is one group's within the folds' noise)
    assert by[("hash", 2)].price > by[("none", 1)].price * 0.9 and choice.price < 0.5 * by[("hash", 2)].price
    plan, ch = optimize_partitioned(k4, cells, "exact", cost_model=MODEL)
    assert plan.partitioning == ch.rule and plan.group_ids == [0, 1]
    assert plan.source["key_groups"]["method"] == ch.method
    # s0 probes the stream that is cold in each group first
    firsts = {plan.probe_sequence("s0", g)[0] for g in plan.group_ids}
    assert firsts == {"s1", "s2"}
    one = optimize(k4, regroup(cells["buckets"].stats, cells["buckets"].rule, None), "exact", cost_model=MODEL)
    st = regroup(cells["buckets"].stats, cells["buckets"].rule, ch.rule)
    assert plan_cost(k4, st, plan, MODEL, GroupOverhead()) < 0.5 * plan_cost(
        k4, regroup(cells["buckets"].stats, cells["buckets"].rule, None), one, MODEL)


def test_a_rule_pays_only_below_one_group_in_each_fold(k4):
    """The average of the two folds is not enough: one fold's luck (+14.6%, +5.3%: 10.1% on average) is no gain."""
    base = Candidate("none", 1, None, price=100.0, fold_prices=(100.0, 100.0))
    lucky = Candidate("hash", 16, {"method": "hash", "attr_class": "c0", "groups": 16}, 16, price=89.9,
                      fold_prices=(85.4, 94.7))
    steady = Candidate("rate", 2, None, 2, price=80.0, fold_prices=(79.0, 81.0))
    assert not pays(lucky, base) and pays(steady, base)
    assert not pays(Candidate("rate", 2, None, 2, price=95.0, fold_prices=(80.0, 80.0)), base)  # the average too
    assert pays(Candidate("rate", 2, None, 2, price=80.0), Candidate("none", 1, None, price=100.0))  # in sample
    # where groups really favour other orders both folds agree, and the choice says so per fold
    choice = choose(k4, {"buckets": bucket_cells(k4, *striped())}, "exact", cost_model=MODEL)
    best = next(c for c in choice.candidates if c.rule == choice.rule)
    one = next(c for c in choice.candidates if c.groups == 1)
    assert all(v < 0.5 * b for v, b in zip(best.fold_prices, one.fold_prices)) and len(best.fold_prices) == 2
    assert choice.to_json()["candidates"][0]["fold_prices"]


def test_method_and_d_can_be_fixed_and_multi_class_queries_stay_one_group(k4, two_class_query):
    cells = {"buckets": bucket_cells(k4, *striped())}
    hashed = choose(k4, cells, "exact", methods=("hash",), counts=(1, 4), cost_model=MODEL)
    assert hashed.groups == 1  # hash does not pay here ...
    forced = choose(k4, cells, "exact", methods=("hash",), counts=(1, 4), cost_model=MODEL, forced=True)
    assert (forced.method, forced.groups) == ("hash", 4)  # ... but D = 4 was asked for
    other = choose(two_class_query, cells, "exact", cost_model=MODEL)
    assert other.rule is None and "attribute classes" in other.notes[0]
    with pytest.raises(ValueError, match="unknown partitioning method"):
        choose(k4, cells, methods=("zorder",))


# ---- the per-group overhead -------------------------------------------------------------------------

def test_group_overhead_counts_the_extra_probe_chains(k4):
    ov = GroupOverhead(per_chain=1e-4, per_call=5e-5, batch_seconds=10, buckets=16)
    assert ov.chain_seconds(4) == pytest.approx(1e-4 + 3 * 5e-5)
    # per (engine bucket, batch) one chain per group present: busy groups everywhere, none without tuples
    assert expected_chains(np.full((16, 1), 100.0), 10) == pytest.approx(1.6)
    assert expected_chains(np.zeros((16, 2)), 10) == 0
    assert expected_chains(np.full((16, 2), 50.0), 10) == pytest.approx(3.2)
    cells = bucket_cells(k4, *striped())
    one = regroup(cells.stats, cells.rule, None)
    assert group_overhead(k4, one, ov, MODEL) == 0
    table = {"method": "table", "attr_class": "c0", "modulus": 32, "assignment": [int(c >= 16) for c in range(32)]}
    two = regroup(cells.stats, cells.rule, table)
    spread = group_overhead(k4, two, ov, MODEL)  # without cells: each group's rate over every engine bucket
    assert 0 < spread <= 4 * 1.6 * ov.chain_seconds(4) + 1e-12  # at most one more chain per stream, bucket, batch
    assert group_overhead(k4, two, ov, CostModel()) == pytest.approx(spread / 3.5e-9)  # uncalibrated: in units
    # with the cells, exact: engine bucket e holds the cells e, e + 16, e + 32, e + 48: stripes e and e + 16 of both
    # groups, so the same extra chains here ...
    exact = group_overhead(k4, two, ov, MODEL, cells=(cells.stats, cells.rule))
    assert exact == pytest.approx(spread, rel=0.05)
    # ... but hash groups key mod 4 never share an engine bucket key mod 16: no extra chain at all
    h4 = regroup(cells.stats, cells.rule, {"method": "hash", "attr_class": "c0", "groups": 4})
    assert group_overhead(k4, h4, ov, MODEL) > 0 and group_overhead(k4, h4, ov, MODEL, cells=(cells.stats, cells.rule)) == 0


def test_chain_overhead_is_measured_from_the_engines_metrics():
    """A chain's fixed CPU (besides its steps) per run, apart from its materialising's per-result part."""
    rng = np.random.default_rng(0)
    per_chain, per_in, per_out = 2e-4, 4e-7, 1e-7  # a chain run, a tuple it selects, a result: besides the steps
    recs = []
    for b in range(12):
        chains = []
        for s in range(4):
            runs, rows_in, results = int(rng.integers(8, 17)), int(rng.integers(100, 2000)), int(rng.integers(0, 5000))
            steps = [{"calls": runs, "cpu_seconds": 0.004}, {"calls": runs // 2, "cpu_seconds": 0.002}]
            cpu = 0.006 + per_chain * runs + per_in * rows_in + per_out * results + rng.normal(0, 2e-5)
            chains.append({"rows_in": rows_in, "results": results, "cpu_seconds": cpu,
                           "materialise_seconds": per_out * results + 1e-3, "steps": steps})
        recs.append({"chains": chains + [{"results": 0, "cpu_seconds": 5.0, "steps": []}]})  # ran in no bucket
    assert chain_overhead_from_metrics(recs) == pytest.approx(per_chain, rel=0.05)
    assert chain_overhead_from_metrics(recs[:4]) is None  # 16 chain records: too few


# ---- the loop's params -------------------------------------------------------------------------------

def test_loop_params_method_and_d(tmp_path):
    base = {"query": "tpcds_returns_by_address", "lake": str(tmp_path)}
    cfg = LoopConfig.from_params(base)
    assert (cfg.partition_method, cfg.partition_groups) == ("auto", "auto")
    methods, counts, forced = cfg.partition_search()
    assert set(methods) == {"hash", "range", "rate", "cost"} and counts == (1, 2, 4, 8, 16) and not forced
    assert LoopConfig.from_params({**base, "partition_method": "none"}).partition_search() is None
    assert LoopConfig.from_params({**base, "partition_groups": 1}).partition_search() is None
    assert LoopConfig.from_params({**base, "partition_method": "rate", "partition_groups": "8"}).partition_search() \
        == (("rate",), (1, 8), True)
    with pytest.raises(ValueError, match="partition_method"):
        LoopConfig.from_params({**base, "partition_method": "zorder"})
    with pytest.raises(ValueError, match="partition_groups"):
        LoopConfig.from_params({**base, "partition_groups": "many"})
    from mjoin.loop.params import REOPTIMIZE_PARAMS

    assert REOPTIMIZE_PARAMS["partition_method"][2]["enum"] == ["auto", "none", "hash", "range", "rate", "cost"]
    assert REOPTIMIZE_PARAMS["partition_groups"][0] == "auto"


# ---- the striped generator -----------------------------------------------------------------------------

def test_striped_generator_puts_each_streams_hot_keys_in_its_residue_classes(tmp_path):
    from mjoin.workloads import synthetic
    from mjoin.workloads.presets import preset_document

    doc = preset_document("stripes", 4)
    assert doc["streams"]["s1"]["stripes"] == 32
    m = synthetic.generate_synthetic(tmp_path / "w", streams=4, duration="40s", schedule="stripes", rate=200,
                                     domain=4096, window="10s", seed=5)
    import pyarrow.dataset as ds

    share = {}
    for s in ("s0", "s1", "s2"):
        k = ds.dataset(str(tmp_path / "w" / "streams" / s), format="parquet").to_table(columns=["key"]).column("key").to_numpy()
        assert k.min() >= 0 and k.max() < 4096
        share[s] = np.bincount(k % 32, minlength=32) / len(k)
    # hot stripes 0-13 and 16-29, drifting by 2 over the workload: 2-13 stay s1's, 18-29 s2's, never both
    assert share["s1"][2:14].min() > 0.05 and share["s1"][16:32].max() == 0
    assert share["s2"][18:30].min() > 0.05 and share["s2"][:16].max() == 0
    assert share["s1"][:2].sum() > 0.03 and share["s1"][14:16].sum() > 0.03  # drifted: 0-1 early, 14-15 late
    assert share["s0"].min() > 0.02  # uniform
    assert m.parameters["schedule"] == "stripes"
