"""Calibration: least-squares recovery of known coefficients from synthetic engine metrics,
degenerate and bad input, the metrics reader and the ``calibrate`` command."""
import json
import math

import numpy as np
import pytest

from mjoin.optimizer.calibrate import C_MAX, CalibrationError, calibrate, read_observations
from mjoin.cli import main
from mjoin.optimizer.cost import CostModel


def synthetic(n=300, state="sorted", alpha_q=2e-7, alpha_m=5e-8, c=3.0, m_slots=5000.0, overhead=1e-4,
              noise=0.02, seed=0, kappa_range=(10, 1e6)):
    """Steps as the engine would report them, timed by a known model plus multiplicative noise."""
    rng = np.random.default_rng(seed)
    lookups = rng.integers(100, 20000, n)
    hits = rng.uniform(0.05, 1.0, n)
    mu = rng.uniform(1, 20, n)
    matches = np.round(lookups * hits * mu)
    kappa = np.round(10 ** rng.uniform(np.log10(kappa_range[0]), np.log10(kappa_range[1]), n))
    f = c + (np.log2(np.maximum(kappa, 1)) if state == "sorted" else kappa / (2 * m_slots))
    seconds = (alpha_q * f * lookups + alpha_m * matches + overhead) * rng.normal(1, noise, n)
    return [{"lookups": int(a), "matches": float(b), "kappa": float(k), "seconds": float(s), "state_backend": state}
            for a, b, k, s in zip(lookups, matches, kappa, seconds)]


def test_recovers_known_coefficients_sorted():
    model, report = calibrate(synthetic())
    assert model.calibrated and model.state == "sorted"
    assert model.alpha_q == pytest.approx(2e-7, rel=0.05)
    assert model.alpha_m == pytest.approx(5e-8, rel=0.05)
    assert model.c == pytest.approx(3.0, rel=0.1)
    assert report["overhead_seconds_per_step"] == pytest.approx(1e-4, rel=0.5)
    assert report["r2"] > 0.99 and report["used"] == 300 and report["identified"]["c"]
    assert report["residuals"]["p50_relative"] < 0.03
    assert model.calibration["n"] == 300 and model.calibration["r2"] == pytest.approx(report["r2"], abs=1e-6)


def test_recovers_known_coefficients_hash():
    model, report = calibrate(synthetic(state="hash", alpha_q=1e-7, c=1.0, m_slots=5000), "hash")
    assert model.state == "hash" and model.c == 1.0
    assert model.alpha_q == pytest.approx(1e-7, rel=0.05)
    assert model.m_slots == pytest.approx(5000, rel=0.1)
    assert model.alpha_m == pytest.approx(5e-8, rel=0.05)


def test_state_auto_follows_the_metrics():
    model, _ = calibrate(synthetic(state="hash", c=1.0), "auto")
    assert model.state == "hash"


def test_without_kappa_spread_c_is_kept_and_said():
    obs = synthetic(kappa_range=(1000, 1001), c=1.0)
    model, report = calibrate(obs)
    assert not report["identified"]["c"] and model.c == 1.0
    assert any("c not identified" in n for n in report["notes"])
    assert model.alpha_q == pytest.approx(2e-7, rel=0.05)  # the data were made with c = 1 here


def test_lookup_cost_independent_of_kappa_gives_a_nearly_constant_f():
    obs = synthetic(alpha_q=0.0, overhead=0.0)  # no lookup cost at all...
    for o in obs:
        o["seconds"] += 3e-7 * o["lookups"]  # ...but a constant 3e-7 s per lookup
    model, report = calibrate(obs)
    assert model.c == C_MAX and any("no dependence on kappa" in n for n in report["notes"])
    assert model.query_cost(1000) == pytest.approx(3e-7, rel=0.05)
    assert model.query_cost(1e6) == pytest.approx(3e-7, rel=0.05)


def test_coefficients_stay_non_negative():
    # matches cost nothing and timing is noisy: plain least squares may go negative, nnls does not
    obs = synthetic(alpha_m=0.0, noise=0.3, seed=1)
    model, report = calibrate(obs)
    assert model.alpha_m >= 0 and model.alpha_q >= 0 and model.c >= 0
    assert all(v >= 0 for v in report["coefficients"].values())
    x = np.column_stack([[o["lookups"] for o in obs], [o["lookups"] * math.log2(o["kappa"]) for o in obs],
                         [o["matches"] for o in obs], np.ones(len(obs))])
    ols = np.linalg.lstsq(x, [o["seconds"] for o in obs], rcond=None)[0]
    assert ols[2] < 0  # the case nnls exists for: the constrained optimum sits on the bound
    assert model.alpha_m == 0.0


def test_overhead_per_call_and_cpu_time_field():
    """Engine steps sum over buckets: the fixed cost is per vectorised call, fitted as such; with
    ``time_field="auto"`` the CPU time is used when every step reports it."""
    rng = np.random.default_rng(4)
    obs = synthetic(overhead=0.0, noise=0.002)
    for o in obs:
        o["calls"] = int(rng.integers(1, 17))
        o["cpu_seconds"] = o["seconds"] + 5e-4 * o["calls"]
        o["seconds"] = o["cpu_seconds"] * rng.uniform(1, 3)  # wall time inflated by other processes
    model, report = calibrate(obs, time_field="auto")
    assert report["time_field"] == "cpu_seconds" and report["overhead_term"] == "calls"
    assert report["overhead_seconds_per_call"] == pytest.approx(5e-4, rel=0.1)
    assert model.alpha_q == pytest.approx(2e-7, rel=0.05) and model.alpha_m == pytest.approx(5e-8, rel=0.05)
    assert model.calibration["time_field"] == "cpu_seconds" and report["r2"] > 0.99
    wall, wall_report = calibrate(obs, time_field="seconds")
    assert wall_report["r2"] < report["r2"]
    with pytest.raises(CalibrationError, match="time field"):
        calibrate(obs, time_field="minutes")
    # steps that never ran (no groups alive: no lookups, no calls) carry no information
    _, rep = calibrate(obs + [{"lookups": 0, "matches": 0, "kappa": 5, "seconds": 0.0, "cpu_seconds": 0.0, "calls": 0}],
                       time_field="cpu_seconds")
    assert rep["rejected"] == {"no lookups (step not run)": 1}


def test_reader_reads_each_engine_batch_once(tmp_path):
    """An interval run's metrics folder holds batch=<B>.json and metrics.jsonl with the same records."""
    recs = engine_records(synthetic(n=40))
    d = tmp_path / "metrics" / "q"
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    for r in recs:
        (d / f"batch={r['batch_id']}.json").write_text(json.dumps(r))
    obs, counts = read_observations(tmp_path / "metrics")
    assert counts["records"] == len(recs) and len(obs) == 40


def test_too_few_observations():
    with pytest.raises(CalibrationError, match="3 usable observation"):
        calibrate(synthetic(n=3))


def test_collinear_terms_are_refused():
    obs = [{"lookups": k, "matches": 2 * k, "kappa": 100, "seconds": 1e-6 * k} for k in range(100, 3000, 100)]
    with pytest.raises(CalibrationError, match="do not separate"):
        calibrate(obs, "sorted")


def test_bad_observations_are_counted_not_hidden():
    obs = synthetic(n=40)
    obs += [{"lookups": 1, "matches": 1, "kappa": 1}, {"lookups": "x", "matches": 1, "kappa": 1, "seconds": 1},
            {"lookups": -1, "matches": 1, "kappa": 1, "seconds": 1},
            {"lookups": 1, "matches": 1, "kappa": float("nan"), "seconds": 1},
            {"lookups": 1, "matches": 1, "kappa": 1, "seconds": 1, "state_backend": "hash"}]
    model, report = calibrate(obs, "sorted")
    assert report["used"] == 40 and report["observations"] == 45
    assert report["rejected"] == {"missing seconds": 1, "not a number": 1, "negative or not finite": 2,
                                  "state_backend hash (fitting sorted)": 1}
    with pytest.raises(CalibrationError, match=r"5 rejected"):
        calibrate(obs[-5:] + synthetic(n=2), "sorted")


def engine_records(obs, per_batch=10):
    """Group observations into engine metrics records (chains[].steps[])."""
    recs = []
    for b in range(0, len(obs), per_batch):
        steps = [{"left": "cu", "right": "sr", "hits": 1, "strategy": "index-nested-loop", **{k: v for k, v in o.items()
                                                                                          if k != "state_backend"}}
                 for o in obs[b:b + per_batch]]
        recs.append({"query": "q", "batch_id": b, "state_backend": "sorted",
                     "chains": [{"stream": "cu", "group": 0, "steps": steps[:5]},
                                {"stream": "sr", "group": 0, "steps": steps[5:]}]})
    return recs


def test_reader_takes_engine_metrics_records(tmp_path):
    obs = synthetic(n=60)
    path = tmp_path / "metrics" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text("\n".join(json.dumps(r) for r in engine_records(obs)) + "\nnot json\n")
    back, counts = read_observations(tmp_path / "metrics")
    assert counts == {"files": 1, "records": 6, "observations": 60, "bad_lines": 1}
    assert [o["lookups"] for o in back] == [o["lookups"] for o in obs]
    assert back[0]["state_backend"] == "sorted" and back[0]["stream"] == "cu" and back[5]["stream"] == "sr"
    with pytest.raises(CalibrationError, match="no such metrics file"):
        read_observations(tmp_path / "missing.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CalibrationError, match="no metrics files"):
        read_observations(tmp_path / "empty")


def test_cli_calibrate_then_optimize(capsys, tmp_path, seed_query):
    import random

    from mjoin.optimizer.synthetic import random_statistics
    from mjoin.model.plan import load_plan

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("\n".join(json.dumps(r) for r in engine_records(synthetic(n=200))))
    out = tmp_path / "cm.json"
    assert main(["calibrate", "--metrics", str(metrics), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "R^2 = " in text and "wrote" in text
    model = CostModel.load(out)
    assert model.calibrated and model.alpha_q == pytest.approx(2e-7, rel=0.05)
    stats = random_statistics(seed_query, random.Random(1)).save(tmp_path / "s.json")
    assert main(["optimize", "--query", "tpcds_returns_by_address", "--stats", str(stats), "--strategy", "exact",
                 "--cost-model", str(out), "--out", str(tmp_path / "p.json")]) == 0
    assert load_plan(tmp_path / "p.json", seed_query).cost_model["calibrated"] is True
    capsys.readouterr()
    (tmp_path / "few.jsonl").write_text(json.dumps(engine_records(synthetic(n=3), per_batch=3)[0]))
    assert main(["calibrate", "--metrics", str(tmp_path / "few.jsonl"), "--out", str(out)]) == 2
    assert "calibration needs at least" in capsys.readouterr().err


# ---- calibration from the real engine's metrics -------------------------------------------------

@pytest.mark.spark
def test_calibrate_from_real_engine_metrics(spark, tmp_path):
    """Run the engine (4 orders of a synthetic 4-stream query, 4 cycles each), calibrate from its
    metrics, check the fit is sane, then write the model where the loop reads it and optimize with it."""
    import random

    from engine_helpers import T0
    from mjoin.optimizer.calibrate import calibrate_from_lake, engine_observations, predict_step_seconds
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.interval import run_interval_plans
    from mjoin.lake.layout import Lake
    from mjoin.optimizer.strategies import optimize
    from mjoin.optimizer.synthetic import random_statistics
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.model.query import load_query
    from mjoin.workloads.synthetic import generate_synthetic

    # ~100 tuples/s per stream over 5000 keys: thousands of lookups per step and more matches than lookups,
    # so that alpha_m is identified (over 20000 keys matches were ~30% of the lookups and a run under load
    # fitted alpha_m = 0)
    root = tmp_path / "w"
    generate_synthetic(root, streams=4, duration="3m", rate=100, domain=5000, window="1m", cycle="30s", seed=2)
    q = load_query(str(root / "query.yaml"))
    perms = [["s0", "s1", "s2", "s3"], ["s3", "s2", "s1", "s0"], ["s1", "s3", "s0", "s2"], ["s2", "s0", "s3", "s1"]]
    plans = {"".join(p): make_plan(q, orders_from_permutation(q, p), "fixed") for p in perms}
    summaries = run_interval_plans(spark, q, plans, Lake(str(root)), T0 + 60, T0 + 180, 30, str(tmp_path / "out"),
                                   config=EngineConfig(buckets=1))
    records = [r for s in summaries.values() for r in read_metrics(s.metrics_path)]
    obs = engine_observations(records)
    assert all("cpu_seconds" in o and "calls" in o for o in obs)

    model, report = calibrate(obs, "auto", time_field="auto")
    assert report["time_field"] == "cpu_seconds" and report["overhead_term"] == "calls"
    assert report["used"] >= 150 and model.state == "sorted" and model.calibrated
    # costs are positive: a lookup and a matched tuple both cost time
    assert model.alpha_m > 0 and model.query_cost(1000) > 0
    # the fitted model explains the measured step times, and much better than a model blind to the
    # order (every step of a chain costs the same, scaled by the chain's new tuples)
    used = [o for o in obs if o["lookups"] > 0]
    measured = np.array([o["cpu_seconds"] for o in used])
    predicted = predict_step_seconds(model, used, report["overhead_seconds_per_call"])
    r_model = np.corrcoef(predicted, measured)[0, 1]
    blind = np.array([c["rows_in"] for r in records for c in r["chains"] for st in c["steps"] if st["lookups"] > 0])
    r_blind = np.corrcoef(blind, measured)[0, 1]
    assert r_model > 0.6 and r_model > r_blind + 0.2, (r_model, r_blind, report["r2"])
    assert report["r2"] > 0.3

    # the library path: <lake>/plans/<query>/cost_model.json, which the loop and the optimizer read
    lake = Lake(str(tmp_path / "out" / "s0s1s2s3"))
    loaded_model, rep, path = calibrate_from_lake(lake, q.name)
    assert path.endswith(f"plans/{q.name}/cost_model.json") and rep["records"] == 4
    assert CostModel.load(path) == loaded_model and loaded_model.calibration["time_field"] == "cpu_seconds"
    stats = random_statistics(q, random.Random(3))
    plan = optimize(q, stats, "exact", cost_model=path)
    assert plan.cost_model["calibrated"] is True and plan.cost_model["alpha_m"] == pytest.approx(loaded_model.alpha_m)
    # the command does the same
    import os

    os.remove(path)
    assert main(["calibrate", "--lake", lake.root, "--query", q.name]) == 0
    assert CostModel.load(path).calibrated
    with pytest.raises(CalibrationError, match="below"):
        calibrate_from_lake(lake, q.name, min_r2=1.01, out=tmp_path / "never.json")
    assert not (tmp_path / "never.json").exists()
    with pytest.raises(CalibrationError, match="no engine metrics"):
        calibrate_from_lake(tmp_path / "empty", q.name)
