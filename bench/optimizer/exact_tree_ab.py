"""exact's search time on the optimizer benchmark's random graphs (several attribute classes) for two code trees.

    .venv/bin/python bench/optimizer/exact_tree_ab.py --base /work/wt/h38 --out bench/optimizer/results/exact-ab-h38.json

Runs ``exact_dp`` once per graph (``random`` shape, n = 12 and 16, 3 graphs each: the graphs of
``bench_optimizer.py``, seed 0) in a child process per tree (this tree's ``include/`` or ``<base>/include``), so
both trees' ``mjoin`` are timed on the same graphs in one run. Written for the class-change prototype
(branch ``h38-twoclass-model``: ``rho`` as the product of the run's ``u``, exact as a Pareto DP over lines).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = r'''
import json, random, sys, time
from mjoin.cost import CostModel, JoinProblem
from mjoin.optimizers.exact import exact_dp
from mjoin.optimizers.synthetic import query_from_edges, random_edges, random_statistics
model = CostModel()
for n in (12, 16):
    for gi in range(3):
        rng = random.Random(f"0-random-{n}-{gi}")  # bench_optimizer.run's graphs
        q = query_from_edges(n, random_edges(n, "random", rng, 3, p=0.4), name=f"random{n}")
        stats = random_statistics(q, rng)
        P = JoinProblem.from_statistics(q, stats)
        t = time.perf_counter(); best = exact_dp(P, model); dt = time.perf_counter() - t
        print(json.dumps({"n": n, "graph": gi, "classes": int(P.K), "seconds": dt,
                          "cost_sum": float(sum(c for _, c in best.values()))}), flush=True)
'''


def run_tree(include: Path) -> list:
    env = dict(os.environ, PYTHONPATH=str(include))
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def commit(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the other tree (its include/ is timed)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    this, base = HERE.parent.parent, Path(args.base)
    doc = {"benchmark": "exact_tree_ab", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "python": sys.version.split()[0]},
           "goal": "exact under 0.05 s at n = 12 and under 1 s at n = 16 (bench_optimizer.py)",
           "trees": {}}
    for label, tree in (("this", this), ("base", base)):
        doc["trees"][label] = {"path": str(tree), "commit": commit(tree), "runs": run_tree(tree / "include")}
    doc["load_average_after"] = os.getloadavg()
    print(json.dumps(doc, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
