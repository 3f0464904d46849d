"""Benchmark: the engine's cost curve from TPC-DS sf 0.1 to sf 30 (the engine-throughput goals), beside Spark's own chained
joins (``--engine spark-native``) and a one-shot DuckDB query of the same semantics, in one run per size.

    python bench/scale/bench_scale.py --sf 1            # one size: both densities, 3 rounds
    python bench/scale/bench_scale.py --sf 0.1 1 10     # several sizes (one JSON each)
    python bench/scale/bench_scale.py --plot            # only redraw the plot from the JSONs present
    flock /tmp/mjoin-bench.lock nice -n 5 .venv/bin/python bench/scale/bench_scale.py --sf 10   # big sizes

Per size, two densities of the same tables (the seed query's windows are 5 minutes):

- **dense**: the replay lasts 300 s, so a window holds (nearly) all of the data;
- **sparse**: the replay lasts 1800 s, so a window holds about a sixth of it.

Per (size, density), rounds in shuffled order (medians and spread): the interval run of the engine
(``run_interval``, one plan, 30-s cycles, 16 buckets, ``local[2]``, on the Spark path: ``driver_rows=0``), spark-native over the same interval
(up to ``--native-max-sf``, ``--native-rounds`` rounds (1: it is 10-50x slower), and only while a run
finishes within ``--native-timeout``), and DuckDB
(``COPY (<the tests' reference query>) TO parquet``: ``tests/engine_helpers.reference_sql``, the
textbook window semantics ``max(ts) - ts_i < W_i``, 2 threads). Every result is checked: row count and
an order-independent fingerprint over all output columns (``mjoin.engine.results``), equal for all.

Recorded per run: wall time, the engine's phases (contract checks on the driver, the input stage, the
operator stage, the commit; from ``execution.spark_stages``), rows/s and seconds per million input
tuples, peak RSS of the driver's Python process (DuckDB runs in it), of the JVM (driver = executor in
local mode) and of the Python workers together (the operator runs there), the state's size on disk, the
result rows. Writes ``bench/scale/results/scale-sf<sf>.json`` (machine, load before/after, versions, git
commit, parameters) and redraws ``bench/scale/results/scale.png`` from every JSON there.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))
sys.path.insert(0, str(PROJECT / "tests"))  # the DuckDB reference of the window semantics (engine_helpers)
QUERY = "tpcds_returns_by_address"
DENSITIES = {"dense": 300, "sparse": 1800}  # replay length in seconds (windows: 5 minutes)
CYCLE = 30
WARM: list = []  # the session has run once (warm-up done)


def versions() -> dict:
    import duckdb
    import numpy
    import pyarrow
    import pyspark

    return {"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__, "duckdb": duckdb.__version__,
            "numpy": numpy.__version__, "python": sys.version.split()[0]}


class PeakRSS:
    """Peak resident memory while a run lasts, sampled every ``every`` seconds: this Python process (the
    driver; DuckDB runs in it), the JVMs it started (local mode: driver and executor in one) and their
    Python workers together (where the operator runs)."""

    def __init__(self, every: float = 0.2):
        self.every = every
        self.peak = {"driver_python": 0, "jvm": 0, "python_workers": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        now = {"driver_python": me.memory_info().rss, "jvm": 0, "python_workers": 0}
        for child in me.children(recursive=True):
            try:
                name = child.name()
                rss = child.memory_info().rss
            except psutil.Error:
                continue
            if name.startswith("java"):
                now["jvm"] += rss
            elif name.startswith("python"):
                now["python_workers"] += rss
        for k, v in now.items():
            self.peak[k] = max(self.peak[k], v)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()
        return False

    def mb(self) -> dict:
        return {k: round(v / 2**20, 1) for k, v in self.peak.items()}


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def workload(sf: float, density: str, work: Path) -> tuple[Path, object]:
    """The replay of ``sf`` lasting the density's length, landed (whole) into ``work``."""
    from mjoin.workloads.tpcds_replay import generate_tpcds
    from mjoin.workloads.lander import land
    from mjoin.workloads.manifest import load_manifest

    wl, landed = work / f"wl-{sf:g}-{density}", work / f"landed-{sf:g}-{density}"
    if not (landed / "streams").exists():
        generate_tpcds(str(wl), sf=sf, duration=DENSITIES[density], cycle="10s", overwrite=True)
        land(str(wl), str(landed), None)
        shutil.rmtree(wl / "streams", ignore_errors=True)  # the landed copy is what the runs read
    return landed, load_manifest(str(wl))


def drop_null_keys(landed: Path) -> dict:
    """Rewrite the landed files of the query's streams without their rows with a NULL join key (TPC-DS's returns
    have 1-4% of them in every file, so every file of the benchmark can reject a row): a lake where no row can be
    rejected, for ``ab_input.py --no-null-keys``. Once per folder (a marker file). Returns source -> rows dropped."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query

    marker = landed / "no-null-keys.json"
    if marker.exists():
        return json.loads(marker.read_text())
    lake, dropped = Lake(str(landed)), {}
    for s in load_query(QUERY).streams:
        for path in lake.stream_files(s.source):
            t = pq.read_table(path)
            keep = pc.and_(*[t.column(k).is_valid() for k in s.keys]) if len(s.keys) > 1 else t.column(s.keys[0]).is_valid()
            if pc.all(keep).as_py():
                continue
            kept = t.filter(keep)
            dropped[s.source] = dropped.get(s.source, 0) + t.num_rows - kept.num_rows
            pq.write_table(kept, path)
    marker.write_text(json.dumps(dropped))
    return dropped


def engine_config(path: str = "spark"):
    """The engine's configuration per path: ``spark`` (``driver_rows=0``: every interval as Spark jobs, what the
    issue's goals were set on), ``default`` (the engine's default: an interval of at most
    ``interval_driver_rows`` rows runs on the driver) or ``driver`` (on the driver whatever its size)."""
    from mjoin.engine.config import EngineConfig

    return {"spark": EngineConfig(buckets=16, driver_rows=0), "default": EngineConfig(buckets=16),
            "driver": EngineConfig(buckets=16, interval_driver_rows=10**9, driver_rows=10**9)}[path]


def run_mjoin(spark, landed: Path, out: Path, span, config=None) -> dict:
    """The engine over the interval with ``config`` (:func:`engine_config`; default: the Spark path). On the
    driver its input and operator phases are ``input_driver`` and ``operator_driver``."""
    from mjoin.engine.results import result_fingerprint
    from mjoin.engine.runs import run_interval

    config = config or engine_config("spark")
    shutil.rmtree(out, ignore_errors=True)
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        s = run_interval(spark, QUERY, None, str(landed), span[0], span[1], CYCLE, str(out), config=config)
        wall = time.perf_counter() - t0
    stages = s.extra["phases"]["spark_stages"]
    ph = s.extra["phases"]
    phases = {"contract_checks_driver": ph["contract_checks_driver"],
              "input_stage": sum(x["wall_seconds"] or 0 for x in stages if x["kind"] == "input") + ph.get("input_driver", 0.0),
              "operator_stages": sum(x["wall_seconds"] or 0 for x in stages if x["kind"] == "operator")
              + ph.get("operator_driver", 0.0)}
    phases["rest"] = wall - sum(phases.values())  # planning, job start, commit, metrics
    rows_in = sum(s.rows_in.values()) + sum(sum(v.values()) for v in s.quarantined.values())
    doc = {"engine": "mjoin", "wall_seconds": wall, "phases": phases,
           "input_share": (phases["contract_checks_driver"] + phases["input_stage"]) / wall,
           "prepare_seconds": s.prepare_seconds,
           "spark_stages": stages, "rows_in": rows_in, "result_rows": s.result_rows,
           "peak_rss_mb": mem.mb(), "state_bytes": du(out / "state"), "results_bytes": du(out / "results"),
           "batches": s.batches, "execution": s.extra.get("execution")}
    doc["tasks"] = {f"{kind}_{k}": sum(x[k] for x in stages if x["kind"] == kind)
                    for kind in ("input", "operator") for k in ("task_seconds", "task_cpu_seconds")}
    doc["fingerprint"] = result_fingerprint(str(out), QUERY)
    return doc


def run_native(spark, landed: Path, out: Path, span, timeout: float) -> dict:
    """spark-native over the interval; cancelled (``finished: False``) when it runs past ``timeout``."""
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.results import result_fingerprint
    from mjoin.engine.runs import run_interval

    shutil.rmtree(out, ignore_errors=True)
    sc = spark.sparkContext
    timer = threading.Timer(timeout, sc.cancelAllJobs)
    timer.start()
    try:
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            s = run_interval(spark, QUERY, None, str(landed), span[0], span[1], CYCLE, str(out), engine="spark-native",
                             config=EngineConfig(buckets=16, driver_rows=0))
            wall = time.perf_counter() - t0
    except Exception as exc:  # cancelled at the timeout (or failed): recorded, not fatal
        return {"engine": "spark-native", "finished": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                "timeout_seconds": timeout}
    finally:
        timer.cancel()
    return {"engine": "spark-native", "finished": True, "wall_seconds": wall, "result_rows": s.result_rows,
            "peak_rss_mb": mem.mb(), "fingerprint": result_fingerprint(str(out), QUERY)}


def duckdb_connect(spill: Path):
    """A DuckDB connection as the benchmarks run the reference: 2 threads (the machine's cores), 8 GB, spilling to
    ``spill``, no extension installed or loaded behind our back."""
    import duckdb

    return duckdb.connect(config={"threads": 2, "memory_limit": "8GB", "temp_directory": str(spill),
                                  "autoinstall_known_extensions": False, "autoload_known_extensions": False})


def duckdb_copy(landed: Path, span, target: Path, spill: Path) -> float:
    """The tests' reference query (engine_helpers.reference_sql) over the landed files, its results written to
    ``target`` as Parquet (zstd) in one DuckDB query; its wall seconds."""
    from engine_helpers import reference_sql
    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query

    sql = reference_sql(load_query(QUERY), Lake(str(landed)), span[0] * 1_000_000, span[1] * 1_000_000)
    con = duckdb_connect(spill)
    try:
        t0 = time.perf_counter()
        con.execute(f"COPY ({sql}) TO '{target}' (FORMAT parquet, COMPRESSION zstd)")
        return time.perf_counter() - t0
    finally:
        con.close()


def run_duckdb(landed: Path, out: Path, span, spill: Path) -> dict:
    """:func:`duckdb_copy` into ``out``, its rows fingerprinted as the engine's (then removed)."""
    import pyarrow.parquet as pq

    from mjoin.engine.compiled import EngineQuery
    from mjoin.engine.frame import arrow_result_schema
    from mjoin.engine.results import fingerprint_tables
    from mjoin.model.query import load_query

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    target = out / "results.parquet"
    with PeakRSS() as mem:
        wall = duckdb_copy(landed, span, target, spill)
    schema = arrow_result_schema(EngineQuery.from_query(load_query(QUERY)))
    pf = pq.ParquetFile(target)
    fp = fingerprint_tables(b.cast(schema) for b in
                            (__import__("pyarrow").Table.from_batches([rb]) for rb in pf.iter_batches(1 << 20)))
    target.unlink()
    return {"engine": "duckdb", "wall_seconds": wall, "result_rows": fp["rows"], "peak_rss_mb": mem.mb(),
            "fingerprint": fp}


def median_spread(xs: list) -> dict:
    xs = [x for x in xs if x is not None]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else None


def one_size(spark, sf: float, rounds: int, work: Path, native_max_sf: float, native_timeout: float,
             native_rounds: int = 1, densities=tuple(DENSITIES), default_max_sf: float = 1.0) -> dict:
    from mjoin.engine.metrics import git_commit, machine

    load_before = os.getloadavg()
    out = {"benchmark": "scale", "sf": sf, "machine": machine(), "load_before": load_before,
           "git_commit": git_commit(PROJECT), "versions": versions(), "densities": {},
           # the contract's footer cache (a re-run in one process reads no footer again): "0" = off, every run
           # pays a first run's footer reads
           "footers_cache": os.environ.get("MJOIN_FOOTERS_CACHE", "on")}
    for density in densities:
        landed, man = workload(sf, density, work)
        span = (man.start_epoch, man.end_epoch + 60)
        files = sum(1 for _ in (landed / "streams").rglob("*.parquet"))
        kinds = ["mjoin", "duckdb"] + (["native"] if sf <= native_max_sf else []) + \
            (["mjoin-default"] if sf <= default_max_sf else [])
        runs = {k: [] for k in kinds}
        if not WARM:  # warm-up (JVM JIT, Python workers), once per process, not measured
            run_mjoin(spark, landed, work / "out-warm", span)
            shutil.rmtree(work / "out-warm", ignore_errors=True)
            WARM.append(True)
        for r in range(rounds):
            order = list(kinds)
            random.Random(r).shuffle(order)
            for k in order:
                if k in ("mjoin", "mjoin-default"):
                    res = run_mjoin(spark, landed, work / f"out-{k}", span,
                                    engine_config("default" if k == "mjoin-default" else "spark"))
                elif k == "duckdb":
                    res = run_duckdb(landed, work / "out-duckdb", span, work / "spill")
                else:
                    if len(runs["native"]) >= native_rounds or (runs["native"] and not runs["native"][-1].get("finished")):
                        continue  # enough rounds, or it did not finish once: not again
                    res = run_native(spark, landed, work / "out-native", span, native_timeout)
                res["round"], res["load"] = r, os.getloadavg()[0]
                runs[k].append(res)
                print(f"sf {sf:g} {density} round {r} {k}: {res.get('wall_seconds', float('nan')):.2f}s "
                      f"{res.get('result_rows')} rows (load {res['load']:.1f})", flush=True)
        ref = runs["mjoin"][0]["fingerprint"]
        done = [x for v in runs.values() for x in v if x.get("finished", True)]
        identical = all(x["fingerprint"] == ref for x in done)
        m = runs["mjoin"]
        rows_in = m[0]["rows_in"]
        summary = {k: median_spread([x.get("wall_seconds") for x in v if x.get("finished", True)]) for k, v in runs.items()}
        per_m = {k: (v["median"] / rows_in * 1e6 if v else None) for k, v in summary.items()}
        phases = {p: statistics.median(x["phases"][p] for x in m) for p in m[0]["phases"]}
        doc = {"replay_seconds": DENSITIES[density], "span": span, "files": files, "rows_in": rows_in,
               "result_rows": m[0]["result_rows"], "identical_results": identical, "fingerprint": ref,
               "wall": summary, "seconds_per_million_tuples": per_m,
               # per million tuples in and out: the dense and the sparse replays' results grow faster than their
               # input with the size (sf 1 -> 10: 9x the tuples, 40x the results), and every system writes them
               "seconds_per_million_in_out": per_million_in_out(summary, rows_in, m[0]["result_rows"]),
               "rows_per_second": {k: (rows_in / v["median"] if v else None) for k, v in summary.items()},
               "mjoin_phases_median": phases,
               "mjoin_input_share_median": statistics.median(x["input_share"] for x in m),
               # the engine's default path (on the driver up to driver_rows rows): its phases and input share
               **({"mjoin_default_execution": runs["mjoin-default"][0]["execution"],
                   "mjoin_default_phases_median": {p: statistics.median(x["phases"][p] for x in runs["mjoin-default"])
                                                   for p in runs["mjoin-default"][0]["phases"]},
                   "mjoin_default_input_share_median": statistics.median(x["input_share"]
                                                                         for x in runs["mjoin-default"])}
                  if runs.get("mjoin-default") else {}),
               "peak_rss_mb_max": {k: {c: max(x["peak_rss_mb"][c] for x in v if "peak_rss_mb" in x) for c in
                                       ("driver_python", "jvm", "python_workers")} for k, v in runs.items()
                                   if any("peak_rss_mb" in x for x in v)},
               "state_bytes": m[0]["state_bytes"],
               "vs": {"duckdb_over_mjoin": summary["duckdb"]["median"] / summary["mjoin"]["median"],
                      "native_over_mjoin": (summary["native"]["median"] / summary["mjoin"]["median"]
                                            if summary.get("native") else None),
                      **({"duckdb_over_mjoin_default": summary["duckdb"]["median"] / summary["mjoin-default"]["median"],
                          "native_over_mjoin_default": (summary["native"]["median"] / summary["mjoin-default"]["median"]
                                                        if summary.get("native") else None)}
                         if summary.get("mjoin-default") else {})},
               "runs": runs}
        out["densities"][density] = doc
        print(json.dumps({k: doc[k] for k in ("rows_in", "result_rows", "identical_results", "wall",
                                              "seconds_per_million_tuples", "mjoin_phases_median",
                                              "mjoin_input_share_median", "peak_rss_mb_max", "vs")},
                         indent=1, default=str), flush=True)
        shutil.rmtree(landed, ignore_errors=True)
    out["load_after"] = os.getloadavg()
    out["parameters"] = {"query": QUERY, "rounds": rounds, "cycle_seconds": CYCLE, "buckets": 16,
                         "local": "local[2]", "shuffle_partitions": 4, "densities": DENSITIES,
                         "native_max_sf": native_max_sf, "native_timeout_seconds": native_timeout,
                         "native_rounds": native_rounds,
                         "duckdb": {"threads": 2, "memory_limit": "8GB"}}
    return out


def per_million_in_out(wall: dict, rows_in: int, result_rows: int) -> dict:
    """System -> median wall seconds per million tuples read plus result rows written."""
    return {k: (v["median"] / (rows_in + result_rows) * 1e6 if v else None) for k, v in wall.items()}


def plot(results_dir: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = sorted((json.loads(p.read_text()) for p in results_dir.glob("scale-sf*.json")), key=lambda d: d["sf"])
    if not docs:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    styles = {"mjoin": "-o", "mjoin-default": "-.D", "duckdb": "--s", "native": ":^"}
    for ax, per, ylabel in ((axes[0], "input", "wall seconds per million input tuples (median)"),
                            (axes[1], "in_out", "wall seconds per million input tuples + result rows")):
        for density, color in (("dense", "#c44"), ("sparse", "#27a")):
            for kind, style in styles.items():
                pts = []
                for d in docs:
                    doc = d["densities"].get(density)
                    if doc is None:
                        continue
                    y = (doc["seconds_per_million_tuples"].get(kind) if per == "input" else
                         per_million_in_out(doc["wall"], doc["rows_in"], doc["result_rows"]).get(kind))
                    if y is not None:
                        pts.append((d["sf"], y))
                if pts:
                    name = {"mjoin": "mjoin (Spark path)", "mjoin-default": "mjoin (default: driver up to 1 M rows)"}.get(kind, kind)
                    ax.plot(*zip(*pts), style, color=color, label=f"{name}, {density}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("TPC-DS scale factor")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title("seed query, 5-min windows, 30-s cycles, local[2]")
    axes[1].set_title("the same per tuple read or written")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = results_dir / "scale.png"
    fig.savefig(path, dpi=120)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, nargs="*", default=[0.1, 1.0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--native-max-sf", type=float, default=1.0)
    ap.add_argument("--native-timeout", type=float, default=600.0)
    ap.add_argument("--native-rounds", type=int, default=1, help="spark-native is 10-50x slower: 1 round by default")
    ap.add_argument("--densities", nargs="*", default=list(DENSITIES), choices=list(DENSITIES))
    ap.add_argument("--default-max-sf", type=float, default=1.0,
                    help="also run the engine's default path (on the driver up to driver_rows rows) up to this size")
    ap.add_argument("--work", default=None, help="scratch folder (default: a new one under /tmp)")
    ap.add_argument("--plot", action="store_true", help="only redraw the plot")
    args = ap.parse_args(argv)
    results = HERE / "results"
    results.mkdir(parents=True, exist_ok=True)
    if args.plot:
        print(plot(results))
        return 0
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    work = Path(args.work) if args.work else Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-scale-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    spark = get_spark("bench-scale", Resources(spark_master="local[2]", shuffle_partitions=4),
                      conf={"spark.driver.memory": "6g"})
    ok = True
    for sf in args.sf:
        doc = one_size(spark, sf, args.rounds, work, args.native_max_sf, args.native_timeout, args.native_rounds,
                       args.densities, args.default_max_sf)
        path = results / f"scale-sf{sf:g}.json"
        path.write_text(json.dumps(doc, indent=1, default=str))
        ok &= all(d["identical_results"] for d in doc["densities"].values())
        print(f"wrote {path}", flush=True)
    print(plot(results))
    spark.stop()
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
