"""Drift that makes the active plan bad, detected between the scheduled runs (the drift watcher's logic).

Two signals, each judged against a bound derived from history, each confirmed by ``confirm`` consecutive
observations (one odd cycle or batch is not drift):

- **forecast error**: the statistics measured since the newest forecast (the one the last run planned with,
  ``runs/<end>/forecast.json``) against that forecast, per series (stream: lambda, kappa, window_tuples; edge:
  gamma, mu; per key group). The error of a cycle is ``|measured - forecast| / spread``, ``spread`` the
  forecast gate's robust spread of the series' last ``window`` cycles before the forecast (1.4826 x MAD,
  floored at 10% of the level and an absolute floor: :class:`mjoin.forecast.bound.ForecastBound`). Drift when
  the newest ``confirm`` cycles of a series all err by more than ``k`` spreads.
- **measured cost of the active plan**: the running join job's probe work per input tuple (lookups + matches
  over every probe step of a batch, :mod:`mjoin.engine.metrics`) in the batches of the active version. The
  bound is ``median + k x spread`` of its earlier batches (at least ``min_batches`` of them), spread as above;
  drift when the newest ``confirm`` batches are all above it. (Only with a running job: cycle mode has no
  metrics between runs.)

:func:`watch` is what the drift watcher (plugins/mjoin_drift_trigger.py, an Airflow AssetWatcher) calls every
poll: :func:`detect`, then the debounce (at most one drift event per ``debounce`` seconds per query), then
the event is recorded in ``<lake>/reports/<query>/drift/`` (``state.json``, ``events.jsonl``) and returned;
Airflow turns it into an asset event on ``mjoin.drift.<query>`` and a run of mjoin_reoptimize. The event
records the change point (``since``: the first cycle the series left their bound); a run whose forecast window
straddles it forecasts from the cycles since then only (:func:`shift_since`, used by mjoin.loop.replan).
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from mjoin.engine.metrics import read_metrics
from mjoin.forecast.bound import MAD_TO_SIGMA, ForecastBound
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.model.statistics import ROW_COLUMNS, Statistics
from mjoin.model.timeutil import iso, parse_time
from mjoin.runtime import fsutil
from mjoin.stats.history import HistoryError, history_root, read_history

log = logging.getLogger(__name__)

STREAM_FIELDS = ("lambda", "kappa", "window_tuples")
EDGE_FIELDS = ("gamma", "mu")


@dataclass(frozen=True)
class DriftConfig:
    """The drift watcher's settings (docs/orchestration.md, "Drift-triggered runs")."""

    #: an error beyond k spreads is drift (forecast error and cost alike)
    k: float = 4.0
    #: ... in this many consecutive newest cycles (or batches)
    confirm: int = 2
    #: cycles of history before the forecast that give a series' spread
    window: int = 10
    #: batches of the active plan before its cost bound means anything
    min_batches: int = 6
    #: at most one drift event per this many seconds per query
    debounce: float = 300.0

    def bound(self) -> ForecastBound:
        return ForecastBound(window=self.window)


# ---- the two signals --------------------------------------------------------------------------

def forecast_errors(history: pd.DataFrame, forecast: Statistics, cfg: DriftConfig = DriftConfig()) -> list[dict]:
    """The series whose newest ``confirm`` measured cycles after ``forecast``'s cycle all err by more than ``k``
    spreads (tidy ``history`` rows, ``ROW_COLUMNS``); each with its errors, forecast and measured values."""
    if history is None or history.empty or not forecast.cycle_start:
        return []
    start = pd.Timestamp(parse_time(forecast.cycle_start))
    frame = history.copy()
    frame["cycle"] = pd.to_datetime(frame["cycle_start"], utc=True)
    frame["right"] = frame["right"].where(frame["right"].notna(), None)
    bound = cfg.bound()
    out = []
    for row in forecast.to_rows():
        fields = STREAM_FIELDS if row["entity"] == "stream" else EDGE_FIELDS
        series = frame[(frame["group"] == row["group"]) & (frame["entity"] == row["entity"])
                       & (frame["stream"] == row["stream"])
                       & ((frame["right"] == row["right"]) if row["right"] else frame["right"].isna())]
        series = series.sort_values("cycle")
        before, after = series[series["cycle"] < start], series[series["cycle"] >= start]
        if len(after) < cfg.confirm:
            continue
        for f in fields:
            predicted = float(row[f]) if row[f] is not None else math.nan
            recent = bound.recent(before[f].to_numpy(dtype=float), f)
            if not recent.n or not math.isfinite(predicted):
                continue
            every = np.abs(after[f].to_numpy(dtype=float) - predicted) / recent.spread
            errors = every[-cfg.confirm:]
            if np.all(errors > cfg.k):
                where = f"[{row['stream']}]" + (f"[{row['right']}]" if row["right"] else "")
                where += f" g{row['group']}" if int(row["group"]) else ""
                run = len(every) - int(np.argmin((every > cfg.k)[::-1])) if not np.all(every > cfg.k) else 0
                out.append({"series": f"{f}{where}", "forecast": predicted,
                            "measured": after[f].to_numpy(dtype=float)[-cfg.confirm:].tolist(),
                            "spread": recent.spread, "errors": [round(float(e), 3) for e in errors],
                            "cycles": [iso(c) for c in after["cycle"].iloc[-cfg.confirm:]],
                            "since": iso(after["cycle"].iloc[run])})
    return sorted(out, key=lambda d: -min(d["errors"]))


def probe_work_per_tuple(record: dict) -> float:
    """A metrics record's measured cost: lookups + matches of every probe step per input tuple (NaN: no input)."""
    rows = sum((record.get("rows_in") or {}).values())
    work = sum(st.get("lookups", 0) + st.get("matches", 0)
               for chain in record.get("chains") or [] for st in (chain or {}).get("steps") or [])
    return work / rows if rows else math.nan


def cost_drift(costs: list[float], cfg: DriftConfig = DriftConfig()) -> dict | None:
    """``costs``: the active plan's measured cost per batch, oldest first. Drift (a dict saying why) when the
    newest ``confirm`` lie above ``median + k x spread`` of the batches before them, else None."""
    costs = [c for c in costs if math.isfinite(c)]
    if len(costs) < cfg.min_batches + cfg.confirm:
        return None
    base, newest = np.asarray(costs[:-cfg.confirm]), np.asarray(costs[-cfg.confirm:])
    median = float(np.median(base))
    spread = max(MAD_TO_SIGMA * float(np.median(np.abs(base - median))), 0.10 * abs(median), 1e-9)
    limit = median + cfg.k * spread
    if np.all(newest > limit):
        return {"cost_per_tuple": newest.tolist(), "median": median, "spread": spread, "limit": limit,
                "batches": len(base)}
    return None


# ---- reading the lake -------------------------------------------------------------------------

def newest_forecast(lake: Lake, query: str) -> tuple[Statistics | None, str | None]:
    """The forecast of the newest run folder that has one (the plan the loop deployed last was made on it)."""
    root = fsutil.join(lake.reports(query), "runs")
    for stamp in sorted((n for n in fsutil.listdir(root) if not n.startswith(".")), reverse=True):
        path = fsutil.join(root, stamp, "forecast.json")
        if fsutil.exists(path):
            try:
                return Statistics.load(path), path
            except (OSError, ValueError, KeyError) as exc:
                log.warning("drift: the forecast %s cannot be read (%s); trying an older run", path, exc)
    return None, None


def detect(lake: Lake, query: str, cfg: DriftConfig = DriftConfig()) -> dict:
    """Both signals on the lake as it is now: ``{"drift": bool, "reasons": [...], "forecast_errors", "cost"}``."""
    out = {"query": query, "checked_at": iso(time.time()), "drift": False, "reasons": [], "forecast_errors": [],
           "cost": None, "forecast": None, "active_version": None}
    fc, path = newest_forecast(lake, query)
    if fc is not None and fc.cycle_start:
        out["forecast"] = path
        start = parse_time(fc.cycle_start)
        tau = float(fc.cycle_seconds or 10.0)
        try:
            history = read_history(history_root(lake), query, start=iso(start.timestamp() - (cfg.window + 1) * tau))
        except (HistoryError, FileNotFoundError, OSError):
            history = pd.DataFrame(columns=list(ROW_COLUMNS))
        errors = forecast_errors(history, fc, cfg)
        out["forecast_errors"] = errors[:10]
        if errors:
            e = errors[0]
            out["reasons"].append(f"{len(errors)} series off their forecast by more than {cfg.k:g} spreads for "
                                  f"{cfg.confirm} cycles, e.g. {e['series']}: forecast {e['forecast']:.4g}, measured "
                                  f"{', '.join(f'{v:.4g}' for v in e['measured'])} ({', '.join(map(str, e['errors']))} "
                                  "spreads)")
    version, damaged = PlanRegistry(lake, query).active_version_or_none()
    out["active_version"] = version
    out["damaged_pointer"] = damaged  # no active plan to judge: no cost signal
    if version is not None:
        try:
            records = read_metrics(lake, query)[-200:]
        except (FileNotFoundError, OSError, ValueError):
            records = []
        costs = [probe_work_per_tuple(r) for r in records if r.get("plan_version") == version]
        cost = cost_drift(costs, cfg)
        out["cost"] = cost
        if cost:
            out["reasons"].append(f"the active plan v{version} costs {', '.join(f'{c:.4g}' for c in cost['cost_per_tuple'])} "
                                  f"probe steps per input tuple in its newest batches, above {cost['limit']:.4g} "
                                  f"(median {cost['median']:.4g} + {cfg.k:g} spreads of its {cost['batches']} earlier batches)")
    out["drift"] = bool(out["reasons"])
    return out


def drift_dir(lake: Lake, query: str) -> str:
    return fsutil.join(lake.reports(query), "drift")


def watch(lake: Lake, query: str, cfg: DriftConfig = DriftConfig(), now: float | None = None) -> dict | None:
    """One poll of the drift watcher: the drift event to emit, or None (no drift, or debounced: at most one
    event per ``cfg.debounce`` seconds per query, whoever polls)."""
    now = time.time() if now is None else now
    verdict = detect(lake, query, cfg)
    if not verdict["drift"]:
        return None
    folder = drift_dir(lake, query)
    state_path = fsutil.join(folder, "state.json")
    try:
        last = json.loads(fsutil.read_text(state_path)).get("last_event") if fsutil.exists(state_path) else None
    except (OSError, ValueError):
        last = None
    if last is not None and now - float(last) < cfg.debounce:
        log.info("drift of %s (%s) debounced: the last drift event was %.0f s ago (at most one per %.0f s)", query,
                 verdict["reasons"][0], now - float(last), cfg.debounce)
        return None
    since = min((e["since"] for e in verdict["forecast_errors"]), default=None)
    event = {"query": query, "at": iso(now), "reasons": verdict["reasons"], "active_version": verdict["active_version"],
             "forecast": verdict["forecast"], "series": [e["series"] for e in verdict["forecast_errors"]],
             "since": since, "cost": verdict["cost"], "debounce": cfg.debounce}
    fsutil.makedirs(folder)
    fsutil.atomic_write_text(state_path, json.dumps({"last_event": now, "event": event, "config": asdict(cfg)}, indent=2))
    log_path = fsutil.join(folder, "events.jsonl")
    old = fsutil.read_text(log_path) if fsutil.exists(log_path) else ""
    fsutil.atomic_write_text(log_path, old + json.dumps(event, default=str) + "\n")
    log.warning("drift of %s: %s", query, "; ".join(verdict["reasons"]))
    return event


def shift_since(lake: Lake, query: str, start, end):
    """The change point of the newest drift event (the first cycle its series left their bound) when it lies
    inside ``(start, end)``, else None: a run forecasts from the cycles since the change only (Holt on a window
    that straddles a level shift lags it by many cycles; under ``min_points`` cycles it takes the last value)."""
    path = fsutil.join(drift_dir(lake, query), "state.json")
    try:
        since = (json.loads(fsutil.read_text(path)).get("event") or {}).get("since") if fsutil.exists(path) else None
    except (OSError, ValueError):
        return None
    if not since:
        return None
    t = parse_time(since)
    return t if parse_time(start) < t < parse_time(end) else None
