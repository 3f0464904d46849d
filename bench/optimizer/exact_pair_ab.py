"""exact's search time, this tree's DP against an earlier commit's, interleaved in one process.

    flock /tmp/mjoin-bench.lock .venv/bin/python bench/optimizer/exact_pair_ab.py --base-commit <rev> \\
        --out bench/optimizer/results/exact-ab-faster.json

Only ``mjoin/optimizer/exact.py`` may differ between the two (the script checks that nothing else under
``include/mjoin/optimizer`` and ``include/mjoin/model`` does): the earlier version is loaded from ``git show`` beside this
tree's. On the optimizer benchmark's several-class random graphs (``classes.py``'s timing part: the ``random`` shape,
three predicate labels, seed 0, graphs 0.. of each n) it times ``exact_dp`` of each version in turn, ``--repeats``
pairs per graph, alternating which goes first, so both see the same load: per graph the lowest CPU time of each and
the median of the pairs' ratios (before / after), and whether both return the same orders and costs.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "include"))

from mjoin.engine.metrics import git_commit, machine  # noqa: E402
from mjoin.optimizer import exact as after  # noqa: E402
from mjoin.optimizer.cost import CostModel, JoinProblem  # noqa: E402
from mjoin.optimizer.synthetic import query_from_edges, random_edges, random_statistics  # noqa: E402


def load_base(rev: str):
    other = subprocess.run(["git", "-C", str(ROOT), "diff", "--name-only", rev, "--", "include/mjoin/optimizer",
                            "include/mjoin/model"], capture_output=True, text=True, check=True).stdout.split()
    if set(other) - {"include/mjoin/optimizer/exact.py"}:
        raise SystemExit(f"more than exact.py differs from {rev}: {other}")
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:include/mjoin/optimizer/exact.py"],
                         capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "exact_base.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("exact_base", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-commit", required=True)
    ap.add_argument("--ns", nargs="+", type=int, default=[12, 16])
    ap.add_argument("--graphs", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=7, help="pairs per graph (n >= 16: a third of it, at least 3)")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    base = load_base(args.base_commit)
    model = CostModel()
    doc = {"benchmark": "exact_pair_ab", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "machine": machine(), "numpy": np.__version__, "git_commit": git_commit(ROOT),
           "base_commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.base_commit], capture_output=True,
                                         text=True).stdout.strip(),
           "parameters": vars(args), "load_average_before": list(os.getloadavg()), "rows": []}
    for n in args.ns:
        reps = args.repeats if n < 16 else max(3, args.repeats // 3)
        for gi in range(args.graphs):
            rng = random.Random(f"0-random-{n}-{gi}")  # bench_optimizer.run's graphs
            q = query_from_edges(n, random_edges(n, "random", rng, 3, p=0.4), name=f"random{n}")
            problem = JoinProblem.from_statistics(q, random_statistics(q, rng))
            cpu = {"before": [], "after": []}
            out = {}
            for i in range(reps):
                for label in (("before", "after") if i % 2 else ("after", "before")):
                    mod = base if label == "before" else after
                    c = time.process_time()
                    out[label] = mod.exact_dp(problem, model)
                    cpu[label].append(time.process_time() - c)
            row = {"n": n, "graph": gi, "classes": int(problem.K), "pairs": reps,
                   "cpu_before": min(cpu["before"]), "cpu_after": min(cpu["after"]),
                   "median_pair_ratio": statistics.median(b / a for b, a in zip(cpu["before"], cpu["after"])),
                   "same_orders_and_costs": out["before"] == out["after"], "load_average": os.getloadavg()[0]}
            doc["rows"].append(row)
            print(f"n={n} graph {gi}: before {row['cpu_before']:.4f} s, after {row['cpu_after']:.4f} s CPU, "
                  f"pairs' median ratio {row['median_pair_ratio']:.2f}, same {row['same_orders_and_costs']}, "
                  f"load {row['load_average']:.1f}", flush=True)
    doc["summary"] = {}
    for n in args.ns:
        sel = [r for r in doc["rows"] if r["n"] == n]
        doc["summary"][str(n)] = {
            "worst_cpu_before": max(r["cpu_before"] for r in sel), "worst_cpu_after": max(r["cpu_after"] for r in sel),
            "sum_ratio": sum(r["cpu_before"] for r in sel) / sum(r["cpu_after"] for r in sel),
            "median_pair_ratio": statistics.median(r["median_pair_ratio"] for r in sel),
            "all_same": all(r["same_orders_and_costs"] for r in sel)}
    doc["load_average_after"] = list(os.getloadavg())
    print(json.dumps(doc["summary"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
