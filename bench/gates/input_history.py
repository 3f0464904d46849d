"""Benchmark: what judging the input against each stream's own history costs (the input gate's bounds).

A live-like lake (the live feed's TPC-DS replay, 10-s cycles, landed at once) holds `--history` minutes
before a 5-minute interval; the input gate (pyarrow engine, the DAG's cycle of 10 s) runs with its default
10 minutes of history (one footer read per earlier file, shared with the duplicate check) and with
`fraction_history=0`. Median of --repeat runs, seconds, after one warm-up (GX import and context).

Writes bench/gates/results/input-history.json (machine, versions, load, git commit, date, timings).

    python bench/gates/input_history.py [--sf 0.1 1] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "include"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, nargs="+", default=[0.1, 1.0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=str(HERE / "results" / "input-history.json"))
    args = ap.parse_args(argv)

    import great_expectations
    import pyarrow
    import scipy

    from mjoin.gates.config import GateConfig
    from mjoin.gates.input import check_input
    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query
    from mjoin.workloads.live import run_live

    query = load_query("tpcds_returns_by_address")
    rows = []
    for sf in args.sf:
        with tempfile.TemporaryDirectory() as tmp:
            now = time.time()
            run_live(f"{tmp}/lake", sf=sf, cycle=10, chunk="1h", backlog="16m", until=now - 10, workdir=f"{tmp}/w")
            lake = Lake(f"{tmp}/lake")
            end = int(now // 10) * 10 - 10
            start = end - 300
            check_input(query, lake, start, end, cycle=10)  # warm-up: GX import and context
            for label, cfg in (("history 10 min", GateConfig()), ("no history", GateConfig(fraction_history=0))):
                times, res = [], None
                for _ in range(args.repeat):
                    t = time.perf_counter()
                    res = check_input(query, lake, start, end, cycle=10, config=cfg)
                    times.append(time.perf_counter() - t)
                hist = sum((s["history"] or {}).get("rows") or 0 for s in res.details["streams"])
                rows.append({"sf": sf, "variant": label, "status": res.status, "seconds": statistics.median(times),
                             "files": res.details["files"], "interval_rows": int(sum(s["rows"] for s in res.details["streams"])),
                             "history_rows": int(hist)})
                print(f"sf {sf:g} {label:<15} {res.status:<7} {statistics.median(times):.3f} s "
                      f"({res.details['files']} files in the interval, {hist} rows of history)")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    doc = {"benchmark": "input gate with and without the streams' history", "date": datetime.now(timezone.utc).isoformat(),
           "git_commit": commit, "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                            "python": platform.python_version()},
           "load_average": os.getloadavg(), "versions": {"great_expectations": great_expectations.__version__,
                                                         "pyarrow": pyarrow.__version__, "scipy": scipy.__version__},
           "parameters": {"repeat": args.repeat, "interval_seconds": 300, "cycle_seconds": 10, "history_seconds": 600},
           "results": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
