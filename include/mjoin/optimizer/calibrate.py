"""Fit the cost model's coefficients to measured engine metrics (least squares, Eq. 4-7).

Every probe step the engine runs in a batch is one observation (``metrics["chains"][i]
["steps"][j]``: ``lookups`` q, ``matches`` s, ``kappa`` of the probed state, ``seconds``).
The model says a step costs

    seconds ~ alpha_q f(kappa) lookups + alpha_m matches (+ a fixed overhead per step)

which is linear in the unknowns once ``f`` is expanded:

- sorted state, ``f = c + log2(max(kappa, 1))``:
  ``seconds ~ b0 lookups + b1 lookups log2(kappa) + b2 matches + b3``
  -> ``alpha_q = b1``, ``c = b0 / b1``, ``alpha_m = b2``;
- hash state, ``f = c + kappa / (2 m_slots)``: ``alpha_q`` and ``c`` only appear as
  their product, so ``c = 1`` (units of one hash lookup):
  ``seconds ~ b0 lookups + b1 lookups kappa + b2 matches + b3``
  -> ``alpha_q = b0``, ``m_slots = b0 / (2 b1)``, ``alpha_m = b2``.

The fit is non-negative least squares (``scipy.optimize.nnls``): the coefficients are
costs, and a negative one (which plain least squares returns when timing noise is
large, or columns are nearly collinear) would make the optimizer *prefer* more lookups
or matches. ``b3`` (overhead) is the same for every order of the same length and is
reported, not put in the model. When the observations say how many vectorised calls
made them (the engine's ``calls``: one per bucket and batch that had groups alive), the
overhead is fitted per call (``b3 calls``), since a step summed over 16 buckets pays it
16 times; otherwise as one constant per observation. Coefficients are in seconds, so
plan costs become seconds of probing per second of input.

The time measured is ``seconds`` (wall) or, when the engine reports it, ``cpu_seconds``
(the thread's CPU time): on a shared machine other processes inflate wall time but not
CPU time, so :func:`calibrate_from_lake` prefers it.
"""
from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import numpy as np
from scipy.optimize import nnls

from mjoin.engine.metrics import read_metrics
from mjoin.lake.layout import Lake
from mjoin.optimizer.cost import STATES, CostModel
from mjoin.runtime import fsutil
from mjoin.runtime.fsutil import read_text

log = logging.getLogger(__name__)

FIELDS = ("lookups", "matches", "kappa", "seconds")
TIME_FIELDS = ("seconds", "cpu_seconds")
COST_MODEL_FILE = "cost_model.json"
#: c is set to at most this when the lookup time shows no dependence on kappa (f nearly constant)
C_MAX = 1e6
#: log2(kappa) must span at least this much for c to be identified (sorted state)
MIN_LOG_SPREAD = 1.0


class CalibrationError(ValueError):
    """Observations that cannot calibrate the model (too few, no variation); the message says why."""


# ---- reading engine metrics -------------------------------------------------------------

def observations_from_batch(doc: dict) -> list[dict]:
    """The probe steps of one engine metrics record (``chains[].steps[]``) as observations,
    each with the batch's ``state_backend`` and its chain's ``stream``; a record that is
    itself an observation (has ``lookups``) is returned as is."""
    if "chains" not in doc:
        return [dict(doc)] if "lookups" in doc else []
    out = []
    for chain in doc.get("chains") or []:
        for step in (chain or {}).get("steps") or []:
            obs = dict(step)
            obs.setdefault("stream", chain.get("stream"))
            if doc.get("state_backend") is not None:
                obs.setdefault("state_backend", doc["state_backend"])
            out.append(obs)
    return out


def read_observations(paths) -> tuple[list[dict], dict]:
    """Observations from metrics files: JSON lines (``.jsonl``), ``.json`` (one record or a
    list), or folders holding them. Returns ``(observations, counts)``; unreadable lines
    are counted (``bad_lines``), never silently dropped."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files = []
    for p in paths:
        if fsutil.is_url(p):  # hdfs://, s3://: one folder level
            if fsutil.is_dir(p):
                files += [fsutil.join(p, name) for name in fsutil.listdir(p) if name.endswith((".jsonl", ".json"))]
            else:
                files.append(str(p))
            continue
        p = Path(p)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.suffix in (".jsonl", ".json") and f.is_file())
            # an engine metrics folder holds each batch twice (batch=<B>.json and, after an interval
            # run, metrics.jsonl): read the per-batch files only
            batch_dirs = {f.parent for f in found if f.name.startswith("batch=") and f.suffix == ".json"}
            files += [f for f in found if not (f.name == "metrics.jsonl" and f.parent in batch_dirs)]
        else:
            files.append(p)
    if not files:
        raise CalibrationError(f"no metrics files in {', '.join(map(str, paths))}")
    out, counts = [], Counter()
    for f in files:
        try:
            text = read_text(f)
        except FileNotFoundError:
            raise CalibrationError(f"{f}: no such metrics file") from None
        docs = []
        if str(f).endswith(".json") and text.lstrip().startswith("["):
            try:
                docs = json.loads(text)
            except json.JSONDecodeError:
                counts["bad_lines"] += 1
        else:
            for line in text.splitlines():
                if not line.strip():
                    continue
                try:
                    docs.append(json.loads(line))
                except json.JSONDecodeError:
                    counts["bad_lines"] += 1
        for doc in docs:
            if not isinstance(doc, dict):
                counts["bad_lines"] += 1
                continue
            counts["records"] += 1
            obs = observations_from_batch(doc)
            if not obs:
                counts["records_without_steps"] += 1
            out += obs
        counts["files"] += 1
    counts["observations"] = len(out)
    return out, dict(counts)


# ---- the fit ---------------------------------------------------------------------------------

def _clean(observations: Iterable[dict], state: str, time_field: str = "seconds") -> tuple[np.ndarray, Counter, int]:
    """``(rows (k, 5): lookups, matches, kappa, time, calls (NaN if absent); rejected reasons; total)``."""
    fields = ("lookups", "matches", "kappa", time_field)
    rows, rejected, total = [], Counter(), 0
    for obs in observations:
        total += 1
        if not isinstance(obs, dict):
            rejected["not an object"] += 1
            continue
        missing = [f for f in fields if obs.get(f) is None]
        if missing:
            rejected[f"missing {missing[0]}"] += 1
            continue
        try:
            vals = [float(obs[f]) for f in fields]
            calls = float(obs["calls"]) if obs.get("calls") is not None else math.nan
        except (TypeError, ValueError):
            rejected["not a number"] += 1
            continue
        if not all(math.isfinite(v) and v >= 0 for v in vals) or calls < 0 or math.isinf(calls):
            rejected["negative or not finite"] += 1
            continue
        backend = obs.get("state_backend")
        if backend is not None and backend != state:
            rejected[f"state_backend {backend} (fitting {state})"] += 1
            continue
        if vals[0] == 0 and (math.isnan(calls) or calls == 0):
            rejected["no lookups (step not run)"] += 1
            continue
        rows.append(vals + [calls])
    return np.array(rows, dtype=float).reshape(-1, 5), rejected, total


def _nnls(X: np.ndarray, y: np.ndarray, names: list[str]) -> np.ndarray:
    """Non-negative least squares on unit-norm columns (conditioning), refusing a design
    whose columns are linearly dependent (the coefficients would not be identified)."""
    norms = np.linalg.norm(X, axis=0)
    zero = [names[i] for i in range(len(names)) if norms[i] == 0]
    if zero:
        raise CalibrationError(f"every observation has {' and '.join(zero)} = 0: cannot fit its coefficient")
    Xs = X / norms
    rank = np.linalg.matrix_rank(Xs, tol=1e-10 * max(Xs.shape))
    if rank < Xs.shape[1]:
        raise CalibrationError(f"the observations do not separate the terms {', '.join(names)} (rank {rank} < "
                               f"{len(names)}): they vary together, e.g. matches proportional to lookups in every "
                               "step; calibrate on runs with different match rates, key counts and batch sizes")
    coef, _ = nnls(Xs, y)
    return coef / norms


def _time_field(observations: list, time_field: str) -> str:
    if time_field == "auto":
        steps = [o for o in observations if isinstance(o, dict)]
        return "cpu_seconds" if steps and all(o.get("cpu_seconds") is not None for o in steps) else "seconds"
    if time_field not in TIME_FIELDS:
        raise CalibrationError(f"time field {time_field!r}: one of {', '.join(TIME_FIELDS)} (or auto)")
    return time_field


def calibrate(observations: Iterable[dict], state: str = "sorted", *, intercept: bool = True,
              min_observations: int | None = None, base: CostModel | None = None,
              source: str | None = None, time_field: str = "seconds") -> tuple[CostModel, dict]:
    """Fit ``alpha_q, alpha_m`` (and ``c`` for a sorted state, ``m_slots`` for a hash state) by
    non-negative least squares. Returns the calibrated :class:`CostModel` and a report
    (R^2, residuals, rejected observations by reason, which coefficients were identified).

    ``state="auto"`` takes the observations' ``state_backend`` when they agree (else sorted).
    ``time_field``: ``seconds``, ``cpu_seconds`` or ``auto`` (CPU time when every observation has it).
    The overhead term is per call when every usable observation has ``calls``, else per observation.
    Raises :class:`CalibrationError` with too few usable observations or no variation."""
    observations = list(observations)
    time_field = _time_field(observations, time_field)
    if state == "auto":
        backends = {o.get("state_backend") for o in observations if isinstance(o, dict)} - {None}
        state = backends.pop() if len(backends) == 1 else "sorted"
    if state not in STATES:
        raise CalibrationError(f"state {state!r}: one of {', '.join(STATES)} (or auto)")
    base = base or CostModel(state=state)
    data, rejected, total = _clean(observations, state, time_field)
    lookups, matches, kappa, seconds, calls = data.T if data.size else (np.zeros(0),) * 5
    per_call = bool(len(calls)) and not np.isnan(calls).any()
    notes = []

    def design(cols: dict) -> tuple[np.ndarray, list[str]]:
        if intercept:
            cols = {**cols, **({"calls": calls} if per_call else {"overhead": np.ones_like(seconds)})}
        return np.column_stack(list(cols.values())), list(cols)

    if state == "sorted":
        logk = np.log2(np.maximum(kappa, 1.0))
        spread = float(logk.max() - logk.min()) if logk.size else 0.0
        c_identified = spread >= MIN_LOG_SPREAD
        if c_identified:
            X, names = design({"lookups": lookups, "lookups*log2(kappa)": lookups * logk, "matches": matches})
        else:
            X, names = design({"lookups*f(kappa)": lookups * base.f(kappa), "matches": matches})
            notes.append(f"log2(kappa) spans {spread:.2f} < {MIN_LOG_SPREAD}: c not identified, kept c = {base.c:g}")
    else:
        spread = float(kappa.max() - kappa.min()) if kappa.size else 0.0
        if spread > 0:
            X, names = design({"lookups": lookups, "lookups*kappa": lookups * kappa, "matches": matches})
        else:
            X, names = design({"lookups*f(kappa)": lookups * base.f(kappa), "matches": matches})
            notes.append(f"kappa is constant: m_slots not identified, kept {base.m_slots}")

    need = max(8, 2 * len(names)) if min_observations is None else min_observations
    if len(data) < need:
        why = f" ({sum(rejected.values())} rejected: {dict(rejected)})" if rejected else ""
        raise CalibrationError(f"{len(data)} usable observation(s) of {total}{why}; calibration needs at least {need} "
                               f"for {len(names)} coefficients")
    coef = dict(zip(names, _nnls(X, seconds, names)))

    fields = {"state": state, "alpha_m": coef["matches"]}
    identified = {}
    if state == "sorted":
        if c_identified:
            b0, b1 = coef["lookups"], coef["lookups*log2(kappa)"]
            if b1 > 0 and b0 / b1 <= C_MAX:
                fields.update(alpha_q=b1, c=b0 / b1)
            else:
                fields.update(alpha_q=b0 / C_MAX, c=C_MAX)
                notes.append(f"lookup time shows no dependence on kappa: c = {C_MAX:g} (f nearly constant)")
        else:
            fields.update(alpha_q=coef["lookups*f(kappa)"], c=base.c)
        identified["c"] = c_identified
    else:
        if "lookups" in coef:
            b0, b1 = coef["lookups"], coef["lookups*kappa"]
            if b0 > 0:
                fields.update(alpha_q=b0, c=1.0, m_slots=(b0 / (2 * b1)) if b1 > 0 else None)
                if b1 == 0:
                    notes.append("lookup time shows no dependence on kappa: m_slots = null (f = c)")
            else:
                m = base.m_slots or CostModel().m_slots
                fields.update(alpha_q=2 * m * b1, c=0.0, m_slots=m)
                notes.append(f"no fixed lookup cost: c = 0, m_slots kept at {m:g}")
            identified["m_slots"] = True
        else:
            fields.update(alpha_q=coef["lookups*f(kappa)"], c=base.c, m_slots=base.m_slots)
            identified["m_slots"] = False

    pred = X @ np.array([coef[n] for n in names])
    resid = seconds - pred
    ss_res = float(resid @ resid)
    ss_tot = float(((seconds - seconds.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    rel = np.abs(resid) / np.maximum(seconds, 1e-12)
    overhead = float(coef.get("overhead", 0.0)) if not per_call else 0.0
    report = {
        "state": state,
        "time_field": time_field,
        "observations": total,
        "used": int(len(data)),
        "rejected": dict(rejected),
        "design": names,
        "coefficients": {k: float(v) for k, v in coef.items()},
        "overhead_seconds_per_step": overhead,
        "overhead_seconds_per_call": float(coef.get("calls", 0.0)),
        "overhead_term": ("calls" if per_call else "constant") if intercept else None,
        "identified": identified,
        "r2": r2,
        "rmse_seconds": math.sqrt(ss_res / len(data)),
        "residuals": {"mean_abs_seconds": float(np.abs(resid).mean()), "max_abs_seconds": float(np.abs(resid).max()),
                      "p50_relative": float(np.quantile(rel, 0.5)), "p90_relative": float(np.quantile(rel, 0.9))},
        "notes": notes,
    }
    report["correlation"] = float(np.corrcoef(pred, seconds)[0, 1]) if len(seconds) > 1 and pred.std() > 0 \
        and seconds.std() > 0 else None
    summary = {"fitted_at": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"), "n": int(len(data)),
               "r2": round(r2, 6), "rmse_seconds": report["rmse_seconds"],
               "overhead_seconds_per_step": report["overhead_seconds_per_step"],
               "overhead_seconds_per_call": report["overhead_seconds_per_call"], "time_field": time_field,
               "method": "nnls"}
    if source:
        summary["source"] = source
    model = replace(base, **fields, calibrated=True, calibration=summary)
    for note in notes:
        log.info("calibration: %s", note)
    return model, report


# ---- predictions and the engine's own metrics ----------------------------------------------------

def predict_step_seconds(model: CostModel, observations: Iterable[dict], overhead_per_call: float = 0.0,
                         overhead_per_step: float = 0.0) -> np.ndarray:
    """The model's time of each probe step: ``alpha_q f(kappa) lookups + alpha_m matches`` (Eq. 4, 7)
    plus the fitted overhead (per call or per step); what a calibration is checked against."""
    obs = list(observations)
    q = np.array([float(o["lookups"]) for o in obs])
    s = np.array([float(o["matches"]) for o in obs])
    k = np.array([float(o["kappa"]) for o in obs])
    calls = np.array([float(o.get("calls") or 0) for o in obs])
    return model.alpha_q * model.f(k) * q + model.alpha_m * s + overhead_per_call * calls + overhead_per_step


def engine_observations(records: Iterable[dict]) -> list[dict]:
    """Every probe step of engine metrics records (``chains[].steps[]``) as observations."""
    return [o for rec in records for o in observations_from_batch(rec)]


def calibrate_from_lake(lake, query, *, out=None, time_field: str = "auto", last: int | None = None,
                        min_r2: float | None = None, min_observations: int | None = None) -> tuple[CostModel, dict, str]:
    """Fit the cost model to the engine's metrics of ``query`` in ``lake`` (``<lake>/metrics/<query>/``)
    and write it to ``out`` (default ``<lake>/plans/<query>/cost_model.json``, which the
    re-optimization loop reads when present). Returns ``(model, report, path)``.

    ``last``: use only the newest ``last`` batches. ``time_field="auto"``: CPU time when the metrics
    have it. ``min_r2``: refuse (:class:`CalibrationError`, nothing written) a fit explaining less of
    the measured time than that, so a caller keeps its previous model instead of a noise fit."""
    lake = lake if isinstance(lake, Lake) else Lake(str(lake))
    name = query if isinstance(query, str) else query.name
    try:
        records = read_metrics(lake, name)
    except FileNotFoundError:
        raise CalibrationError(f"no engine metrics for {name} in {lake.metrics(name)}") from None
    records = [r for r in records if r.get("engine", "mjoin") == "mjoin"]
    if last:
        records = records[-int(last):]
    obs = engine_observations(records)
    model, report = calibrate(obs, "auto", min_observations=min_observations, time_field=time_field,
                              source=f"{lake.metrics(name)} ({len(records)} batches)")
    report["records"] = len(records)
    report["batches"] = [records[0]["batch_id"], records[-1]["batch_id"]] if records else []
    if min_r2 is not None and report["r2"] < min_r2:
        raise CalibrationError(f"the fit explains R^2 = {report['r2']:.3f} of the measured step time, below "
                               f"{min_r2}: not written (too little or too noisy work in these batches)")
    path = str(out) if out else fsutil.join(lake.plans(name), COST_MODEL_FILE)
    model.save(path)
    return model, report, path
