"""Workload generation and landing: how long dsdgen, the replays, the synthetic generator and the lander take.

    python bench/workloads/bench_workloads.py            # full: sf 0.1 and 1, synthetic 4 and 8 streams x 30 min
    python bench/workloads/bench_workloads.py --quick    # smoke test: sf 0.01, one small synthetic workload
    python bench/workloads/bench_workloads.py --sf 0.1 1 10

Every step runs cold in a fresh temporary folder (the dsdgen cache included).
Measured: wall seconds, rows, files and bytes written, rows/s. Writes JSON
(machine, versions, date, parameters, every measurement) and a PNG (seconds per
step, log scale) to bench/workloads/results/. Timings on a shared machine are
noisy; re-run on a quiet one for numbers to quote.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "include"))

from mjoin.lake.layout import Lake  # noqa: E402
from mjoin.workloads.tpcds_cache import ensure_tables
from mjoin.workloads.synthetic import generate_synthetic
from mjoin.workloads.tpcds_replay import generate_tpcds
from mjoin.workloads.lander import land  # noqa: E402


def folder_size(root) -> tuple[int, int]:
    files = [p for p in Path(root).rglob("*.parquet")]
    return len(files), sum(p.stat().st_size for p in files)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def bench_tpcds(sf: float, work: Path) -> list[dict]:
    rows = []
    cache = work / f"cache-{sf:g}"
    seconds, folder = timed(lambda: ensure_tables(sf, cache))
    meta = json.loads((Path(folder) / "meta.json").read_text())
    n_rows = sum(meta["rows"][t] for t in ("customer", "store_returns", "web_returns", "catalog_returns"))
    rows.append({"step": "dsdgen + cache", "config": f"sf={sf:g}", "seconds": seconds, "rows": n_rows,
                 "bytes": sum(p.stat().st_size for p in Path(folder).glob("*.parquet"))})
    for replay in ("paper", "event-time"):
        out = work / f"tpcds-{sf:g}-{replay}"
        seconds, m = timed(lambda: generate_tpcds(out, sf=sf, replay=replay, cache_dir=cache))
        files, size = folder_size(out / "streams")
        streamed = sum(m.rows(s) for s in m.sources)
        rows.append({"step": f"replay {replay}", "config": f"sf={sf:g}", "seconds": seconds, "rows": streamed,
                     "files": files, "bytes": size, "rows_per_s": streamed / seconds})
        if replay == "paper":
            lake = Lake(str(work / f"lake-{sf:g}"))
            seconds, r = timed(lambda: land(m.root, lake, None))
            rows.append({"step": "land --all", "config": f"sf={sf:g}", "seconds": seconds, "rows": sum(r.rows_per_source().values()),
                         "files": r.files, "files_per_s": r.files / seconds})
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    return rows


def bench_synthetic(streams: int, duration: str, rate: float, schedule: str, work: Path) -> dict:
    out = work / f"syn-{streams}-{duration}-{rate:g}"
    seconds, m = timed(lambda: generate_synthetic(out, streams=streams, duration=duration, rate=rate, schedule=schedule))
    files, size = folder_size(out / "streams")
    n = sum(m.rows(s) for s in m.sources)
    shutil.rmtree(out, ignore_errors=True)
    return {"step": "synthetic", "config": f"{streams} streams, {duration}, {rate:g}/s, {schedule}", "seconds": seconds,
            "rows": n, "files": files, "bytes": size, "rows_per_s": n / seconds}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['step']}\n{r['config']}" for r in results]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(results)), 4.5))
    ax.bar(range(len(results)), [r["seconds"] for r in results], color="tab:blue")
    ax.set_xticks(range(len(results)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("wall seconds (log)")
    ax.set_title("mjoin workloads: generation and landing time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke test: sf 0.01 and one small synthetic workload")
    p.add_argument("--sf", type=float, nargs="+", help="scale factors (default 0.1 1; quick: 0.01)")
    p.add_argument("--out", default=str(HERE / "results"), help="results folder")
    args = p.parse_args(argv)
    sfs = args.sf or ([0.01] if args.quick else [0.1, 1.0])
    synthetic = [(4, "5m", 20.0, "mixed")] if args.quick else [(4, "30m", 20.0, "mixed"), (8, "30m", 20.0, "mixed"),
                                                                (4, "30m", 200.0, "mixed")]
    results = []
    with tempfile.TemporaryDirectory(prefix="mjoin-bench-workloads-") as tmp:
        work = Path(tmp)
        for sf in sfs:
            results += bench_tpcds(sf, work / "tpcds")
            print(f"sf={sf:g} done", flush=True)
        for cfg in synthetic:
            results.append(bench_synthetic(*cfg, work))
    import duckdb
    import numpy
    import pyarrow

    doc = {
        "benchmark": "workloads", "mode": "quick" if args.quick else "full",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()},
        "versions": {"duckdb": duckdb.__version__, "numpy": numpy.__version__, "pyarrow": pyarrow.__version__},
        "parameters": {"sf": sfs, "synthetic": [dict(zip(("streams", "duration", "rate", "schedule"), c)) for c in synthetic]},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "quick" if args.quick else "full"
    (out / f"{name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot(results, out / f"{name}.png")
    for r in results:
        extra = f"  {r['rows_per_s']:.0f} rows/s" if "rows_per_s" in r else (f"  {r['files_per_s']:.0f} files/s" if "files_per_s" in r else "")
        print(f"{r['step']:<18} {r['config']:<34} {r['seconds']:8.2f} s  {r['rows']:>9} rows{extra}")
    print(f"-> {out / name}.json, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
