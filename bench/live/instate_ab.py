"""The in-job statistics' share of the join's task CPU, two code trees side by side on the same lake.

    flock /tmp/mjoin-bench.lock .venv/bin/python bench/live/instate_ab.py \
        --tree before=/path/to/old/checkout --tree after=. --lake 50=/tmp/lake-sf0.1 --lake 500=/tmp/lake-sf1

Per lake (a live TPC-DS replay landed ahead, ``mjoin.workloads.live.run_live`` with 1200-s chunks: 10-s arrival
folders of the seed query's four tables) and per tree, alternating (``--runs``: before, after,
after, before): the streaming join job ``python -m mjoin run --stream --trigger availableNow --max-files-per-trigger 4
--stats-cycle 10 --buckets 16`` over the whole lake in a fresh namespace, one arrival folder (10 s of the feed)
per micro-batch, so each batch makes one 10-s cycle final as the live job does; the tree's ``include/`` first on
``PYTHONPATH`` (driver and Spark's Python workers, ``bench/abtree.py``). From each batch's metrics: the
statistics' task CPU (``job_stats.task_cpu_seconds``) over the join's own task CPU
(``job_stats.join_task_cpu_seconds``), over the batches once the window is full (the 31st on: 5-minute windows)
and over all batches. Writes ``instate-ab.json`` beside this file (or ``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))
sys.path.insert(0, str(PROJECT / "bench"))

from abtree import tree_env  # noqa: E402
from mjoin.engine.metrics import git_commit, machine, read_metrics  # noqa: E402
from mjoin.lake.layout import Lake  # noqa: E402

QUERY = "tpcds_returns_by_address"
FULL_WINDOW_BATCH = 31  # 5-minute windows, 10-s batches


def one_run(tree: str, lake: str, ns: str, args) -> dict:
    root = Path(lake) / ns
    shutil.rmtree(root, ignore_errors=True)
    load = list(os.getloadavg())
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "mjoin", "run", "--stream", "--query", QUERY, "--lake", lake,
                           "--trigger", "availableNow", "--max-files-per-trigger", "4", "--stats-cycle", "10",
                           "--buckets", str(args.buckets), "--namespace", ns],
                          capture_output=True, text=True, env=tree_env(tree), cwd=str(PROJECT))
    wall = time.monotonic() - t
    if proc.returncode:
        raise SystemExit(f"{tree} on {lake} failed:\n{proc.stderr[-3000:]}")
    recs = sorted(read_metrics(Lake(str(root)), QUERY), key=lambda r: r["batch_id"])
    js = [(r["batch_id"], r.get("job_stats") or {}) for r in recs]
    out = {"namespace": ns, "batches": len(recs), "wall_seconds": round(wall, 1), "load_average_before": load,
           "load_average_after": list(os.getloadavg()),
           "cycles_emitted": sum(len(j.get("cycles") or []) for _, j in js),
           "errors": sorted({str(e) for _, j in js for e in j.get("errors") or []})}
    for name, sel in (("full_window", [j for b, j in js if b >= FULL_WINDOW_BATCH]), ("all", [j for _, j in js])):
        stats = sum(j.get("task_cpu_seconds") or 0.0 for j in sel)
        join = sum(j.get("join_task_cpu_seconds") or 0.0 for j in sel)
        out[name] = {"batches": len(sel), "stats_task_cpu_seconds": round(stats, 4),
                     "join_task_cpu_seconds": round(join, 4), "share": round(stats / join, 4) if join else None,
                     "stats_driver_cpu_seconds": round(sum(j.get("driver_cpu_seconds") or 0.0 for j in sel), 4)}
    shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="label=path of a checkout (two)")
    ap.add_argument("--lake", action="append", required=True, help="tuples_per_s=path of a landed lake")
    ap.add_argument("--runs", type=int, default=2, help="runs per tree and lake, alternating (2: before, after, after, before)")
    ap.add_argument("--reverse", action="store_true", help="start with the second tree")
    ap.add_argument("--buckets", type=int, default=16)
    ap.add_argument("--out", default=str(HERE / "results" / "instate-ab.json"))
    args = ap.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree]
    lakes = [l.split("=", 1) for l in args.lake]
    doc = {"benchmark": "instate_ab", "date": datetime.now(timezone.utc).isoformat(), "command": " ".join(sys.argv),
           "parameters": {"query": QUERY, "stats_cycle": 10, "buckets": args.buckets, "max_files_per_trigger": 4,
                          "runs": args.runs, "reverse": args.reverse, "full_window_from_batch": FULL_WINDOW_BATCH,
                          "trees": {label: {"path": path, "commit": git_commit(path)} for label, path in trees},
                          "lakes": {rate: path for rate, path in lakes}},
           "machine": machine(), "commit": git_commit(str(PROJECT)), "points": []}
    for rate, lake in lakes:
        point = {"tuples_per_s": float(rate), "lake": lake, "runs": []}
        doc["points"].append(point)
        order = []
        for k in range(args.runs):
            order += trees if (k % 2 == 0) != args.reverse else trees[::-1]
        for i, (label, path) in enumerate(order):
            run = one_run(path, lake, f"eval/ab-{label}-{i}", args)
            run["tree"] = label
            point["runs"].append(run)
            print(f"{rate:>6}/s {label:<7} share {run['full_window']['share']} (all {run['all']['share']}) "
                  f"stats {run['full_window']['stats_task_cpu_seconds']} s join {run['full_window']['join_task_cpu_seconds']} s "
                  f"load {run['load_average_before'][0]:.1f}", flush=True)
            Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        point["median_share_full_window"] = {
            label: statistics.median(r["full_window"]["share"] for r in point["runs"] if r["tree"] == label)
            for label, _ in trees}
        point["median_share_all"] = {
            label: statistics.median(r["all"]["share"] for r in point["runs"] if r["tree"] == label)
            for label, _ in trees}
    doc["machine"]["load_average_after"] = list(os.getloadavg())
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps([{"tuples_per_s": p["tuples_per_s"], **p["median_share_full_window"]} for p in doc["points"]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
