"""Speed of the forecast: fitting hundreds of series per re-optimization must take seconds.

Times ``mjoin.forecast.holt.forecast`` on synthetic histories of 4 streams x 12 edges x G key
groups (36 G series, half of them trending, some constant), and single-series fits of the
alternatives: statsmodels' defaults (L-BFGS-B after a brute-force start grid), SLSQP with and
without the brute grid (ours: without), and ETSModel (which has prediction intervals).
Accuracy of each alternative = mean absolute one-step error on the same series.

    python bench/forecast/speed.py --quick
    python bench/forecast/speed.py            # up to 16 groups (576 series)

Writes bench/forecast/results/speed[-quick].json and .png.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "stats"))
sys.path.insert(0, str(HERE.parents[1] / "include"))

from _common import machine_info, write_json  # noqa: E402


def synthetic_history(query, cycles: int, groups: int, seed: int = 0) -> pd.DataFrame:
    from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StreamStats

    rng = np.random.default_rng(seed)
    rows = []
    t0 = pd.Timestamp("2026-01-01T00:00:00Z")
    slopes = rng.normal(0, 0.5, (groups, 4))
    for j in range(cycles):
        gs = {}
        for g in range(groups):
            G = GroupStats()
            for i, s in enumerate(query.stream_names):
                lam = max(0.0, 20 + slopes[g, i] * j + rng.normal(0, 1))
                G.streams[s] = StreamStats(lam=lam, kappa=100.0 if i == 0 else 80 + j + rng.normal(0, 2),
                                           window_tuples=300 * lam, tuples=10 * lam)
            for k, (l, r) in enumerate(query.directed_edges):
                G.edges[(l, r)] = EdgeStats(gamma=float(np.clip(0.3 + 0.003 * j * (k % 3 - 1) + rng.normal(0, 0.02), 0, 1)),
                                            mu=1.0 if k % 4 == 0 else 1.5 + rng.normal(0, 0.1))
            gs[g] = G
        rows += Statistics(query.name, gs, cycle_start=t0 + pd.Timedelta(seconds=10 * j), cycle_seconds=10.0).to_rows()
    h = pd.DataFrame(rows)
    h["cycle_start"] = pd.to_datetime(h["cycle_start"], utc=True)
    return h


def single_fit_alternatives(n_series: int, seed: int = 1) -> dict:
    from statsmodels.tsa.exponential_smoothing.ets import ETSModel
    from statsmodels.tsa.holtwinters import Holt

    rng = np.random.default_rng(seed)
    t = np.arange(61)
    ys = [20 + rng.normal(0, 0.5) * t + np.cumsum(rng.normal(0, 0.5, 61)) + rng.normal(0, 1, 61) for _ in range(n_series)]
    alts = {
        "statsmodels default (L-BFGS-B + brute)": lambda y, d: Holt(y, initialization_method="estimated", damped_trend=d).fit().forecast(1)[0],
        "SLSQP + brute": lambda y, d: Holt(y, initialization_method="estimated", damped_trend=d).fit(method="SLSQP").forecast(1)[0],
        "SLSQP, no brute (mjoin)": lambda y, d: Holt(y, initialization_method="estimated", damped_trend=d).fit(method="SLSQP", use_brute=False).forecast(1)[0],
        "ETSModel (intervals)": lambda y, d: ETSModel(pd.Series(y), error="add", trend="add", damped_trend=d).fit(disp=False)
        .get_prediction(start=len(y), end=len(y)).summary_frame(alpha=0.1)["mean"].iloc[0],
    }
    out = {}
    for name, fn in alts.items():
        for damped in (False, True):
            errs, start = [], time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for y in ys:
                    errs.append(abs(fn(y[:60], damped) - y[60]))
            out[f"{name}{' damped' if damped else ''}"] = {
                "ms_per_series": (time.perf_counter() - start) / n_series * 1000, "mae": float(np.mean(errs))}
            print(f"{name:40s} damped={damped!s:5s} {out[f'{name}' + (' damped' if damped else '')]}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    from mjoin.forecast.holt import forecast
    from mjoin.model.query import load_query

    query = load_query("tpcds_returns_by_address")
    group_counts = [1, 4] if args.quick else [1, 4, 8, 16]
    h = synthetic_history(query, 20, 1)
    forecast(h, h["cycle_start"].max() + pd.Timedelta(seconds=10), length=20)  # warm-up: imports, first fits
    whole = []
    for groups in group_counts:
        h = synthetic_history(query, 80, groups)
        as_of = h["cycle_start"].max() + pd.Timedelta(seconds=10)
        start = time.perf_counter()
        res = forecast(h, as_of, length=60)
        elapsed = time.perf_counter() - start
        fitted = sum(v for k, v in res.statistics.meta["methods"].items() if k.startswith("holt"))
        whole.append({"groups": groups, "series": len(res.series), "seconds": elapsed,
                      "fit_seconds": res.fit_seconds, "prepare_seconds": elapsed - res.fit_seconds,
                      "fitted_series": fitted, "ms_per_fitted_series": 1000 * res.fit_seconds / max(fitted, 1),
                      "methods": res.statistics.meta["methods"]})
        print(f"forecast(): {len(res.series)} series in {elapsed:.2f}s (fits {res.fit_seconds:.2f}s, "
              f"{whole[-1]['ms_per_fitted_series']:.1f} ms per fitted series)  {res.statistics.meta['methods']}")
    alts = single_fit_alternatives(20 if args.quick else 100)
    doc = {"benchmark": "forecast-speed", "machine": machine_info(),
           "parameters": {"length": 60, "cycles": 80, "groups": group_counts}, "forecast": whole, "alternatives": alts}
    name = "speed-quick" if args.quick else "speed"
    write_json(Path(args.out) / f"{name}.json", doc)
    _plot(doc, Path(args.out) / f"{name}.png")
    return 0


def _plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    ax[0].plot([w["series"] for w in doc["forecast"]], [w["seconds"] for w in doc["forecast"]], "o-")
    ax[0].set_xlabel("series per re-optimization")
    ax[0].set_ylabel("seconds")
    ax[0].set_title("mjoin.forecast.holt.forecast (Holt, SLSQP, no brute grid)", fontsize=9)
    names = list(doc["alternatives"])
    ax[1].barh(names, [doc["alternatives"][n]["ms_per_series"] for n in names])
    for i, n in enumerate(names):
        ax[1].text(doc["alternatives"][n]["ms_per_series"], i, f" MAE {doc['alternatives'][n]['mae']:.2f}", va="center", fontsize=7)
    ax[1].set_xlabel("ms per series (one fit + one-step forecast)")
    ax[1].tick_params(axis="y", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
