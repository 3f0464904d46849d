"""Cost of the statistics job: wall time per interval (exact and sketch mode), and the hook to
compare it with the join engine's time on the same interval (goal: statistics <= 5% of the engine).

    python bench/stats/bench_stats.py --quick          # TPC-DS sf 0.1, a few minutes of replay
    python bench/stats/bench_stats.py --sf 1 --rate 500
    python bench/stats/bench_stats.py --engine-seconds 812.5   # the engine's time on the same interval

The engine lands later: pass its wall time for the same interval with --engine-seconds, or
--engine-metrics <lake>/metrics/<query> (JSON lines with "wall_seconds" or "duration_ms" per
batch) once it writes them; the result JSON then holds stats_seconds / engine_seconds.

--band-join also times the straightforward alternative for the edge statistics (a Spark band
join of each l tuple with r's window, aggregated per key and timestamp first), which the event
sweep in mjoin.stats.exact replaces.

Writes bench/stats/results/cost[-quick].json and .png.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "include"))

from _common import land_tpcds_replay, machine_info, spark_session, write_json  # noqa: E402


def engine_seconds_from_metrics(path) -> float | None:
    """Sum the per-batch wall times in the engine's JSON-lines metrics (format not final yet)."""
    total, found = 0.0, False
    for f in sorted(Path(path).glob("**/*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "wall_seconds" in rec:
                total += float(rec["wall_seconds"]); found = True
            elif "duration_ms" in rec:
                total += float(rec["duration_ms"]) / 1000; found = True
    return total if found else None


def band_join_seconds(spark, query, lake, start, end) -> float:
    """Edge counts the direct way: per edge, a band join of l's (key, ts) groups with r's."""
    from pyspark.sql import functions as F

    from mjoin.stats.sources import Grid, US, load_streams

    grid = Grid(int(start) * US, int(end) * US, 10 * US)
    base, _ = load_streams(spark, query, lake, grid, None)
    base = base.where("t IS NOT NULL AND k0 IS NOT NULL").cache()
    base.count()
    t = time.perf_counter()
    names = query.stream_names
    for l, r in query.directed_edges:
        wr = int(query.stream(r).window * US)
        L = (base.where(f"sid = {names.index(l)} AND t >= {grid.t0_us} AND t < {grid.t1_us}")
             .groupBy("k0", "t").agg(F.count(F.lit(1)).alias("nl")))
        R = base.where(f"sid = {names.index(r)}").groupBy("k0", "t").agg(F.count(F.lit(1)).alias("nr"))
        j = (L.alias("l").join(R.alias("r"), (F.col("l.k0") == F.col("r.k0")) & (F.col("r.t") <= F.col("l.t"))
                               & (F.col("r.t") > F.col("l.t") - wr), "left")
             .groupBy("l.k0", "l.t", "l.nl").agg(F.coalesce(F.sum("r.nr"), F.lit(0)).alias("c"))
             .agg(F.sum("nl"), F.sum(F.when(F.col("c") > 0, F.col("nl"))), F.sum(F.col("nl") * F.col("c"))))
        j.collect()
    elapsed = time.perf_counter() - t
    base.unpersist()
    return elapsed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: TPC-DS sf 0.1, 5 minutes of replay")
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=500.0, help="replayed rows per second (all streams)")
    ap.add_argument("--cycle", type=int, default=10)
    ap.add_argument("--minutes", type=float, default=None, help="interval length (default: the whole replay)")
    ap.add_argument("--engine-seconds", type=float, help="the join engine's wall time on the same interval")
    ap.add_argument("--engine-metrics", help="the engine's metrics folder (JSON lines) for the same interval")
    ap.add_argument("--band-join", action="store_true", help="also time the band-join alternative")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    if args.quick:
        args.sf, args.rate, args.minutes, args.band_join = 0.1, 200.0, 5.0, True

    from mjoin.lake import Lake
    from mjoin.query import load_query
    from mjoin.sketch import SketchConfig
    from mjoin.stats.job import StatsConfig, run_statistics

    query = load_query("tpcds_returns_by_address")
    tmp = tempfile.mkdtemp(prefix="mjoin-bench-stats-")
    lake = Lake(str(Path(tmp) / "lake"))
    t0, t1, counts = land_tpcds_replay(lake, args.sf, args.rate)
    if args.minutes:
        t1 = min(t1, t0 + int(args.minutes * 60))
    t1 = t0 + (t1 - t0) // args.cycle * args.cycle
    spark = spark_session()
    runs = []
    for mode in ("exact", "sketch", "exact", "sketch"):  # the first of each warms the JVM up
        cfg = StatsConfig(mode=mode, sketch=SketchConfig() if mode == "sketch" else None)
        t = time.perf_counter()
        run = run_statistics(spark, query, lake, t0, t1, args.cycle, out=str(Path(tmp) / f"stats-{mode}"), config=cfg)
        wall = time.perf_counter() - t
        s = run.summary
        runs.append({"mode": mode, "wall_seconds": wall, "phases": s["wall_seconds"], "cycles": s["cycles"],
                     "tuples": sum(v["tuples"] for v in s["streams"].values()),
                     "rows_read": sum(v["rows_read"] for v in s["streams"].values()),
                     "sketch": s.get("sketch")})
        print(f"{mode}: {wall:.1f}s for {s['cycles']} cycles, {runs[-1]['tuples']} tuples")
    warm = {r["mode"]: r for r in runs[2:]}
    engine = args.engine_seconds or (engine_seconds_from_metrics(args.engine_metrics) if args.engine_metrics else None)
    doc = {
        "benchmark": "stats-cost", "machine": machine_info(),
        "parameters": {"workload": "tpcds replay", "sf": args.sf, "rate": args.rate, "cycle": args.cycle,
                       "interval": [t0, t1], "interval_seconds": t1 - t0, "landed_rows": counts},
        "runs": runs,
        "engine_seconds": engine,
        "stats_over_engine": ({m: r["wall_seconds"] / engine for m, r in warm.items()} if engine else None),
        "goal": "statistics <= 5% of the engine's time on the same interval",
    }
    if args.band_join:
        doc["band_join_seconds"] = band_join_seconds(spark, query, lake, t0, t1)
        doc["sweep_edges_seconds"] = warm["exact"]["phases"].get("edges")
        print(f"band join (edges only): {doc['band_join_seconds']:.1f}s vs event sweep {doc['sweep_edges_seconds']:.1f}s")
    name = "cost-quick" if args.quick else "cost"
    write_json(Path(args.out) / f"{name}.json", doc)
    _plot(doc, Path(args.out) / f"{name}.png")
    return 0


def _plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    warm = {r["mode"]: r for r in doc["runs"][2:]}
    phases = sorted({k for r in warm.values() for k in r["phases"] if k not in ("compute", "total")})
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    bottom = {m: 0.0 for m in warm}
    for ph in phases:
        vals = [warm[m]["phases"].get(ph, 0.0) for m in warm]
        ax[0].bar(list(warm), vals, bottom=[bottom[m] for m in warm], label=ph)
        for m, v in zip(warm, vals):
            bottom[m] += v
    ax[0].set_ylabel("seconds (warm run)")
    ax[0].set_title(f"statistics job, {doc['parameters']['interval_seconds']} s of TPC-DS replay "
                    f"(sf {doc['parameters']['sf']})", fontsize=9)
    ax[0].legend(fontsize=7)
    labels, vals = ["exact: edges (sweep)"], [warm["exact"]["phases"].get("edges", 0)]
    if doc.get("band_join_seconds") is not None:
        labels.append("band join (edges)")
        vals.append(doc["band_join_seconds"])
    if doc.get("engine_seconds"):
        labels.append("engine x 5%")
        vals.append(doc["engine_seconds"] * 0.05)
    ax[1].bar(labels, vals, color=["C0", "C3", "C2"][:len(vals)])
    ax[1].set_ylabel("seconds")
    ax[1].set_title("edge statistics: event sweep vs band join", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
