"""Benchmark: the same engine runs in local mode (local[2]) and on the native two-worker standalone cluster
(2 workers x 1 core: the same cores), on the native cluster of docs/cluster.md.

    make cluster-up
    flock /tmp/mjoin-bench.lock .venv/bin/python bench/cluster/bench_cluster.py            # sf 1, 3 rounds
    flock /tmp/mjoin-bench.lock .venv/bin/python bench/cluster/bench_cluster.py --quick    # sf 0.1, 1 round

Per round and side, one fresh driver process (a SparkContext per process): a warm-up interval run (not
measured), then, measured, (1) the interval run of the whole replay (pipelined, one plan: the spec's
order) and (2) the streaming job's catch-up over the landed backlog (``availableNow``, 8 files per
micro-batch, every batch on the executors: ``driver_rows=0``). The sides alternate their order from round
to round; medians and spread over the rounds. Results must be identical on both sides (count and
fingerprint over all output columns).

Writes ``bench/cluster/results/cluster[-quick].json`` (machine, load before/after, versions, git commit,
parameters, every run).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))
QUERY = "tpcds_returns_by_address"
FILES_PER_BATCH = 8


def side(args) -> int:
    """One driver process: warm up, then the measured interval run and streaming catch-up; prints JSON."""
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.results import result_fingerprint
    from mjoin.engine.runs import run_interval, run_stream
    from mjoin.lake.layout import Lake
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    conf = dict(kv.split("=", 1) for kv in args.conf.split(",") if kv) if args.conf else {}
    t0 = time.perf_counter()
    spark = get_spark("bench-cluster", Resources(spark_master=args.master, shuffle_partitions=4), conf=conf)
    startup = time.perf_counter() - t0
    landed, work = Path(args.landed), Path(args.work)
    span = (args.start, args.end)
    cfg = EngineConfig(buckets=16)
    run_interval(spark, QUERY, None, str(landed), span[0], span[1], span[1] - span[0], str(work / "warm"), config=cfg)
    t0 = time.perf_counter()
    s = run_interval(spark, QUERY, None, str(landed), span[0], span[1], span[1] - span[0], str(work / "interval"),
                     config=cfg)
    interval = {"wall_seconds": time.perf_counter() - t0, "batches": s.batches if isinstance(s.batches, int)
                else len(s.batches),
                "fingerprint": result_fingerprint(str(work / "interval"), QUERY)}
    ns = Lake(str(landed), f"bench-{os.getpid()}")
    t0 = time.perf_counter()
    st = run_stream(spark, QUERY, ns, config=EngineConfig(buckets=16, max_files_per_trigger=FILES_PER_BATCH,
                                                           driver_rows=0))
    recs = read_metrics(ns, QUERY)
    stream = {"wall_seconds": time.perf_counter() - t0, "batches": st.batches if isinstance(st.batches, int)
              else len(st.batches),
              "batch_seconds_median": statistics.median(r["wall_seconds"] for r in recs),
              "where": sorted({r["execution"]["where"] for r in recs}),
              "fingerprint": result_fingerprint(ns, QUERY)}
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - (0 if args.master.startswith("local")
                                                                                 else 1)
    shutil.rmtree(Path(landed) / ns.namespace, ignore_errors=True)
    spark.stop()
    print("RESULT " + json.dumps({"master": args.master, "startup_seconds": startup, "executors": executors,
                                  "interval": interval, "stream": stream}))
    return 0


def run_side(master: str, conf: str, landed: Path, work: Path, span, env: dict) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--side", "--master", master, "--conf", conf, "--landed", str(landed),
           "--work", str(work), "--start", str(span[0]), "--end", str(span[1])]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"{master} side failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    shutil.rmtree(work, ignore_errors=True)
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sf", type=float)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--suffix", default="", help="appended to the result file's name (smoke runs)")
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)
    for a in ("--master", "--conf", "--landed", "--work"):
        ap.add_argument(a, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        return side(args)
    from mjoin.runtime import cluster
    from mjoin.engine.metrics import git_commit, machine
    from mjoin.workloads.tpcds_replay import generate_tpcds
    from mjoin.workloads.lander import land
    from mjoin.workloads.manifest import load_manifest

    st = cluster.status()
    if not st["up"]:
        print(f"the native cluster is not up ({st['problem']}): make cluster-up", file=sys.stderr)
        return 2
    sf = args.sf or (0.1 if args.quick else 1.0)
    rounds = args.rounds or (1 if args.quick else 3)
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        workload, landed = tmp / "workload", tmp / "landed"
        generate_tpcds(str(workload), sf=sf, rate=2000.0, cycle="10s")
        man = load_manifest(str(workload))
        land(str(workload), str(landed), None)
        span = (man.start_epoch - 3600, man.end_epoch + 60)
        cenv = cluster.env()
        base = {k: v for k, v in os.environ.items() if k != "SPARK_SUBMIT_ARGS_SET_MASTER"}
        base.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"})
        sides = {"local[2]": ("local[2]", "spark.driver.memory=4g"),
                 "cluster": (cenv["MJOIN_SPARK_MASTER"], cenv["MJOIN_SPARK_CONF"] + ",spark.driver.memory=4g")}
        runs = {k: [] for k in sides}
        for r in range(rounds):
            order = list(sides) if r % 2 == 0 else list(reversed(sides))
            for name in order:
                master, conf = sides[name]
                runs[name].append(run_side(master, conf, landed, tmp / "work", span, base))
                got = runs[name][-1]
                print(f"round {r} {name}: interval {got['interval']['wall_seconds']:.2f}s, stream "
                      f"{got['stream']['wall_seconds']:.2f}s ({got['stream']['batches']} batches), "
                      f"{got['executors']} executors", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fps = {json.dumps(x[k]["fingerprint"], sort_keys=True) for v in runs.values() for x in v for k in ("interval", "stream")}
    summary = {}
    for name, v in runs.items():
        summary[name] = {}
        for k in ("interval", "stream"):
            w = [x[k]["wall_seconds"] for x in v]
            summary[name][k] = {"wall_median": statistics.median(w), "wall_spread": [min(w), max(w)]}
        summary[name]["stream"]["batch_seconds_median"] = statistics.median(
            x["stream"]["batch_seconds_median"] for x in v)
        summary[name]["stream"]["batches"] = v[0]["stream"]["batches"]
        summary[name]["startup_seconds_median"] = statistics.median(x["startup_seconds"] for x in v)
    for k in ("interval", "stream"):
        summary[f"cluster_vs_local_{k}"] = summary["cluster"][k]["wall_median"] / summary["local[2]"][k]["wall_median"]
    doc = {"benchmark": "cluster", "machine": machine(), "load_before": load_before, "load_after": os.getloadavg(),
           "git_commit": git_commit(PROJECT), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "versions": {"python": sys.version.split()[0], "pyspark": __import__("pyspark").__version__},
           "parameters": {"sf": sf, "rounds": rounds, "query": QUERY, "buckets": 16, "shuffle_partitions": 4,
                          "files_per_batch": FILES_PER_BATCH, "stream_driver_rows": 0,
                          "cluster": st["config"], "local": "local[2]"},
           "identical_results": len(fps) == 1, "fingerprint": json.loads(next(iter(fps))) if len(fps) == 1 else None,
           "summary": summary, "runs": runs}
    out = HERE / "results" / f"cluster{'-quick' if args.quick else ''}{args.suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(summary, indent=1))
    print(f"identical results: {doc['identical_results']}; written {out}")
    return 0 if doc["identical_results"] else 1


if __name__ == "__main__":
    sys.exit(main())
