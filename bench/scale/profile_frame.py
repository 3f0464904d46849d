"""Profile: what the frame's width costs the input path (the frame that crosses the one shuffle).

    MJOIN_CACHE=... flock /tmp/mjoin-bench.lock nice -n 0 .venv/bin/python bench/scale/profile_frame.py --sf 1

In one Spark session (``local[2]``, 4 shuffle partitions, as ``bench_scale.py``), on the same landed sf
data, per density, variants in alternating order (``--rounds`` each, after a warm-up):

- ``run``: the whole interval run (``run_interval``, fused), its phases from ``execution.spark_stages``;
- ``shuffle``: only the input path: the interval's routed rows (``interval.route_interval``, exactly
  what the run's operator stage gets), handed to a ``mapInArrow`` that counts rows and Arrow bytes and
  does nothing else: the input stage (read, normalise, route, shuffle write) plus the operator stage's
  share of the input (shuffle read, the sort, the conversion to Arrow, the hand-over to Python);
- ``shuffle-23-columns`` (``--wide``): the same rows in the layout that crossed the shuffle before the
  input layout (``frame.input_ddl``): every stream's payload by name, the partial results' columns,
  projected just before the exchange (so the same rows, only wider);
- ``run-open1m`` (``--open-cost``): the whole run with ``spark.sql.files.openCostInBytes`` at 1 MB
  (Spark's default 4 MB packs ~4 MB of "open cost" per file into a scan task: with 30-150 kB files the
  sparse replay's 720 files make 25 scan tasks).

Per Spark stage: wall, task time, CPU, shuffle bytes and records, shuffle write time, GC, peak execution
memory, spill. Writes ``results/profile-frame-sf<sf>[-<tag>].json`` (machine, load per round, versions,
git commit, parameters).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_scale as B  # noqa: E402  (puts include/ and tests/ on sys.path)


def _count_task(batches):
    import pyarrow as pa

    rows = nbytes = 0
    t0 = time.perf_counter()
    for b in batches:
        rows += b.num_rows
        nbytes += b.nbytes
    yield pa.RecordBatch.from_pydict({"doc": [json.dumps({"rows": rows, "arrow_bytes": nbytes, "columns": None,
                                                          "python_seconds": time.perf_counter() - t0})]})


def run_shuffle(spark, landed: Path, out: Path, span, wide: bool) -> dict:
    """The interval's routed rows through the one exchange into a counting ``mapInArrow`` (no operator)."""
    from mjoin.engine import interval as I
    from mjoin.engine.batch import BatchRunner
    from mjoin.engine.sparkplan import apply_engine_conf, restore_conf
    from mjoin.engine.compiled import EngineQuery
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.inputs import as_lake, as_query

    before = apply_engine_conf(spark)
    try:
        q = as_query(B.QUERY)
        eq = EngineQuery.from_query(q)
        lake, out_lake = as_lake(str(landed)), as_lake(str(out))
        I.clear_outputs(out_lake, q.name)
        runner = BatchRunner(spark, q, out_lake, EngineConfig(buckets=16), mode="interval")
        group = f"profile-{time.time_ns()}"
        spark.sparkContext.setJobGroup(group, "profile", interruptOnCancel=False)
        t0 = time.perf_counter()
        if wide:
            partitioned = runner.partitioned
            runner.partitioned = lambda df: partitioned(widen(runner, df))
        data = I.read_interval(spark, q, eq, lake, out_lake, span[0], span[1], B.CYCLE)
        t1 = time.perf_counter()
        routed = I.route_interval(runner, data)
        t2 = time.perf_counter()
        docs = [json.loads(r.doc) for r in routed.mapInArrow(_count_task, "doc string").collect()]
        t3 = time.perf_counter()
        from mjoin.engine.metrics import stage_times

        stages = stage_times(spark, group, detail=True)
        return {"wall_seconds": t3 - t0, "driver_read_seconds": t1 - t0, "driver_route_seconds": t2 - t1,
                "job_seconds": t3 - t2, "columns": len(routed.columns),
                "rows": sum(d["rows"] for d in docs), "arrow_bytes": sum(d["arrow_bytes"] for d in docs),
                "python_seconds": sum(d["python_seconds"] for d in docs), "stages": stages}
    finally:
        restore_conf(spark, before)


def widen(runner, routed):
    """Stage 1's rows in the layout before ``frame.input_ddl``: META, the keys, the partial results' columns,
    every stream's payload by name (from the slots of the row's stream), the reject columns, ``_batch``."""
    from mjoin.engine.compiled import key_name
    from mjoin.engine.frame import META, PARTIAL, REJECT, payload_slots
    from mjoin.engine.frame import sql_type

    eq = runner.eq
    _, of = payload_slots(eq)
    types = {f"{s}__{c}": sql_type(t) for s in eq.streams for c, t in eq.payload[s]}
    cols = [n for n, _ in META] + [key_name(c) for c in eq.classes]
    cols += [f"CAST(NULL AS {t}) AS {n}" for n, t in PARTIAL] + ["_hi"]
    cols += [f"CAST(CASE WHEN _s = {eq.index(s)} THEN {slot} END AS {types[name]}) AS `{name}`"
             for s in eq.streams for name, slot in of[s]]
    have = set(routed.columns)  # (a lake where no row can be rejected: routed without the reject columns)
    rejects = [n if n in have else f"CAST(NULL AS {t}) AS {n}" for n, t in REJECT]
    return routed.selectExpr(*cols, *rejects, *[c for c in ("_batch",) if c in have])


def run_full(spark, landed: Path, out: Path, span, conf: dict | None = None) -> dict:
    before = {k: spark.conf.get(k, None) for k in conf or {}}
    for k, v in (conf or {}).items():
        spark.conf.set(k, v)
    try:
        res = B.run_mjoin(spark, landed, out, span)
    finally:
        for k, v in before.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)
    return {"wall_seconds": res["wall_seconds"], "phases": res["phases"], "input_share": res["input_share"],
            "result_rows": res["result_rows"], "fingerprint": res["fingerprint"], "stages": res["spark_stages"]}


def med(xs):
    xs = [x for x in xs if x is not None]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else None


def summarise(runs: list) -> dict:
    out = {"wall": med([r["wall_seconds"] for r in runs])}
    if "phases" in runs[0]:
        out["phases"] = {p: med([r["phases"][p] for r in runs]) for p in runs[0]["phases"]}
        out["input_share"] = med([r["input_share"] for r in runs])
    else:
        for k in ("driver_read_seconds", "driver_route_seconds", "job_seconds", "python_seconds"):
            out[k] = med([r[k] for r in runs])
        out["columns"] = runs[0]["columns"]
        out["rows"] = runs[0]["rows"]
        out["arrow_bytes"] = runs[0]["arrow_bytes"]
    for kind in ("input", "operator"):
        sts = [[s for s in r["stages"] if s["kind"] == kind] for r in runs]
        if not all(sts):
            continue
        keys = [k for k, v in sts[0][0].items() if isinstance(v, (int, float)) and k != "stage"]
        out[f"{kind}_stage"] = {k: med([sum(s[k] or 0 for s in st) for st in sts]) for k in keys}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--densities", nargs="*", default=["dense", "sparse"])
    ap.add_argument("--variants", nargs="*", default=["run", "shuffle"])
    ap.add_argument("--wide", action="store_true", help="add the shuffle-23-columns variant")
    ap.add_argument("--open-cost", action="store_true", help="add the run-open1m variant")
    ap.add_argument("--work", default=None)
    ap.add_argument("--tag", default="")
    ap.add_argument("--conf", nargs="*", default=[], help="key=value Spark SQL settings for every variant")
    args = ap.parse_args(argv)
    from mjoin.engine.metrics import git_commit, machine
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    work = Path(args.work or f"/tmp/profile-frame-{os.getpid()}")
    work.mkdir(parents=True, exist_ok=True)
    spark = get_spark("profile-frame", Resources(spark_master="local[2]", shuffle_partitions=4),
                      conf={"spark.driver.memory": "6g"})
    for kv in args.conf:
        k, v = kv.split("=", 1)
        spark.conf.set(k, v)
    variants = list(args.variants) + (["shuffle-23-columns"] if args.wide else []) + \
        (["run-open1m"] if args.open_cost else [])
    doc = {"benchmark": "profile-frame", "sf": args.sf, "machine": machine(), "load_before": os.getloadavg(),
           "git_commit": git_commit(B.PROJECT), "versions": B.versions(), "conf": args.conf, "densities": {}}
    for density in args.densities:
        landed, man = B.workload(args.sf, density, work)
        span = (man.start_epoch, man.end_epoch + 60)
        out = work / "out"
        runs = {v: [] for v in variants}
        fn = {"run": lambda: run_full(spark, landed, out, span),
              "shuffle": lambda: run_shuffle(spark, landed, out, span, False),
              "shuffle-23-columns": lambda: run_shuffle(spark, landed, out, span, True),
              "run-open1m": lambda: run_full(spark, landed, out, span, {"spark.sql.files.openCostInBytes": "1048576"})}
        for v in variants:  # warm-up
            fn[v]()
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for v in order:
                load = os.getloadavg()[0]
                res = fn[v]()
                res["load"] = load
                runs[v].append(res)
                print(f"{density} round {r} {v}: {res['wall_seconds']:.2f}s (load {load:.1f})", flush=True)
        doc["densities"][density] = {"summary": {v: summarise(rs) for v, rs in runs.items()}, "runs": runs}
        print(json.dumps(doc["densities"][density]["summary"], indent=1), flush=True)
    doc["load_after"] = os.getloadavg()
    doc["parameters"] = {"rounds": args.rounds, "variants": variants, "buckets": 16, "local": "local[2]",
                         "shuffle_partitions": 4, "cycle_seconds": B.CYCLE, "query": B.QUERY}
    path = HERE / "results" / f"profile-frame-sf{args.sf:g}{'-' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {path}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
