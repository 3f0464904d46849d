"""python -m mjoin optimize: statistics + cost model -> probe orders (a plan)."""
from __future__ import annotations

import json

from mjoin.commands import UserError
from mjoin.model.query import load_query
from mjoin.model.statistics import Statistics, StatisticsError
from mjoin.model.timeutil import iso
from mjoin.optimizer.cost import CostModelError, resolve_cost_model
from mjoin.optimizer.partitioning import GROUP_COUNTS, METHODS, Cells, optimize_partitioned
from mjoin.optimizer.strategies import STRATEGIES, OptimizerError, compare, optimize
from mjoin.runtime.fsutil import read_text
from mjoin.stats.history import CELL_KINDS, read_cells

NAME = "optimize"
HELP = "choose every stream's probe order from statistics (fixed, greedy, dppick, exact, ...)"
DESCRIPTION = """Choose the probe order of every stream of a query from a statistics snapshot
(measured or forecast) under the cost model, print the orders and their estimated
costs, and write the plan (JSON, validated against the query).

  python -m mjoin optimize --query tpcds_returns_by_address --stats stats.json \\
      --strategy exact --out plan.json
  python -m mjoin optimize --query tpcds_returns_by_address --stats stats.json --compare
  python -m mjoin optimize --query Q --key-groups .lake/stats --from T0 --to T1 --strategy exact

With --key-groups, the key-to-group rule and D are chosen (PMJoin: hash, range, rate, cost
candidates priced with the cost model summed over the groups plus the per-group overhead,
out of sample) from the per-cell statistics of the history's cycles in [--from, --to); the
groups' orders come from those cells regrouped.

Costs: C_s is the expected cost of probing one new tuple of s; the plan's estimated
cost is sum_s lambda_s * C_s per second (in seconds per second with a calibrated
model, in model units with the uncalibrated defaults)."""


def add_arguments(p):
    p.add_argument("--query", required=True, help="query spec path or name")
    p.add_argument("--stats", help="statistics snapshot JSON (mjoin.model.statistics format); not with --key-groups")
    p.add_argument("--key-groups", metavar="HISTORY",
                   help="choose the key groups from the per-cell statistics of this statistics history (its root or "
                        "the query's folder) in [--from, --to)")
    p.add_argument("--from", dest="start", metavar="T0", help="--key-groups: first cycle (default: all)")
    p.add_argument("--to", dest="end", metavar="T1", help="--key-groups: end, exclusive (default: all)")
    p.add_argument("--partition-method", default="auto", choices=("auto", "hash", "range", "rate", "cost"),
                   help="--key-groups: the rule's method (default auto: the cheapest)")
    p.add_argument("--partition-groups", default="auto", metavar="D",
                   help="--key-groups: number of groups (default auto: 1, 2, 4, 8 or 16, the cheapest)")
    p.add_argument("--strategy", choices=list(STRATEGIES), metavar="NAME",
                   help="one of: " + ", ".join(STRATEGIES))
    p.add_argument("--initial-order", help="comma-separated permutation of the streams (fixed; default: spec order)")
    p.add_argument("--cost-model", metavar="FILE", help="cost model JSON (from python -m mjoin calibrate); "
                   "default: uncalibrated defaults")
    p.add_argument("--partitioning", metavar="RULE.json",
                   help="key-to-group rule (JSON); default: the statistics' own rule, else one group")
    p.add_argument("--out", metavar="PLAN.json", help="write the plan of --strategy here")
    p.add_argument("--compare", action="store_true", help="run every strategy on these statistics and print "
                   "their orders and estimated costs side by side")
    p.add_argument("--json", action="store_true", help="print the plan JSON instead of the summary")


def run(args) -> int:
    if not args.strategy and not args.compare:
        raise UserError("give --strategy NAME (or --compare)")
    if args.out and not args.strategy:
        raise UserError("--out writes the plan of --strategy: give --strategy too")
    query = load_query(args.query)
    if args.key_groups:
        if args.stats or args.compare or args.partitioning:
            raise UserError("--key-groups chooses the rule and the statistics: not with --stats, --compare, "
                            "--partitioning")
        return _key_groups(args, query)
    if not args.stats:
        raise UserError("give --stats STATS.json (or --key-groups HISTORY)")
    stats = Statistics.load(args.stats)
    try:
        model = resolve_cost_model(args.cost_model)
        partitioning = _load_rule(args.partitioning) if args.partitioning else None
        initial = args.initial_order.split(",") if args.initial_order else None
        source = {"statistics": str(args.stats)}
        if args.cost_model:
            source["cost_model"] = str(args.cost_model)
        print(f"query {query.name}: statistics {args.stats} ({stats.kind}"
              + (f", cycle {stats.cycle_start}" if stats.cycle_start else "") + ")")
        print(f"cost model: {model.describe()}")
        if args.compare:
            plans, skipped = compare(query, stats, initial_order=initial, cost_model=model,
                                     partitioning=partitioning, source=source)
            _print_comparison(query, plans, skipped)
        if args.strategy:
            plan = optimize(query, stats, args.strategy, initial_order=initial, cost_model=model,
                            partitioning=partitioning, source=source)
            if args.json:
                print(json.dumps(plan.to_json(), indent=2))
            elif not args.compare:
                _print_plan(query, stats, plan)
            if args.out:
                plan.save(args.out)
                print(f"wrote {args.out} ({plan.strategy}, estimated cost {plan.estimated_cost:.6g}/s)")
    except (OptimizerError, CostModelError, ValueError) as exc:
        raise UserError(str(exc)) from None
    return 0


def _key_groups(args, query) -> int:
    """--key-groups: choose the rule from the history's per-cell statistics, optimize its groups' orders."""
    g = str(args.partition_groups)
    if g != "auto" and not (g.isdigit() and int(g) >= 1):
        raise UserError(f"--partition-groups {g!r}: auto or a number of groups")
    try:
        model = resolve_cost_model(args.cost_model)
        cells = {}
        for kind in CELL_KINDS:
            rows = read_cells(args.key_groups, query.name, kind, start=args.start, end=args.end)
            rules = rows.attrs.get("rules") or {}
            if len(rows) and rules:
                newest = rules[max(rules)]
                keep = rows["cycle_start"].map(iso).isin({c for c, r in rules.items() if r == newest})
                cells[kind] = Cells.from_rows(kind, newest, rows[keep])
        if not cells:
            raise UserError(f"{args.key_groups} holds no per-cell statistics of {query.name} in the range "
                            "(the statistics job writes them in exact pass mode, for queries on one attribute class)")
        methods = METHODS if args.partition_method == "auto" else (args.partition_method,)
        counts = GROUP_COUNTS if g == "auto" else (1, int(g))
        plan, choice = optimize_partitioned(query, cells, args.strategy, methods=methods, counts=counts,
                                            cost_model=model, forced=g not in ("auto", "1"),
                                            source={"statistics": str(args.key_groups)})
    except (OptimizerError, CostModelError, StatisticsError, ValueError) as exc:
        raise UserError(str(exc)) from None
    print(f"query {query.name}: per-cell statistics of {args.key_groups} ("
          + ", ".join(f"{k}: {c.cycles} cycles" for k, c in cells.items()) + ")")
    print(f"cost model: {model.describe()}")
    print(choice.describe())
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    if args.out:
        plan.save(args.out)
        print(f"wrote {args.out} ({plan.strategy}, {len(plan.group_ids)} key group(s), estimated cost "
              f"{plan.estimated_cost:.6g}/s)")
    return 0


def _load_rule(path):
    try:
        rule = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON ({exc})") from None
    return rule.get("partitioning", rule) if isinstance(rule, dict) else rule


def _fmt_order(start, pairs) -> str:
    """``sr,wr,cr`` when every lookup goes from the start stream, else ``[l,r]`` pairs."""
    if all(l == start for l, _ in pairs):
        return ",".join(r for _, r in pairs)
    return " ".join(f"[{l},{r}]" for l, r in pairs)


def _print_plan(query, stats, plan):
    print(f"strategy {plan.strategy}: estimated cost {plan.estimated_cost:.6g}/s (sum of lambda_s * C_s)")
    width = max(len(s) for s in query.stream_names)
    for g in plan.group_ids:
        if len(plan.group_ids) > 1:
            print(f"  group {g}: {plan.group_costs.get(g, float('nan')):.6g}/s")
        for s in query.stream_names:
            c = plan.cost(s, g)
            lam = stats.lam(s, g)
            print(f"  {s:<{width}}  {_fmt_order(s, plan.order(s, g)):<30}  C={c:<10.4g} lambda={lam:<8.4g} "
                  f"lambda*C={lam * c:.4g}")


def _print_comparison(query, plans, skipped):
    if not plans:
        print("no strategy could run")
        return
    ref = plans.get("exact")
    groups = next(iter(plans.values())).group_ids
    for g in groups:
        if len(groups) > 1:
            print(f"group {g}:")
        streams = query.stream_names
        orders = {name: [_fmt_order(s, p.order(s, g)) for s in streams] for name, p in plans.items()}
        widths = [max(len(s), *(len(o[i]) for o in orders.values())) for i, s in enumerate(streams)]
        head = f"  {'strategy':<18} {'cost/s':>12} {'vs exact':>9}  " + "  ".join(
            f"{s:<{w}}" for s, w in zip(streams, widths))
        print(head)
        for name, p in plans.items():
            cost = p.group_costs.get(g, p.estimated_cost) if len(groups) > 1 else p.estimated_cost
            base = (ref.group_costs.get(g, ref.estimated_cost) if len(groups) > 1 else ref.estimated_cost) if ref else None
            rel = f"{(cost / base - 1) * 100:+.1f}%" if base else "-"
            print(f"  {name:<18} {cost:>12.6g} {rel:>9}  " + "  ".join(
                f"{o:<{w}}" for o, w in zip(orders[name], widths)))
    for name, why in skipped.items():
        print(f"  {name:<18} skipped: {why}")
