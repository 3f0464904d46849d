"""The range a forecast value may take: its series' recent history, widened by ``k`` spreads; and
when a Holt forecast lags a level shift (:class:`LagBound`).

One bound, two users: the forecast gate's rule ``forecast.near_recent_history``
(:func:`mjoin.gates.forecast.plausibility_frame`) fails a value outside it, and
:func:`mjoin.forecast.holt.forecast` replaces a Holt forecast outside it by the series' last
value (so a trend carried past a step does not fail the gate). Pure logic (numpy only).

``recent`` is the series' last ``window`` cycles before the forecast (finite values);
the value's distance to ``[min(recent), max(recent)]`` (0 inside it: a value the series
has already taken is never absurd), in spreads, must be at most ``k``. ``spread`` is
1.4826 x the median absolute deviation (``spread="mad"``, robust to the one odd cycle)
or the standard deviation (``"std"``), floored at
``max(floor_rel * |median(recent)|, floor_abs)`` (``floor_abs_gamma`` for ``gamma``) so
that a flat history (spread 0) does not reject every change.

The defaults here are the gate's (``GateConfig.forecast_*`` take them from this class;
``GateConfig.forecast_bound()`` builds the bound of a configuration).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): for normal data sigma = 1.4826 x MAD
SPREADS = ("mad", "std")


def spread_of(values: np.ndarray, how: str) -> float:
    """Robust (MAD) or classical (std) spread of the recent history."""
    if len(values) == 0:
        return math.nan
    if how == "std":
        return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return MAD_TO_SIGMA * float(np.median(np.abs(values - np.median(values))))


def spread_floor(bound, reference: float, statistic: str) -> float:
    """The least spread a bound uses: ``max(floor_rel * |reference|, floor_abs)`` (``floor_abs_gamma`` for
    ``gamma``), so that a flat or perfectly fitted history does not call every small change a shift."""
    return max(bound.floor_rel * abs(reference), bound.floor_abs_gamma if statistic == "gamma" else bound.floor_abs)


@dataclass(frozen=True)
class Recent:
    """What a value is compared with: the recent history's median, range and (floored) spread."""

    n: int
    median: float
    low: float
    high: float
    spread: float


@dataclass(frozen=True)
class ForecastBound:
    """``k`` spreads around the range of the last ``window`` cycles (see the module docstring)."""

    window: int = 10
    k: float = 6.0
    spread: str = "mad"
    floor_rel: float = 0.10
    floor_abs: float = 1.0
    floor_abs_gamma: float = 0.02

    def __post_init__(self):
        if not (isinstance(self.window, int) and self.window >= 1):
            raise ValueError(f"window={self.window!r} must be an integer >= 1")
        if self.spread not in SPREADS:
            raise ValueError(f"spread={self.spread!r}: use one of {', '.join(SPREADS)}")

    def recent(self, values, statistic: str) -> Recent:
        """The last ``window`` of ``values`` (oldest first), their finite ones measured."""
        vals = np.asarray(values, dtype=float)[-self.window:]
        vals = vals[np.isfinite(vals)]
        if not len(vals):
            return Recent(0, math.nan, math.nan, math.nan, math.nan)
        median = float(np.median(vals))
        floor = spread_floor(self, median, statistic)
        return Recent(len(vals), median, float(vals.min()), float(vals.max()),
                      max(spread_of(vals, self.spread), floor))

    @staticmethod
    def deviation(value: float, recent: Recent) -> float:
        """Distance from ``value`` to the recent range in spreads (0 inside it); NaN without history or value."""
        if not recent.n or not math.isfinite(value):
            return math.nan
        return max(recent.low - value, value - recent.high, 0.0) / recent.spread

    def limits(self, recent: Recent) -> tuple[float, float]:
        """``[low - k spread, high + k spread]``: the values :meth:`accepts` (NaN without history)."""
        return recent.low - self.k * recent.spread, recent.high + self.k * recent.spread

    def accepts(self, value: float, recent: Recent) -> bool:
        """The gate's rule: at most ``k`` spreads outside the range (True without history: nothing to judge by)."""
        d = self.deviation(value, recent)
        return not d > self.k


@dataclass(frozen=True)
class LagBound:
    """Holt lags a shift when its last one-step error exceeds ``k`` robust spreads of its earlier ones (Eq. 71).

    ``errors`` are the fit's one-step-ahead errors ``y_t - yhat_{t|t-1}`` over the fitted window, oldest first;
    the spread is that of all but the last (1.4826 MAD by default: a burst's few large errors in the window do
    not widen it), floored at ``max(floor_rel * |y_T|, floor_abs)`` (``floor_abs_gamma`` for ``gamma``) with
    ``y_T`` the last value, so that a flat or perfectly fitted history does not call every small error a shift.
    :func:`mjoin.forecast.holt.forecast_series` then forecasts the last value instead of Holt's, for the series
    and cycle the test fires on: at a step or burst Holt's level moves by ``alpha`` of the error per cycle and
    lags for several cycles, while the last value has followed within one.
    """

    k: float = 3.0
    spread: str = "mad"
    floor_rel: float = 0.10
    floor_abs: float = 1.0
    floor_abs_gamma: float = 0.02

    def __post_init__(self):
        if not self.k > 0:
            raise ValueError(f"k={self.k!r} must be > 0")
        if self.spread not in SPREADS:
            raise ValueError(f"spread={self.spread!r}: use one of {', '.join(SPREADS)}")

    def error_spread(self, errors, last: float, statistic: str) -> float:
        """The earlier errors' spread (all but the last, finite ones), floored (NaN without any)."""
        e = np.asarray(errors, dtype=float)[:-1]
        e = e[np.isfinite(e)]
        floor = spread_floor(self, last, statistic)
        return max(spread_of(e, self.spread), floor) if len(e) else math.nan

    def deviation(self, errors, last: float, statistic: str) -> float:
        """The last error in spreads (NaN without a finite last error or earlier errors)."""
        e = np.asarray(errors, dtype=float)
        if not len(e) or not math.isfinite(e[-1]):
            return math.nan
        return abs(float(e[-1])) / self.error_spread(e, last, statistic)

    def lags(self, errors, last: float, statistic: str) -> bool:
        """Eq. 71: the last one-step error is more than ``k`` spreads (False when nothing can be judged)."""
        return self.deviation(errors, last, statistic) > self.k

    def outruns(self, clipped: float, last: float, statistic: str) -> bool:
        """Eq. 71, second case: a Holt value clipped to its valid range more than ``k`` floors from the last value."""
        floor = spread_floor(self, last, statistic)
        return abs(clipped - last) > self.k * floor
