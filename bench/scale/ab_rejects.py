"""Benchmark: the interval run with and without the reject columns on the exchange, side by side in one process
(the input path's fifth round), on the same landed data, alternating A B B A per round.

    flock /tmp/mjoin-bench.lock nice -n -5 .venv/bin/python bench/scale/ab_rejects.py --sf 1 --rounds 4
    ... --no-null-keys      # the lake without its NULL-key rows (bench_scale.drop_null_keys): no file can reject

The two ways (this tree's code both):

- ``facts``: as the engine runs: where the footers say no row of any file can be rejected, no reject columns
  cross the exchange (``--no-null-keys``); on the benchmark's lake (NULL keys in every returns file) the
  customer files' group is normalised without them and gets them as NULLs through the union;
- ``rejects``: as if every file could reject a row (``Inspected.can_reject`` always true): every group computes
  the reason and the row's JSON, and the three columns cross the exchange (the path before the footer facts).

Per density: one warm-up of each, then ``--rounds`` rounds of ``bench_scale.run_mjoin`` per way (ABBA order),
wall, phases, input share, the fingerprint of the results (must be equal). Writes
``results/rejects-ab[-nonull]-sf<sf>.json`` (machine, load before/after and per run, versions, git commit).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--densities", nargs="*", default=["dense", "sparse"])
    ap.add_argument("--no-null-keys", action="store_true")
    ap.add_argument("--work", default=None)
    args = ap.parse_args(argv)
    import bench_scale as B  # puts this tree's include/ first on sys.path

    from mjoin.engine.metrics import git_commit, machine
    from mjoin.engine.normalize import Inspected
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    work = Path(args.work or Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-rejects-{os.getpid()}")
    spark = get_spark("bench-rejects", Resources(spark_master="local[2]", shuffle_partitions=4),
                      conf={"spark.driver.memory": "6g"})
    facts = Inspected.can_reject
    ways = {"facts": facts, "rejects": lambda self, stream, paths, late_before=None: True}
    doc = {"benchmark": "rejects-ab", "sf": args.sf, "machine": machine(), "load_before": os.getloadavg(),
           "git_commit": git_commit(B.PROJECT), "versions": B.versions(), "runs": {w: [] for w in ways},
           "null_key_rows_dropped": {}}
    for density in args.densities:
        landed, man = B.workload(args.sf, density, work)
        if args.no_null_keys:
            doc["null_key_rows_dropped"][density] = B.drop_null_keys(landed)
        span = (man.start_epoch, man.end_epoch + 60)
        order = ["facts", "rejects"]
        for r in range(args.rounds + 1):  # the first: warm-up of both
            for way in (order if r % 2 else order[::-1]):
                Inspected.can_reject = ways[way]
                load = os.getloadavg()[0]
                res = B.run_mjoin(spark, landed, work / "out", span)
                Inspected.can_reject = facts
                if r:
                    doc["runs"][way].append({"density": density, "round": r, "load": load,
                                             "wall_seconds": res["wall_seconds"], "phases": res["phases"],
                                             "input_share": res["input_share"], "fingerprint": res["fingerprint"],
                                             "result_rows": res["result_rows"]})
                print(f"{density} round {r} {way}: {res['wall_seconds']:.2f}s (load {load:.1f})", flush=True)

    def ms(xs):
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}

    doc["summary"] = {w: {d: {"wall": ms([r["wall_seconds"] for r in runs if r["density"] == d]),
                              "input_share": ms([r["input_share"] for r in runs if r["density"] == d]),
                              "phases": {p: ms([r["phases"][p] for r in runs if r["density"] == d])
                                         for p in runs[0]["phases"]}}
                          for d in args.densities} for w, runs in doc["runs"].items()}
    doc["identical_results"] = {d: len({json.dumps(r["fingerprint"], sort_keys=True) for w in doc["runs"]
                                        for r in doc["runs"][w] if r["density"] == d}) == 1 for d in args.densities}
    doc["load_after"] = os.getloadavg()
    doc["parameters"] = {"rounds": args.rounds, "densities": args.densities, "no_null_keys": args.no_null_keys,
                         "local": "local[2]", "buckets": 16, "cycle_seconds": B.CYCLE, "order": "ABBA per round"}
    path = HERE / "results" / f"rejects-ab{'-nonull' if args.no_null_keys else ''}-sf{args.sf:g}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps({w: {d: {"wall": s[d]["wall"]["median"], "input_stage": s[d]["phases"]["input_stage"]["median"],
                              "operator": s[d]["phases"]["operator_stages"]["median"]} for d in s}
                      for w, s in doc["summary"].items()}, indent=1))
    print(f"wrote {path}; identical results: {doc['identical_results']}")
    spark.stop()
    return 0 if all(doc["identical_results"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
