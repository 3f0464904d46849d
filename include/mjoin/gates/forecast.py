"""Gate 3: the forecast (finite, in range, complete, and not absurdly far from the recent history).

"Absurdly far": more than ``forecast_spread_k`` spreads outside the range ``[min, max]`` of
the last ``forecast_window`` cycles of the series before the forecast (a value the series has
already taken is never absurd); the spread and its floor: :mod:`mjoin.forecast.bound`, the
one bound the gate checks and the forecast keeps Holt within (``GateConfig.forecast_bound()``).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd

from mjoin.forecast.bound import MAD_TO_SIGMA, spread_of
from mjoin.gates.base import GateRun
from mjoin.gates.config import GateConfig
from mjoin.gates.frames import (UNKNOWN, coverage_frame, groups_of, mark_expected_groups, recorded_groups, tidy_frame,
                                where_label)
from mjoin.gates.result import GateResult
from mjoin.gates.suites import (EDGE_FIELDS, STREAM_FIELDS, coverage_suite, forecast_document_suite,
                                forecast_plausibility_suite, forecast_values_suite, history_columns_suite)
from mjoin.model.schemas import SchemaError
from mjoin.model.statistics import ROW_COLUMNS, Statistics, StatisticsError

__all__ = ["MAD_TO_SIGMA", "spread_of", "load_forecast", "plausibility_frame", "check_forecast"]


def load_forecast(ref) -> Statistics:
    """A forecast :class:`Statistics` from itself, a JSON document or a file path."""
    if isinstance(ref, Statistics):
        return ref
    if isinstance(ref, dict):
        return Statistics.from_json(ref)
    if isinstance(ref, (str, os.PathLike)):
        return Statistics.load(ref)
    raise TypeError(f"a forecast is a Statistics, a JSON document or a path, not {type(ref).__name__}")


def plausibility_frame(forecast_rows: pd.DataFrame, history: pd.DataFrame, cfg: GateConfig,
                       before=None) -> pd.DataFrame:
    """One row per forecast value: the recent history it is compared with and how far it is (in spreads)."""
    bound = cfg.forecast_bound()
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
            vals = grp[f"{f}_raw"].to_numpy(dtype=float) if grp is not None else np.array([], dtype=float)
            recent = bound.recent(vals, f)  # the last forecast_window cycles, their finite values
            deviation = bound.deviation(value, recent)
            out.append({"where": where_label(row["entity"], row["stream"], right, row["group"], None), "field": f,
                        "value": value, "median": recent.median, "low": recent.low, "high": recent.high,
                        "spread": recent.spread, "deviation": deviation, "n_history": recent.n})
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
