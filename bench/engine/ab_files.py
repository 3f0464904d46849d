"""Benchmark: the files a pipelined interval run writes per batch (the peers comparison and the engine-throughput goals), two code
trees side by side in alternating processes (A B B A A B ...) on the same lake, so both see the same load.

    flock /tmp/mjoin-bench.lock nice -n 5 .venv/bin/python bench/engine/ab_files.py --base <tree> \
        --lake /tmp/h26/full/tpcds-sf1 --plan /tmp/h26/full/peers-seed-sf1/plan.json --start 1767225600 --end 1767229200

The run: the TPC-DS seed query (``tpcds_returns_by_address``) over ``[start, end)`` in ``--cycle``-second
cycles (sf 1, one hour, 10 s: 360 batches, every batch rejecting rows of three streams), one plan
(``run_interval``: fused, pipelined), 4 buckets, ``local[2]``, on both paths: the driver
(``driver_rows = interval_driver_rows = 10**7``) and Spark jobs (``driver_rows=0``).

``--base``: a checkout (``include/``) of the commit to compare against, e.g.
``git archive main include | tar -x -C <tree>`` (``--base-commit`` records which); the other tree is this one. Each process starts its own
Spark session, runs a two-cycle warm-up per path, then ``--rounds`` rounds per path. Recorded per run:
wall, ``batch_seconds``, ``prepare_seconds``, the phases, the pipelined run's stage and commit seconds,
the files it wrote by kind (results, quarantine, metrics, state) and the results' fingerprint. Writes
``results/files-ab.json``: per tree and path medians and spread, machine, load before/after and per run,
versions, both commits, parameters.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from abtree import run_worker  # noqa: E402  (bench/abtree.py: one worker process per code tree)
QUERY = "tpcds_returns_by_address"
PATHS = {"driver": 10**7, "spark": 0}  # driver_rows (and interval_driver_rows) of each path


def files_written(out: Path) -> dict:
    """Files under a run's output folder by kind (the first folder level), and in all."""
    counts = {}
    for dirpath, _, names in os.walk(out):
        rel = Path(dirpath).relative_to(out).parts
        kind = rel[0] if rel else "."
        counts[kind] = counts.get(kind, 0) + len(names)
    counts["all"] = sum(counts.values())
    return counts


def worker(args) -> None:
    """In a child process (``PYTHONPATH`` = the tree's include/): JSON lines, one per run."""
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.results import result_fingerprint
    from mjoin.engine.runs import run_interval
    from mjoin.model.plan import load_plan
    from mjoin.model.query import load_query
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    q = load_query(QUERY)
    plan = load_plan(args.plan, q) if args.plan else None
    spark = get_spark("bench-files", Resources(spark_master="local[2]", shuffle_partitions=4))
    out = Path(args.work) / f"out-{os.getpid()}"
    for path, rows in PATHS.items():
        if args.paths and path not in args.paths:
            continue
        cfg = EngineConfig(buckets=4, driver_rows=rows, interval_driver_rows=rows)
        run_interval(spark, q, plan, args.lake, args.start, args.start + 2 * args.cycle, args.cycle, str(out),
                     config=cfg)  # warm-up
        for _ in range(args.rounds):
            shutil.rmtree(out, ignore_errors=True)
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            s = run_interval(spark, q, plan, args.lake, args.start, args.end, args.cycle, str(out), config=cfg)
            wall = time.perf_counter() - t0
            rec = read_metrics(s.metrics_path)[0]["execution"]
            print(json.dumps({"path": path, "wall_seconds": wall, "batch_seconds": s.batch_seconds,
                              "prepare_seconds": s.prepare_seconds, "batches": s.batches,
                              "execution": s.extra.get("execution"),
                              "phases": {k: v for k, v in s.extra.get("phases", {}).items() if k != "spark_stages"},
                              "stage_seconds": rec["stage_seconds"],
                              "spark_stages": [{k: st.get(k) for k in ("kind", "tasks", "wall_seconds", "task_seconds",
                                                                       "task_cpu_seconds")}
                                               for st in s.extra.get("phases", {}).get("spark_stages", [])],
                              "final_files_write_seconds": rec.get("final_files_write_seconds"),
                              "files": files_written(out), "result_rows": s.result_rows,
                              "quarantined": s.quarantined, "fingerprint": result_fingerprint(s.results_path),
                              "load": load, "mjoin_module": sys.modules["mjoin"].__file__}), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    spark.stop()


def _ms(xs: list) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summary(runs: list) -> dict:
    return {"wall": _ms([r["wall_seconds"] for r in runs]), "batch_seconds": _ms([r["batch_seconds"] for r in runs]),
            "prepare_seconds": _ms([r["prepare_seconds"] for r in runs]),
            "commit_seconds": _ms([r["stage_seconds"].get("commit", 0.0) for r in runs]),
            "files": {k: statistics.median(r["files"].get(k, 0) for r in runs)
                      for k in sorted({k for r in runs for k in r["files"]})}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="the tree to compare against (its include/); required")
    ap.add_argument("--base-commit", default=None, help="the base tree's commit, recorded (a git archive has no .git)")
    ap.add_argument("--lake", required=True)
    ap.add_argument("--plan", default=None)
    ap.add_argument("--start", type=int, required=True)
    ap.add_argument("--end", type=int, required=True)
    ap.add_argument("--cycle", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1, help="rounds per path in each process")
    ap.add_argument("--processes", type=int, default=3, help="processes per tree (order A B B A A B ...)")
    ap.add_argument("--paths", nargs="*", default=None, help="driver, spark (default both)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=str(HERE / "results" / "files-ab.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.work = args.work or str(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-files-{os.getpid()}")
    if args.worker:
        worker(args)
        return 0
    if not args.base:
        ap.error("--base is required")
    sys.path.insert(0, str(HERE.parent.parent / "include"))
    from mjoin.engine.metrics import git_commit, machine

    trees = {"base": str(Path(args.base).resolve()), "new": str(HERE.parent.parent)}
    order = [["base", "new"], ["new", "base"]]
    order = [t for i in range(args.processes) for t in order[i % 2]]
    import numpy
    import pyarrow
    import pyspark

    doc = {"benchmark": "files-ab", "machine": machine(), "load_before": os.getloadavg(),
           "git_commit": git_commit(HERE.parent.parent), "base_tree": trees["base"],
           "base_commit": args.base_commit or git_commit(trees["base"]),
           "versions": {"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__, "numpy": numpy.__version__,
                        "python": sys.version.split()[0]},
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "order": order, "runs": {t: [] for t in trees}}
    passthrough = ["--lake", args.lake, "--start", str(args.start), "--end", str(args.end), "--cycle", str(args.cycle),
                   "--rounds", str(args.rounds), "--work", args.work] + (["--plan", args.plan] if args.plan else []) \
        + (["--paths", *args.paths] if args.paths else [])
    for i, tree in enumerate(order):
        t0 = time.perf_counter()
        rows = run_worker(__file__, passthrough, trees[tree], label=f"process {i} ({tree})")
        for r in rows:
            r["process"] = i
            assert Path(r["mjoin_module"]).is_relative_to(trees[tree]), (r["mjoin_module"], trees[tree])
        doc["runs"][tree] += rows
        print(f"{i} {tree}: {time.perf_counter() - t0:.0f}s: "
              + ", ".join(f"{r['path']} {r['wall_seconds']:.2f}s (batches {r['batch_seconds']:.2f}s, "
                          f"{r['files']['all']} files)" for r in rows), flush=True)
    doc["load_after"] = os.getloadavg()
    paths = sorted({r["path"] for runs in doc["runs"].values() for r in runs})
    doc["summary"] = {t: {p: summary([r for r in runs if r["path"] == p]) for p in paths}
                      for t, runs in doc["runs"].items()}
    doc["identical_results"] = len({json.dumps([r["fingerprint"], r["quarantined"]], sort_keys=True)
                                    for runs in doc["runs"].values() for r in runs}) == 1
    doc["parameters"] = {"query": QUERY, "lake": args.lake, "plan": args.plan, "start": args.start, "end": args.end,
                         "cycle_seconds": args.cycle, "rounds_per_process": args.rounds,
                         "processes_per_tree": args.processes, "buckets": 4, "local": "local[2]",
                         "driver_rows": PATHS}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc["summary"], indent=1))
    print(f"identical results: {doc['identical_results']}; wrote {args.out}")
    return 0 if doc["identical_results"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
