"""python -m mjoin quarantine: what the join engine did not join (list, show) and its replay."""
from __future__ import annotations

import json

from mjoin.commands import UserError
from mjoin.engine import quarantine as qmod
from mjoin.lake.layout import Lake
from mjoin.model.query import load_query
from mjoin.runtime.resources import Resources

NAME = "quarantine"
HELP = "quarantined files and rows of a query: list them, show one, replay a fixed file or rows as a new arrival"
DESCRIPTION = """Files rejected whole by a rule of the landing contract (unreadable, missing_key,
schema_mismatch, no_event_time, duplicate_file) and rows rejected one by one (null_key, bad_type,
bad_time, late), as the join engine quarantined them under <lake>[/<namespace>]/quarantine/<query>/.

  python -m mjoin quarantine list   --query Q [--lake L] [--namespace NS] [--json]
  python -m mjoin quarantine show   --query Q ID [--limit 20]
  python -m mjoin quarantine replay --query Q ID [--with FIXED.parquet]

replay lands the fixed file (for a rejected file: required) or the quarantined rows themselves
(for a row set, unless --with gives fixed ones) into the lake as a new arrival of the stream's
source, exactly once per ID. The streaming job reads it like any landed file: rows below its
watermark by then are late again (a query with more lateness accepts them); an interval run over
their event time joins them. Exit 2 for an unknown or already replayed ID or a fixed file that
breaks a contract rule."""


def add_arguments(p):
    p.add_argument("action", choices=("list", "show", "replay"))
    p.add_argument("id", nargs="?", help="entry id (from list): f-... for a file, r-<stream>-<batch>-<reason> for rows")
    p.add_argument("--query", required=True, help="query spec (YAML path or name)")
    p.add_argument("--lake", help="lake root (default $MJOIN_LAKE or <project>/.lake)")
    p.add_argument("--namespace", default="", help="lake namespace of the run that quarantined them")
    p.add_argument("--with", dest="fixed", help="replay: the fixed file (Parquet) to land instead")
    p.add_argument("--limit", type=int, default=20, help="show: rows to print")
    p.add_argument("--by", default="cli", help="replay: who replays (recorded)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    query = load_query(args.query)
    lake = Lake(args.lake or Resources.from_env().lake, args.namespace)
    try:
        if args.action == "list":
            items = qmod.entries(lake, query)
            if args.json:
                print(json.dumps({"entries": [e.to_json() for e in items], "summary": qmod.summary(items)}, indent=1))
                return 0
            if not items:
                print(f"nothing quarantined for {query.name} in {lake.quarantine(query.name)}")
                return 0
            print(f"{'id':<34} {'batch':>5} {'stream':<8} {'reason':<16} {'rows':>7}  detail")
            for e in items:
                done = f" [replayed {e.replayed['at']}]" if e.replayed else ""
                what = f"{e.rule}: {e.detail} ({e.path})" if e.kind == "file" else e.path
                print(f"{e.id:<34} {e.batch:>5} {e.stream:<8} {e.reason:<16} {e.rows if e.rows is not None else '-':>7}  "
                      f"{what}{done}")
            return 0
        if not args.id:
            raise UserError(f"quarantine {args.action} needs an entry id (python -m mjoin quarantine list)")
        if args.action == "show":
            e = qmod.find(lake, query, args.id)
            doc = e.to_json()
            if e.kind == "rows":
                rows = qmod.rows_of(e, query)
                doc["sample"] = rows.slice(0, args.limit).to_pylist()
            print(json.dumps(doc, indent=1, default=str))
            return 0
        record = qmod.replay(lake, query, args.id, args.fixed, by=args.by)
        print(json.dumps(record, indent=1) if args.json else
              f"replayed {record['id']}: {record['rows']} rows landed as {record['landed']}")
        return 0
    except qmod.QuarantineError as exc:
        raise UserError(str(exc)) from None
