"""Backtest: one-step-ahead error of Holt against the last value (the paper's noSmooth) and the mean.

For each workload, stream data are landed in a temporary lake and the real statistics job
computes the history; then for every cycle i after a warm-up, the forecast made with the
cycles before i (``as_of`` = start of cycle i) is compared with the measured cycle i.

Workloads: ``drifting`` (synthetic: rates, key skew and key overlap drift), ``tpcds``
(TPC-DS customer/returns replayed in random order, the paper's seed experiment).
Error: sMAPE = mean of 2|f - a| / (|f| + |a|) (0 when both are 0), per statistic, over
every stream/edge series and evaluated cycle; also MAE and Holt's win rate over last value.

    python bench/forecast/backtest.py --quick
    python bench/forecast/backtest.py --minutes 60

Writes bench/forecast/results/backtest[-quick].json and one forecast-vs-actual PNG per workload.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "stats"))
sys.path.insert(0, str(HERE.parents[1] / "include"))

from _common import land_drifting, land_tpcds_replay, machine_info, spark_session, write_json  # noqa: E402

STATS = ("lambda", "kappa", "window_tuples", "gamma", "mu")
MODELS = ("holt", "last_value", "mean")


def smape(f, a):
    f, a = np.asarray(f, float), np.asarray(a, float)
    den = np.abs(f) + np.abs(a)
    return np.where(den == 0, 0.0, 2 * np.abs(f - a) / np.where(den == 0, 1, den))


def history_for(spark, workload, minutes, cycle, sf, tmp):
    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query
    from mjoin.stats.history import read_history
    from mjoin.stats.job import run_statistics

    query = load_query("tpcds_returns_by_address")
    lake = Lake(str(tmp / workload / "lake"))
    seconds = int(minutes * 60)
    if workload == "drifting":
        t0, t1 = land_drifting(lake, seconds)
        meta = {"duration_seconds": seconds}
    else:
        from _common import tpcds_tables

        total = sum(len(df) for df in tpcds_tables(sf).values())
        rate = total / seconds  # replay the whole sf in the given time
        t0, t1, counts = land_tpcds_replay(lake, sf, rate)
        meta = {"sf": sf, "rate": rate, "rows": counts}
    t1 = t0 + (t1 - t0) // cycle * cycle
    start = time.perf_counter()
    run_statistics(spark, query, lake, t0, t1, cycle, out=str(tmp / workload / "stats"))
    meta["stats_job_seconds"] = time.perf_counter() - start
    return read_history(str(tmp / workload / "stats"), query.name, meta=True), meta


def backtest(history: pd.DataFrame, length: int, warmup: int):
    from mjoin.forecast.holt import ForecastConfig, forecast

    cycles = sorted(history["cycle_start"].unique())
    rows = []
    fit_seconds = []  # per Holt forecast: (elapsed, in the fits, fitted series)
    for i in range(warmup, len(cycles)):
        as_of = cycles[i]
        actual = history[history["cycle_start"] == as_of]
        for model in MODELS:
            t = time.perf_counter()
            res = forecast(history, as_of, length=length, config=ForecastConfig(model=model))
            if model == "holt":
                fitted = sum(v for k, v in res.statistics.meta["methods"].items() if k.startswith("holt"))
                fit_seconds.append((time.perf_counter() - t, res.fit_seconds, fitted))
            rep = res.report
            for ent, stats in (("stream", STATS[:3]), ("edge", STATS[3:])):
                a = actual[actual.entity == ent]
                r = rep[rep.entity == ent]
                keys = ["group", "stream"] + (["right"] if ent == "edge" else [])
                merged = r.merge(a, on=keys, suffixes=("", "_actual"))
                for stat in stats:
                    sub = merged[merged.statistic == stat]
                    for rec in sub.to_dict("records"):  # ("lambda" is not an attribute name)
                        rows.append({"cycle": as_of, "model": model, "statistic": stat, "series":
                                     f"{rec['group']}/{rec['stream']}" + (f"->{rec['right']}" if ent == "edge" else ""),
                                     "forecast": rec["value"], "actual": rec[stat], "method": rec["method"]})
    df = pd.DataFrame(rows)
    df["smape"] = smape(df["forecast"], df["actual"])
    df["abs_err"] = (df["forecast"] - df["actual"]).abs()
    return df, fit_seconds


def summarise(df: pd.DataFrame) -> dict:
    out = {}
    for stat in STATS:
        sub = df[df.statistic == stat]
        rec = {m: {"smape": float(sub[sub.model == m]["smape"].mean()), "mae": float(sub[sub.model == m]["abs_err"].mean())}
               for m in MODELS}
        h = sub[sub.model == "holt"].set_index(["cycle", "series"])["abs_err"]
        lv = sub[sub.model == "last_value"].set_index(["cycle", "series"])["abs_err"]
        both = pd.concat([h, lv], axis=1, keys=["h", "lv"]).dropna()
        rec["holt_better_than_last_value"] = float((both.h < both.lv).mean()) if len(both) else None
        rec["holt_methods"] = sub[sub.model == "holt"]["method"].value_counts().to_dict()
        out[stat] = rec
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 20 minutes, sf 0.1, L = 30")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--cycle", type=int, default=10)
    ap.add_argument("--length", type=int, default=60)
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--workloads", default="drifting,tpcds")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    if args.quick:
        args.minutes, args.sf, args.length = 20, 0.1, 30
    warmup = max(10, args.length // 3)
    spark = spark_session()
    tmp = Path(tempfile.mkdtemp(prefix="mjoin-backtest-"))
    name = "backtest-quick" if args.quick else "backtest"
    doc = {"benchmark": "forecast-backtest", "machine": machine_info(),
           "parameters": {"minutes": args.minutes, "cycle": args.cycle, "length": args.length, "sf": args.sf,
                          "warmup_cycles": warmup, "error": "sMAPE (0..2) and MAE per statistic"},
           "workloads": {}}
    for wl in args.workloads.split(","):
        history, meta = history_for(spark, wl, args.minutes, args.cycle, args.sf, tmp)
        df, fit_seconds = backtest(history, args.length, warmup)
        doc["workloads"][wl] = {"meta": meta, "cycles": int(history["cycle_start"].nunique()),
                                "evaluated_cycles": int(df["cycle"].nunique()),
                                "holt_seconds_per_forecast": float(np.mean([x[0] for x in fit_seconds])),
                                "holt_fit_seconds_per_forecast": float(np.mean([x[1] for x in fit_seconds])),
                                "ms_per_fitted_series": 1000 * float(sum(x[1] for x in fit_seconds)
                                                                     / max(sum(x[2] for x in fit_seconds), 1)),
                                "series_per_forecast": int(len(df[(df.model == "holt")]) / max(df["cycle"].nunique(), 1)),
                                "errors": summarise(df)}
        for stat, rec in doc["workloads"][wl]["errors"].items():
            print(f"{wl:9s} {stat:14s} sMAPE holt {rec['holt']['smape']:.4f}  last {rec['last_value']['smape']:.4f}  "
                  f"mean {rec['mean']['smape']:.4f}  holt wins {rec['holt_better_than_last_value']}")
        _plot(df, wl, Path(args.out) / f"{name}-{wl}.png")
    write_json(Path(args.out) / f"{name}.json", doc)
    return 0


def _plot(df, workload, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    picks = [("lambda", "0/sr"), ("kappa", "0/sr"), ("gamma", "0/cu->sr"), ("mu", "0/sr->cu")]
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    for ax, (stat, series) in zip(axes.ravel(), picks):
        sub = df[(df.statistic == stat) & (df.series == series)]
        act = sub[sub.model == "holt"].sort_values("cycle")
        ax.plot(act["cycle"], act["actual"], "k-", lw=1.2, label="measured")
        for model, style in (("holt", "C0-"), ("last_value", "C3--")):
            s = sub[sub.model == model].sort_values("cycle")
            err = s["smape"].mean()
            ax.plot(s["cycle"], s["forecast"], style, lw=0.9, label=f"{model} (sMAPE {err:.3f})")
        ax.set_title(f"{workload}: {stat} {series}", fontsize=9)
        ax.tick_params(axis="x", labelsize=6, rotation=20)
        ax.legend(fontsize=7)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
