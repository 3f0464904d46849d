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
from .frames import UNKNOWN, coverage_frame, groups_of, mark_expected_groups, recorded_groups, tidy_frame, where_label
from .result import GateResult
from .suites import (EDGE_FIELDS, STREAM_FIELDS, coverage_suite, forecast_document_suite, forecast_plausibility_suite,
                     forecast_values_suite, history_columns_suite)

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


def check_forecast(query, forecast, history: pd.DataFrame, *, config: GateConfig | None = None,
                   partitioning=UNKNOWN) -> GateResult:
    """Check a forecast snapshot (``Statistics``, JSON document or path) against the query and the
    recent statistics history (tidy rows, ``ROW_COLUMNS``).

    The key groups every stream and edge must be forecast for come from ``partitioning`` (see
    :func:`~mjoin.gates.frames.groups_of`), else from the forecast's own partitioning, else from
    the partitioning the stats job recorded for the last history cycle before the forecast, else
    from the groups the forecast holds (a note then says so). A history without the tidy columns
    fails ``forecast.history_columns_present``: the plausibility rules cannot run without it.
    """
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

    if history is None:
        history = pd.DataFrame()
    history_ok = not run.check(history_columns_suite(query), history.iloc[:0].copy())
    hist = tidy_frame(history, query) if history_ok else None

    rows = pd.DataFrame(fc.to_rows(), columns=list(ROW_COLUMNS))
    frame = tidy_frame(rows, query)
    cycle = frame["cycle"].iloc[0] if len(frame) else None
    expected, groups_from = _expected_groups(partitioning, fc, history, hist, cycle)
    data_groups = sorted(int(g) for g in frame["group"].unique()) or [0]
    if expected is None:
        run.note(f"key groups taken from the forecast itself ({', '.join(map(str, data_groups))}): a key group "
                 "missing from the whole forecast cannot be detected; pass the partitioning (check forecast --partitioning)")
    run.check(forecast_values_suite(query, cfg), mark_expected_groups(frame, expected))
    groups = expected if expected is not None else data_groups
    run.check(coverage_suite("forecast", query), coverage_frame(frame, query, [cycle], groups))
    run.details.update({"groups": list(groups), "groups_from": groups_from})

    if not history_ok:
        run.skip(["forecast.has_recent_history", "forecast.near_recent_history"],
                 "the history lacks the tidy columns (see forecast.history_columns_present)")
        return run.result()
    plaus = plausibility_frame(frame, hist, cfg, before=cycle)
    run.check(forecast_plausibility_suite(query, cfg), plaus)
    run.details["plausibility"] = plaus.to_dict("records")
    return run.result()


def _expected_groups(partitioning, fc, history, hist, cycle):
    """``(group ids or None, where they come from)`` for the forecast's coverage (see check_forecast)."""
    if partitioning is not UNKNOWN:
        return groups_of(partitioning), "partitioning given"
    if fc.partitioning is not None:
        return groups_of(fc.partitioning), "partitioning of the forecast"
    if hist is not None and len(hist):
        before = hist["cycle"].dropna()
        if cycle is not None and not pd.isna(cycle):
            before = before[before < cycle]
        if len(before):
            rec = recorded_groups(history, before.max())
            if rec is not None:
                return rec, "partitioning recorded by the stats job for the last history cycle"
    return None, "forecast rows"
