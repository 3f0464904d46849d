"""python -m mjoin feed: land a generated workload into a lake in real time at a chosen rate (staged ahead)."""
from __future__ import annotations

import json
import math
import os
import sys
import time

from mjoin.commands import UserError
from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso, parse_duration
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.feeder import achieved, prepare_feed, read_record, run_feed

NAME = "feed"
HELP = "land a workload in real time at a chosen rate (up to hundreds of thousands of tuples/s), staged ahead"
DESCRIPTION = """Re-chunk a generated workload into arrival folders of --rate tuples/s (all sources together,
event times on the wall clock; --pace replay: lanes of the replay with shifted keys, each key at the
replay's own pace) in <lake>/.feed-staging/, then rename each folder into <lake>/streams/<source>/arrival=<epoch>/ when
its cycle ends. Writes one JSON line per landed folder (planned and landed time, rows) to --record.

  python -m mjoin feed --workload .demo/tpcds --lake /tmp/lake --rate 100000 --duration 3m
  python -m mjoin feed --workload .demo/tpcds --lake /tmp/lake --rate 20000 --duration 10m --start +60s"""


def add_arguments(p):
    p.add_argument("--workload", required=True, help="workload folder (made by `python -m mjoin generate`)")
    p.add_argument("--lake", help="lake root, a local folder (default $MJOIN_LAKE or <project>/.lake)")
    p.add_argument("--rate", type=float, required=True, help="tuples per second over all sources")
    p.add_argument("--duration", required=True, help="feed length, e.g. 180s, 10m")
    p.add_argument("--cycle", type=int, default=10, help="arrival cycle, whole seconds (default 10)")
    p.add_argument("--start", default="+0s",
                   help="first cycle: epoch seconds or +<duration> from when staging ends (default +0s)")
    p.add_argument("--record", help="achieved-rate record, JSON lines (default <lake>/feed-record.jsonl)")
    p.add_argument("--columns", choices=("query", "all"), default="query",
                   help="keep the columns the workload's queries read (default) or all")
    p.add_argument("--pace", choices=("replay", "compressed"), default="replay",
                   help="replay (default): every key at the replay's own pace, the rate grown with the keys (lanes of "
                        "the replay, keys shifted per lane); compressed: the replay squeezed to the rate, pass after pass")
    p.add_argument("--rows-per-file", type=int, help="split each folder into files of at most this many rows")


def run(args) -> int:
    lake = Lake(args.lake) if args.lake else Lake.default()
    record = args.record or os.path.join(lake.root, "feed-record.jsonl")
    try:
        duration = parse_duration(args.duration)
        rel = str(args.start).startswith("+")
        # the event times are written into the staged files, so a relative start counts from when staging is
        # estimated to end (~0.5 M rows/s here; folders due before staging ends land at once)
        est = 10 + args.rate * duration / 5e5
        start = time.time() + est + parse_duration(args.start[1:]) if rel else float(args.start)
        start = math.ceil(start / args.cycle) * args.cycle
        print(f"staging {args.rate:g} tuples/s for {duration:g} s from {iso(start)} ...", flush=True)
        plan = prepare_feed(args.workload, lake, rate=args.rate, duration=duration, start=start, cycle=args.cycle,
                            columns=args.columns, rows_per_file=args.rows_per_file, pace=args.pace)
        print(f"staged {plan.rows} rows in {len(plan.folders)} folders ({plan.passes} passes) in "
              f"{plan.prepare_seconds:.1f} s; landing into {lake.root}", flush=True)
        run_feed(plan, record)
    except (WorkloadError, ValueError) as exc:
        raise UserError(str(exc)) from None
    except KeyboardInterrupt:
        print("stopped: every landed folder is complete", file=sys.stderr)
        return 130
    print(json.dumps(achieved(read_record(record), plan.cycle)))
    return 0
