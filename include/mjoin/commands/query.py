"""python -m mjoin query: validate and describe query specs."""
from __future__ import annotations

import json

from mjoin.model.query import list_queries, load_query

NAME = "query"
HELP = "validate a query spec and show its join graph and attribute classes"
DESCRIPTION = """Validate a query spec (YAML path or a name from include/queries/) and print
its streams, attribute classes and join-graph edges. Exit 2 naming the bad field."""


def add_arguments(p):
    p.add_argument("spec", nargs="?", help="spec path or query name (omit with --list)")
    p.add_argument("--list", action="store_true", help="list the shipped query specs")
    p.add_argument("--json", action="store_true", help="print the canonical spec as JSON")


def run(args) -> int:
    if args.list or not args.spec:
        for name in list_queries():
            print(name)
        return 0
    q = load_query(args.spec)
    print(json.dumps(q.to_spec(), indent=2) if args.json else q.describe())
    return 0
