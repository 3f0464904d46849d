"""Forecast gate: a real Holt forecast passes; each kind of bad forecast fails with exactly the expected expectations."""
from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest

from mjoin.gates.config import GateConfig
from mjoin.gates.forecast import check_forecast
from mjoin.gates.forecast import MAD_TO_SIGMA, spread_of
from mjoin.model.statistics import Statistics
from test_gates_support import cycle_iso, history, snapshot

N = 12  # cycles of history; the forecast is for cycle N


@pytest.fixture(scope="module")
def hist(seed_query):
    return history(seed_query, N)


def holt_forecast(query, hist: pd.DataFrame) -> Statistics:
    """A real one-step forecast with statsmodels Holt (damped for gamma), clipped as docs/algorithms.md, "Forecasting" says."""
    from statsmodels.tsa.holtwinters import Holt

    fc = snapshot(query, cycle_iso(N), kind="forecast")
    for (entity, s, r), grp in hist.groupby(["entity", "stream", "right"], dropna=False):
        grp = grp.sort_values("cycle_start")
        fields = ("lambda", "kappa", "window_tuples") if entity == "stream" else ("gamma", "mu")
        for f in fields:
            y = grp[f].to_numpy(dtype=float)
            fit = Holt(y, damped_trend=(f == "gamma"), initialization_method="estimated").fit()
            v = float(fit.forecast(1)[0])
            if entity == "stream":
                setattr(fc.groups[0].streams[s], "lam" if f == "lambda" else f, max(v, 0.0))
            else:
                v = min(max(v, 0.0), 1.0) if f == "gamma" else max(v, 1.0)
                setattr(fc.groups[0].edges[(s, r)], f, v)
    for s, st in fc.groups[0].streams.items():  # a window cannot hold more keys than tuples
        st.kappa = min(st.kappa, st.window_tuples)
    return fc


@pytest.fixture(scope="module")
def good(seed_query, hist):
    return holt_forecast(seed_query, hist)


def test_holt_forecast_passes(seed_query, hist, good):
    res = check_forecast(seed_query, good, hist)
    assert res.status == "passed", res.summary()
    plaus = pd.DataFrame(res.details["plausibility"])
    n_values = 3 * len(seed_query.stream_names) + 2 * len(seed_query.directed_edges)
    assert len(plaus) == n_values and (plaus["n_history"] == 10).all()  # forecast_window cycles


def test_forecast_json_document_and_file(seed_query, hist, good, tmp_path):
    path = good.save(tmp_path / "forecast.json")
    assert check_forecast(seed_query, str(path), hist).status == "passed"
    assert check_forecast(seed_query, good.to_json(), hist).status == "passed"


def _edit(fc: Statistics, fn) -> Statistics:
    out = copy.deepcopy(fc)
    fn(out.groups[0])
    return out


@pytest.mark.parametrize("edit,expected", [
    (lambda g: setattr(g.streams["cu"], "lam", float("nan")), {"forecast.lambda_finite"}),
    (lambda g: setattr(g.edges[("sr", "wr")], "mu", float("inf")), {"forecast.mu_finite"}),
    (lambda g: setattr(g.edges[("cu", "sr")], "gamma", 1.3), {"forecast.gamma_in_unit_interval",
                                                              "forecast.near_recent_history"}),
    (lambda g: setattr(g.streams["wr"], "kappa", -5.0), {"forecast.kappa_non_negative",
                                                         "forecast.near_recent_history"}),
    (lambda g: setattr(g.edges[("cr", "cu")], "mu", 0.4), {"forecast.mu_at_least_one_where_matched"}),
    (lambda g: g.streams.pop("sr"), {"forecast.every_stream_present"}),
    (lambda g: g.edges.pop(("wr", "cr")), {"forecast.every_edge_present"}),
])
def test_bad_forecast_fails_exactly(seed_query, hist, good, edit, expected):
    res = check_forecast(seed_query, _edit(good, edit), hist)
    assert res.status == "failed"
    assert res.failed_expectations == sorted(expected)


def test_absurd_forecast_is_rejected_with_its_reason(seed_query, hist, good):
    bad = _edit(good, lambda g: setattr(g.streams["cu"], "lam", g.streams["cu"].lam * 50))
    res = check_forecast(seed_query, bad, hist)
    assert res.failed_expectations == ["forecast.near_recent_history"]
    (f,) = res.failures
    v = f.values[0]
    assert v["where"] == "[cu]" and v["field"] == "lambda"
    # independent check of the rule: distance to [min, max] of the recent values / max(1.4826 MAD, floor) > k
    recent = hist[(hist["entity"] == "stream") & (hist["stream"] == "cu")].sort_values("cycle_start")["lambda"]
    recent = recent.to_numpy(dtype=float)[-10:]
    med = np.median(recent)
    spread = max(MAD_TO_SIGMA * np.median(np.abs(recent - med)), 0.1 * abs(med), 1.0)
    assert v["median"] == pytest.approx(med) and v["spread"] == pytest.approx(spread)
    assert v["deviation"] == pytest.approx((bad.lam("cu") - recent.max()) / spread)
    assert v["deviation"] > 6
    assert "6 spreads" in f.reason and "range of the last 10 cycles" in f.reason
    assert f.rendered[0].startswith("lambda[cu] = ")


def test_spread_rule_is_configurable(seed_query, hist, good):
    bad = _edit(good, lambda g: setattr(g.streams["cu"], "window_tuples", g.streams["cu"].window_tuples * 1.8))
    assert check_forecast(seed_query, bad, hist).failed_expectations == ["forecast.near_recent_history"]
    loose = GateConfig(forecast_spread_k=20.0)
    assert check_forecast(seed_query, bad, hist, config=loose).status == "passed"
    std = GateConfig(forecast_spread="std")
    assert check_forecast(seed_query, bad, hist, config=std).failed_expectations == ["forecast.near_recent_history"]


def test_flat_history_allows_small_changes(seed_query):
    """A constant history has spread 0: the floor (10 % of the level) keeps small changes passing."""
    flat = history(seed_query, N)
    for f in ("lambda", "kappa", "window_tuples", "gamma", "mu"):
        flat[f] = flat.groupby(["entity", "stream", "right"], dropna=False)[f].transform("first")
    fc = snapshot(seed_query, cycle_iso(N), kind="forecast", seed=0)  # same values as cycle 0
    fc.groups[0].streams["cu"].window_tuples *= 1.3  # +30 % on a flat series: 3 floors away
    fc.groups[0].streams["cu"].kappa = min(fc.groups[0].streams["cu"].kappa, fc.groups[0].streams["cu"].window_tuples)
    assert check_forecast(seed_query, fc, flat).status == "passed"
    fc.groups[0].streams["cu"].window_tuples *= 3  # ~ +290 %: absurd
    res = check_forecast(seed_query, fc, flat)
    assert res.failed_expectations == ["forecast.near_recent_history"]


def test_value_inside_the_recent_range_is_never_absurd(seed_query):
    """A sparse match rate (zeros with one spike) has spread 0 around its median 0: a forecast
    between 0 and the spike is plausible, one far above the spike is not."""
    sparse = history(seed_query, N)
    edge = (sparse["entity"] == "edge") & (sparse["stream"] == "cu") & (sparse["right"] == "wr")
    sparse.loc[edge, "gamma"] = 0.0
    last = sparse[edge]["cycle_start"].max()
    sparse.loc[edge & (sparse["cycle_start"] == last), "gamma"] = 0.25
    fc = snapshot(seed_query, cycle_iso(N), kind="forecast", seed=0)
    for (l, r), e in fc.groups[0].edges.items():
        e.gamma = float(sparse[(sparse["entity"] == "edge") & (sparse["stream"] == l) & (sparse["right"] == r)]
                        .sort_values("cycle_start")["gamma"].iloc[-1])
    fc.groups[0].edges[("cu", "wr")].gamma = 0.14  # Holt on zeros + a spike: inside [0, 0.25]
    assert "forecast.near_recent_history" not in check_forecast(seed_query, fc, sparse).failed_expectations
    fc.groups[0].edges[("cu", "wr")].gamma = 0.95  # 0.7 above the largest value seen, floor 0.02: absurd
    assert "forecast.near_recent_history" in check_forecast(seed_query, fc, sparse).failed_expectations


def test_series_without_history(seed_query, hist, good):
    partial = hist[~((hist["entity"] == "stream") & (hist["stream"] == "wr"))]
    res = check_forecast(seed_query, good, partial)
    # a warning: a new series cannot be judged, but the value rules still hold it finite and in range
    assert (res.status, res.failed_expectations, res.warning_expectations) == ("passed", [],
                                                                              ["forecast.has_recent_history"])
    assert res.failures[0].count == 3  # lambda, kappa, window_tuples of wr


def test_only_cycles_before_the_forecast_count_as_history(seed_query, hist, good):
    """History rows at or after the forecast cycle are not 'recent history' (no peeking)."""
    later = history(seed_query, 3, start=cycle_iso(N))
    later["lambda"] *= 100
    assert check_forecast(seed_query, good, pd.concat([hist, later], ignore_index=True)).status == "passed"


def test_forecast_for_another_query(seed_query, hist, good):
    other = copy.deepcopy(good)
    other.query = "another_query"
    assert check_forecast(seed_query, other, hist).failed_expectations == ["forecast.for_this_query"]


def test_not_a_statistics_document(seed_query, hist, good, tmp_path):
    doc = good.to_json()
    del doc["groups"][0]["streams"][0]["kappa"]
    res = check_forecast(seed_query, doc, hist)
    assert res.failed_expectations == ["forecast.schema_valid"]
    assert "kappa" in res.failures[0].rendered[0]
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    assert check_forecast(seed_query, str(p), hist).failed_expectations == ["forecast.schema_valid"]


def test_spread_of():
    x = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    assert spread_of(x, "mad") == pytest.approx(MAD_TO_SIGMA * 1.0)
    assert spread_of(x, "std") == pytest.approx(np.std(x, ddof=1))
    assert json.dumps(spread_of(np.array([]), "mad")) == "NaN"


# ---- key groups and the history's columns ----------------------------------------------------

RULE2 = {"method": "hash", "attr_class": "c0", "groups": 2}


def test_key_group_missing_from_the_forecast(seed_query):
    """The forecast holds group 0 only while the partitioning has two groups: every stream and edge of g1
    is missing. Without any partitioning the gate cannot know (and says so in a note)."""
    hist2 = history(seed_query, N, groups=(0, 1))
    fc = snapshot(seed_query, cycle_iso(N), kind="forecast", groups=(0,))
    blind = check_forecast(seed_query, fc, hist2)
    assert blind.status == "passed", blind.summary()
    assert any("cannot be detected" in n for n in blind.details["notes"])
    res = check_forecast(seed_query, fc, hist2, partitioning=RULE2)
    assert res.failed_expectations == ["forecast.every_edge_present", "forecast.every_stream_present"]
    streams = next(f for f in res.failures if f.expectation == "forecast.every_stream_present")
    assert sorted(v["where"] for v in streams.values) == sorted(f"[{s}]@{cycle_iso(N)} g1" for s in seed_query.stream_names)
    # the forecast's own partitioning says the same
    fc.partitioning = RULE2
    own = check_forecast(seed_query, fc, hist2)
    assert own.failed_expectations == res.failed_expectations
    assert own.details["groups_from"] == "partitioning of the forecast"


def test_partitioning_recorded_in_the_history_is_used(seed_query, tmp_path):
    from mjoin.gates.history import read_history
    from test_gates_support import write_history

    hist2 = history(seed_query, N, groups=(0, 1))
    root = write_history(hist2, tmp_path / "stats", meta={"partitioning": RULE2})
    fc = snapshot(seed_query, cycle_iso(N), kind="forecast", groups=(0,))
    res = check_forecast(seed_query, fc, read_history(root))
    assert res.failed_expectations == ["forecast.every_edge_present", "forecast.every_stream_present"]
    assert res.details["groups_from"] == "partitioning recorded by the stats job for the last history cycle"


def test_forecast_group_outside_the_partitioning(seed_query, hist):
    fc = snapshot(seed_query, cycle_iso(N), kind="forecast", groups=(0, 3))
    res = check_forecast(seed_query, fc, hist, partitioning=None)
    assert "forecast.groups_of_partitioning" in res.failed_expectations
    f = next(f for f in res.failures if f.expectation == "forecast.groups_of_partitioning")
    assert f.count == len(seed_query.stream_names) + len(seed_query.directed_edges)
    assert all(v["where"].endswith(" g3") for v in f.values)


@pytest.mark.parametrize("history_frame", [
    pd.DataFrame({"query": [], "cycle_start": []}), pd.DataFrame(), None], ids=["two-columns", "no-columns", "None"])
def test_history_without_its_columns_fails(seed_query, good, history_frame):
    """Without a readable history the plausibility rules cannot run: a failed expectation, not a silent pass."""
    res = check_forecast(seed_query, good, history_frame)
    assert res.status == "failed"
    assert res.failed_expectations == ["forecast.history_columns_present"]
    (f,) = res.failures
    assert "gamma" in f.values[0]["missing"] and "lambda" in f.values[0]["missing"]
    assert {s["expectation"] for s in res.details["skipped"]} == {"forecast.has_recent_history",
                                                                 "forecast.near_recent_history"}
    assert "forecast.near_recent_history" not in res.evaluated


def test_the_gate_checks_the_bound_its_config_gives_the_forecast(seed_query, hist, good):
    """near_recent_history's window, spread and floors are GateConfig.forecast_bound(), the bound the forecast keeps
    Holt within (mjoin.forecast.bound): the defaults are one set, overrides reach both."""
    from mjoin.forecast.holt import ForecastConfig
    from mjoin.forecast.bound import ForecastBound

    assert GateConfig().forecast_bound() == ForecastBound() == ForecastConfig().bound
    cfg = GateConfig.from_dict({"forecast_window": 7, "forecast_spread_k": "2.5", "forecast_spread": "std",
                                "forecast_floor_rel": 0.2, "forecast_floor_abs": 3, "forecast_floor_abs_gamma": 0.05})
    bound = cfg.forecast_bound()
    assert bound == ForecastBound(window=7, k=2.5, spread="std", floor_rel=0.2, floor_abs=3.0, floor_abs_gamma=0.05)
    res = check_forecast(seed_query, good, hist, config=cfg)
    plaus = pd.DataFrame(res.details["plausibility"]).set_index(["where", "field"])
    for where, entity, stream, right, field, value in (("[cu]", "stream", "cu", None, "lambda", good.lam("cu")),
                                                       ("[cu][sr]", "edge", "cu", "sr", "gamma", good.gamma("cu", "sr"))):
        sel = (hist["entity"] == entity) & (hist["stream"] == stream)
        sel &= hist["right"].isna() if right is None else (hist["right"] == right)
        y = hist[sel].sort_values("cycle_start")[field].to_numpy(dtype=float)
        recent = bound.recent(y, field)
        row = plaus.loc[(where, field)]
        assert row["n_history"] == 7 and row["spread"] == pytest.approx(recent.spread)
        assert (row["low"], row["high"]) == (recent.low, recent.high)
        assert row["deviation"] == pytest.approx(bound.deviation(value, recent), nan_ok=True)
        assert recent.spread >= (0.05 if field == "gamma" else 3.0)
