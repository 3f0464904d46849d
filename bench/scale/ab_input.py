"""Benchmark: the engine's interval run on two code trees side by side (the input path), in
alternating processes (A B B A ...) on the same landed data, so that both see the same machine load.

    MJOIN_CACHE=... python bench/scale/ab_input.py --base /tmp/base-tree --sf 1 --work /tmp/w
    flock /tmp/mjoin-bench.lock nice -n 0 .venv/bin/python bench/scale/ab_input.py --base <tree> --sf 1

``--no-null-keys``: the rows with a NULL join key are dropped from the landed files first (TPC-DS's returns
have them in every file, so on the benchmark's lake every file can reject a row); both trees read the same files.

``--base``: a checkout (``include/``, ``bench/``, ``tests/engine_helpers.py``) of the commit to compare
against, e.g. ``git archive <commit> include bench tests/engine_helpers.py | tar -x -C <tree>`` (or the
base's ``include/`` with this tree's ``bench/``: the same harness on both); the other tree is this one.
``--path``: the engine's path (``bench_scale.engine_config``: ``spark``, the default, or ``default``). Each process starts its own Spark session (``local[2]``, as ``bench_scale.py``),
runs one warm-up, then ``--rounds`` rounds of ``bench_scale.run_mjoin`` per density (wall, the phases,
the fingerprint of the results). The blocks alternate ``--blocks`` times (ABBA order). Writes
``results/input-ab-sf<sf>.json``: per tree and density the medians and spread of the wall time and of
every phase, the input share, the results' fingerprints (must be equal), machine, load before/after
and per round, versions, both commits.
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
sys.path.insert(0, str(HERE.parent))
from abtree import run_worker  # noqa: E402  (bench/abtree.py: one worker process per code tree)


def driver_rounds(spark, B, landed, span, out, rounds: int, density: str) -> None:
    """``--driver-only``: the driver's part of an interval run, no Spark job: ``read_interval`` (listing,
    contract checks, the lazy read) and ``route_interval`` (the routed plan), timed, with the py4j calls."""
    from py4j.clientserver import ClientServerConnection

    from mjoin.engine import interval as I
    from mjoin.engine.batch import BatchRunner
    from mjoin.engine.sparkplan import apply_engine_conf
    from mjoin.engine.compiled import EngineQuery
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.inputs import as_lake, as_query

    calls = [0]
    send = ClientServerConnection.send_command

    def counted(self, command):
        calls[0] += 1
        return send(self, command)

    ClientServerConnection.send_command = counted
    apply_engine_conf(spark)
    q = as_query(B.QUERY)
    eq = EngineQuery.from_query(q)
    lake, out_lake = as_lake(str(landed)), as_lake(str(out))
    runner = BatchRunner(spark, q, out_lake, EngineConfig(buckets=16), mode="interval")
    for r in range(rounds + 1):  # the first: warm-up
        load, c0 = os.getloadavg()[0], calls[0]
        t0 = time.perf_counter()
        data = I.read_interval(spark, q, eq, lake, out_lake, span[0], span[1], B.CYCLE)
        t1 = time.perf_counter()
        I.route_interval(runner, data)
        t2 = time.perf_counter()
        if r:
            print(json.dumps({"density": density, "wall_seconds": t2 - t0, "input_share": 0.0,
                              "phases": {"read_interval": t1 - t0, "route_interval": t2 - t1},
                              "py4j_calls": calls[0] - c0, "load": load, "fingerprint": None,
                              "mjoin_module": sys.modules["mjoin"].__file__}), flush=True)
    ClientServerConnection.send_command = send


def worker(root: str, sf: float, rounds: int, work: str, densities: list, driver_only: bool = False,
           path: str = "spark") -> None:
    """Run in a child process: ``rounds`` engine runs per density with the code of ``root``; JSON lines out."""
    sys.path.insert(0, str(Path(root) / "bench" / "scale"))
    import bench_scale as B  # puts <root>/include and <root>/tests first on sys.path

    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    spark = get_spark("bench-ab", Resources(spark_master="local[2]", shuffle_partitions=4), conf={"spark.driver.memory": "6g"})
    warm = False
    for density in densities:
        landed, man = B.workload(sf, density, Path(work))
        span = (man.start_epoch, man.end_epoch + 60)
        out = Path(work) / f"out-ab-{os.getpid()}"
        if driver_only:
            driver_rounds(spark, B, landed, span, out, rounds, density)
            continue
        if not warm:
            B.run_mjoin(spark, landed, out, span, B.engine_config(path))
            warm = True
        for _ in range(rounds):
            load = os.getloadavg()[0]
            res = B.run_mjoin(spark, landed, out, span, B.engine_config(path))
            print(json.dumps({"density": density, "wall_seconds": res["wall_seconds"], "phases": res["phases"],
                              "input_share": res["input_share"], "result_rows": res["result_rows"],
                              "fingerprint": res["fingerprint"], "load": load,
                              "mjoin_module": sys.modules["mjoin"].__file__}), flush=True)
    spark.stop()


def summary(runs: list) -> dict:
    def ms(xs):
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}

    return {"wall": ms([r["wall_seconds"] for r in runs]),
            "phases": {p: ms([r["phases"][p] for r in runs]) for p in runs[0]["phases"]},
            "input_share": ms([r["input_share"] for r in runs])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="the tree to compare against (include/, bench/); required")
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per density in each process")
    ap.add_argument("--blocks", type=int, default=2, help="ABBA blocks: each tree runs 2 x blocks processes")
    ap.add_argument("--densities", nargs="*", default=["dense", "sparse"])
    ap.add_argument("--work", default=None)
    ap.add_argument("--driver-only", action="store_true",
                    help="time only the driver's part (read_interval, route_interval; no Spark job): under a minute")
    ap.add_argument("--no-null-keys", action="store_true",
                    help="first drop the rows with a NULL join key from the landed files (bench_scale.drop_null_keys): "
                         "a lake where no row can be rejected")
    ap.add_argument("--path", choices=("spark", "default", "driver"), default="spark",
                    help="the engine's path (bench_scale.engine_config; default: the Spark path)")
    ap.add_argument("--tag", default="", help="added to the result file's name (input-ab[-driver]-<tag>-sf<sf>.json)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = args.work or str(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-ab-{os.getpid()}")
    if args.worker:
        worker(args.worker, args.sf, args.rounds, work, args.densities, args.driver_only, args.path)
        return 0
    if not args.base:
        ap.error("--base is required")
    sys.path.insert(0, str(HERE.parent.parent / "include"))
    from mjoin.engine.metrics import git_commit, machine

    import bench_scale as B

    trees = {"base": str(Path(args.base).resolve()), "new": str(HERE.parent.parent)}
    dropped = {}
    if args.no_null_keys:  # the workers find the landed folders made (and cleaned) here
        for d in args.densities:
            dropped[d] = B.drop_null_keys(B.workload(args.sf, d, Path(work))[0])
        print(f"rows with NULL keys dropped: {dropped}", flush=True)
    order = []
    for _ in range(args.blocks):
        order += ["base", "new", "new", "base"]
    doc = {"benchmark": "input-ab", "sf": args.sf, "machine": machine(), "load_before": os.getloadavg(),
           "git_commit": git_commit(HERE.parent.parent), "base_tree": trees["base"], "versions": B.versions(),
           "order": order, "runs": {t: [] for t in trees}}
    for i, tree in enumerate(order):
        t0 = time.perf_counter()
        # the Spark Python workers (the operator) import mjoin from the same tree as the driver
        rows = run_worker(__file__, [trees[tree], "--sf", args.sf, "--rounds", args.rounds, "--work", work,
                                     "--path", args.path, "--densities", *args.densities]
                          + (["--driver-only"] if args.driver_only else []),
                          trees[tree], label=tree)
        for r in rows:
            r["process"] = i
        doc["runs"][tree] += rows
        print(f"{i} {tree}: {len(rows)} runs in {time.perf_counter() - t0:.0f}s: "
              + ", ".join(f"{r['density']} {r['wall_seconds']:.2f}s" for r in rows), flush=True)
    doc["load_after"] = os.getloadavg()
    doc["summary"] = {t: {d: summary([r for r in runs if r["density"] == d]) for d in args.densities}
                      for t, runs in doc["runs"].items()}
    doc["identical_results"] = {d: len({json.dumps(r["fingerprint"], sort_keys=True) for t in doc["runs"]
                                        for r in doc["runs"][t] if r["density"] == d}) == 1 for d in args.densities}
    if args.driver_only:
        doc["identical_results"] = {d: None for d in args.densities}  # no results: nothing joined
        for t, runs in doc["runs"].items():
            for d in args.densities:
                doc["summary"][t][d]["py4j_calls"] = statistics.median(r["py4j_calls"] for r in runs if r["density"] == d)
    doc["parameters"] = {"rounds_per_process": args.rounds, "path": args.path, "tag": args.tag, "blocks": args.blocks, "densities": args.densities,
                         "driver_only": args.driver_only, "no_null_keys": args.no_null_keys,
                         "null_key_rows_dropped": dropped,
                         "local": "local[2]", "buckets": 16, "cycle_seconds": B.CYCLE}
    path = HERE / "results" / f"input-ab{'-driver' if args.driver_only else ''}{'-' + args.tag if args.tag else ''}-sf{args.sf:g}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc["summary"], indent=1))
    print(f"wrote {path}")
    return 0 if all(v is not False for v in doc["identical_results"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
