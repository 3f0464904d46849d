"""Benchmark of the gates: what a gate costs, and why summaries are validated with pandas.

Measures (median of --repeat runs, seconds):
  1. great-expectations: import; ephemeral context made per validation vs reused;
     one suite on a pandas frame vs the same suite on a Spark frame of the same rows;
     one GX row condition vs a computed column (why the suites avoid row conditions);
  2. each gate end to end on synthetic good data (stats, forecast, plan, input);
  3. the input gate's scan: pyarrow with footer statistics, pyarrow reading the columns
     (files without statistics), and the Spark scan.

Writes bench/gates/results/gates[-quick].json (machine, versions, date, parameters,
timings) and a PNG plot next to it. Timings on a shared machine are noisy.

    python bench/gates/bench_gates.py --quick
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "include"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def timed(fn, repeat: int) -> float:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def gx_import_seconds() -> float:
    code = "import time; t=time.perf_counter(); import great_expectations; print(time.perf_counter()-t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def snapshot(query, cycle_start, seed):
    from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StreamStats

    rng = np.random.default_rng(seed)
    g = GroupStats()
    for i, s in enumerate(query.stream_names):
        w = float(1000 + 100 * i + rng.integers(0, 20))
        g.streams[s] = StreamStats(lam=w / 300, kappa=round(w * 0.4), window_tuples=w)
    for j, (l, r) in enumerate(query.directed_edges):
        g.edges[(l, r)] = EdgeStats(gamma=0.2 + 0.03 * j + 0.01 * rng.random(), mu=1.2 + 0.1 * j)
    return Statistics(query=query.name, groups={0: g}, kind="forecast", cycle_start=cycle_start, cycle_seconds=60.0)


def write_lake(root, query, files_per_stream: int, rows: int, statistics_: bool, t0: int):
    from mjoin.lake.layout import Lake

    lake = Lake(root)
    rng = np.random.default_rng(0)
    for k in range(files_per_stream):
        arrival = t0 + 60 * k
        for s in query.streams:
            cols = {}
            for c, t in s.columns.items():
                if t == "timestamp":
                    cols[c] = pa.array(((arrival + rng.uniform(0, 59, rows)) * 1e6).astype("int64"), pa.timestamp("us", tz="UTC"))
                else:
                    cols[c] = pa.array(rng.integers(1, 10_000, rows).astype("int64"))
            path = lake.stream_file(s.source, arrival, 0)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pq.write_table(pa.table(cols), path, write_statistics=statistics_)
    return lake


def bench_gx(repeat: int, rows: int, spark) -> dict:
    import great_expectations as gx

    from mjoin.gates.gxengine import expect, make_suite, run_suite, runner

    df = pd.DataFrame({"k": np.arange(rows, dtype="float64"), "x": np.random.default_rng(0).random(rows)})
    df["where"] = df.index.astype(str)
    df["row_id"] = df.index

    def suite():
        return make_suite("bench", [
            expect("ExpectColumnValuesToNotBeNull", "b.k_not_null", "", "{where}", column="k"),
            expect("ExpectColumnValuesToBeBetween", "b.x_unit", "", "{where}", column="x", min_value=0, max_value=1),
        ])

    out = {}
    runner()
    out["pandas_validation_reused_context"] = timed(lambda: run_suite(suite(), df, {}), repeat)

    from great_expectations.data_context.types.base import (DataContextConfig, InMemoryStoreBackendDefaults,
                                                            ProgressBarsConfig)

    def fresh():
        ctx = gx.get_context(mode="ephemeral", project_config=DataContextConfig(
            analytics_enabled=False, progress_bars=ProgressBarsConfig(globally=False),
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False)))
        ds = ctx.data_sources.add_pandas("p")
        bd = ds.add_dataframe_asset("a").add_batch_definition_whole_dataframe("w")
        s = ctx.suites.add(gx.ExpectationSuite(name="s", expectations=[
            gx.expectations.ExpectColumnValuesToNotBeNull(column="k"),
            gx.expectations.ExpectColumnValuesToBeBetween(column="x", min_value=0, max_value=1)]))
        vd = ctx.validation_definitions.add(gx.ValidationDefinition(name="v", data=bd, suite=s))
        vd.run(batch_parameters={"dataframe": df})
    out["pandas_validation_new_context"] = timed(fresh, repeat)

    from great_expectations.expectations.row_conditions import Column

    # 8 range rules restricted to half the rows: by a GX row condition, or by a column computed in pandas
    # (NaN outside the rows, which GX skips as missing): what the statistics suite needed
    half = df["k"] < rows / 2
    for i in range(8):
        df[f"x{i}"] = df["x"].where(half)

    def with_condition():
        run_suite(make_suite("bench_cond", [
            expect("ExpectColumnValuesToBeBetween", f"b.x{i}", "", "{where}", column="x", min_value=0, max_value=1,
                   row_condition=Column("k") < rows / 2) for i in range(8)]), df, {})

    def with_column():
        run_suite(make_suite("bench_col", [
            expect("ExpectColumnValuesToBeBetween", f"b.x{i}", "", "{where}", column=f"x{i}", min_value=0,
                   max_value=1) for i in range(8)]), df, {})
    out["pandas_8_rules_row_condition"] = timed(with_condition, repeat)
    out["pandas_8_rules_computed_columns"] = timed(with_column, repeat)

    if spark is not None:
        sdf = spark.createDataFrame(df[["k", "x"]])
        sdf.cache().count()
        ctx = runner().context
        sds = ctx.data_sources.add_or_update_spark("bench_spark")
        try:
            asset = sds.get_asset("a")
        except LookupError:
            asset = sds.add_dataframe_asset("a")
        bd = asset.add_batch_definition_whole_dataframe("w")
        s = ctx.suites.add_or_update(gx.ExpectationSuite(name="spark_suite", expectations=[
            gx.expectations.ExpectColumnValuesToNotBeNull(column="k"),
            gx.expectations.ExpectColumnValuesToBeBetween(column="x", min_value=0, max_value=1)]))
        vd = ctx.validation_definitions.add_or_update(gx.ValidationDefinition(name="spark_vd", data=bd, suite=s))
        out["spark_validation_same_rows"] = timed(lambda: vd.run(batch_parameters={"dataframe": sdf}), repeat)
    return out


def bench_gates(repeat: int, files: int, rows: int, spark) -> dict:
    from mjoin.gates.forecast import check_forecast
    from mjoin.gates.input import check_input
    from mjoin.gates.plan import check_plan
    from mjoin.gates.stats import check_statistics, history_from_statistics
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.model.query import load_query
    from mjoin.model.timeutil import iso

    q = load_query("tpcds_returns_by_address")
    t0 = 1767225600
    hist = history_from_statistics([snapshot(q, iso(t0 + 60 * k), k) for k in range(60)])
    fc = snapshot(q, iso(t0 + 3600), 99)
    a = make_plan(q, orders_from_permutation(q, ["cu", "sr", "wr", "cr"]), "a", estimated_cost=10.0)
    b = make_plan(q, orders_from_permutation(q, ["wr", "sr", "cu", "cr"]), "b", estimated_cost=8.0)
    out = {
        "stats_gate_60_cycles": timed(lambda: check_statistics(q, hist, iso(t0 + 3000), iso(t0 + 3600), 60.0), repeat),
        "forecast_gate": timed(lambda: check_forecast(q, fc, hist), repeat),
        "plan_gate": timed(lambda: check_plan(q, b, active=a), repeat),
    }
    with tempfile.TemporaryDirectory() as d:
        end = t0 + 60 * files
        lake = write_lake(os.path.join(d, "stats"), q, files, rows, True, t0)
        out["input_gate_pyarrow_footer_stats"] = timed(lambda: check_input(q, lake, t0, end, cycle=60.0), repeat)
        lake2 = write_lake(os.path.join(d, "nostats"), q, files, rows, False, t0)
        out["input_gate_pyarrow_read_columns"] = timed(lambda: check_input(q, lake2, t0, end, cycle=60.0), repeat)
        if spark is not None:
            check_input(q, lake2, t0, end, cycle=60.0, spark=spark)  # warm up
            out["input_gate_spark_scan"] = timed(lambda: check_input(q, lake2, t0, end, cycle=60.0, spark=spark), repeat)
    return out


def versions() -> dict:
    import great_expectations
    import pyarrow

    v = {"python": platform.python_version(), "great_expectations": great_expectations.__version__,
         "pandas": pd.__version__, "pyarrow": pyarrow.__version__}
    try:
        import pyspark

        v["pyspark"] = pyspark.__version__
    except ImportError:
        pass
    return v


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    items = [(f"{sec}: {k}", v) for sec in ("gx", "gates") for k, v in results[sec].items()]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(items) + 1.2))
    ax.barh([k for k, _ in items], [v for _, v in items])
    ax.set_xscale("log")
    ax.set_xlabel("seconds (median, log scale)")
    ax.set_title(f"mjoin gates ({'quick' if results['parameters']['quick'] else 'full'}, {results['date'][:10]})")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repeats (smoke test)")
    ap.add_argument("--no-spark", action="store_true", help="skip the Spark measurements")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    p = {"quick": args.quick, "repeat": 3 if args.quick else 7, "gx_rows": 1_000 if args.quick else 100_000,
         "input_files_per_stream": 3 if args.quick else 20, "input_rows_per_file": 2_000 if args.quick else 200_000}
    spark = None
    if not args.no_spark:
        from mjoin.runtime.resources import Resources
        from mjoin.runtime.spark import get_spark

        spark = get_spark("mjoin-bench-gates", Resources(spark_master="local[2]", shuffle_partitions=4))
    try:
        results = {"date": datetime.now(timezone.utc).isoformat(), "machine": {"platform": platform.platform(),
                   "cpus": os.cpu_count()}, "versions": versions(), "parameters": p,
                   "gx": {"import": gx_import_seconds(), **bench_gx(p["repeat"], p["gx_rows"], spark)},
                   "gates": bench_gates(p["repeat"], p["input_files_per_stream"], p["input_rows_per_file"], spark)}
    finally:
        if spark is not None:
            spark.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "gates-quick" if args.quick else "gates"
    (out / f"{stem}.json").write_text(json.dumps(results, indent=2))
    plot(results, out / f"{stem}.png")
    for sec in ("gx", "gates"):
        for k, v in results[sec].items():
            print(f"{sec:6} {k:40} {v:8.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
