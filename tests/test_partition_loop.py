"""PMJoin key groups in the loop: the statistics job's per-cell statistics rebuild any rule's history exactly,
so the forecast after a rule change sees every cycle (not blind); the loop chooses the rule, the plan gate compares
whole plans each under its own groups, and the next run forecasts the new groups from the regrouped history."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from engine_helpers import T0
from mjoin.forecast.holt import forecast
from mjoin.lake.layout import Lake
from mjoin.stats.cells import history_for_rule
from mjoin.stats.history import history_root, read_history
from mjoin.stats.job import StatsConfig, run_statistics
from mjoin.model.timeutil import iso

pytestmark = pytest.mark.spark
NUM = ["lambda", "kappa", "window_tuples", "tuples", "gamma", "mu", "q", "m", "s"]


@pytest.fixture(scope="module")
def stripes(tmp_path_factory):
    """The stripes preset (s1 hot on key stripes 0-13 mod 32, s2 on 16-29, drifting), landed in a lake."""
    from mjoin.model.query import load_query
    from mjoin.workloads.synthetic import generate_synthetic
    from mjoin.workloads.lander import land

    root = tmp_path_factory.mktemp("stripes")
    generate_synthetic(root / "w", streams=4, duration="3m", schedule="stripes", rate=30, domain=512, window="30s",
                       cycle="10s", seed=3)
    lake = Lake(str(root / "lake"))
    land(root / "w", lake, None)
    return lake, load_query(str(root / "w" / "query.yaml"))


def _sorted(df):
    return df.sort_values(["cycle_start", "group", "entity", "stream", "right"]).reset_index(drop=True)


def test_after_a_rule_change_the_forecast_sees_every_cycle_regrouped_exactly(spark, stripes, tmp_path):
    lake, q = stripes
    a = {"method": "hash", "attr_class": "c0", "groups": 2}
    b = {"method": "table", "attr_class": "c0", "modulus": 32, "assignment": [int(i >= 16) for i in range(32)]}
    mixed, direct = str(tmp_path / "mixed"), str(tmp_path / "direct")
    # the history as the loop leaves it: 12 cycles under rule a, then the rule changed to b
    run_statistics(spark, q, lake, T0 + 30, T0 + 150, 10, out=mixed, config=StatsConfig(partitioning=a))
    run_statistics(spark, q, lake, T0 + 150, T0 + 180, 10, out=mixed, config=StatsConfig(partitioning=b))
    run_statistics(spark, q, lake, T0 + 30, T0 + 180, 10, out=direct,
                   config=StatsConfig(partitioning=b, key_buckets=0, key_ranges=0))
    rebuilt, report = history_for_rule(mixed, q.name, b, end=T0 + 180)
    assert report == {"as_stored": 3, "regrouped": {"buckets": 12}, "missing": []}
    want = read_history(direct, q.name)
    got = _sorted(rebuilt)
    pd.testing.assert_frame_equal(got[["cycle_start", "group", "entity", "stream", "right"]],
                                  _sorted(want)[["cycle_start", "group", "entity", "stream", "right"]])
    assert np.allclose(got[NUM].fillna(-1).to_numpy(), _sorted(want)[NUM].fillna(-1).to_numpy())
    # one group too (the union of all cells): what a plan without a rule is costed and forecast with
    one, rep1 = history_for_rule(mixed, q.name, None, end=T0 + 180)
    assert rep1["regrouped"] == {"buckets": 15} and sorted(one["group"].unique()) == [0]
    # the forecast of rule b: 15 cycles, the same as had b always been in force; blind would mean 3
    fc = forecast(rebuilt, iso(T0 + 180), length=15)
    ref = forecast(read_history(direct, q.name, meta=True), iso(T0 + 180), length=15)
    assert fc.statistics.meta["cycles_used"] == 15
    assert fc.report["value"].to_numpy() == pytest.approx(ref.report["value"].to_numpy())
    blind = forecast(read_history(mixed, q.name, meta=True), iso(T0 + 180), length=15)
    assert blind.statistics.meta["cycles_used"] == 3 and "another partitioning ignored" in blind.statistics.meta["notes"][0]
    # the command: key groups from the same history's cells (here rate-based, D = 2 as asked)
    from mjoin.cli import main
    from mjoin.model.plan import load_plan

    out = tmp_path / "plan.json"
    assert main(["optimize", "--query", q.source_path, "--key-groups", mixed, "--strategy", "exact",
                 "--partition-method", "rate", "--partition-groups", "2", "--out", str(out)]) == 0
    plan = load_plan(out, q)
    assert plan.partitioning["method"] == "table" and plan.group_ids == [0, 1] and plan.source["key_groups"]


def test_the_loop_chooses_key_groups_gates_them_and_forecasts_them_next_run(spark, stripes, tmp_path):
    from mjoin.optimizer.cost import CostModel
    from mjoin.lake.registry import PlanRegistry
    from mjoin.loop.config import LoopConfig
    from mjoin.loop.replan import check_plan, optimize
    from mjoin.loop.deploy import deploy
    from mjoin.loop.replan import forecast as forecast_step

    src, q = stripes
    lake = Lake(str(tmp_path / "lake"))
    (tmp_path / "lake").mkdir()
    os.symlink(src.streams(), tmp_path / "lake" / "streams")  # the landed streams; own stats, plans, registry
    model = tmp_path / "model.json"
    CostModel(alpha_q=3.5e-9, alpha_m=5.3e-8, c=0.0, calibrated=True).save(model)
    cfg = LoopConfig.from_params({"query": q.source_path, "lake": lake.root, "cycle": 10, "period": 60, "length": 12,
                                  "partition_method": "rate", "partition_groups": "2", "calibrate": False,
                                  "cost_model": str(model), "gates": {"min_history": 3}}, run_id="manual__t")
    root = history_root(lake)

    def run(start, end):
        folder = tmp_path / "runs" / str(end)
        folder.mkdir(parents=True)
        ctx = {"query": q.name, "start": iso(start), "end": iso(end), "run_dir": str(folder), "namespace": "",
               "lake": lake.root, "mode": "cycle"}
        active = PlanRegistry(lake, q.name).active(q)
        run_statistics(spark, q, lake, start, end, 10, config=StatsConfig(partitioning=active and active.partitioning))
        return ctx, forecast_step(cfg, ctx)

    ctx, fc = run(T0 + 30, T0 + 90)
    assert fc["key_groups"] is None and fc["history"]["as_stored"] == 6
    out = optimize(cfg, ctx)
    assert out["key_groups"]["method"] == "rate" and out["key_groups"]["groups"] == 2
    plan = json.loads(open(out["plan"]).read())
    assert plan["partitioning"]["method"] == "table" and len(plan["groups"]) == 2
    choice = json.loads(open(os.path.join(ctx["run_dir"], "key_groups.json")).read())
    assert {c["method"] for c in choice["candidates"]} == {"none", "rate"}
    # the buckets split along the stripes: s1's hot half apart from s2's
    assignment = np.asarray(plan["partitioning"]["assignment"])
    by_stripe = [np.bincount(assignment[np.arange(64) % 32 == c], minlength=2).argmax() for c in range(32)]
    assert by_stripe[4] != by_stripe[20] and by_stripe[8] != by_stripe[24]
    gate = check_plan(cfg, ctx)
    assert gate["status"] == "passed"
    deploy(cfg, ctx, gate)
    rule = PlanRegistry(lake, q.name).active(q).partitioning
    assert rule == plan["partitioning"]
    # the next run: its statistics under the new rule; the forecast of the new groups sees all 12 cycles
    ctx2, fc2 = run(T0 + 90, T0 + 150)
    assert fc2["key_groups"] == rule and fc2["history"] == {"as_stored": 6, "regrouped": {"buckets": 6},
                                                            "missing": []}
    stats = json.loads(open(fc2["forecast"]).read())
    assert stats["partitioning"] == rule and stats["meta"]["cycles_used"] == 12
    optimize(cfg, ctx2)
    gate2 = check_plan(cfg, ctx2)  # whole plans, each under its own groups' forecast, one threshold
    details = json.loads(open(gate2["result"]).read())["details"]
    assert details["active_cost"] is not None and details["key_groups"]["active_groups"] == 2
