"""One size, three ways, alternating in one process: the engine on the Spark path (``driver_rows=0``), the
engine on the driver (``interval_driver_rows`` raised above the interval's rows) and the DuckDB one-shot
query, R rounds; results compared by fingerprint. Answers whether an interval of this size should run on the
driver (``EngineConfig.interval_driver_rows``).

    flock /tmp/mjoin-bench.lock nice -n 5 .venv/bin/python bench/scale/paths_sf.py --sf 10 --density dense --rounds 3

Writes ``results/paths-sf<sf>-<density>.json`` (machine, versions, load, git commit, one row per run); the lake
comes from ``bench_scale.workload`` (generated once into ``--work``)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_scale as B  # noqa: E402  (puts include/ and tests/ on sys.path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=10)
    ap.add_argument("--density", choices=list(B.DENSITIES), default="dense")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/tmp/scale-work")
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    from mjoin.engine.metrics import git_commit, machine
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    landed, manifest = B.workload(args.sf, args.density, Path(args.work))
    span = (int(manifest.doc["start_epoch"]), int(manifest.doc["start_epoch"]) + B.DENSITIES[args.density])
    spark = get_spark("bench-paths", Resources(spark_master="local[2]", shuffle_partitions=16),
                      conf={"spark.driver.memory": "6g"})
    out = Path(args.work) / f"paths-out-{os.getpid()}"
    doc = {"benchmark": "paths", "sf": args.sf, "density": args.density, "machine": machine(),
           "versions": B.versions(), "git_commit": git_commit(HERE.parent.parent), "load_before": os.getloadavg(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "span": span, "runs": []}
    for r in range(args.rounds):
        for name in ("spark", "driver"):
            load = os.getloadavg()[0]
            row = {"round": r, "path": name, "load": load,
                   **B.run_mjoin(spark, landed, out, span, B.engine_config(name))}
            doc["runs"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "spark_stages"}, default=str), flush=True)
        d = B.run_duckdb(landed, out, span, Path(args.work) / "spill")
        doc["runs"].append({"round": r, "path": "duckdb", "wall_seconds": d["wall_seconds"], "load": load,
                            "result_rows": d["result_rows"], "peak_rss_mb": d["peak_rss_mb"],
                            "fingerprint": d["fingerprint"]})
        print(json.dumps(doc["runs"][-1]), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    spark.stop()
    doc["load_after"] = os.getloadavg()
    doc["identical_results"] = len({json.dumps(r["fingerprint"], sort_keys=True) for r in doc["runs"]}) == 1
    path = HERE / "results" / f"paths-sf{args.sf:g}-{args.density}{'-' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
