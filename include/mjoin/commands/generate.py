"""python -m mjoin generate: make a stream workload (TPC-DS replay or synthetic drifting data)."""
from __future__ import annotations

import argparse
import json

from mjoin.commands import UserError
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.params import DEFAULT_START
from mjoin.workloads.presets import describe_presets
from mjoin.workloads.punctuations import write_punctuations
from mjoin.workloads.synthetic import generate_synthetic
from mjoin.workloads.tpcds_replay import generate_tpcds

NAME = "generate"
HELP = "generate a stream workload: TPC-DS tables replayed as streams, or synthetic drifting streams"
DESCRIPTION = """Generate a workload folder: streams/<source>/arrival=<epoch>/part-00000.parquet
(the lake's input layout), manifest.json and, for synthetic workloads, query.yaml.
Land it into a lake with `python -m mjoin land`.

  python -m mjoin generate tpcds --sf 0.1 --out .demo/tpcds
  python -m mjoin generate tpcds --sf 0.1 --out .demo/tpcds-et --replay event-time
  python -m mjoin generate synthetic --out .demo/syn --streams 4 --schedule rate-swap"""


def _common(p, default_seed=0):
    p.add_argument("--out", required=True, help="workload folder to create")
    p.add_argument("--cycle", default="10s", help="arrival-cycle length, whole seconds (default 10s)")
    p.add_argument("--start", default=None, help="start of the simulated clock, ISO-8601 or epoch (default 2026-01-01T00:00:00Z)")
    p.add_argument("--seed", type=int, default=default_seed, help="random seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing workload in --out")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON instead of a summary")


def add_arguments(p):
    sub = p.add_subparsers(dest="kind", metavar="<kind>")
    sub.required = True
    t = sub.add_parser("tpcds", help="TPC-DS customer and returns tables replayed as four streams",
                       description="TPC-DS (DuckDB dsdgen, offline, cached per scale factor) replayed as the streams "
                                   "customer, store_returns, web_returns, catalog_returns.")
    t.add_argument("--sf", type=float, default=0.1, help="TPC-DS scale factor, >= 0.01 (default 0.1)")
    t.add_argument("--replay", default="paper", choices=["paper", "event-time"],
                   help="paper: one seeded random interleaving at --rate (default); event-time: returns in TPC-DS time order")
    rate = t.add_mutually_exclusive_group()
    rate.add_argument("--rate", type=float, help="total arrival rate, tuples/s over all streams (default: the replay lasts 1h)")
    rate.add_argument("--duration", help="replay length on the simulated clock, e.g. 30m (instead of --rate)")
    rate.add_argument("--speedup", type=float, help="event-time only: calendar seconds per simulated second")
    t.add_argument("--customer-arrival", default="uniform", choices=["uniform", "start"],
                   help="event-time only: customer rows arrive uniformly over the horizon (default) or all at start")
    t.add_argument("--cache", help="dsdgen cache root (default $MJOIN_CACHE or <project>/.cache)")
    _common(t)
    t.set_defaults(_generate=_tpcds)


    y = sub.add_parser("synthetic", help="n streams with Zipf keys whose rates and match rates drift on a schedule",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Synthetic streams s0..s{n-1} (key, ts, id, payload) joined on key; rates, key "
                                   "popularity and match rates change as a schedule says.\n\npresets (--schedule), shown for 4 streams:\n"
                                   + describe_presets())
    y.add_argument("--streams", type=int, default=4, help="number of streams, 2..26 (default 4)")
    y.add_argument("--duration", default="30m", help="length on the simulated clock (default 30m)")
    y.add_argument("--rate", type=float, help="base rate, tuples/s per stream (default: the schedule's, else 20)")
    y.add_argument("--domain", type=int, help="base key domain size (default: the schedule's, else 1000)")
    y.add_argument("--schedule", default="stationary", help="a preset name or a YAML/JSON schedule file (default stationary)")
    y.add_argument("--window", default="1m", help="window of every stream in the written query.yaml (default 1m)")
    y.add_argument("--name", help="query name in query.yaml (default synthetic_<schedule>_<n>)")
    y.add_argument("--prefix", default="", help="prefix of the source folder names (default none: s0, s1, ...)")
    _common(y)
    y.set_defaults(_generate=_synthetic)

    u = sub.add_parser("punctuations", help="add punctuations to a workload: where a key's life in a stream ends",
                       description="Write punctuation files (docs/workloads.md, Punctuations) into a generated "
                                   "workload: per source, the keys whose last tuple is in an arrival cycle are "
                                   "promised to come no more, in that cycle's folder.")
    u.add_argument("--workload", required=True, help="the generated workload folder")
    u.add_argument("--source", action="append", required=True, metavar="SOURCE[:COLUMN]",
                   help="a source to punctuate, with its key column (default column: key); repeatable")
    u.add_argument("--keep-cycles", type=int, default=1,
                   help="keys still seen in the last N cycles are not promised (default 1)")
    u.add_argument("--json", action="store_true", help="print the counts as JSON")
    u.set_defaults(_generate=_punctuations)


def _tpcds(args):
    return generate_tpcds(args.out, sf=args.sf, replay=args.replay, rate=args.rate, duration=args.duration,
                          speedup=args.speedup, cycle=args.cycle, start=args.start or DEFAULT_START, seed=args.seed,
                          customer_arrival=args.customer_arrival, cache_dir=args.cache, overwrite=args.overwrite)


def _synthetic(args):
    return generate_synthetic(args.out, streams=args.streams, duration=args.duration, rate=args.rate, domain=args.domain,
                              schedule=args.schedule, window=args.window, cycle=args.cycle,
                              start=args.start or DEFAULT_START, seed=args.seed, name=args.name, prefix=args.prefix,
                              overwrite=args.overwrite)


def _punctuations(args):
    columns = dict((s.split(":", 1) + ["key"])[:2] for s in args.source)
    return write_punctuations(args.workload, columns, keep_cycles=args.keep_cycles)


def run(args) -> int:
    try:
        manifest = args._generate(args)
    except WorkloadError as exc:
        raise UserError(str(exc)) from None
    if isinstance(manifest, dict):  # punctuations: keys promised per source
        print(json.dumps(manifest) if args.json else
              "\n".join(f"{s}: {n} keys promised to end" for s, n in manifest.items()))
        return 0
    print(json.dumps(manifest.doc, indent=2, sort_keys=True) if args.json else manifest.describe())
    return 0
