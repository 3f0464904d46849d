"""mjoin.forecast: the lag test (Eq. 71): after a step or a burst the forecast follows within one cycle, on a smooth
trend or plain noise Holt is kept."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mjoin.forecast.bound import LagBound
from mjoin.forecast.holt import ForecastConfig, ForecastError, forecast, forecast_series

OFF = ForecastConfig(lag=None)


def burst_series(n=60, at=40, length=7, factor=100.0, seed=1):
    """~20/s with noise, x``factor`` on cycles ``at`` .. ``at + length - 1``."""
    y = 20 + np.random.default_rng(seed).normal(0, 1, n)
    y[at:at + length] *= factor
    return y


def test_a_burst_is_followed_within_one_cycle_at_its_start_and_its_end():
    y = burst_series()
    for end in (41, 48):  # the forecast after the burst's first cycle (40), after its first cycle past the end (47)
        seen = y[:end]
        new, holt = forecast_series(seen, "lambda"), forecast_series(seen, "lambda", config=OFF)
        assert new["method"] == "last_value" and new["lagging"] and not new["out_of_range"]
        assert new["value"] == pytest.approx(seen[-1])
        assert "lags a shift" in new["reason"] and "Eq. 71" in new["reason"]
        # Holt alone lags: it is still closer to the level before the change than the last value is
        assert holt["method"] == "holt" and not holt["lagging"]
        assert abs(holt["value"] - seen[-1]) > 0.2 * abs(seen[-1] - seen[-2])
    # Holt's error on the next cycle, against the rule's: the rule's is at the noise level
    for end in (41, 48):
        nxt = y[end]
        assert abs(forecast_series(y[:end], "lambda")["value"] - nxt) < 0.1 * abs(forecast_series(y[:end], "lambda",
                                                                                               config=OFF)["value"] - nxt)


def test_a_step_down_to_a_filter_is_followed_within_one_cycle():
    y = np.r_[300 + np.random.default_rng(3).normal(0, 5, 50), [4.0]]
    new, holt = forecast_series(y, "lambda"), forecast_series(y, "lambda", config=OFF)
    assert new["method"] == "last_value" and new["lagging"] and new["value"] == 4.0
    assert holt["value"] > 40  # Holt's level moved by alpha of the error only


@pytest.mark.parametrize("stat, y", [
    ("kappa", 100 + 3.0 * np.arange(60) + np.random.default_rng(3).normal(0, 1, 60)),  # a steady trend
    ("lambda", 50 + 20 * np.sin(np.arange(60) / 5) + np.random.default_rng(6).normal(0, 1, 60)),  # a smooth swing
    ("lambda", 50 + np.random.default_rng(2).normal(0, 3, 60)),  # stationary noise
    ("gamma", np.clip(0.2 + np.random.default_rng(4).normal(0, 0.02, 60), 0, 1)),  # damped
])
def test_on_a_smooth_series_holt_is_kept(stat, y):
    new, holt = forecast_series(y, stat), forecast_series(y, stat, config=OFF)
    assert new == holt and new["method"].startswith("holt") and not new["lagging"]


def test_false_alarms_on_noise_are_rare():
    """Poisson counts and normal noise around a level, 100 series each: the test fires on at most 3%."""
    rng = np.random.default_rng(11)
    fired = sum(forecast_series(rng.poisson(200, 60).astype(float), "lambda")["lagging"] for _ in range(100))
    fired += sum(forecast_series(50 + rng.normal(0, 5, 60), "lambda")["lagging"] for _ in range(100))
    assert fired <= 6


def test_the_lag_test_itself():
    lag = LagBound()
    errors = np.r_[np.random.default_rng(0).normal(0, 2, 30), [0.0]]
    spread = lag.error_spread(errors, 100.0, "lambda")
    assert spread == pytest.approx(10.0)  # the floor, 0.1 x |last|: larger than the errors' ~2
    assert not lag.lags(errors, 100.0, "lambda")
    errors[-1] = -31.0  # 3.1 spreads
    assert lag.deviation(errors, 100.0, "lambda") == pytest.approx(3.1) and lag.lags(errors, 100.0, "lambda")
    assert not LagBound(k=4).lags(errors, 100.0, "lambda")
    # a burst's large errors earlier in the window do not widen the robust spread
    errors[5:9] = 500.0
    assert lag.error_spread(errors, 100.0, "lambda") == pytest.approx(10.0)
    assert lag.error_spread(errors, 100.0, "lambda") < LagBound(spread="std").error_spread(errors, 100.0, "lambda")
    # gamma's absolute floor; nothing to judge by
    assert lag.error_spread([0.0, 0.0, 0.1], 0.0, "gamma") == pytest.approx(0.02)
    assert math.isnan(lag.deviation([5.0], 1.0, "lambda")) and not lag.lags([5.0], 1.0, "lambda")
    assert math.isnan(lag.deviation([1.0, math.nan], 1.0, "lambda"))
    with pytest.raises(ValueError, match="k="):
        LagBound(k=0)
    with pytest.raises(ValueError, match="spread"):
        LagBound(spread="iqr")
    with pytest.raises(ForecastError, match="LagBound or None"):
        ForecastConfig(lag=3.0)


def test_the_bound_comes_first_so_an_overshoot_stays_out_of_range():
    """A step whose Holt trend overshoots the recent range: the forecast bound's fallback, as before."""
    y = np.r_[np.tile([2.0, 3.0, 4.0, 3.0], 10), [20.0, 80.0, 250.0, 640.0]]
    out = forecast_series(y, "lambda")
    assert out["method"] == "last_value" and out["out_of_range"] and not out["lagging"]


def test_forecast_reports_the_lagging_series(seed_query):
    from tests.test_forecast import T0, TAU, history_of

    n = 45
    lam = burst_series(n=n, at=n - 1, length=1)  # the last cycle bursts
    hist = history_of(seed_query, n, lam=lambda j: lam[j], gamma=lambda j: 0.2)
    as_of = T0 + pd.Timedelta(seconds=TAU * n)
    res = forecast(hist, as_of, length=60)
    assert "0/cu/lambda" in res.statistics.meta["lagging"]
    row = res.report[(res.report.stream == "cu") & (res.report.statistic == "lambda")].iloc[0]
    assert bool(row["lagging"]) and row["value"] == pytest.approx(lam[-1])
    assert res.statistics.lam("cu") == pytest.approx(lam[-1])
    off = forecast(hist, as_of, length=60, config=OFF)
    assert off.statistics.meta["lagging"] == [] and off.statistics.lam("cu") < 0.75 * lam[-1]
    assert res.statistics.meta["config"]["lag"]["k"] == 3.0


def test_a_trend_that_outruns_the_series_after_a_burst_becomes_the_last_value():
    """A window emptying after a burst (the twoclass-burst run's s1 window_tuples): Holt's trend carries the decline
    below 0 while the series sits at 12-17; the clipped 0 is more than 3 floors from the last value."""
    y = np.array([2, 4, 6, 6, 10, 12, 14, 12, 15, 20, 16, 16, 12, 13, 133, 329, 539, 728, 915, 1120, 1180, 1101,
                  894, 709, 523, 321, 138, 17, 17, 16, 16, 13, 12], dtype=float)
    holt = forecast_series(y, "window_tuples", config=OFF)
    assert holt["method"] == "holt" and holt["value"] == 0.0 and "clipped" in holt["reason"]
    new = forecast_series(y, "window_tuples")
    assert new["method"] == "last_value" and new["lagging"] and new["value"] == 12.0
    assert "outran the series" in new["reason"] and "Eq. 71" in new["reason"]
    assert LagBound().outruns(0.0, 12.0, "window_tuples") and not LagBound().outruns(0.0, 0.3, "lambda")
