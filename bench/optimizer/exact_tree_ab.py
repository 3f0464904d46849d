"""exact's search time on the optimizer benchmark's random graphs (several attribute classes) for two code trees.

    .venv/bin/python bench/optimizer/exact_tree_ab.py --base /work/wt/h38 --out bench/optimizer/results/exact-ab-h38.json

Runs ``exact_dp`` once per graph (``random`` shape, n = 12 and 16, 3 graphs each: the graphs of
``bench_optimizer.py``, seed 0) in a worker process per tree (``bench/abtree.py``: this tree's ``include/`` or
``<base>/include``), so both trees' ``mjoin`` are timed on the same graphs in one run, wall and CPU time. Written
for the first class-change prototype (``rho`` as the product of the run's ``u``, exact as a Pareto DP over lines in
Python: ``results/exact-ab-h38.json``); ``results/exact-ab-classes.json`` times the merged DP over lines
(docs/optimizer.md, "Strategies") against the DP before the class-change price.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from abtree import run_worker  # noqa: E402  (bench/abtree.py: one worker process per code tree)


def worker() -> None:
    """In a child process, with one tree's ``mjoin``: exact on each graph, a JSON line per graph."""
    import random
    import time

    from mjoin.optimizer.cost import CostModel, JoinProblem
    from mjoin.optimizer.exact import exact_dp
    from mjoin.optimizer.synthetic import query_from_edges, random_edges, random_statistics

    model = CostModel()
    for n in (12, 16):
        for gi in range(3):
            rng = random.Random(f"0-random-{n}-{gi}")  # bench_optimizer.run's graphs
            q = query_from_edges(n, random_edges(n, "random", rng, 3, p=0.4), name=f"random{n}")
            stats = random_statistics(q, rng)
            problem = JoinProblem.from_statistics(q, stats)
            t, c = time.perf_counter(), time.process_time()
            best = exact_dp(problem, model)
            dt, dc = time.perf_counter() - t, time.process_time() - c
            print(json.dumps({"n": n, "graph": gi, "classes": int(problem.K), "seconds": dt, "cpu_seconds": dc,
                              "cost_sum": float(sum(c for _, c in best.values()))}), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="the other tree (its include/ is timed)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker()
        return 0
    if not args.base:
        ap.error("--base is required")
    sys.path.insert(0, str(HERE.parent.parent / "include"))
    from mjoin.engine.metrics import git_commit, machine

    this, base = HERE.parent.parent, Path(args.base)
    doc = {"benchmark": "exact_tree_ab", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": machine(), "goal": "exact under 0.05 s at n = 12 and under 1 s at n = 16 (bench_optimizer.py)",
           "trees": {}}
    for label, tree in (("this", this), ("base", base)):
        doc["trees"][label] = {"path": str(tree), "commit": git_commit(tree),
                               "runs": run_worker(__file__, [], tree, label=label)}
    doc["load_average_after"] = list(os.getloadavg())
    print(json.dumps(doc, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
