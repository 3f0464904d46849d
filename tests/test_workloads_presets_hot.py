"""The hot-stream drift presets (hot-rotate, hot-ramp, hot-burst): the roles they give the streams over time, and
that on their expected statistics selectivity_first and dppick pick different probe orders (the point of them).

Pure: the schedule and the optimizer only (no Spark). The statistics are the expected ones of uniform keys
(tests/preset_statistics.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import preset_statistics
from mjoin.optimizer.cost import CostModel
from mjoin.optimizer.strategies import optimize
from mjoin.model.query import parse_query
from mjoin.model.statistics import Statistics
from mjoin.workloads.presets import preset_document
from mjoin.workloads.schedule import load_schedule
from mjoin.workloads.synthetic import query_document

WINDOW, RATE, DOMAIN, DURATION = 60.0, 200.0, 200, 480.0
CALIBRATED = Path(__file__).resolve().parent.parent / "bench" / "engine" / "results" / "orders_full.json"


def _query(n: int):
    return parse_query(query_document("hot", {f"s{i}": f"s{i}" for i in range(n)}, WINDOW), source="<hot>")


def expected_statistics(sched, t: float) -> Statistics:
    """The expected statistics of uniform keys at time ``t`` of ``sched`` (see the module docstring)."""
    return preset_statistics.expected_statistics(sched, _query(len(sched.stream_names)), t, WINDOW)


def _first_probe(plan, stream: str = "s0") -> str:
    return plan.orders[0][stream][0][1]


def _last_probe(plan, stream: str = "s0") -> str:
    return plan.orders[0][stream][-1][1]


def _models():
    out = [CostModel()]
    if CALIBRATED.exists():
        import json

        out.append(CostModel.from_json(json.loads(CALIBRATED.read_text())["calibration"]["cpu_seconds"]["model"]))
    return out


def test_hot_rotate_roles_and_orders():
    n = 4
    sched = load_schedule("hot-rotate", streams=n, duration=DURATION, rate=RATE, domain=DOMAIN)
    query = _query(n)
    # phases: s1 hot until 40%, s2 until 70%, then s3; the hot stream is 4x the source over 2d, filters sparse over d
    for t, hot in ((0.2 * DURATION, "s1"), (0.55 * DURATION, "s2"), (0.85 * DURATION, "s3")):
        rates = {s: float(sched.rate(s, [t])[0]) for s in sched.stream_names}
        assert max(rates, key=rates.get) == hot
        assert rates[hot] == pytest.approx(4 * rates["s0"])
        assert float(sched.value(hot, "domain", [t])[0]) == 2 * DOMAIN
        assert all(rates[s] < 0.01 * rates["s0"] for s in sched.stream_names if s not in ("s0", hot))
        stats = expected_statistics(sched, t)
        for model in _models():
            assert _last_probe(optimize(query, stats, "dppick", cost_model=model)) == hot
            assert _last_probe(optimize(query, stats, "exact", cost_model=model)) == hot
            assert _first_probe(optimize(query, stats, "selectivity_first", cost_model=model)) == hot


def test_hot_ramp_and_burst_change_the_best_order():
    query = _query(4)
    ramp = load_schedule("hot-ramp", streams=4, duration=DURATION, rate=RATE, domain=DOMAIN)
    before, after = expected_statistics(ramp, 0.1 * DURATION), expected_statistics(ramp, 0.9 * DURATION)
    assert _last_probe(optimize(query, before, "dppick")) == "s1"
    assert _last_probe(optimize(query, after, "dppick")) == "s2"
    # selectivity_first: s2 (over 3d) always first, whether it is a filter or hot
    assert _first_probe(optimize(query, before, "selectivity_first")) == "s2"
    assert _first_probe(optimize(query, after, "selectivity_first")) == "s2"
    burst = load_schedule("hot-burst", streams=4, duration=DURATION, rate=RATE, domain=DOMAIN)
    assert float(burst.rate("s2", [0.35 * DURATION])[0]) == pytest.approx(100 * float(burst.rate("s2", [0.0])[0]))
    assert float(burst.rate("s3", [0.5 * DURATION])[0]) == pytest.approx(100 * float(burst.rate("s3", [0.0])[0]))
    # outside the bursts the filters come first; while s2 bursts dppick probes s3 first, and the other way round
    assert _first_probe(optimize(query, expected_statistics(burst, 0.2 * DURATION), "dppick")) in ("s2", "s3")
    assert _first_probe(optimize(query, expected_statistics(burst, 0.35 * DURATION), "dppick")) == "s3"
    assert _first_probe(optimize(query, expected_statistics(burst, 0.5 * DURATION), "dppick")) == "s2"
    # selectivity_first probes the hot stream (over 2d) first throughout
    for t in (0.2, 0.35, 0.5, 0.9):
        assert _first_probe(optimize(query, expected_statistics(burst, t * DURATION), "selectivity_first")) == "s1"


@pytest.mark.parametrize("name", ["hot-rotate", "hot-ramp", "hot-burst"])
@pytest.mark.parametrize("n", [2, 3, 4, 6])
def test_hot_presets_any_width(name, n):
    doc = preset_document(name, n)
    assert set(doc["streams"]) == {f"s{i}" for i in range(n)}
    sched = load_schedule(name, streams=n, duration=DURATION, rate=RATE, domain=DOMAIN)
    assert np.mean([sched.base[s]["rate"] for s in sched.stream_names]) == pytest.approx(RATE)
    assert sched.base["s1"]["domain"] == 2 * DOMAIN and sched.base["s0"]["domain"] == DOMAIN
