"""Cost of the statistics job side by side with the join engine on the same interval and data
(the goal: statistics for an interval cost at most 5% of what the engine spends on it).

    python bench/stats/bench_stats.py                 # sf 0.1 and sf 1, cold and warm (the full run)
    python bench/stats/bench_stats.py --quick         # sf 0.1 only, warm only, one measured round
    python bench/stats/bench_stats.py --sizes 1       # one size

Workload: TPC-DS replayed as the seed query's four streams (``_common.land_tpcds_replay``),
20 minutes of event time at ``rate`` rows/s (sf 0.1: 50 rows/s, sf 1: 500 rows/s, as in
bench/engine/run_bench.py); the interval is everything after the first 5-minute window
(full windows from the start), whole minutes.

Measured on that interval, for each size:

- **engine**: ``mjoin.engine.runs.run_interval`` (the spec's stream order, 60 s batches, 16 buckets:
  the engine benchmark's settings), its wall time (reading and routing the interval, the
  warm-up batch, the batches, writing results and metrics) and ``batch_seconds`` (the batches only);
- **engine_streaming**: what the continuous join job spends on the interval: the same engine with one
  Spark job per 10-s micro-batch (``pipelined=False``, the streaming job's per-batch path; 10 s is
  ``mjoin_join_job``'s default trigger);
- **stats**: ``mjoin.stats.job.run_statistics`` with 10 s cycles (the DAG's default tau), exact
  mode with ``method="pass"`` (one Spark job; ``stats_pass``: the default, which at these sizes
  collects the narrow rows and runs the kernel on the driver; ``stats_pass_executors``:
  ``driver_rows=0``, the kernel in Spark tasks after a shuffle by key) and ``method="sql"`` (one
  Spark SQL aggregation per statistic, the previous implementation), and sketch mode; wall time
  including the history write;
- **stats_marginal**: what exact statistics would add to a run that has already read the interval and
  routed it by key, as the engine's interval run does (the kernel job over a cached routed frame,
  assembly, history write; the read and route are not timed): the cost if the pass ran inside the
  engine's run instead of as a separate job.

Two situations:

- **cold** (what the DAG pays: each task is a fresh ``spark-submit``): ``python -m mjoin run`` and
  ``python -m mjoin stats`` as subprocesses, wall time of the whole process (interpreter, JVM start,
  Python workers) and the time each reports for itself;
- **connect** (what a DAG run pays with ``MJOIN_SPARK_REMOTE`` set): ``python -m mjoin stats`` as a fresh
  Python process (no JVM of its own) against a Spark Connect server started once by this script
  (``mjoin.runtime.connect_server``, local[2], 4 shuffle partitions, like the warm session), ``--rounds``
  rounds, the first discarded (the server's first job starts its Python workers), medians reported;
- **warm** (a long-lived session): all runs in one SparkSession, ``--rounds`` rounds in a fresh
  random order each, the first round discarded (JVM and Python workers warm up), medians reported.

``stats_over_engine`` = stats wall / engine wall for each. The load average is recorded with every
measurement: on a shared machine the numbers are noisy; re-run on a quiet machine for the record.

Writes bench/stats/results/cost[-quick].json and .png.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(PROJECT / "include"))

from _common import land_tpcds_replay, machine_info, spark_session, write_json  # noqa: E402

QUERY = "tpcds_returns_by_address"
RATES = {0.1: 50.0, 1.0: 500.0}  # rows/s: 20 minutes of replay at both sizes
ENGINE_CYCLE = 60
STREAM_TRIGGER = 10  # seconds: mjoin_join_job's default processingTime trigger
STATS_CYCLE = 10
WARMUP = 300  # the seed query's window: the interval starts once every window is full


def band_join_seconds(spark, query, lake, start, end) -> float:
    """Edge counts the direct way: per edge, a band join of l's (key, ts) groups with r's."""
    from pyspark.sql import functions as F

    from mjoin.stats.sources import US, Grid, load_streams

    grid = Grid(int(start) * US, int(end) * US, STATS_CYCLE * US)
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


def stats_marginal(spark, query, lake, start, end, out) -> dict:
    """What the exact statistics would add to a run that has already read the interval and routed it by
    key (the engine's interval run does: its prepare step reads, validates and routes every row by
    (class, key bucket) and caches it): the one-pass kernel job over a cached routed frame, the
    assembly and the history write. The read and route are done first and not timed."""
    from pyspark import StorageLevel

    from mjoin.stats import exact, history
    from mjoin.stats.job import StatsConfig, _assemble, make_grid
    from mjoin.stats.sources import load_streams

    config = StatsConfig()
    grid = make_grid(start, end, STATS_CYCLE)
    classes = list(query.attribute_classes)
    stream_classes = [[classes.index(c) for c in query.classes_of(s)] for s in query.stream_names]
    members = {ci: [sid for sid, cs in enumerate(stream_classes) if ci in cs] for ci in range(len(classes))}
    windows = [exact.micros(s.window) for s in query.streams]
    base, _ = load_streams(spark, query, lake, grid, None)
    routed = exact.route(base, stream_classes, config.histogram_buckets,
                         int(spark.conf.get("spark.sql.shuffle.partitions"))).persist(StorageLevel.MEMORY_AND_DISK)
    routed.count()
    t = time.perf_counter()
    res = exact.run_partials(routed, exact.kernel_params(grid, windows, stream_classes, members,
                                                         config.histogram_buckets))
    t_job = time.perf_counter() - t
    run = _assemble(query, grid, config, res["counts"], res["window_tuples"], res["kappa"], res["edges"],
                    res["histogram"], stream_classes, classes)
    history.write_cycles(out, query.name, [grid.start_epoch(j) for j in range(grid.n)], run.rows, run.cycle_meta,
                         run.histogram)
    wall = time.perf_counter() - t
    routed.unpersist()
    return {"wall_seconds": wall, "phases": {"kernel_job": res["seconds"]["spark_job"], "reduce": res["seconds"]["reduce"],
                                             "assemble_and_write": wall - t_job}}


def _load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def _cli(args: list[str], extra_env: dict | None = None) -> dict:
    """Run ``python -m mjoin ARGS --json`` in a fresh process; its wall time and its own summary."""
    env = dict(os.environ, PYTHONPATH=str(PROJECT / "include"), **(extra_env or {}))
    load = _load()
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mjoin", *args, "--json"], capture_output=True, text=True, env=env,
                          cwd=str(PROJECT))
    wall = time.perf_counter() - t
    if proc.returncode:
        raise RuntimeError(f"mjoin {args[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = proc.stdout
    summary = json.loads(out[out.index("{"):])
    return {"process_seconds": wall, "summary": summary, "load_average": load}


def cold(lake, work: Path, start: int, end: int) -> dict:
    common = ["--query", QUERY, "--lake", lake.root, "--from", str(start), "--to", str(end)]
    eng = _cli(["run", *common, "--cycle", str(ENGINE_CYCLE), "--out", str(work / "cold-engine")])
    st = _cli(["stats", *common, "--cycle", str(STATS_CYCLE), "--out", str(work / "cold-stats"), "--plan", "none"])
    return {
        "engine": {"process_seconds": eng["process_seconds"], "wall_seconds": eng["summary"]["wall_seconds"],
                   "batch_seconds": eng["summary"]["batch_seconds"], "result_rows": eng["summary"]["result_rows"],
                   "load_average": eng["load_average"]},
        "stats_pass": {"process_seconds": st["process_seconds"], "wall_seconds": st["summary"]["wall_seconds"]["total"],
                       "phases": st["summary"]["wall_seconds"], "load_average": st["load_average"],
                       "kernel": st["summary"].get("kernel")},
    }


def connect_runs(url: str, lake, work: Path, start: int, end: int, rounds: int) -> dict:
    """``python -m mjoin stats`` in fresh processes against the Spark Connect server ``url`` (a DAG run's cost)."""
    runs = []
    for r in range(rounds):
        args = ["stats", "--query", QUERY, "--lake", lake.root, "--from", str(start), "--to", str(end), "--cycle",
                str(STATS_CYCLE), "--out", str(work / f"connect-{r}"), "--plan", "none"]
        rec = _cli(args, {"MJOIN_SPARK_REMOTE": url, "MJOIN_SHUFFLE_PARTITIONS": "4"})
        s = rec["summary"]
        assert s["spark"]["session"] == "connect", s["spark"]
        runs.append({"round": r, "process_seconds": rec["process_seconds"], "wall_seconds": s["wall_seconds"]["total"],
                     "phases": s["wall_seconds"], "load_average": rec["load_average"], "kernel": s.get("kernel")})
        print(f"  round {r} stats over Spark Connect: process {rec['process_seconds']:.2f}s, "
              f"self-reported {s['wall_seconds']['total']:.2f}s", flush=True)
    measured = runs[1:] or runs
    return {"runs": runs, "median_process_seconds": statistics.median(x["process_seconds"] for x in measured),
            "median_wall_seconds": statistics.median(x["wall_seconds"] for x in measured)}


def warm(spark, query, lake, work: Path, start: int, end: int, rounds: int, kinds: list[str], seed: int) -> dict:
    from mjoin.engine.runs import run_interval
    from mjoin.stats.sketch import SketchConfig
    from mjoin.stats.job import StatsConfig, run_statistics

    def one(kind, r):
        load = _load()
        t = time.perf_counter()
        if kind in ("engine", "engine_streaming"):
            # engine: the pipelined interval run (60-s batches, one Spark job per stage for the interval);
            # engine_streaming: what the continuous job spends, one Spark job per 10-s micro-batch
            # (the join-job DAG's default trigger), the streaming job's per-batch code path
            streaming = kind == "engine_streaming"
            s = run_interval(spark, query, None, lake, start, end, STREAM_TRIGGER if streaming else ENGINE_CYCLE,
                             str(work / f"{kind}-{r}"), pipelined=not streaming)
            return {"wall_seconds": s.wall_seconds, "call_seconds": time.perf_counter() - t,
                    "batch_seconds": s.batch_seconds, "prepare_seconds": s.prepare_seconds,
                    "warmup_seconds": s.warmup_seconds, "batches": s.batches, "result_rows": s.result_rows,
                    "rows_in": sum(s.rows_in.values()), "load_average": load}
        if kind == "stats_marginal":
            rec = stats_marginal(spark, query, lake, start, end, str(work / f"{kind}-{r}"))
            rec["load_average"] = load
            return rec
        cfg = {"stats_pass": StatsConfig(method="pass"),  # the default: the kernel on the driver at these sizes
               "stats_pass_executors": StatsConfig(method="pass", driver_rows=0),  # the kernel in Spark tasks
               "stats_sql": StatsConfig(method="sql"),
               "stats_sketch": StatsConfig(mode="sketch", sketch=SketchConfig())}[kind]
        run = run_statistics(spark, query, lake, start, end, STATS_CYCLE, out=str(work / f"{kind}-{r}"), config=cfg)
        s = run.summary
        return {"wall_seconds": time.perf_counter() - t, "phases": s["wall_seconds"], "cycles": s["cycles"],
                "tuples": sum(v["tuples"] for v in s["streams"].values()),
                "rows_read": sum(v["rows_read"] for v in s["streams"].values()), "load_average": load,
                "kernel": s.get("kernel")}

    rng = random.Random(seed)
    runs = []
    for r in range(rounds):
        order = list(kinds)
        rng.shuffle(order)
        for kind in order:
            rec = one(kind, r)
            rec.update({"kind": kind, "round": r})
            runs.append(rec)
            print(f"  round {r} {kind}: {rec['wall_seconds']:.2f}s (load {rec['load_average'][0]})", flush=True)
    measured = [x for x in runs if x["round"] > 0] or runs
    median = {k: statistics.median(x["wall_seconds"] for x in measured if x["kind"] == k) for k in kinds}
    median_batches = statistics.median(x["batch_seconds"] for x in measured if x["kind"] == "engine")
    return {"runs": runs, "median_wall_seconds": median, "median_engine_batch_seconds": median_batches}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sf 0.1 only, warm only, 2 rounds (one measured)")
    ap.add_argument("--sizes", default="0.1,1", help="TPC-DS scale factors (default 0.1,1)")
    ap.add_argument("--rounds", type=int, default=3, help="warm rounds; the first is discarded (default 3)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold (fresh process) runs")
    ap.add_argument("--no-connect", action="store_true", help="skip the runs over a Spark Connect server")
    ap.add_argument("--no-sketch", action="store_true", help="skip sketch mode in the warm rounds")
    ap.add_argument("--no-streaming", action="store_true",
                    help="skip the engine as the continuous job runs it (one Spark job per 10-s micro-batch)")
    ap.add_argument("--band-join", action="store_true", help="also time the band-join alternative for the edges")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--plot-only", action="store_true", help="redraw the plot of the committed result JSON")
    args = ap.parse_args(argv)
    if args.plot_only:
        name = "cost-quick" if args.quick else "cost"
        _plot(json.loads((Path(args.out) / f"{name}.json").read_text()), Path(args.out) / f"{name}.png")
        return 0
    if args.quick:
        args.sizes, args.rounds, args.no_cold = "0.1", 2, True

    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query

    query = load_query(QUERY)
    kinds = (["engine"] + ([] if args.no_streaming else ["engine_streaming"]) + ["stats_pass", "stats_pass_executors", "stats_marginal", "stats_sql"]
             + ([] if args.no_sketch else ["stats_sketch"]))
    doc = {"benchmark": "stats-cost", "machine": machine_info(), "command": " ".join([Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
           "parameters": {"query": QUERY, "workload": "tpcds replay, 20 minutes", "engine_cycle": ENGINE_CYCLE,
                          "engine": "mjoin, spec order, EngineConfig() defaults", "stats_cycle": STATS_CYCLE,
                          "rounds": args.rounds, "spark": "warm: local[2], 4 shuffle partitions; cold: the CLIs' "
                                                          "defaults (local[*], 2 x cores shuffle partitions)"},
           "goal": "statistics <= 5% of the engine's time on the same interval", "sizes": {}}
    spark = None
    server = None
    if not args.no_connect:
        from mjoin.runtime import connect_server
        from mjoin.runtime.resources import Resources

        server_dir = Path(tempfile.mkdtemp(prefix="mjoin-bench-connect-"))
        server = connect_server.start(server_dir, 0,
                                      Resources(spark_master="local[2]", shuffle_partitions=4), driver_memory="4g")
        print(f"Spark Connect server {server['url']} (pid {server['pid']})", flush=True)
    for sf in [float(x) for x in args.sizes.split(",")]:
        rate = RATES.get(sf, 500.0 * sf)
        work = Path(tempfile.mkdtemp(prefix=f"mjoin-bench-stats-{sf}-"))
        lake = Lake(str(work / "lake"))
        t0, t1, counts = land_tpcds_replay(lake, sf, rate)
        start = t0 + WARMUP
        end = start + (t1 - start) // ENGINE_CYCLE * ENGINE_CYCLE
        print(f"sf {sf}: {sum(counts.values())} rows at {rate:g}/s, interval {end - start} s", flush=True)
        size = {"sf": sf, "rate": rate, "interval": [start, end], "interval_seconds": end - start,
                "landed_rows": counts}
        if not args.no_cold:
            size["cold"] = cold(lake, work, start, end)
            c = size["cold"]
            c["stats_over_engine"] = {"process": c["stats_pass"]["process_seconds"] / c["engine"]["process_seconds"],
                                      "self_reported": c["stats_pass"]["wall_seconds"] / c["engine"]["wall_seconds"]}
            print(f"  cold: engine {c['engine']['process_seconds']:.1f}s, stats {c['stats_pass']['process_seconds']:.1f}s",
                  flush=True)
        if server is not None:
            size["connect"] = connect_runs(server["url"], lake, work, start, end, max(2, args.rounds))
        if spark is None:
            spark = spark_session()
        size["warm"] = warm(spark, query, lake, work, start, end, args.rounds, kinds, args.seed)
        med = size["warm"]["median_wall_seconds"]
        stats_kinds = [k for k in med if k.startswith("stats_")]
        size["warm"]["stats_over_engine"] = {k: med[k] / med["engine"] for k in stats_kinds}
        if "engine_streaming" in med:
            size["warm"]["stats_over_engine_streaming"] = {k: med[k] / med["engine_streaming"] for k in stats_kinds}
        if "connect" in size:
            c = size["connect"]
            c["stats_over_engine"] = {"process": c["median_process_seconds"] / med["engine"],
                                      "self_reported": c["median_wall_seconds"] / med["engine"]}
            if "engine_streaming" in med:
                c["stats_over_engine_streaming"] = {"process": c["median_process_seconds"] / med["engine_streaming"],
                                                    "self_reported": c["median_wall_seconds"] / med["engine_streaming"]}
        size["warm"]["stats_over_engine_batches"] = {k: v / size["warm"]["median_engine_batch_seconds"]
                                                     for k, v in med.items() if k.startswith("stats_")}
        if args.band_join:
            size["band_join_seconds"] = band_join_seconds(spark, query, lake, start, end)
        doc["sizes"][str(sf)] = size
        print(f"  warm medians: {json.dumps({k: round(v, 2) for k, v in med.items()})}", flush=True)
    if server is not None:
        connect_server.stop(server_dir)
    doc["load_average_end"] = _load()
    name = "cost-quick" if args.quick else "cost"
    write_json(Path(args.out) / f"{name}.json", doc)
    _plot(doc, Path(args.out) / f"{name}.png")
    return 0


def _plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(doc["sizes"].values())
    fig, axes = plt.subplots(1, len(sizes), figsize=(7.5 * len(sizes), 4.8), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        med = size["warm"]["median_wall_seconds"]
        eng = [k for k in ("engine", "engine_streaming") if k in med]
        stats_kinds = [k for k in med if k.startswith("stats_")]
        labels = (["engine\n(interval)", "engine\n(batches)"] + (["engine\n(streaming)"] if "engine_streaming" in med else [])
                  + [k.replace("stats_", "stats\n").replace("_", "\n") for k in stats_kinds])
        vals = ([med["engine"], size["warm"]["median_engine_batch_seconds"]] + [med[k] for k in eng[1:]]
                + [med[k] for k in stats_kinds])
        colors = ["C2"] * (len(eng) + 1) + ["C0", "C6", "C9", "C1", "C4"][:len(stats_kinds)]
        bars = ax.bar(labels, vals, color=colors, alpha=0.85, label="warm (median)")
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        ax.axhline(0.05 * med["engine"], color="k", ls="--", lw=1, label="5% of the engine (warm)")
        if "engine_streaming" in med:
            ax.axhline(0.05 * med["engine_streaming"], color="C3", ls=":", lw=1, label="5% of the engine, streaming")
        if "cold" in size:
            c = size["cold"]
            xs = [0, labels.index("stats\npass")]
            ax.scatter(xs, [c["engine"]["process_seconds"], c["stats_pass"]["process_seconds"]], marker="v",
                       color="k", zorder=3, label="cold: whole process")
            ax.scatter(xs, [c["engine"]["wall_seconds"], c["stats_pass"]["wall_seconds"]], marker="x",
                       color="k", zorder=3, label="cold: self-reported")
        if "connect" in size:
            c = size["connect"]
            x = len(labels)
            ax.bar([x], [c["median_process_seconds"]], color="C5", alpha=0.85)
            ax.text(x, c["median_process_seconds"], f"{c['median_process_seconds']:.1f}", ha="center", va="bottom",
                    fontsize=8)
            ax.set_xticks(list(range(len(labels) + 1)), labels + ["stats over\nConnect\n(DAG run)"])
        ratio = size["warm"]["stats_over_engine"]["stats_pass"]
        streaming = size["warm"].get("stats_over_engine_streaming", {}).get("stats_pass")
        extra = f", / streaming engine = {streaming:.1%}" if streaming is not None else ""
        if "connect" in size and "stats_over_engine_streaming" in size["connect"]:
            ratios = size["connect"]["stats_over_engine_streaming"]
            extra += (f"\nDAG run over Spark Connect / streaming engine = {ratios['self_reported']:.1%} "
                      f"self-reported, {ratios['process']:.1%} whole process")
        ax.set_title(f"TPC-DS sf {size['sf']:g}, {size['interval_seconds']} s interval, "
                     f"{sum(size['landed_rows'].values())} rows\nstats (pass) / engine interval run = {ratio:.0%} warm"
                     f"{extra}", fontsize=9)
        ax.set_ylabel("seconds")
        ax.tick_params(axis="x", labelsize=7)
        ax.legend(fontsize=7)
    fig.suptitle(f"statistics job vs join engine, same interval (load average {doc['machine']['load_average'][0]:.1f} "
                 f"at start, {doc['machine']['cpus']} cores)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
