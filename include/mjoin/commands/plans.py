"""python -m mjoin plans: the plan registry (list, show, publish, activate, rollback, repair)."""
from __future__ import annotations

import json

from mjoin.commands import UserError
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry, RegistryError
from mjoin.model.plan import load_plan
from mjoin.model.query import load_query
from mjoin.runtime.resources import Resources

NAME = "plans"
HELP = "plan registry: list versions, show one, publish a plan file, activate a version, roll back, repair"
DESCRIPTION = """Operate the versioned plan registry of a query (<lake>[/<namespace>]/plans/<query>/).
A running join job picks up a newly activated version at its next batch boundary.

  python -m mjoin plans list     --query Q [--lake L] [--namespace NS]
  python -m mjoin plans show     --query Q [--version N]          (default: the active one)
  python -m mjoin plans publish  --query Q --plan PLAN.json [--activate]
  python -m mjoin plans activate --query Q --version N
  python -m mjoin plans rollback --query Q                        (undo the last activation)
  python -m mjoin plans repair   --query Q                        (fix a damaged ACTIVE pointer)

activate and rollback check the target plan against the query as publish does.
rollback follows the activation log as a stack: rolling back twice goes two activations
back and never re-activates a version a rollback undid (docs/orchestration.md).
list marks a version whose file is damaged, and a damaged ACTIVE pointer. repair points a
damaged ACTIVE (or one naming a plan that cannot run) at the newest valid activation of the
log, or removes it when there is none; activate over a damaged ACTIVE replaces it too."""


def add_arguments(p):
    p.add_argument("action", choices=("list", "show", "publish", "activate", "rollback", "repair"))
    p.add_argument("--query", required=True, help="query spec (YAML path or name)")
    p.add_argument("--lake", help="lake root (default $MJOIN_LAKE or <project>/.lake)")
    p.add_argument("--namespace", default="", help="lake namespace (e.g. eval/backfill)")
    p.add_argument("--version", type=int, help="plan version (show, activate; rollback: only if vN is still active)")
    p.add_argument("--plan", help="plan JSON to publish")
    p.add_argument("--activate", action="store_true", help="publish: also activate it")
    p.add_argument("--by", default="cli", help="who made the change (recorded in the activation log)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args) -> int:
    query = load_query(args.query)
    lake = Lake(args.lake or Resources.from_env().lake, args.namespace)
    reg = PlanRegistry(lake, query.name)
    try:
        if args.action == "list":
            hist = reg.history()
            pointer = reg.pointer_problem()
            if args.json:
                print(json.dumps({"active": None if pointer else reg.active_version(), "active_damaged": pointer,
                                  "versions": hist, "activations": reg.activations()}, indent=2, default=str))
                return 0
            if not hist:
                print(f"{query.name}: no plans in {reg.root}")
            for h in hist:
                if h["damaged"]:
                    print(f"{'*' if h['active'] else ' '} v{h['version']:<4} DAMAGED: {h['damaged']}")
                    continue
                cost = f"{h['estimated_cost']:.6g}" if h["estimated_cost"] is not None else "-"
                print(f"{'*' if h['active'] else ' '} v{h['version']:<4} {h['strategy']:<18} {h['created_at']}  cost {cost}"
                      f"  run {h['run'] or '-'}")
            if pointer:
                print(f"ACTIVE DAMAGED: {pointer}")
        elif args.action == "show":
            version = args.version or reg.active_version()
            if version is None:
                raise UserError(f"{query.name}: no active plan; give --version")
            plan = reg.get(version, query)
            print(plan.dumps() if args.json else plan.describe())
            if not args.json:
                print(json.dumps(reg.lineage(version), indent=2, default=str))
        elif args.action == "publish":
            if not args.plan:
                raise UserError("publish needs --plan PLAN.json")
            version = reg.publish(load_plan(args.plan, query), {"run": args.by, "source_file": args.plan}, query)
            print(f"published {query.name} v{version}")
            if args.activate:
                reg.activate(version, by=args.by, reason="plans publish --activate")
                print(f"activated v{version}")
        elif args.action == "activate":
            if args.version is None:
                raise UserError("activate needs --version N")
            rec = reg.activate(args.version, by=args.by, query=query)
            was = f"was v{rec.previous}" if rec.previous is not None else "no valid ACTIVE before"
            print(f"activated {query.name} v{rec.version} ({was})")
        elif args.action == "repair":
            rec, changed = reg.repair(by=args.by, query=query)
            if rec is None:
                print(f"{query.name}: no valid plan on the activation log: " + (
                    "ACTIVE removed (the join job runs its fallback plan)" if changed else "no ACTIVE, nothing to repair"))
            elif changed:
                print(f"repaired {query.name}: ACTIVE -> v{rec.version}")
            else:
                print(f"{query.name}: ACTIVE is fine (v{rec.version}): nothing to repair")
        else:
            expect = args.version  # --version N: roll back only while vN is active
            rec = reg.rollback(by=args.by, expect_active=expect, query=query)
            print(f"rolled {query.name} back to v{rec.version} (was v{rec.previous})")
    except RegistryError as exc:
        raise UserError(str(exc)) from None
    return 0
