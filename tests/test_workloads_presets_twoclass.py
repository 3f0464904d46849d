"""The two-class drift presets (twoclass-step, twoclass-burst): the roles they give the streams over time, and that
on their expected statistics dppick and exact cross attribute classes where the preset is designed to make it pay,
while selectivity_first and the fixed orders do not (the point of them).

Pure: the schedule and the optimizer only (no Spark). Expected statistics of uniform keys per attribute class
(tests/preset_statistics.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import preset_statistics
from mjoin.optimizer.cost import CostModel, plan_cost
from mjoin.evaluation.cycle_loop import covering_orders
from mjoin.optimizer.strategies import optimize
from mjoin.model.query import parse_query
from mjoin.model.statistics import Statistics
from mjoin.workloads.presets import preset_document
from mjoin.workloads.schedule import load_schedule
from mjoin.workloads.synthetic import query_document

WINDOW, RATE, DOMAIN, DURATION = 60.0, 200.0, 200, 480.0
CALIBRATED = Path(__file__).resolve().parent.parent / "bench" / "engine" / "results" / "orders_full.json"


def _query(sched):
    return parse_query(query_document("twoclass", {s: s for s in sched.stream_names}, WINDOW, dict(sched.keys)),
                       source="<twoclass>")


def expected_statistics(sched, query, t: float) -> Statistics:
    """The expected statistics of uniform keys at time ``t`` of ``sched``, per attribute class."""
    return preset_statistics.expected_statistics(sched, query, t, WINDOW)


def _probes(plan, stream: str = "s0") -> list:
    return [r for _, r in plan.orders[0][stream]]


def _models():
    out = [CostModel()]
    if CALIBRATED.exists():
        out.append(CostModel.from_json(json.loads(CALIBRATED.read_text())["calibration"]["cpu_seconds"]["model"]))
    return out


def _costs(query, stats, model) -> dict:
    """Model cost of dppick's, exact's and selectivity_first's plans and the mean over the covering fixed orders."""
    out = {s: plan_cost(query, stats, optimize(query, stats, s, cost_model=model), cost_model=model)
           for s in ("dppick", "exact", "selectivity_first")}
    fixed = [plan_cost(query, stats, optimize(query, stats, "fixed", initial_order=o, cost_model=model),
                       cost_model=model) for o in covering_orders(query.stream_names)]
    out["fixed_mean"] = float(np.mean(fixed))
    return out


def test_two_class_step_roles_and_orders():
    sched = load_schedule("twoclass-step", streams=4, duration=DURATION, rate=RATE, domain=DOMAIN)
    q = _query(sched)
    assert sorted(sorted(s for s, _ in m) for m in q.attribute_classes.values()) == [["s0", "s1"], ["s0", "s2", "s3"]]
    for t, hot, hot_param in ((0.25, "s1", "domain"), (0.75, "s2", "key2_domain")):
        rates = {s: float(sched.rate(s, [t * DURATION])[0]) for s in sched.stream_names}
        assert max(rates, key=rates.get) == hot and rates[hot] == pytest.approx(4 * rates["s0"])
        assert float(sched.value(hot, hot_param, [t * DURATION])[0]) == 2 * DOMAIN
        assert all(rates[s] < 0.01 * rates["s0"] for s in sched.stream_names if s not in ("s0", hot))
    before, after = expected_statistics(sched, q, 0.25 * DURATION), expected_statistics(sched, q, 0.75 * DURATION)
    for model in _models():
        for strategy in ("dppick", "exact"):
            # s1 (key) hot: the hub probes the key2 filters first and crosses to key last; then s1 first
            assert _probes(optimize(q, before, strategy, cost_model=model))[-1] == "s1"
            assert _probes(optimize(q, after, strategy, cost_model=model)) == ["s1", "s3", "s2"]
        # selectivity_first probes the hot stream (its key over 2d) first in both phases
        assert _probes(optimize(q, before, "selectivity_first", cost_model=model))[0] == "s1"
        assert _probes(optimize(q, after, "selectivity_first", cost_model=model))[0] == "s2"
        for stats in (before, after):
            c = _costs(q, stats, model)
            assert c["exact"] == pytest.approx(c["dppick"])
            assert c["dppick"] < 0.75 * c["selectivity_first"] and c["dppick"] < 0.75 * c["fixed_mean"], c


def test_two_class_burst_roles_and_orders():
    sched = load_schedule("twoclass-burst", streams=4, duration=DURATION, rate=RATE, domain=DOMAIN)
    q = _query(sched)
    assert float(sched.rate("s1", [0.4 * DURATION])[0]) == pytest.approx(100 * float(sched.rate("s1", [0.0])[0]))
    assert float(sched.rate("s3", [0.7 * DURATION])[0]) == pytest.approx(100 * float(sched.rate("s3", [0.0])[0]))
    assert float(sched.value("s2", "key2_domain", [0.0])[0]) == 2 * DOMAIN
    for model in _models():
        at = {t: expected_statistics(sched, q, t * DURATION) for t in (0.2, 0.4, 0.7, 0.9)}
        for strategy in ("dppick", "exact"):
            # outside the bursts: the key filter s1 first (cross early), the hot s2 last
            assert _probes(optimize(q, at[0.2], strategy, cost_model=model)) == ["s1", "s3", "s2"]
            # while s1 bursts: the key2 filter s3 first, s1 before the hot s2
            assert _probes(optimize(q, at[0.4], strategy, cost_model=model)) == ["s3", "s1", "s2"]
            # while s3 bursts: s1 first, then the hot s2 (it filters on key2 now) before the bursting s3
            assert _probes(optimize(q, at[0.7], strategy, cost_model=model))[0] == "s1"
        for t, stats in at.items():
            assert _probes(optimize(q, stats, "selectivity_first", cost_model=model))[0] == "s2", t
            c = _costs(q, stats, model)
            assert c["exact"] == pytest.approx(c["dppick"])
            assert c["dppick"] < 0.75 * c["selectivity_first"] and c["dppick"] < 0.75 * c["fixed_mean"], (t, c)


@pytest.mark.parametrize("name", ["twoclass-step", "twoclass-burst"])
@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_two_class_presets_any_width(name, n):
    doc = preset_document(name, n)
    assert set(doc["streams"]) == {f"s{i}" for i in range(n)}
    sched = load_schedule(name, streams=n, duration=DURATION, rate=RATE, domain=DOMAIN)
    assert np.mean([sched.base[s]["rate"] for s in sched.stream_names]) == pytest.approx(RATE)
    q = _query(sched)
    # two streams cannot hold two classes (a composite key): the preset is then one class on key
    assert sched.two_class == (n > 2) and len(q.attribute_classes) == (2 if n > 2 else 1)
