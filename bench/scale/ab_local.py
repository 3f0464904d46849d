"""Benchmark: the driver-local input path (``normalize.normalize_local`` + ``routing.route_local``, what a small
streaming micro-batch runs instead of a Spark job) on two code trees side by side, in alternating processes
(A B B A ...) on the same landed files.

    .venv/bin/python bench/scale/ab_local.py --base /tmp/base-tree --landed <landed lake> --files 40

``--base``: a checkout of the commit to compare against (``git archive <commit> include | tar -x -C <tree>``);
the other tree is this one. Each process inspects ``--files`` landed files (a quarter per stream of the seed
query, the first ones in arrival order), then times ``--reps`` repetitions of both calls after two warm-ups.
Writes ``results/local-ab-<tag>.json``: per tree the medians (and spread over processes), rows, columns,
load per process, machine, versions, both commits.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def worker(root: str, landed: str, nfiles: int, reps: int) -> None:
    sys.path.insert(0, str(Path(root) / "include"))
    from mjoin.engine import frame as F
    from mjoin.engine.routing import route_local
    from mjoin.engine.compiled import EngineQuery
    from mjoin.engine.inputs import as_lake, as_query
    from mjoin.engine.normalize import inspect_files, normalize_local

    q = as_query("tpcds_returns_by_address")
    eq = EngineQuery.from_query(q)
    lake = as_lake(landed)
    files = {s.name: [p for _, p, k in lake.landed(s.source) if k == "data"][:nfiles // len(q.streams)] for s in q.streams}
    # the schema route_local is given: the input layout where the tree has one, else the whole frame
    schema = F.arrow_input_schema(eq) if hasattr(F, "arrow_input_schema") else F.arrow_frame_schema(eq)
    inspected = inspect_files(q, eq, files)
    times = []
    for r in range(reps + 2):
        t0 = time.perf_counter()
        table = normalize_local(q, eq, inspected)
        t1 = time.perf_counter()
        routed = route_local(table, eq, 16, schema)
        t2 = time.perf_counter()
        if r >= 2:
            times.append((t1 - t0, t2 - t1))
    print(json.dumps({"files": sum(map(len, files.values())), "rows": table.num_rows, "columns": table.num_columns,
                      "routed_rows": routed.num_rows, "routed_columns": routed.num_columns,
                      "normalize_seconds": statistics.median(a for a, _ in times),
                      "route_seconds": statistics.median(b for _, b in times), "load": os.getloadavg()[0],
                      "mjoin_module": sys.modules["mjoin"].__file__}), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--landed", required=True, help="a landed lake (e.g. bench_scale.py's sf 1 sparse replay)")
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--tag", default="")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.landed, args.files, args.reps)
        return 0
    sys.path.insert(0, str(HERE))
    import bench_scale as B

    from mjoin.engine.metrics import git_commit, machine

    trees = {"base": str(Path(args.base).resolve()), "this": str(HERE.parent.parent)}
    runs: dict = {k: [] for k in trees}
    load_before = os.getloadavg()
    for b in range(args.blocks):
        for name in ("base", "this", "this", "base"):
            out = subprocess.run([sys.executable, __file__, "--worker", trees[name], "--base", args.base,
                                  "--landed", args.landed, "--files", str(args.files), "--reps", str(args.reps)],
                                 capture_output=True, text=True, check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(name, runs[name][-1], flush=True)

    def ms(xs):
        return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}

    doc = {"benchmark": "local-ab", "machine": machine(), "load_before": load_before, "load_after": os.getloadavg(),
           "git_commit": git_commit(HERE), "versions": B.versions(), "trees": trees,
           "parameters": {"files": args.files, "reps": args.reps, "blocks": args.blocks, "landed": args.landed,
                          "order": "ABBA per block; each process: 2 warm-ups, then the median of --reps"},
           "summary": {k: {"normalize_seconds": ms([r["normalize_seconds"] for r in v]),
                           "route_seconds": ms([r["route_seconds"] for r in v]),
                           "rows": v[0]["rows"], "columns": v[0]["columns"], "routed_columns": v[0]["routed_columns"]}
                       for k, v in runs.items()},
           "runs": runs}
    path = HERE / "results" / f"local-ab{'-' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc["summary"], indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
