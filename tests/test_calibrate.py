"""Calibration: least-squares recovery of known coefficients from synthetic engine metrics,
degenerate and bad input, the metrics reader and the ``calibrate`` command."""
import json
import math

import numpy as np
import pytest

from mjoin.calibrate import C_MAX, CalibrationError, calibrate, read_observations
from mjoin.cli import main
from mjoin.cost import CostModel


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

    from mjoin.optimizers.synthetic import random_statistics
    from mjoin.plan import load_plan

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
