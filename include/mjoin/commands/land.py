"""python -m mjoin land: replay a generated workload into a lake, cycle by cycle."""
from __future__ import annotations

import json
import sys

from mjoin.commands import UserError
from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso, parse_duration
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.lander import cycles_bound, land
from mjoin.workloads.manifest import load_manifest

NAME = "land"
HELP = "land a workload's arrival cycles into a lake (idempotent, atomic per cycle)"
DESCRIPTION = """Copy the workload's arrival cycles with since <= epoch < until into
<lake>/streams/<source>/arrival=<epoch>/ (hidden temp folder, then rename). Cycles
already in the lake are skipped. Times are ISO-8601, epoch seconds, or +<duration>
from the workload's start (e.g. --until +5m).

  python -m mjoin land --workload .demo/tpcds --lake .lake --until +5m
  python -m mjoin land --workload .demo/tpcds --lake .lake --cycles 30 --since +5m
  python -m mjoin land --workload .demo/tpcds --lake .lake --all --realtime --speed 10"""


def add_arguments(p):
    p.add_argument("--workload", required=True, help="workload folder (made by `python -m mjoin generate`)")
    p.add_argument("--lake", help="lake root (default $MJOIN_LAKE or <project>/.lake)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--until", help="land cycles starting before this time")
    which.add_argument("--cycles", type=int, help="land this many cycles (from --since or the workload's start)")
    which.add_argument("--all", action="store_true", help="land every cycle")
    p.add_argument("--since", help="land cycles starting at or after this time")
    p.add_argument("--realtime", action="store_true", help="follow the simulated clock: sleep between cycles")
    p.add_argument("--speed", type=float, default=1.0, help="with --realtime: simulated seconds per wall second (default 1)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _time(value, manifest, name):
    if value is None:
        return None
    text = str(value).strip()
    if text.startswith("+"):
        try:
            return manifest.start_epoch + parse_duration(text[1:])
        except ValueError as exc:
            raise WorkloadError(str(exc), name) from None
    return text


def run(args) -> int:
    try:
        if args.speed is not None and args.speed <= 0:
            raise WorkloadError(f"{args.speed!r} must be positive", "--speed")
        manifest = load_manifest(args.workload)
        lake = Lake(args.lake) if args.lake else Lake.default()
        since = _time(args.since, manifest, "--since")
        if args.all:
            until = None
        elif args.cycles is not None:
            until = cycles_bound(manifest, args.cycles, since)
        else:
            until = _time(args.until, manifest, "--until")

        def progress(epoch, cycles):
            if args.realtime and not args.json:
                rows = sum(c.rows for c in cycles)
                print(f"{iso(epoch)}  {len(cycles)} files  {rows} rows", flush=True)

        result = land(manifest, lake, until, since=since, speed=args.speed if args.realtime else None, on_cycle=progress)
    except WorkloadError as exc:
        raise UserError(str(exc)) from None
    except KeyboardInterrupt:
        print("interrupted: every landed cycle is complete; run again to continue", file=sys.stderr)
        return 130
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.summary())
    return 0
