"""python -m mjoin live: a real-time TPC-DS replay landing into the lake the DAGs read."""
from __future__ import annotations

import sys

from mjoin.commands import UserError
from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.live import run_live

NAME = "live"
HELP = "feed the lake with a real-time TPC-DS replay starting now (what make airflow runs beside Airflow)"
DESCRIPTION = """Generate TPC-DS streams (the paper's replay, offline dsdgen, cached) whose event times are
wall-clock times, and land each arrival cycle into <lake>/streams/ when it ends, from now on,
one chunk after another (each chunk another seed), until Ctrl-C or --until. --backlog lands
that much history at once first, so the first scheduled run of mjoin_reoptimize has a history
to forecast from. A restart continues after the newest cycle in the lake.

  python -m mjoin live                          # into MJOIN_LAKE or .lake, sf 0.1, 10 s cycles
  python -m mjoin live --sf 1 --backlog 30m

To feed the DAGs from a real source instead, do not run this: land files as the landing
contract says (docs/workloads.md) under the lake that MJOIN_LAKE names."""


def add_arguments(p):
    p.add_argument("--lake", help="lake root (default $MJOIN_LAKE or <project>/.lake)")
    p.add_argument("--sf", type=float, default=0.1, help="TPC-DS scale factor (default 0.1: ~17 tuples/s)")
    p.add_argument("--cycle", default="10s", help="arrival cycle (default 10s; the DAG's statistics cycle)")
    p.add_argument("--chunk", default="1h", help="replay length generated at a time (default 1h)")
    p.add_argument("--backlog", default="10m", help="history landed at once before now (default 10m; 0 for none)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first chunk (default 0)")
    p.add_argument("--until", help="stop at this time (ISO-8601 or epoch seconds; default: never)")
    p.add_argument("--workdir", help="where the chunks are generated (default .cache/live)")
    p.add_argument("--quiet", action="store_true", help="no line per landed cycle")


def run(args) -> int:
    lake = Lake(args.lake) if args.lake else Lake.default()

    def progress(epoch, cycles):
        if not args.quiet:
            print(f"{iso(epoch)}  {len(cycles)} files  {sum(c.rows for c in cycles)} rows", flush=True)

    print(f"live TPC-DS sf={args.sf:g} into {lake.root} (Ctrl-C stops between cycles)", flush=True)
    try:
        feed = run_live(lake, sf=args.sf, cycle=args.cycle, chunk=args.chunk, backlog=args.backlog, seed=args.seed,
                        workdir=args.workdir, until=args.until, on_cycle=progress)
    except (WorkloadError, ValueError) as exc:
        raise UserError(str(exc)) from None
    except KeyboardInterrupt:
        print("stopped: every landed cycle is complete; run again to continue", file=sys.stderr)
        return 130
    print(f"landed {feed.cycles} cycles from {iso(feed.start)}: {feed.rows}")
    return 0
