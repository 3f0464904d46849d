"""Benchmark: the seed query's interval run (TPC-DS returns by address, one hour, 10-s cycles, the peers' plan) on
two code trees side by side, on both input paths (the engine-throughput goals: the input's share of the run), in alternating
processes (base, new, new, base, ...) on the same lake, so that both see the same machine load.

    flock /tmp/mjoin-bench.lock .venv/bin/python bench/scale/ab_seed.py --base <tree> \\
        --job /tmp/h26/full/peers-seed-sf1/mjoin.json --tag h29

``--job``: the seed run's job file (``query``, ``lake``, ``start``, ``end``, ``plan``, ``cycle``: what
``bench/evaluation`` writes next to its peers' runs). ``--base``: a checkout of the commit to compare against
(``git archive <commit> include bench | tar -x -C <tree>``); the other tree is this one. ``--variants``: extra runs
of this tree with environment settings, ``name:VAR=value`` (default ``new-cold:MJOIN_FOOTERS_CACHE=0``: no footer
cache, every run reads every footer as a first run does); ``--base-variants`` the same for the base tree.
Each process starts its own Spark session (``local[2]``,
4 shuffle partitions), runs a warm-up over the first two cycles (it lists and inspects every landed file, as each
run does), then ``--rounds`` timed runs per path: ``driver`` (``driver_rows`` = ``interval_driver_rows`` = 10**7:
the interval read, batched and joined on the driver) and ``spark`` (both 0). Writes
``results/seed-ab[-<tag>].json``: per tree and path the medians and spread of the run's wall, ``prepare_seconds``
and every phase, the input's share, the results' fingerprints (must be equal), machine, load, versions, commits.
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
PATHS = {"driver": 10**7, "spark": 0}


def worker(job: dict, rounds: int, paths: list, out: str) -> None:
    """In a child process (``mjoin`` imported from the tree on ``PYTHONPATH``): JSON lines, one per timed run."""
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.results import result_fingerprint
    from mjoin.engine.runs import run_interval
    from mjoin.model.plan import load_plan
    from mjoin.model.query import load_query
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    q = load_query(job["query"])
    plan = load_plan(job["plan"], q)
    cycle = job.get("cycle", 10)
    spark = get_spark("bench-seed-ab", Resources(spark_master="local[2]", shuffle_partitions=4),
                      conf={"spark.driver.memory": "6g"})
    for path in paths:
        cfg = EngineConfig(buckets=4, driver_rows=PATHS[path], interval_driver_rows=PATHS[path])
        shutil.rmtree(out, ignore_errors=True)
        run_interval(spark, q, plan, job["lake"], job["start"], job["start"] + 2 * cycle, cycle, out, config=cfg)
        for _ in range(rounds):
            shutil.rmtree(out, ignore_errors=True)
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            s = run_interval(spark, q, plan, job["lake"], job["start"], job["end"], cycle, out, config=cfg)
            wall = time.perf_counter() - t0
            phases = {k: v for k, v in s.extra["phases"].items() if k != "spark_stages"}
            phases["prepare"] = s.prepare_seconds
            print(json.dumps({"path": path, "execution": s.extra.get("execution"), "wall_seconds": wall,
                              "batch_seconds": s.batch_seconds, "phases": phases,
                              "input_share": s.prepare_seconds / wall, "result_rows": s.result_rows,
                              "fingerprint": result_fingerprint(out, q), "load": load,
                              "mjoin_module": sys.modules["mjoin"].__file__}), flush=True)
    spark.stop()


def summary(runs: list) -> dict:
    def ms(xs):
        xs = [x for x in xs if x is not None]
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else None

    keys = sorted({k for r in runs for k in r["phases"]})
    return {"wall": ms([r["wall_seconds"] for r in runs]), "input_share": ms([r["input_share"] for r in runs]),
            "phases": {k: ms([r["phases"].get(k) for r in runs]) for k in keys}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", help="the tree to compare against (include/); required")
    ap.add_argument("--job", default="/tmp/h26/full/peers-seed-sf1/mjoin.json")
    ap.add_argument("--rounds", type=int, default=1, help="timed runs per path in each process")
    ap.add_argument("--blocks", type=int, default=3, help="each tree (and variant) runs this many processes")
    ap.add_argument("--paths", nargs="*", default=list(PATHS), choices=list(PATHS))
    ap.add_argument("--variants", nargs="*", default=["new-cold:MJOIN_FOOTERS_CACHE=0"])
    ap.add_argument("--base-variants", nargs="*", default=[],
                    help="extra runs of the base tree, as --variants (e.g. base-cold:MJOIN_FOOTERS_CACHE=0)")
    ap.add_argument("--work", default=None)
    ap.add_argument("--tag", default="")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    job = json.loads(Path(args.job).read_text())
    work = args.work or str(Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-seed-ab-{os.getpid()}")
    if args.worker:
        worker(job, args.rounds, args.paths, str(Path(work) / f"out-{os.getpid()}"))
        return 0
    if not args.base:
        ap.error("--base is required")
    sys.path.insert(0, str(HERE.parent.parent / "include"))
    from mjoin.engine.metrics import git_commit, machine

    import bench_scale as B

    trees = {"base": (str(Path(args.base).resolve()), {}), "new": (str(HERE.parent.parent), {})}
    for variants, root in ((args.base_variants, trees["base"][0]), (args.variants, str(HERE.parent.parent))):
        for v in variants:
            name, _, setting = v.partition(":")
            trees[name] = (root, dict(kv.split("=", 1) for kv in setting.split(",") if kv))
    order = []
    for i in range(args.blocks):  # A B C, C B A, A B C, ...
        order += list(trees) if i % 2 == 0 else list(trees)[::-1]
    doc = {"benchmark": "seed-ab", "job": job, "machine": machine(), "load_before": os.getloadavg(),
           "git_commit": git_commit(HERE.parent.parent), "base_tree": trees["base"][0], "versions": B.versions(),
           "trees": {t: {"root": r, "env": e} for t, (r, e) in trees.items()}, "order": order,
           "runs": {t: [] for t in trees}}
    for i, tree in enumerate(order):
        root, env = trees[tree]
        t0 = time.perf_counter()
        rows = run_worker(__file__, [root, "--job", args.job, "--rounds", args.rounds, "--work", work, "--paths",
                                     *args.paths], root, env=env, label=tree, stderr_tail=3000)
        for r in rows:
            r["process"] = i
        doc["runs"][tree] += rows
        print(f"{i} {tree}: {time.perf_counter() - t0:.0f}s: " + ", ".join(
            f"{r['path']} wall {r['wall_seconds']:.2f}s prepare {r['phases']['prepare']:.2f}s" for r in rows), flush=True)
    doc["load_after"] = os.getloadavg()
    doc["summary"] = {t: {p: summary([r for r in runs if r["path"] == p]) for p in args.paths}
                      for t, runs in doc["runs"].items()}
    doc["identical_results"] = {p: len({json.dumps(r["fingerprint"], sort_keys=True) for t in doc["runs"]
                                        for r in doc["runs"][t] if r["path"] == p}) == 1 for p in args.paths}
    doc["parameters"] = {"rounds_per_process": args.rounds, "blocks": args.blocks, "paths": args.paths,
                         "variants": args.variants, "base_variants": args.base_variants, "local": "local[2]",
                         "buckets": 4, "shuffle_partitions": 4}
    path = HERE / "results" / f"seed-ab{'-' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps({t: {p: {"wall": s["wall"]["median"], "prepare": s["phases"]["prepare"]["median"]}
                          for p, s in v.items()} for t, v in doc["summary"].items()}, indent=1))
    print(f"wrote {path}")
    return 0 if all(doc["identical_results"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
