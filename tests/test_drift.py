"""The drift watcher's logic (mjoin.loop.drift) on a real lake: a step change in the statistics after the newest
forecast, or a rise in the active plan's measured cost in the join job's batches, is drift once confirmed
against a bound from history; noise and a single odd cycle are not; events are debounced. And the asset
events a run's outcome produces (mjoin.loop.assets)."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from mjoin.engine.metrics import write_record
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.loop import assets
from mjoin.loop.drift import DriftConfig, cost_drift, detect, forecast_errors, watch
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.stats.history import history_root, write_cycle
from test_gates_support import CYCLE, cycle_iso, snapshot

N = 20  # cycles of history before the forecast


def lake_with_history(tmp_path, query, after: dict[int, float], *, lam_stream="cu") -> Lake:
    """A lake with N cycles of history, a forecast of cycle N (run folder), and cycles N.. with ``lambda`` of
    ``lam_stream`` multiplied by ``after[k]`` (cycles not in ``after`` are not written)."""
    lake = Lake(str(tmp_path / "lake"))
    root = history_root(lake)
    for k in list(range(N)) + sorted(after):
        st = snapshot(query, cycle_iso(k), seed=k)
        if k in after:
            st.groups[0].streams[lam_stream].lam *= after[k]
        write_cycle(root, query.name, cycle_iso(k), pd.DataFrame(st.to_rows()))
    fc = snapshot(query, cycle_iso(N), kind="forecast", seed=999)
    run = os.path.join(lake.reports(query.name), "runs", "20260101T002000Z")
    os.makedirs(run)
    fc.save(os.path.join(run, "forecast.json"))
    return lake


def test_a_step_change_confirmed_over_two_cycles_is_drift_noise_and_one_odd_cycle_are_not(tmp_path, seed_query):
    quiet = detect(lake_with_history(tmp_path / "a", seed_query, {N: 1.0, N + 1: 1.0, N + 2: 1.0}), seed_query.name)
    assert quiet["drift"] is False and quiet["forecast_errors"] == []
    odd = detect(lake_with_history(tmp_path / "b", seed_query, {N: 1.0, N + 1: 5.0, N + 2: 1.0}), seed_query.name)
    assert odd["drift"] is False  # one cycle off is not confirmed
    step = detect(lake_with_history(tmp_path / "c", seed_query, {N: 1.0, N + 1: 5.0, N + 2: 5.0}), seed_query.name)
    assert step["drift"] is True and step["forecast_errors"][0]["series"] == "lambda[cu]"
    assert all(e > 4 for e in step["forecast_errors"][0]["errors"])
    assert "lambda[cu]" in step["reasons"][0] and "spreads for 2 cycles" in step["reasons"][0]
    # a step smaller than k spreads of the history's (floored) spread is not drift
    small = detect(lake_with_history(tmp_path / "d", seed_query, {N: 1.05, N + 1: 1.05}), seed_query.name)
    assert small["drift"] is False


def test_no_forecast_yet_and_no_history_are_no_drift(tmp_path, seed_query):
    lake = Lake(str(tmp_path / "empty"))
    assert detect(lake, seed_query.name)["drift"] is False
    assert forecast_errors(pd.DataFrame(), snapshot(seed_query, cycle_iso(0), kind="forecast")) == []


def metrics(lake: Lake, query: str, version: int, costs: list[float], first: int = 0) -> None:
    for i, c in enumerate(costs):
        write_record(lake.metrics(query), {
            "batch_id": first + i, "plan_version": version, "rows_in": {"cu": 100, "sr": 100},
            "chains": [{"stream": "cu", "steps": [{"lookups": int(200 * c * 0.7), "matches": int(200 * c * 0.3)}]}]})


def test_the_active_plans_measured_cost_above_its_history_is_drift(tmp_path, seed_query):
    lake = Lake(str(tmp_path / "lake"))
    reg = PlanRegistry(lake, seed_query.name)
    for perm in (["cu", "sr", "wr", "cr"], ["sr", "cu", "wr", "cr"]):
        reg.activate(reg.publish(make_plan(seed_query, orders_from_permutation(seed_query, perm), "exact"), {}, seed_query))
    steady = [2.0, 2.1, 1.9, 2.0, 2.05, 1.95, 2.0, 2.1]
    metrics(lake, seed_query.name, 1, [9.0] * 5)  # an older version's batches do not count
    metrics(lake, seed_query.name, 2, steady, first=5)
    assert detect(lake, seed_query.name)["drift"] is False
    metrics(lake, seed_query.name, 2, [6.0], first=13)
    assert detect(lake, seed_query.name)["drift"] is False  # one batch: not confirmed
    metrics(lake, seed_query.name, 2, [6.2], first=14)
    got = detect(lake, seed_query.name)
    assert got["drift"] is True and got["active_version"] == 2 and got["cost"]["cost_per_tuple"] == pytest.approx([6.0, 6.2])
    assert "the active plan v2 costs" in got["reasons"][0]
    assert cost_drift([2.0] * 3 + [9.0, 9.0]) is None  # too few batches of the plan to know its normal cost


def test_drift_events_are_debounced_and_recorded(tmp_path, seed_query):
    lake = lake_with_history(tmp_path, seed_query, {N: 3.0, N + 1: 3.0})
    cfg = DriftConfig(debounce=300)
    first = watch(lake, seed_query.name, cfg, now=1_000_000.0)
    assert first and first["series"][0] == "lambda[cu]" and first["debounce"] == 300
    assert watch(lake, seed_query.name, cfg, now=1_000_000.0 + 299) is None  # within the debounce
    again = watch(lake, seed_query.name, cfg, now=1_000_000.0 + 301)
    assert again is not None
    log = os.path.join(lake.reports(seed_query.name), "drift", "events.jsonl")
    assert [json.loads(line)["at"] for line in open(log)] == [first["at"], again["at"]]


def test_asset_events_of_a_run_carry_its_metadata():
    out = {"query": "q", "namespace": "", "run_id": "scheduled__1", "run_type": "scheduled", "status": "deployed",
           "interval_start": "a", "interval_end": "b", "active_version": 3, "version": 3, "strategy": "exact",
           "estimated_gain": 0.21, "gates": {"input": "passed", "stats": "passed", "forecast": "passed", "plan": "passed"},
           "deployed": True, "tasks": {"join": "success"}, "links": {"plan": "http://x/mjoin/plans/q/3"}}
    evs = assets.events(out)
    assert [e["name"] for e in evs] == [f"mjoin.{k}.q" for k in ("statistics", "forecast", "active_plan", "results")]
    plan = evs[2]
    assert plan["alias"] == "mjoin.active_plan" and plan["uri"] == "x-mjoin://q/active_plan"
    assert {k: plan["extra"][k] for k in ("plan_version", "strategy", "predicted_gain", "gates")} == \
        {"plan_version": 3, "strategy": "exact", "predicted_gain": 0.21, "gates": out["gates"]}
    failed = {**out, "status": "failed", "deployed": False, "gates": {**out["gates"], "forecast": "failed"},
              "tasks": {"join": "success"}}
    assert [e["name"] for e in assets.events(failed)] == [f"mjoin.{k}.q" for k in ("statistics", "results")]
    assert assets.events({**out, "namespace": "eval/backfill"}) == []
    assert assets.drift_watch_settings({"MJOIN_DRIFT": "off"}) is None
    assert assets.drift_watch_settings({"MJOIN_DRIFT_DEBOUNCE": "120"})["debounce"] == 120.0


def test_a_run_after_a_drift_event_forecasts_from_the_change_point(tmp_path, seed_query):
    from mjoin.loop.config import LoopConfig
    from mjoin.loop.replan import rule_history

    lake = lake_with_history(tmp_path, seed_query, {N: 4.0, N + 1: 4.0, N + 2: 4.0})
    cfg = LoopConfig.from_params({"lake": lake.root, "cycle": CYCLE, "length": 60})
    end = cycle_iso(N + 3)
    before, _ = rule_history(cfg, seed_query, None, end)
    assert before["cycle_start"].min() == pd.Timestamp(cycle_iso(0))
    event = watch(lake, seed_query.name, DriftConfig(), now=2_000_000.0)
    assert event["since"] == cycle_iso(N)  # the first cycle the series left its bound
    after, _ = rule_history(cfg, seed_query, None, end)
    assert sorted(after["cycle_start"].unique()) == [pd.Timestamp(cycle_iso(k)) for k in (N, N + 1, N + 2)]
    # a change point outside the window (older than L cycles) is ignored
    old_cfg = LoopConfig.from_params({"lake": lake.root, "cycle": CYCLE, "length": 2})
    assert rule_history(old_cfg, seed_query, None, end)[0]["cycle_start"].min() == pd.Timestamp(cycle_iso(N + 1))
