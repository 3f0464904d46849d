"""mjoin.forecast.holt: Holt / damped Holt with real statsmodels, every fallback, no look-ahead."""
from __future__ import annotations

import logging
import math
import re
import warnings

import numpy as np
import pandas as pd
import pytest

from mjoin.forecast.holt import (ForecastConfig, ForecastError, forecast, forecast_series, last_value, mean_value)
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StreamStats

T0 = pd.Timestamp("2026-01-01T00:00:00Z")
TAU = 10.0


def history_of(query, n, lam, gamma, mu=lambda j: 2.0, kappa=lambda j: 50.0, groups=(0,), start=T0):
    """A tidy history of ``n`` cycles whose series follow the given functions of the cycle index."""
    rows = []
    for j in range(n):
        gs = {}
        for g in groups:
            G = GroupStats()
            for s in query.stream_names:
                G.streams[s] = StreamStats(lam=lam(j), kappa=kappa(j), window_tuples=lam(j) * 300, tuples=lam(j) * TAU)
            for l, r in query.directed_edges:
                G.edges[(l, r)] = EdgeStats(gamma=gamma(j), mu=mu(j))
            gs[g] = G
        st = Statistics(query.name, gs, cycle_start=start + pd.Timedelta(seconds=TAU * j), cycle_seconds=TAU)
        rows += st.to_rows()
    h = pd.DataFrame(rows)
    h["cycle_start"] = pd.to_datetime(h["cycle_start"], utc=True)
    return h


def test_linear_trends_are_recovered(seed_query):
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.5, 200)
    h = history_of(seed_query, 60, lam=lambda j: 20 + 0.8 * j + noise[j], gamma=lambda j: 0.2 + 0.004 * j,
                   mu=lambda j: 1.5 + 0.01 * j + noise[j] * 0.01, kappa=lambda j: 100 + 3 * j + noise[j + 60])
    res = forecast(h, T0 + pd.Timedelta(seconds=TAU * 60), length=60)
    st = res.statistics
    assert st.kind == "forecast" and st.cycle_start == "2026-01-01T00:10:00Z" and st.check(seed_query)
    # the true next values at j = 60
    assert st.lam("cu") == pytest.approx(20 + 0.8 * 60, abs=1.5)
    assert st.kappa("sr") == pytest.approx(100 + 3 * 60, abs=2.5)
    assert st.gamma("cu", "sr") == pytest.approx(0.2 + 0.004 * 60, abs=0.01)
    assert st.mu("wr", "cr") == pytest.approx(1.5 + 0.6, abs=0.03)
    # Holt beats the last value on a trend (the last value lags one step behind)
    lv = last_value(h, T0 + pd.Timedelta(seconds=TAU * 60))
    assert lv.kind == "last_value"
    assert abs(st.lam("cu") - 68) < abs(lv.lam("cu") - 68) + 0.5
    rep = res.report
    assert set(rep[rep.statistic == "gamma"]["method"]) == {"holt_damped"}
    assert set(rep[rep.statistic != "gamma"]["method"]) == {"holt"}
    for r in rep.itertuples():
        assert r.lower <= r.value <= r.upper and r.n_points == 60 and r.horizon == 1


def test_damped_gamma_stays_in_unit_interval(seed_query):
    # gamma rising steeply towards and past 1: forecast clipped into [0, 1]
    h = history_of(seed_query, 40, lam=lambda j: 10.0 + j, gamma=lambda j: min(1.0, 0.05 + 0.03 * j),
                   mu=lambda j: 1.0 + 0.0 * j)
    res = forecast(h, T0 + pd.Timedelta(seconds=TAU * 40))
    for (l, r) in seed_query.directed_edges:
        g = res.statistics.gamma(l, r)
        assert 0.0 <= g <= 1.0
    h2 = history_of(seed_query, 40, lam=lambda j: 10.0, gamma=lambda j: max(0.0, 0.9 - 0.05 * j + 0.01 * (j % 2)))
    res2 = forecast(h2, T0 + pd.Timedelta(seconds=TAU * 40))
    assert all(0.0 <= res2.statistics.gamma(l, r) <= 1.0 for l, r in seed_query.directed_edges)


@pytest.mark.parametrize("series, stat, method, words", [
    ([1.0, 2.0, 3.0], "lambda", "last_value", "short: 3 points < 10"),
    ([5.0] * 30, "kappa", "constant", "constant series"),
    ([0.0] * 30, "gamma", "constant", "all-zero series"),
    ([np.nan] * 30, "mu", "default", "no finite value"),
    ([np.nan] * 30, "lambda", "default", "no finite value"),
])
def test_fallbacks_are_recorded(series, stat, method, words):
    out = forecast_series(series, stat)
    assert out["method"] == method and words in out["reason"]
    if method == "default":
        assert out["value"] == (1.0 if stat == "mu" else 0.0)
    if method == "last_value":
        assert out["value"] == series[-1]


def test_nan_inside_the_window_is_interpolated_not_fatal():
    y = 10 + 0.5 * np.arange(40) + np.random.default_rng(1).normal(0, 0.2, 40)
    y[[5, 17, 18]] = np.nan
    out = forecast_series(y, "lambda")
    assert out["method"] == "holt" and "3 missing or NaN cycle(s) interpolated" in out["reason"]
    assert out["value"] == pytest.approx(10 + 0.5 * 40, abs=1.0)
    # trailing NaN: the forecast reaches further ahead and says so
    y2 = y.copy()
    y2[-2:] = np.nan
    out2 = forecast_series(y2, "lambda")
    assert "3 steps ahead" in out2["reason"] and out2["value"] == pytest.approx(30, abs=1.5)
    assert out2["upper"] - out2["lower"] > out["upper"] - out["lower"]
    # short after dropping NaN
    y3 = np.full(30, np.nan)
    y3[-4:] = [1, 2, 3, 4]
    out3 = forecast_series(y3, "lambda")
    assert out3["method"] == "last_value" and "short: 4 points" in out3["reason"]


def test_fit_failure_falls_back():
    y = 10 + np.arange(30.0)
    # a real statsmodels failure: it rejects an unknown optimizer
    out = forecast_series(y, "lambda", config=ForecastConfig(optimizer="no-such-method"))
    assert out["method"] == "last_value" and out["reason"].startswith("fit failed: ")
    out = forecast_series(y, "lambda", config=ForecastConfig(optimizer="no-such-method", fallback="mean"))
    assert out["method"] == "mean" and out["value"] == pytest.approx(np.mean(y))


@pytest.mark.parametrize("stat, y, bound", [
    ("lambda", 9.8 - 0.5 * np.arange(20), 0.0),  # falls to 0.3: Holt says -0.2
    ("mu", 2.95 - 0.1 * np.arange(20), 1.0),  # falls to 1.05: Holt says 0.95
    ("gamma", 0.052 * np.arange(20), 1.0),  # rises to 0.988: the damped trend still passes 1
])
def test_values_are_clipped_and_the_reason_says_so(stat, y, bound):
    out = forecast_series(y, stat)
    assert out["method"] in ("holt", "holt_damped")  # a fit, then clipped (not a fallback)
    assert out["value"] == bound
    assert re.fullmatch(rf"clipped [-0-9.e]+ to {bound:g}", out["reason"]), out["reason"]
    unclipped = float(out["reason"].split()[1])
    assert (unclipped < bound) == (stat != "gamma") and unclipped != bound  # below 0 / 1, or above 1 for gamma
    assert out["lower"] is not None and out["lower"] <= out["value"] <= out["upper"]


def test_a_forecast_outside_the_data_falls_back_as_fit_unstable():
    """The guard: a fitted value beyond [min - guard*range, max + guard*range] is not used."""
    y = np.arange(20.0)  # Holt extrapolates to 20
    assert forecast_series(y, "lambda")["method"] == "holt"  # default guard (1 x range): accepted
    out = forecast_series(y, "lambda", config=ForecastConfig(guard=0.0))  # no room beyond [0, 19]
    assert out["method"] == "last_value" and out["value"] == 19.0
    assert re.fullmatch(r"fit unstable: forecast 20(\.0+\d*)? outside \[0, 19\]", out["reason"]), out["reason"]
    out = forecast_series(y, "lambda", config=ForecastConfig(guard=0.0, fallback="mean"))
    assert out["method"] == "mean" and out["value"] == pytest.approx(9.5) and "fit unstable" in out["reason"]


def test_statsmodels_warnings_do_not_leak(seed_query, caplog):
    rng = np.random.default_rng(2)
    noise = rng.normal(0, 1, 100)
    h = history_of(seed_query, 12, lam=lambda j: abs(noise[j]) * 1e-9, gamma=lambda j: abs(noise[j + 20]) % 1,
                   mu=lambda j: 1 + abs(noise[j + 40]))
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        res = forecast(h, T0 + pd.Timedelta(seconds=TAU * 12))
    assert caught == [] and [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert res.statistics.check(seed_query)


def test_no_look_ahead(seed_query):
    base = history_of(seed_query, 50, lam=lambda j: 10 + j, gamma=lambda j: 0.3)
    poisoned = pd.concat([base, history_of(seed_query, 10, lam=lambda j: 1e6, gamma=lambda j: 1.0,
                                           start=T0 + pd.Timedelta(seconds=TAU * 50))], ignore_index=True)
    as_of = T0 + pd.Timedelta(seconds=TAU * 50)
    a = forecast(base, as_of).statistics.to_json()
    b = forecast(poisoned, as_of).statistics.to_json()
    a["meta"].pop("elapsed_seconds"), b["meta"].pop("elapsed_seconds")
    assert a == b
    # as_of in the middle of the history: only earlier cycles count
    mid = forecast(poisoned, T0 + pd.Timedelta(seconds=TAU * 30), length=60)
    assert mid.statistics.meta["last_cycle"] == "2026-01-01T00:04:50Z" and mid.statistics.meta["cycles_used"] == 30
    assert mid.statistics.lam("cu") == pytest.approx(40, abs=1)
    with pytest.raises(ForecastError, match="no statistics cycle starts before"):
        forecast(base, T0)


def test_length_and_missing_cycles(seed_query):
    h = history_of(seed_query, 80, lam=lambda j: 10 + j, gamma=lambda j: 0.5)
    res = forecast(h, T0 + pd.Timedelta(seconds=TAU * 80), length=20)
    assert res.statistics.meta["cycles_used"] == 20 and set(res.report["n_points"]) == {20}
    # history ends 3 cycles before as_of: 4 steps ahead, reported
    res = forecast(h, T0 + pd.Timedelta(seconds=TAU * 83), length=60)
    assert res.statistics.meta["horizon"] == 4 and res.statistics.cycle_start == "2026-01-01T00:13:50Z"
    assert res.statistics.lam("cu") == pytest.approx(10 + 83, abs=1.0)
    # a cycle missing in the middle is interpolated
    gap = h[h.cycle_start != T0 + pd.Timedelta(seconds=TAU * 70)]
    rep = forecast(gap, T0 + pd.Timedelta(seconds=TAU * 80)).report
    assert rep["reason"].str.contains("1 missing or NaN cycle").all()


def test_json_output_is_a_statistics_document(seed_query, tmp_path):
    h = history_of(seed_query, 30, lam=lambda j: 10 + j % 3, gamma=lambda j: 0.4 + 0.01 * (j % 4))
    res = forecast(h, T0 + pd.Timedelta(seconds=TAU * 30))
    path = tmp_path / "f.json"
    res.save(path)
    st = Statistics.load(path)
    assert st.kind == "forecast" and st.check(seed_query)
    meta = st.meta["series"]["0/cu->sr/gamma"]
    assert meta["method"] == "holt_damped" and meta["n_points"] == 30
    # lambda, window_tuples: Holt; gamma: damped; kappa and mu are constant here: no fit
    assert st.meta["methods"] == {"holt": 4 + 4, "holt_damped": 12, "constant": 4 + 12}
    mv = mean_value(h, T0 + pd.Timedelta(seconds=TAU * 30))
    assert mv.kind == "mean" and mv.lam("cu") == pytest.approx(np.mean([10 + j % 3 for j in range(30)]))


def test_per_group_series_and_partitioning_change(seed_query):
    h = history_of(seed_query, 20, lam=lambda j: 5.0 + j, gamma=lambda j: 0.5, groups=(0, 1))
    cycles = sorted(h.cycle_start.unique())
    rule = {"method": "hash", "attr_class": "c0", "groups": 2}
    h.attrs["cycles"] = {c.isoformat().replace("+00:00", "Z"): {"partitioning": None if i < 5 else rule}
                         for i, c in enumerate(cycles)}
    res = forecast(h, T0 + pd.Timedelta(seconds=TAU * 20))
    assert sorted(res.statistics.groups) == [0, 1] and res.statistics.partitioning == rule
    assert res.statistics.meta["cycles_used"] == 15
    assert "5 cycle(s) with another partitioning ignored" in res.statistics.meta["notes"]


def test_interval_coverage_is_roughly_nominal():
    rng = np.random.default_rng(11)
    hits, n = 0, 120
    for _ in range(n):
        y = 50 + 0.3 * np.arange(61) + rng.normal(0, 2.0, 61)
        out = forecast_series(y[:60], "lambda", config=ForecastConfig(level=0.9))
        hits += out["lower"] <= y[60] <= out["upper"]
    assert 0.78 <= hits / n <= 0.98


def test_bad_settings_are_clear_errors():
    with pytest.raises(ForecastError, match="forecast model"):
        ForecastConfig(model="arima")
    with pytest.raises(ForecastError, match="min_points"):
        ForecastConfig(min_points=1)
    assert math.isfinite(forecast_series([1.0, 2.0], "gamma")["value"])


def test_kappa_forecast_never_exceeds_window_tuples(seed_query):
    """A sparse stream: 12 tuples in the window, distinct keys rising to all 12 in the last cycle. Holt's
    trend alone forecasts more keys than tuples; the forecast caps kappa (value and interval) at window_tuples."""
    h = history_of(seed_query, 40, lam=lambda j: 0.04, gamma=lambda j: 0.2, kappa=lambda j: 12.0 - 0.2 * (39 - j))
    alone = forecast_series(h[(h.entity == "stream") & (h.stream == "cu")].sort_values("cycle_start")["kappa"]
                            .to_numpy(dtype=float), "kappa")
    res = forecast(h, T0 + pd.Timedelta(seconds=TAU * 40), length=40)
    st = res.statistics
    for s in seed_query.stream_names:
        assert st.window_tuples(s) == pytest.approx(12.0)
        assert st.kappa(s) <= st.window_tuples(s)
    rep = res.report[(res.report.statistic == "kappa") & (res.report.stream == "cu")].iloc[0]
    assert alone["value"] > 12.1  # the trend alone overshoots
    assert rep.value == pytest.approx(12.0) and "capped" in rep.reason and rep.upper <= 12.0
    below = forecast(history_of(seed_query, 40, lam=lambda j: 0.04, gamma=lambda j: 0.2, kappa=lambda j: 6.0),
                     T0 + pd.Timedelta(seconds=TAU * 40), length=40)
    assert below.statistics.kappa("cu") == pytest.approx(6.0)  # below window_tuples: untouched
    assert "capped" not in below.report[below.report.statistic == "kappa"].iloc[0].reason


# ---- the forecast gate's bound: a Holt forecast past the recent range becomes the last value ---------------

STEP = [160.0, 320.0, 480.0, 640.0]  # a stream turning hot: its rate climbs within a few cycles (its window fills)


def step_series() -> np.ndarray:
    """40 cycles at ~3/s, then STEP: Holt's trend carries the forecast past 640 (769 with this statsmodels)."""
    return np.r_[np.tile([2.0, 3.0, 4.0, 3.0], 10), STEP]


def test_a_holt_forecast_past_the_recent_range_becomes_the_last_value():
    from mjoin.forecast.bound import ForecastBound
    from mjoin.gates.config import GateConfig

    y = step_series()
    off = forecast_series(y, "lambda", config=ForecastConfig(bound=None))
    bound = ForecastBound()
    recent = bound.recent(y, "lambda")
    lo, hi = bound.limits(recent)
    assert off["method"] == "holt" and off["value"] > hi and not off["out_of_range"]  # the trend overshoots
    on = forecast_series(y, "lambda")  # on by default, with the gate's default bound
    assert GateConfig().forecast_bound() == ForecastConfig().bound == bound
    assert on["method"] == "last_value" and on["value"] == 640.0 and on["out_of_range"]
    assert f"holt forecast {off['value']:.6g} outside [{lo:.6g}, {hi:.6g}]" in on["reason"]
    assert on["lower"] < 640.0 < on["upper"]  # the last value's interval (differences' spread)
    # a looser bound (the gate with k = 100: the spread here is 1.48) lets the same Holt value through
    loose = forecast_series(y, "lambda", config=ForecastConfig(bound=GateConfig(forecast_spread_k=100).forecast_bound()))
    assert loose["method"] == "holt" and loose["value"] == pytest.approx(off["value"]) and not loose["out_of_range"]


@pytest.mark.parametrize("stat, y", [
    ("lambda", 50 + np.random.default_rng(2).normal(0, 3, 60)),  # stationary noise
    ("kappa", 100 + 3.0 * np.arange(60) + np.random.default_rng(3).normal(0, 1, 60)),  # a steady trend
    ("gamma", np.clip(0.2 + np.random.default_rng(4).normal(0, 0.02, 60), 0, 1)),  # damped
])
def test_an_in_range_holt_forecast_is_unchanged(stat, y):
    on, off = forecast_series(y, stat), forecast_series(y, stat, config=ForecastConfig(bound=None))
    assert on == off and on["method"].startswith("holt") and not on["out_of_range"]


def test_the_bound_applies_to_any_holt_value_it_rejects():
    """A clean trend (Holt extrapolates it past the last value for sure) against a bound of k = 0: the recent
    range itself. Inside the range (a falling-then-rising series' forecast) nothing changes."""
    from mjoin.forecast.bound import ForecastBound

    y = 100 + 3.0 * np.arange(60)
    tight = ForecastConfig(bound=ForecastBound(k=0.0))
    free = forecast_series(y, "kappa", config=ForecastConfig(bound=None))
    assert free["method"] == "holt" and free["value"] > y[-1] + 1
    out = forecast_series(y, "kappa", config=tight)
    assert out["method"] == "last_value" and out["value"] == y[-1] and out["out_of_range"]
    assert forecast_series(y, "kappa", config=ForecastConfig(bound=ForecastBound(k=2.0)))["method"] == "holt"
    with pytest.raises(ForecastError, match="ForecastBound or None"):
        ForecastConfig(bound=3.0)
    with pytest.raises(ValueError, match="spread"):
        ForecastBound(spread="iqr")


def step_history(query, n=40):
    """``cu`` and ``sr`` (rate and window) step up in the last cycles, ``wr`` steps down to a filter; the rest
    stay put."""
    noise = np.random.default_rng(5).poisson(3, n).astype(float)
    hist = history_of(query, n, lam=lambda j: noise[j], gamma=lambda j: 0.2, kappa=lambda j: 20.0)
    up = dict(zip(range(n - len(STEP), n), STEP))  # (the noise differs from step_series': checked below)
    down = dict(zip(range(n - 3, n), [50.0, 30.0, 20.0]))
    for s, steps in (("cu", up), ("sr", up), ("wr", down)):
        for j, v in steps.items():
            at = (hist.entity == "stream") & (hist.stream == s) & (hist.cycle_start == T0 + pd.Timedelta(seconds=TAU * j))
            hist.loc[at, ["lambda", "window_tuples"]] = [v, v * 30]
        if s == "wr":  # high before the drop
            before = (hist.entity == "stream") & (hist.stream == s) & (hist.cycle_start < T0 + pd.Timedelta(seconds=TAU * (n - 3)))
            hist.loc[before, "lambda"] = 100.0 + noise[: int(before.sum())]
            hist.loc[before, "window_tuples"] = hist.loc[before, "lambda"] * 30
    return hist


def test_the_bounded_forecast_passes_the_forecast_gate_that_holt_alone_fails(seed_query, holt_global_fit):
    from mjoin.gates.config import GateConfig
    from mjoin.gates.forecast import check_forecast

    h = step_history(seed_query)
    as_of = T0 + pd.Timedelta(seconds=TAU * 40)
    off = forecast(h, as_of, config=ForecastConfig(bound=None))
    gate_off = check_forecast(seed_query, off.statistics, h)
    assert gate_off.failed_expectations == ["forecast.near_recent_history"], gate_off.summary()
    failed = {v["where"] + v["field"] for f in gate_off.failures for v in f.values}
    assert not off.report["out_of_range"].any() and off.statistics.meta["out_of_range"] == []

    on = forecast(h, as_of)
    replaced = on.report[on.report["out_of_range"]]
    # exactly the series the gate failed, each now its last value
    assert {f"[{r.stream}]{r.statistic}" for r in replaced.itertuples()} == failed
    assert (replaced["method"] == "last_value").all() and (replaced["value"] == replaced["last_value"]).all()
    assert on.statistics.meta["out_of_range"] == [f"0/{r.stream}/{r.statistic}" for r in replaced.itertuples()]
    assert on.statistics.lam("cu") == 640.0 and off.statistics.lam("cu") > 700
    assert check_forecast(seed_query, on.statistics, h).status == "passed"
    # series inside the range: the same values as without the bound
    kept = ~on.report["out_of_range"]
    assert np.allclose(on.report.loc[kept, "value"], off.report.loc[kept, "value"])

    # the bound follows the gate's configuration: with k = 30 Holt's 800 (24 spreads out) is accepted by the
    # gate and kept by the forecast given that gate's bound; the default gate still fails it
    loose = GateConfig(forecast_spread_k=30.0)
    kept_loose = forecast(h, as_of, config=ForecastConfig(bound=loose.forecast_bound()))
    assert kept_loose.statistics.meta["out_of_range"] == [] and kept_loose.statistics.lam("cu") > 700
    assert check_forecast(seed_query, kept_loose.statistics, h, config=loose).status == "passed"
    assert check_forecast(seed_query, kept_loose.statistics, h).failed_expectations == ["forecast.near_recent_history"]


def test_the_forecast_command_bounds_by_default_and_says_so(seed_query, tmp_path, capsys, holt_global_fit):
    from mjoin.cli import main
    from mjoin.stats.history import write_cycle

    h = step_history(seed_query)
    for cyc, rows in h.groupby("cycle_start"):
        write_cycle(str(tmp_path / "hist"), seed_query.name, cyc,
                    rows.assign(cycle_start=cyc.strftime("%Y-%m-%dT%H:%M:%SZ")), meta={"partitioning": None})
    as_of = str((T0 + pd.Timedelta(seconds=TAU * 40)).timestamp())
    args = ["forecast", "--stats-history", str(tmp_path / "hist" / seed_query.name), "--as-of", as_of]
    assert main(args + ["--out", str(tmp_path / "on.json")]) == 0
    assert "2 Holt value(s) outside the forecast gate's range replaced by the last value: 0/cu/lambda, 0/sr/lambda" \
        in capsys.readouterr().out
    assert Statistics.load(tmp_path / "on.json").lam("cu") == 640.0
    assert main(args + ["--out", str(tmp_path / "off.json"), "--no-bound"]) == 0
    assert "replaced" not in capsys.readouterr().out and Statistics.load(tmp_path / "off.json").lam("cu") > 700
