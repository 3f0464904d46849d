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
or matches. ``b3`` (per-step overhead: a numpy call, a Spark task slice) is the same for
every order of the same length and is reported, not put in the model. Coefficients are
in seconds, so plan costs become seconds of probing per second of input.
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

from .cost import STATES, CostModel

log = logging.getLogger(__name__)

FIELDS = ("lookups", "matches", "kappa", "seconds")
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
    from . import fsutil
    from .fsutil import read_text

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
            files += sorted(f for f in p.rglob("*") if f.suffix in (".jsonl", ".json") and f.is_file())
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

def _clean(observations: Iterable[dict], state: str) -> tuple[np.ndarray, Counter, int]:
    """``(rows (k, 4): lookups, matches, kappa, seconds; rejected reasons; total)``."""
    rows, rejected, total = [], Counter(), 0
    for obs in observations:
        total += 1
        if not isinstance(obs, dict):
            rejected["not an object"] += 1
            continue
        missing = [f for f in FIELDS if obs.get(f) is None]
        if missing:
            rejected[f"missing {missing[0]}"] += 1
            continue
        try:
            vals = [float(obs[f]) for f in FIELDS]
        except (TypeError, ValueError):
            rejected["not a number"] += 1
            continue
        if not all(math.isfinite(v) and v >= 0 for v in vals):
            rejected["negative or not finite"] += 1
            continue
        backend = obs.get("state_backend")
        if backend is not None and backend != state:
            rejected[f"state_backend {backend} (fitting {state})"] += 1
            continue
        rows.append(vals)
    return np.array(rows, dtype=float).reshape(-1, 4), rejected, total


def _nnls(X: np.ndarray, y: np.ndarray, names: list[str]) -> np.ndarray:
    """Non-negative least squares on unit-norm columns (conditioning), refusing a design
    whose columns are linearly dependent (the coefficients would not be identified)."""
    from scipy.optimize import nnls

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


def calibrate(observations: Iterable[dict], state: str = "sorted", *, intercept: bool = True,
              min_observations: int | None = None, base: CostModel | None = None,
              source: str | None = None) -> tuple[CostModel, dict]:
    """Fit ``alpha_q, alpha_m`` (and ``c`` for a sorted state, ``m_slots`` for a hash state) by
    non-negative least squares. Returns the calibrated :class:`CostModel` and a report
    (R^2, residuals, rejected observations by reason, which coefficients were identified).

    ``state="auto"`` takes the observations' ``state_backend`` when they agree (else sorted).
    Raises :class:`CalibrationError` with too few usable observations or no variation."""
    observations = list(observations)
    if state == "auto":
        backends = {o.get("state_backend") for o in observations if isinstance(o, dict)} - {None}
        state = backends.pop() if len(backends) == 1 else "sorted"
    if state not in STATES:
        raise CalibrationError(f"state {state!r}: one of {', '.join(STATES)} (or auto)")
    base = base or CostModel(state=state)
    data, rejected, total = _clean(observations, state)
    lookups, matches, kappa, seconds = data.T if data.size else (np.zeros(0),) * 4
    notes = []

    def design(cols: dict) -> tuple[np.ndarray, list[str]]:
        if intercept:
            cols = {**cols, "overhead": np.ones_like(seconds)}
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
    report = {
        "state": state,
        "observations": total,
        "used": int(len(data)),
        "rejected": dict(rejected),
        "design": names,
        "coefficients": {k: float(v) for k, v in coef.items()},
        "overhead_seconds_per_step": float(coef.get("overhead", 0.0)),
        "identified": identified,
        "r2": r2,
        "rmse_seconds": math.sqrt(ss_res / len(data)),
        "residuals": {"mean_abs_seconds": float(np.abs(resid).mean()), "max_abs_seconds": float(np.abs(resid).max()),
                      "p50_relative": float(np.quantile(rel, 0.5)), "p90_relative": float(np.quantile(rel, 0.9))},
        "notes": notes,
    }
    summary = {"fitted_at": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"), "n": int(len(data)),
               "r2": round(r2, 6), "rmse_seconds": report["rmse_seconds"],
               "overhead_seconds_per_step": report["overhead_seconds_per_step"], "method": "nnls"}
    if source:
        summary["source"] = source
    model = replace(base, **fields, calibrated=True, calibration=summary)
    for note in notes:
        log.info("calibration: %s", note)
    return model, report
