"""bench/evaluation: the TPC-DS rate reaches the generated workload (run_evaluation's --tpcds-rate), and
overhead_rate.py's points and 5% crossing."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

EVAL = Path(__file__).resolve().parent.parent / "bench" / "evaluation"
sys.path.insert(0, str(EVAL))

import overhead_rate  # noqa: E402
import run_evaluation  # noqa: E402

from mjoin.workloads.manifest import load_manifest  # noqa: E402
from mjoin.workloads.tpcds_cache import ensure_tables  # noqa: E402

SF = 0.01


@pytest.fixture(scope="module")
def tpcds_cache(tmp_path_factory):
    """The session's dsdgen cache of the workloads tests (same folder name), or a new one."""
    root = tmp_path_factory.getbasetemp() / "tpcds-cache"
    ensure_tables(SF, root)
    return root


def test_tpcds_rate_reaches_the_workload(tmp_path, tpcds_cache, monkeypatch):
    monkeypatch.setenv("MJOIN_CACHE", str(tpcds_cache))
    fast = run_evaluation.tpcds_workload(tmp_path, SF, None, 50.0)
    default = run_evaluation.tpcds_workload(tmp_path, SF, None)
    assert fast.name == "tpcds-sf0.01-r50" and default.name == "tpcds-sf0.01"  # cached workloads do not collide
    m, d = load_manifest(fast), load_manifest(default)
    rows = d.doc["replay"]["total_rows"]
    assert m.parameters["rate"] == 50.0 and m.doc["replay"]["total_rows"] == rows
    assert m.end_epoch - m.start_epoch == pytest.approx(math.ceil(rows / 50.0), abs=1)
    assert d.parameters["rate"] == pytest.approx(rows / 3600) and d.end_epoch - d.start_epoch == 3600
    assert run_evaluation.tpcds_workload(tmp_path, SF, None, 50.0) == fast  # generated once, reused


class _Args(Exception):
    pass


def _parsed(monkeypatch, argv):
    def stop(args):
        raise _Args(args)

    monkeypatch.setattr(run_evaluation, "run", stop)
    with pytest.raises(_Args) as e:
        run_evaluation.main(argv)
    return e.value.args[0]


def test_tpcds_rate_option(monkeypatch, capsys):
    a = _parsed(monkeypatch, ["--sections", "overhead", "--tpcds-rate", "500"])
    assert a.tpcds_rate == 500.0 and a.duration is None
    q = _parsed(monkeypatch, ["--quick", "--tpcds-rate", "500"])  # the quick run's 7-minute replay gives way
    assert q.tpcds_rate == 500.0 and q.duration is None
    d = _parsed(monkeypatch, ["--quick"])  # the default is unchanged
    assert d.tpcds_rate is None and d.duration == "7m"
    with pytest.raises(SystemExit):
        run_evaluation.main(["--duration", "10m", "--tpcds-rate", "500"])
    assert "at most one" in capsys.readouterr().err


def test_points():
    assert overhead_rate.parse_point("paper", 1.0) == (None, 1.0)
    assert overhead_rate.parse_point("500", 1.0) == (500.0, 1.0)
    assert overhead_rate.parse_point("5000@10", 1.0) == (5000.0, 10.0)


def test_crossing_interpolated_in_log_log():
    c = overhead_rate.crossing([(100, 2.0), (1000, 0.2), (10000, 0.02)])
    # 0.2 -> 0.02 over a decade of rate: ratio ~ rate^-1, 0.05 at 1000 * 4
    assert c["how"] == "interpolated" and c["between"] == [1000.0, 10000.0]
    assert c["rate"] == pytest.approx(4000.0)
    assert overhead_rate.crossing([(10000, 0.02), (1000, 0.2)])["rate"] == pytest.approx(4000.0)  # any order


def test_crossing_extrapolated_or_none():
    c = overhead_rate.crossing([(100, 4.0), (400, 1.0)])  # ratio ~ rate^-1: 0.05 at 100 * 80
    assert c["how"].startswith("extrapolated") and c["slope"] == pytest.approx(-1.0)
    assert c["rate"] == pytest.approx(8000.0)
    up = overhead_rate.crossing([(100, 1.0), (1000, 2.0)])  # the ratio grows with the rate: no crossing
    assert up["rate"] is None and up["slope"] > 0
    assert overhead_rate.crossing([(100, 0.01), (1000, 0.02)])["rate"] is None  # already below at the lowest
    assert overhead_rate.crossing([(100, None)])["rate"] is None
    # the first crossing counts, not a later one after the ratio rose again
    assert overhead_rate.crossing([(100, 1.0), (200, 0.04), (400, 0.5), (800, 0.01)])["between"] == [100.0, 200.0]


def test_crossings_per_scale_factor():
    def point(rate, sf, ratio):
        return {"rate": rate, "sf": sf, "period": {"ratio_median": ratio}, "cycle": {"ratio": 10 * ratio}}

    pts = [point(100, 1.0, 1.0), point(1000, 1.0, 0.1), point(2000, 10.0, 0.5), point(5000, 10.0, 0.01)]
    c = overhead_rate.crossings(pts)
    assert set(c) == {"all", "sf1", "sf10"}
    assert c["sf1"]["per_period"]["how"].startswith("extrapolated")
    assert c["sf1"]["per_period"]["rate"] == pytest.approx(2000.0)  # ratio ~ rate^-1 through (1000, 0.1)
    assert c["sf10"]["per_period"]["between"] == [2000.0, 5000.0]
    assert c["all"]["per_period"]["between"] == [2000.0, 5000.0]  # sorted by rate: 0.1 at 1000, 0.5 at 2000, ...
    assert c["sf1"]["per_cycle"]["rate"] == pytest.approx(20000.0)


def test_summarize_per_cycle_and_per_period():
    steps = {"statistics": 0.5, "history": 0.1, "stats_gate": 0.2, "forecast": 0.2, "forecast_gate": 0.2,
             "optimize": 0.0, "plan_gate": 0.05}
    over = {"per_cycle": {"cycles": 60, "loop_seconds_per_cycle": {"median": 1.0}, "loop_seconds_total": 66.0,
                          "median_step_seconds": steps, "join_engine_seconds": 3.0, "join_task_cpu_seconds": 1.5,
                          "fraction_of_join_engine_time": 22.0},
            "per_period": {"period_seconds": 300, "periods": [
                {"seconds": steps, "total": 2.0, "join_engine_seconds": 4.0, "join_task_cpu_seconds": 1.0,
                 "fraction_of_join_engine_time": 0.5},
                {"seconds": steps, "total": 3.0, "join_engine_seconds": 1.0, "join_task_cpu_seconds": 1.0,
                 "fraction_of_join_engine_time": 3.0}]}}
    s = overhead_rate.summarize(over, 10)
    assert s["measured_cycles"] == 60 and s["cycle"]["join_seconds_mean"] == pytest.approx(0.05)
    assert s["cycle"]["loop_seconds_mean"] == pytest.approx(1.1) and s["cycle"]["ratio"] == 22.0
    assert s["period"]["loop_seconds_median"] == 2.5 and s["period"]["ratio_median"] == pytest.approx(1.75)
    assert s["period"]["count"] == 2 and s["period"]["ratios"] == [0.5, 3.0]
    # the median round's join per batch (3.0 s / 60) over the period's 30 batches: 1.5 s
    assert s["period"]["join_seconds_median_round"] == pytest.approx(1.5)
    assert s["period"]["ratio_median_round"] == pytest.approx(2.5 / 1.5)


def test_the_joins_time_per_batch_is_the_median_over_the_engines_rounds(monkeypatch):
    """``_per_batch_wall``: per batch the median of the rounds' composed times, whatever round ran slow (it took the
    middle round in run order: one loaded round moved the per-period ratio by a third at 2,000/s)."""
    from types import SimpleNamespace

    import mjoin.evaluation.cycle_loop

    rounds = [({"t": [1.0, 9.0, 1.0]}, None), ({"t": [50.0, 2.0, 3.0]}, None), ({"t": [2.0, 3.0, 2.0]}, None)]
    monkeypatch.setattr(mjoin.evaluation.cycle_loop, "compose",
                        lambda keys, plans, ch, base, batches: {"wall": ch["t"][batches[0] - 10] + plans[keys[0]]})
    sched = SimpleNamespace(gated={("o", "dppick"): ["p", "q", "p"]}, plans={"p": 0.0, "q": 100.0})
    monkeypatch.setattr(run_evaluation, "sched_orders", lambda s: ["o"])
    doc = {"_sched": sched, "_measured": {"rounds": rounds, "batch_ids": [10, 11, 12]}}
    assert run_evaluation._per_batch_wall(doc) == [2.0, 103.0, 2.0]
