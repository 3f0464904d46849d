"""What each synthetic preset does to the measured rates and match rates (pandas, independent of the engine).

    python bench/workloads/drift_effects.py            # 4 streams x 30 min, every preset
    python bench/workloads/drift_effects.py --quick    # 4 streams x 5 min

For every preset: generate the workload, then per time bucket (1/12 of the
duration) measure each stream's rate (tuples/s) and, for every ordered pair
(l, r), gamma[l][r] = the share of l's tuples whose key appears in r's window
(an r tuple with that key in (t - W, t], W = the spec's window), the statistic
the stats job computes (docs/algorithms.md Eq. 9). Writes JSON and a PNG (one row per
preset: rates, and gamma into and out of the most affected stream).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "include"))

import pandas as pd  # noqa: E402

from mjoin.workloads.presets import PRESETS
from mjoin.workloads.synthetic import generate_synthetic  # noqa: E402

BUCKETS = 12


def frame(root, stream) -> pd.DataFrame:
    files = sorted(glob.glob(os.path.join(root, "streams", stream, "*", "*.parquet")))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def measure(m, window_s: float) -> dict:
    start, end = pd.Timestamp(m.doc["start"]), pd.Timestamp(m.doc["end"])
    width = (end - start) / BUCKETS
    data = {s: frame(m.root, s) for s in m.sources}
    for df in data.values():
        df["bucket"] = ((df["ts"] - start) / width).astype(int).clip(upper=BUCKETS - 1)
    rates = {s: (df.groupby("bucket").size().reindex(range(BUCKETS), fill_value=0) / width.total_seconds()).round(3).tolist()
             for s, df in data.items()}
    gamma = {}
    tol = pd.Timedelta(seconds=window_s) - pd.Timedelta("1us")
    for l, lt in data.items():
        lt = lt.dropna(subset=["key"]).sort_values("ts")
        for r, rt in data.items():
            if r == l:
                continue
            rt = rt.dropna(subset=["key"]).sort_values("ts")[["ts", "key"]].rename(columns={"ts": "rts"})
            j = pd.merge_asof(lt, rt, left_on="ts", right_on="rts", by="key", direction="backward", tolerance=tol)
            gamma[f"{l}->{r}"] = j["rts"].notna().groupby(j["bucket"]).mean().reindex(range(BUCKETS)).round(3).tolist()
    return {"rates": rates, "gamma": gamma}


def plot(results: dict, path: Path, n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    presets = list(results)
    fig, axes = plt.subplots(len(presets), 2, figsize=(11, 2.2 * len(presets)), sharex=True)
    x = [(i + 0.5) / BUCKETS * 100 for i in range(BUCKETS)]
    focus = {"match-drift": f"s{n - 1}", "mixed": f"s{n - 2}", "skew-drift": "s0", "burst": "s1"}
    for row, p in zip(axes, presets):
        for s, ys in results[p]["rates"].items():
            row[0].plot(x, ys, label=s)
        f = focus.get(p, "s0")
        for pair, ys in results[p]["gamma"].items():
            if f in pair.split("->"):
                row[1].plot(x, ys, label=pair, lw=1)
        row[0].set_ylabel(f"{p}\ntuples/s", fontsize=8)
        row[1].set_ylabel(f"gamma (pairs with {f})", fontsize=8)
        row[1].set_ylim(-0.02, 1.02)
        row[0].legend(fontsize=6, ncol=4)
        row[1].legend(fontsize=5, ncol=3)
    for ax in axes[-1]:
        ax.set_xlabel("% of the duration")
    fig.suptitle("synthetic presets: measured rates and match rates (first bucket: windows still filling)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    duration = "5m" if args.quick else "30m"
    results = {}
    with tempfile.TemporaryDirectory(prefix="mjoin-drift-") as tmp:
        for preset in PRESETS:
            m = generate_synthetic(Path(tmp) / preset, streams=args.streams, duration=duration, schedule=preset, seed=0)
            window = m.queries()[0].max_window
            results[preset] = measure(m, window)
            print(f"{preset:<12} done", flush=True)
    name = "drift-quick" if args.quick else "drift-full"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "workloads/drift_effects", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
           "versions": {"pandas": pd.__version__},
           "parameters": {"streams": args.streams, "duration": duration, "rate": 20, "domain": 1000, "window": "1m",
                          "seed": 0, "buckets": BUCKETS},
           "results": results}
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(results, out / f"{name}.png", args.streams)
    print(f"-> {out / name}.json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
