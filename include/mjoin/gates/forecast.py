"""Gate 3: the forecast (finite, in range, complete, and not absurdly far from the recent history).

"Absurdly far": ``max(min(recent) - value, value - max(recent), 0) > k * spread``, i.e.
more than ``k`` spreads outside the range ``[min, max]`` of ``recent``, the last
``forecast_window`` cycles of the series before the forecast (a value the series has
already taken is never absurd). ``spread`` is 1.4826 x the median absolute deviation
(``forecast_spread="mad"``, robust to the one odd cycle) or the standard deviation,
floored at ``max(forecast_floor_rel * |median(recent)|, absolute floor)`` so that a
flat history (spread 0) does not reject every change.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd

from ..schemas import SchemaError
from ..statistics import ROW_COLUMNS, Statistics, StatisticsError
from .base import GateRun
from .config import GateConfig
from .frames import coverage_frame, missing_columns, tidy_frame, where_label
from .result import GateResult
from .suites import (EDGE_FIELDS, STREAM_FIELDS, coverage_suite, forecast_document_suite, forecast_plausibility_suite,
                     forecast_values_suite)

MAD_TO_SIGMA = 1.4826  # 1 / Phi^-1(3/4): for normal data sigma = 1.4826 x MAD


def load_forecast(ref) -> Statistics:
    """A forecast :class:`Statistics` from itself, a JSON document or a file path."""
    if isinstance(ref, Statistics):
        return ref
    if isinstance(ref, dict):
        return Statistics.from_json(ref)
    if isinstance(ref, (str, os.PathLike)):
        return Statistics.load(ref)
    raise TypeError(f"a forecast is a Statistics, a JSON document or a path, not {type(ref).__name__}")


def spread_of(values: np.ndarray, how: str) -> float:
    """Robust (MAD) or classical (std) spread of the recent history."""
    if len(values) == 0:
        return math.nan
    if how == "std":
        return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return MAD_TO_SIGMA * float(np.median(np.abs(values - np.median(values))))


def plausibility_frame(forecast_rows: pd.DataFrame, history: pd.DataFrame, cfg: GateConfig,
                       before=None) -> pd.DataFrame:
    """One row per forecast value: the recent history it is compared with and how far it is (in spreads)."""
    hist = history
    if before is not None and not pd.isna(before) and len(hist):
        hist = hist[hist["cycle"] < before]
    series = {}
    if len(hist):
        for key, grp in hist.sort_values("cycle").groupby(["group", "entity", "stream", "right"], dropna=False):
            series[(int(key[0]), key[1], key[2], None if pd.isna(key[3]) else key[3])] = grp
    out = []
    for row in forecast_rows.to_dict("records"):
        fields = STREAM_FIELDS if row["entity"] == "stream" else EDGE_FIELDS
        right = row["right"] if isinstance(row["right"], str) else None
        grp = series.get((int(row["group"]), row["entity"], row["stream"], right))
        for f in fields:
            value = row[f"{f}_raw"]
            recent = np.array([], dtype=float)
            if grp is not None:
                vals = grp[f"{f}_raw"].to_numpy(dtype=float)[-cfg.forecast_window:]
                recent = vals[np.isfinite(vals)]
            median = float(np.median(recent)) if len(recent) else math.nan
            spread = spread_of(recent, cfg.forecast_spread)
            floor_abs = cfg.forecast_floor_abs_gamma if f == "gamma" else cfg.forecast_floor_abs
            floor = max(cfg.forecast_floor_rel * abs(median), floor_abs) if len(recent) else math.nan
            used = max(spread, floor) if len(recent) else math.nan
            # distance to the range the recent history has shown (0 inside it), in spreads: a value the
            # series has already taken is never absurd, e.g. a sparse gamma of zeros with a spike
            lo = float(recent.min()) if len(recent) else math.nan
            hi = float(recent.max()) if len(recent) else math.nan
            outside = max(lo - value, value - hi, 0.0) if (len(recent) and math.isfinite(value)) else math.nan
            deviation = outside / used if math.isfinite(outside) else math.nan
            out.append({"where": where_label(row["entity"], row["stream"], right, row["group"], None), "field": f,
                        "value": value, "median": median, "low": lo, "high": hi, "spread": used, "deviation": deviation,
                        "n_history": len(recent)})
    return pd.DataFrame(out, columns=["where", "field", "value", "median", "low", "high", "spread", "deviation",
                                      "n_history"])


def check_forecast(query, forecast, history: pd.DataFrame, *, config: GateConfig | None = None) -> GateResult:
    """Check a forecast snapshot (``Statistics``, JSON document or path) against the query and the
    recent statistics history (tidy rows, ``ROW_COLUMNS``)."""
    cfg = config or GateConfig()
    run = GateRun("forecast", query, cfg)
    try:
        fc = load_forecast(forecast)
        problem = None
    except (StatisticsError, SchemaError, json.JSONDecodeError, KeyError, TypeError) as exc:
        fc, problem = None, str(exc)
    run.check(forecast_document_suite(query), pd.DataFrame({"where": ["forecast"], "schema_problem": [problem]}))
    if fc is None:
        run.skip(["forecast.*"], "the forecast is not a statistics document")
        return run.result()
    run.details.update({"kind": fc.kind, "cycle_start": fc.cycle_start, "fallbacks": fc.meta.get("fallbacks")})
    if fc.kind != "forecast":
        run.note(f"statistics of kind {fc.kind!r} checked as a forecast")

    rows = pd.DataFrame(fc.to_rows(), columns=list(ROW_COLUMNS))
    frame = tidy_frame(rows, query)
    run.check(forecast_values_suite(query, cfg), frame)
    groups = sorted(frame["group"].unique()) or [0]
    cycle = frame["cycle"].iloc[0] if len(frame) else None
    run.check(coverage_suite("forecast", query), coverage_frame(frame, query, [cycle], groups))

    missing = missing_columns(history)
    if missing:
        run.note(f"the history lacks column(s) {', '.join(missing)}: plausibility not checked")
        run.skip(["forecast.has_recent_history", "forecast.near_recent_history"], "no usable history")
        return run.result()
    plaus = plausibility_frame(frame, tidy_frame(history, query), cfg, before=cycle)
    run.check(forecast_plausibility_suite(query, cfg), plaus)
    run.details["plausibility"] = plaus.to_dict("records")
    return run.result()
