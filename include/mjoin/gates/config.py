"""GateConfig: every threshold of the four gates, with documented defaults, in one place.

DAG params and ``python -m mjoin check ... --set key=value`` pass overrides through
:meth:`GateConfig.from_dict`, which rejects unknown keys and converts strings
(``"90s"``, ``"true"``, ``"cu,sr"``) to the field's type.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from mjoin.forecast.bound import SPREADS, ForecastBound
from mjoin.lake.contract import DEFAULT_POSITIONAL
from mjoin.model.timeutil import parse_duration


class GateConfigError(ValueError):
    """An override that names no threshold or has a value of the wrong kind."""


#: DEFAULT_POSITIONAL (mjoin.lake.contract): file names the lake reuses in every arrival folder
#: (``Lake.stream_file``: part-00000.parquet): such a name landed twice is not a duplicate; any other name
#: (e.g. Spark's part-00000-<uuid>-c000.snappy.parquet) is taken as unique to its file

#: fields holding durations in seconds (accept "90s", "5m", ...)
_DURATIONS = {"late_tolerance", "future_allowance", "duplicate_lookback", "fraction_history"}


@dataclass(frozen=True)
class GateConfig:
    """Thresholds of the input, statistics, forecast and plan gates (defaults documented in docs/gates.md)."""

    # ---- 1. input gate (raw landed files of one interval) --------------------------
    #: the largest share of a stream's rows with a NULL join key that a healthy feed may have (the cap of
    #: the tolerated share below; without history it is the tolerated share). TPC-DS has 2.2-4.3 % NULL
    #: foreign keys in the seed streams (measured, docs/gates.md), so 10 % passes healthy data.
    null_key_fraction_max: float = 0.10
    #: confidence of the input gate's statistical bounds: a healthy stream fails a fraction rule (or the
    #: flow rule) of one gate run with probability at most 1 - fraction_confidence (Bonferroni over the
    #: rows judged). A cycle of n rows fails when its bad rows exceed the binomial upper bound of n rows
    #: at the tolerated share, so 6 NULL keys in 55 rows is no evidence against a 3.5 % share.
    fraction_confidence: float = 0.999
    #: how far before the interval the stream's own history is read (seconds; 0 = no history): its
    #: landed files' NULL-key, late and future shares and its rows per cycle (from the Parquet footers)
    fraction_history: float = 600.0
    #: the tolerated share of a stream with history is its history's upper confidence bound x this factor,
    #: at most the *_fraction_max cap; its rows per cycle may drop by this factor (a real jump is larger)
    fraction_slack: float = 1.5
    #: rows a stream must deliver in every cycle of the interval (streams not in quiet_streams); a stream
    #: whose history shows empty cycles are normal (a sparse stream: P(0 rows) is not negligible) is held
    #: to its Poisson lower bound instead, per cycle and over the interval
    min_rows_per_cycle: int = 1
    #: streams that are not expected to flow (no minimum row count per cycle)
    quiet_streams: tuple = ()
    #: a tuple is late if its event time is before interval start - late_tolerance;
    #: None = the query's allowed lateness
    late_tolerance: float | None = None
    #: a tuple is from the future if its event time is at or after its arrival folder's epoch + future_allowance
    #: (seconds): the landing contract's rule, the join engine's (mjoin.lake.contract); None = the contract's
    #: default, two arrival cycles of the lake
    future_allowance: float | None = None
    #: caps of the tolerated shares of late / future rows (as null_key_fraction_max)
    late_fraction_max: float = 0.01
    future_fraction_max: float = 0.0
    #: how far before the interval landed files are compared for duplicates (seconds);
    #: None = the query's largest window (a re-landed file inside the window double-counts joins)
    duplicate_lookback: float | None = None
    #: regular expression (full match) of positional file names, reused every cycle and so not compared
    #: by name; other names landed twice in one stream are duplicates
    positional_file_names: str = DEFAULT_POSITIONAL
    #: "pyarrow" (default: footers + key/ts columns on the driver) or "spark" (scan with Spark)
    input_engine: str = "pyarrow"

    # ---- 2. statistics gate ----------------------------------------------------------
    #: cycles of history the forecast needs (docs/algorithms.md, "Forecasting": Holt falls back below ~10 points)
    min_history: int = 10

    # ---- 3. forecast gate ------------------------------------------------------------
    # (defaults: mjoin.forecast.bound.ForecastBound, the one bound the gate and the forecast share)
    #: recent cycles the forecast is compared with (default 10)
    forecast_window: int = ForecastBound.window
    #: a forecast value fails when it lies more than k * spread outside [min, max] of the recent
    #: history: max(min - value, value - max, 0) > k * spread (default 6)
    forecast_spread_k: float = ForecastBound.k
    #: spread of the recent history: "mad" (1.4826 x median absolute deviation, robust; default) or "std"
    forecast_spread: str = ForecastBound.spread
    #: floor of the spread, so a flat history does not reject every change:
    #: spread >= max(forecast_floor_rel * |median of the recent history|, absolute floor) (default 0.10)
    forecast_floor_rel: float = ForecastBound.floor_rel
    #: absolute floor for lambda, kappa, window_tuples and mu (counts and rates; default 1)
    forecast_floor_abs: float = ForecastBound.floor_abs
    #: absolute floor for gamma (a rate in [0, 1]; default 0.02)
    forecast_floor_abs_gamma: float = ForecastBound.floor_abs_gamma

    # ---- 4. plan gate ----------------------------------------------------------------
    #: minimum relative improvement (cost_active - cost_new) / cost_active to deploy;
    #: below it the outcome is "no_change" (hysteresis against flapping on noise)
    improvement_threshold: float = 0.05

    # ---- stored results (mjoin.gates.gxproject; not part of the suites: equal configs still share them) ----
    #: the folder of the file-backed GX context where every gate run's Checkpoint stores its validation results
    #: and rebuilds Data Docs; "" or "off": not stored (the fast path). The loop sets <lake>[/<namespace>]/gx
    #: unless its ``gates`` param says ``results_store: "off"``
    #: (docs/gates.md, "Checkpoints, stored results and Data Docs")
    results_store: str = field(default="", compare=False)
    #: the run name of the stored results (the loop: the Airflow run id; "": the time of the run)
    results_run: str = field(default="", compare=False)
    #: stored validation results (and their Data Docs pages) older than this many days are removed
    results_keep_days: float = field(default=1.0, compare=False)
    #: which stored results the checkpoint's Data Docs action renders: "failures" (the validations that failed an
    #: expectation, critical or warning: the pages a user opens; the default, most runs render nothing), "all"
    #: (every validation, as GX's action does by default; ~0.3 s a page) or "off"
    results_docs: str = field(default="failures", compare=False)

    @property
    def stores_results(self) -> bool:
        return bool(self.results_store) and self.results_store.strip().lower() not in ("off", "none", "false", "0")

    def __post_init__(self):
        problems = []
        for name in ("null_key_fraction_max", "late_fraction_max", "future_fraction_max"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 <= v <= 1):
                problems.append(f"{name}={v!r} must be a fraction in [0, 1]")
        for name in ("min_rows_per_cycle", "min_history", "forecast_window"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
                problems.append(f"{name}={v!r} must be a non-negative integer")
        if self.forecast_window < 1:
            problems.append("forecast_window must be at least 1")
        for name in ("forecast_spread_k", "forecast_floor_rel", "forecast_floor_abs", "forecast_floor_abs_gamma"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                problems.append(f"{name}={v!r} must be a finite number >= 0")
        if not (isinstance(self.fraction_confidence, (int, float)) and 0 < self.fraction_confidence < 1):
            problems.append(f"fraction_confidence={self.fraction_confidence!r} must lie strictly between 0 and 1")
        if not (isinstance(self.fraction_slack, (int, float)) and math.isfinite(self.fraction_slack)
                and self.fraction_slack >= 1):
            problems.append(f"fraction_slack={self.fraction_slack!r} must be a finite number >= 1")
        if not (isinstance(self.fraction_history, (int, float)) and math.isfinite(self.fraction_history)
                and self.fraction_history >= 0):
            problems.append(f"fraction_history={self.fraction_history!r} must be a duration >= 0")
        for name in ("late_tolerance", "duplicate_lookback"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                problems.append(f"{name}={v!r} must be a duration >= 0 or null")
        v = self.future_allowance
        if v is not None and not (isinstance(v, (int, float)) and v > 0):
            problems.append(f"future_allowance={v!r} must be a duration > 0 (inf: no row is future) or null")
        if not (isinstance(self.improvement_threshold, (int, float)) and math.isfinite(self.improvement_threshold)
                and self.improvement_threshold < 1):
            problems.append(f"improvement_threshold={self.improvement_threshold!r} must be a finite number < 1")
        if self.forecast_spread not in SPREADS:
            problems.append(f"forecast_spread={self.forecast_spread!r} must be 'mad' or 'std'")
        if self.results_docs not in ("failures", "all", "off"):
            problems.append(f"results_docs={self.results_docs!r} must be 'failures', 'all' or 'off'")
        if self.input_engine not in ("pyarrow", "spark"):
            problems.append(f"input_engine={self.input_engine!r} must be 'pyarrow' or 'spark'")
        try:
            re.compile(self.positional_file_names)
        except (re.error, TypeError) as exc:
            problems.append(f"positional_file_names={self.positional_file_names!r} is not a regular expression ({exc})")
        if not isinstance(self.quiet_streams, tuple):
            object.__setattr__(self, "quiet_streams", tuple(self.quiet_streams))
        if problems:
            raise GateConfigError("invalid gate config: " + "; ".join(problems))

    # ---- overrides -------------------------------------------------------------------
    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def defaults(cls) -> dict:
        """Every setting with its default, JSON-ready (e.g. for a DAG param's documentation)."""
        return cls().to_dict()

    @classmethod
    def from_dict(cls, overrides: Mapping[str, Any] | None = None, base: "GateConfig | None" = None) -> "GateConfig":
        """The defaults (or ``base``) with ``overrides`` applied; unknown keys raise :class:`GateConfigError`."""
        base = base or cls()
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(cls.keys()))
        if unknown:
            raise GateConfigError(f"unknown gate setting(s) {', '.join(unknown)}; known: {', '.join(cls.keys())}")
        values = {}
        for f in fields(cls):
            if f.name in overrides:
                values[f.name] = _coerce(f.name, overrides[f.name], getattr(base, f.name))
        return dataclasses.replace(base, **values)

    @classmethod
    def from_pairs(cls, pairs, base: "GateConfig | None" = None) -> "GateConfig":
        """From ``["key=value", ...]`` (the CLI's ``--set``)."""
        out = {}
        for item in pairs or ():
            if "=" not in item:
                raise GateConfigError(f"--set {item!r}: use key=value (keys: {', '.join(cls.keys())})")
            k, v = item.split("=", 1)
            out[k.strip()] = v.strip()
        return cls.from_dict(out, base)

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    # ---- derived ---------------------------------------------------------------------
    def forecast_bound(self) -> ForecastBound:
        """The range rule ``forecast.near_recent_history`` checks, as :func:`mjoin.forecast.holt.forecast` applies it."""
        return ForecastBound(window=self.forecast_window, k=self.forecast_spread_k, spread=self.forecast_spread,
                             floor_rel=self.forecast_floor_rel, floor_abs=self.forecast_floor_abs,
                             floor_abs_gamma=self.forecast_floor_abs_gamma)

    def late_tolerance_for(self, query) -> float:
        return query.lateness if self.late_tolerance is None else float(self.late_tolerance)

    def duplicate_lookback_for(self, query) -> float:
        return query.max_window if self.duplicate_lookback is None else float(self.duplicate_lookback)


def _coerce(name: str, value, current):
    """Convert an override to the type of the field (strings come from the CLI and DAG params)."""
    try:
        if name in _DURATIONS:
            if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
                if name == "fraction_history":
                    raise ValueError("must be a duration")
                return None
            if name == "future_allowance" and isinstance(value, str) and value.strip().lower() in ("never", "inf"):
                return float("inf")
            return parse_duration(value)
        if name == "quiet_streams":
            if isinstance(value, str):
                return tuple(s.strip() for s in value.split(",") if s.strip())
            return tuple(str(s) for s in value)
        if isinstance(current, bool):
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError("must be true or false")
            return bool(value)
        if isinstance(current, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError("must be an integer")
            return int(value)
        if isinstance(current, float):
            return float(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise GateConfigError(f"gate setting {name}={value!r}: {exc}") from None
