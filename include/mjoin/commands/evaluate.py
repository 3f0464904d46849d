"""python -m mjoin evaluate: what would each strategy have cost on the same history?"""
from __future__ import annotations

import json
from itertools import permutations

from mjoin.commands import UserError
from mjoin.evaluation.evaluate import STRATEGIES, EvalConfig, EvaluationError, check_has_data, evaluate
from mjoin.evaluation.report import format_summary
from mjoin.model.query import load_query, stream_order_from
from mjoin.runtime.resources import Resources
from mjoin.runtime.spark import get_spark

NAME = "evaluate"
HELP = "cost every strategy's plans and the hindsight oracle on historical intervals (Spark)"
DESCRIPTION = """For each interval of [--from, --to) (length --period), build the plan of every
strategy from statistics known before the interval (Holt forecast; last value for
dppick_nosmooth), and the hindsight oracle's plan from the interval's own statistics;
run every distinct plan with the engine's interval evaluation on the same data and
measure it, --repeats rounds (engine CPU, probe work = lookups + matches, engine
seconds); the summary ranks the strategies by their engine CPU (the median over the
rounds of the total over the intervals, min-max beside it). exact_pmjoin and
oracle_pmjoin choose PMJoin key groups (rule and D) as the re-optimization loop does;
the last column says how many groups each interval's plan had. Writes a table, a
summary and an HTML report with plots to <lake>/<namespace>/reports/<query>/evaluation/."""


def add_arguments(p):
    p.add_argument("--query", required=True, help="query spec (YAML path or name)")
    p.add_argument("--lake", help="lake root (default $MJOIN_LAKE or <project>/.lake)")
    p.add_argument("--from", dest="start", required=True, metavar="T0", help="first interval start (ISO-8601 or epoch)")
    p.add_argument("--to", dest="end", required=True, metavar="T1", help="end of the last interval, exclusive")
    p.add_argument("--period", default="5m", help="interval length (default 5m)")
    p.add_argument("--cycle", default="10s", help="statistics cycle tau (default 10s)")
    p.add_argument("--batch", default="0", help="engine batch length for the runs (default: = --cycle)")
    p.add_argument("--length", type=int, default=60, help="L: cycles the forecast reads (default 60)")
    p.add_argument("--strategies", default=",".join(STRATEGIES), help=f"comma list (default all: {','.join(STRATEGIES)})")
    p.add_argument("--initial-order", action="append", default=[], metavar="a,b,c",
                   help="initial stream order for fixed (repeatable; 'all' = every permutation)")
    p.add_argument("--namespace", default="eval/evaluate", help="lake namespace for all outputs (default eval/evaluate)")
    p.add_argument("--cost-model", default="", help="calibrated cost model JSON")
    p.add_argument("--stats-mode", choices=("exact", "sketch"), default="exact")
    p.add_argument("--reuse-stats", action="store_true", help="reuse the namespace's statistics history")
    p.add_argument("--repeats", type=int, default=EvalConfig.repeats,
                   help="rounds: runs of every distinct plan per interval; the summary ranks by the median engine CPU, "
                        "with the rounds' spread (default %(default)s)")
    p.add_argument("--buckets", type=int, default=0, help="engine key buckets (default: engine default)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def initial_orders(query, specs: list[str]) -> tuple:

    out = []
    for spec in specs:
        if spec == "all":
            out += [list(p) for p in permutations(query.stream_names)]
        else:
            out.append(stream_order_from(query, spec.split(",")))
    return tuple(out)


def run(args) -> int:
    query = load_query(args.query)
    try:  # a bad range, or one without data, is the user's error (exit 2), found before Spark starts
        cfg = EvalConfig(query=args.query, lake=args.lake or Resources.from_env().lake, start=args.start, end=args.end,
                         period=args.period, cycle=args.cycle, batch=args.batch, length=args.length,
                         strategies=tuple(s.strip() for s in args.strategies.split(",") if s.strip()),
                         initial_orders=initial_orders(query, args.initial_order), namespace=args.namespace,
                         cost_model=args.cost_model, stats_mode=args.stats_mode, reuse_stats=args.reuse_stats,
                         repeats=args.repeats, buckets=args.buckets)
        check_has_data(cfg, query)
    except EvaluationError as exc:
        raise UserError(str(exc)) from None
    spark = get_spark("mjoin-evaluate")
    result = evaluate(spark, cfg)
    if args.json:
        print(json.dumps({"summary": result.summary, "report": result.report_dir}, indent=2, default=str))
    else:
        print(format_summary(result.summary))
        print(f"report: {result.report_dir}/index.html")
    return 0
