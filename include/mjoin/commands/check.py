"""python -m mjoin check {input,stats,forecast,plan}: run one data-quality gate from a shell."""
from __future__ import annotations

import dataclasses
import json
import logging

import yaml

from mjoin.commands import UserError
from mjoin.gates.config import GateConfig, GateConfigError
from mjoin.gates.forecast import check_forecast
from mjoin.gates.frames import UNKNOWN
from mjoin.gates.history import read_history
from mjoin.gates.input import check_input
from mjoin.gates.plan import check_plan, model_cost_fn
from mjoin.gates.stats import StatisticsGateError, check_statistics
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.model.query import load_query
from mjoin.model.statistics import Statistics
from mjoin.model.timeutil import parse_duration, parse_time
from mjoin.runtime import fsutil
from mjoin.runtime.fsutil import read_text

NAME = "check"
HELP = "run a data-quality gate (input, stats, forecast, plan) and print the failed expectations"
DESCRIPTION = """Run one gate of the re-optimization loop outside Airflow.

  check input    --query Q --lake DIR --from T0 --to T1 [--cycle S] [--engine pyarrow|spark]
  check stats    --query Q (--history DIR | --lake DIR) --from T0 --to T1 [--cycle S] [--partitioning P]
  check forecast --query Q --forecast F.json (--history DIR | --lake DIR) [--partitioning P]
  check plan     --query Q --plan P.json [--active A.json | --lake DIR] [--stats S.json]

Thresholds: --set key=value (repeatable) and/or --config FILE (JSON or YAML mapping);
see docs/gates.md for the keys. --json OUT writes the result (with the GX results).

Exit 0: passed, or "no change" (the plan is not enough better than the active one);
exit 1: the gate failed (the failed expectations are printed); exit 2: bad arguments."""


def add_arguments(p):
    sub = p.add_subparsers(dest="gate", metavar="{input,stats,forecast,plan}")
    sub.required = True

    def common(sp):
        sp.add_argument("--query", required=True, help="query spec path or name")
        sp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a gate threshold (repeatable)")
        sp.add_argument("--config", help="JSON or YAML file of threshold overrides")
        sp.add_argument("--json", dest="json_out", metavar="OUT", help="write the machine-readable result here")
        sp.add_argument("--quiet", action="store_true", help="print only the status line")

    sp = sub.add_parser("input", help="raw landed files of an interval")
    common(sp)
    sp.add_argument("--lake", required=True, help="lake root (folder or URL)")
    sp.add_argument("--from", dest="start", required=True, help="interval start (ISO-8601 or epoch seconds)")
    sp.add_argument("--to", dest="end", required=True, help="interval end (exclusive)")
    sp.add_argument("--cycle", help="statistics cycle (e.g. 60s): rows are required per cycle, not per interval")
    sp.add_argument("--engine", choices=("pyarrow", "spark"), help="how key and event-time columns are scanned")

    sp = sub.add_parser("stats", help="statistics history of an interval")
    common(sp)
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("--history", help="statistics history: Parquet folder/file or JSON snapshot(s)")
    src.add_argument("--lake", help="lake root: reads <lake>/stats/<query>/")
    sp.add_argument("--from", dest="start", required=True, help="interval start")
    sp.add_argument("--to", dest="end", required=True, help="interval end (exclusive)")
    sp.add_argument("--cycle", help="statistics cycle (default: cycle_seconds recorded in the rows)")
    partitioning_arg(sp)

    sp = sub.add_parser("forecast", help="a forecast against the recent history")
    common(sp)
    sp.add_argument("--forecast", required=True, help="forecast statistics JSON")
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("--history", help="statistics history: Parquet folder/file or JSON snapshot(s)")
    src.add_argument("--lake", help="lake root: reads <lake>/stats/<query>/")
    partitioning_arg(sp)

    sp = sub.add_parser("plan", help="a candidate plan against the query and the active plan")
    common(sp)
    sp.add_argument("--plan", required=True, help="candidate plan JSON")
    act = sp.add_mutually_exclusive_group()
    act.add_argument("--active", help="the active plan JSON (default: none, or the registry's with --lake)")
    act.add_argument("--lake", help="lake root: the active plan is the registry's ACTIVE")
    sp.add_argument("--stats", help="statistics JSON (the forecast) to cost both plans with mjoin.optimizer.cost; "
                                    "without it the plans' recorded estimated_cost are compared")


def partitioning_arg(sp):
    sp.add_argument("--partitioning", metavar="P",
                    help="the key groups every cycle must hold: a number of groups, 'none' (one group), a partitioning "
                         "rule as JSON, or a plan JSON file (its partitioning); default: the partitioning the stats "
                         "job recorded per cycle, else the groups present")


def _partitioning(args):
    """The --partitioning value as the gates take it (UNKNOWN when not given)."""

    text = getattr(args, "partitioning", None)
    if text is None:
        return UNKNOWN
    text = text.strip()
    if text.lower() in ("none", "null", ""):
        return None
    if text.isdigit():
        return int(text)
    try:
        doc = json.loads(fsutil.read_text(text) if fsutil.exists(text) else text)
    except (ValueError, OSError) as exc:
        raise UserError(f"--partitioning {text!r}: not a number, 'none', a JSON rule or a plan file ({exc})") from None
    if isinstance(doc, dict) and "groups" in doc and isinstance(doc.get("groups"), list):  # a plan document
        return doc.get("partitioning")
    return doc


def _config(args):
    base = {}
    if args.config:

        try:
            base = yaml.safe_load(read_text(args.config)) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"--config {args.config}: not JSON or YAML ({exc})") from None
        if not isinstance(base, dict):
            raise UserError(f"--config {args.config}: must be a mapping of setting: value")
    try:
        return GateConfig.from_pairs(args.overrides, GateConfig.from_dict(base))
    except GateConfigError as exc:
        raise UserError(str(exc)) from None


def run(args) -> int:
    if not getattr(args, "verbose", False):  # the summary is printed below; the log line would repeat it
        logging.getLogger("mjoin.gates").setLevel(logging.ERROR)
    _check_times(args)
    query = load_query(args.query)
    cfg = _config(args)
    try:
        result = _GATES[args.gate](args, query, cfg)
    except (GateConfigError, StatisticsGateError) as exc:
        raise UserError(str(exc)) from None
    if args.json_out:
        result.save(args.json_out)
    print(result.summary().splitlines()[0] if args.quiet else result.summary())
    if result.no_change:
        print("no change: the active plan stays")
    return 0 if result.ok else 1


def _check_times(args) -> None:
    """--from, --to, --cycle readable (exit 2 naming the flag, not a traceback)."""
    for flag, attr in (("--from", "start"), ("--to", "end")):
        if getattr(args, attr, None) is not None:
            try:
                parse_time(getattr(args, attr))
            except ValueError as exc:
                raise UserError(f"{flag}: {exc}") from None
    if getattr(args, "cycle", None) is not None:
        try:
            seconds = parse_duration(args.cycle)
        except ValueError as exc:
            raise UserError(f"--cycle: {exc}") from None
        if seconds <= 0:
            raise UserError("--cycle must be positive")


def _duration(text):
    return None if text is None else parse_duration(text)


def _history(args, query):
    return read_history(args.history if args.history else Lake(args.lake).stats(query.name))


def _input(args, query, cfg):


    lake = Lake(args.lake)
    if not fsutil.is_dir(lake.streams()):
        raise UserError(f"--lake {args.lake}: no landed streams there ({lake.streams()} does not exist)")
    if args.engine:
        cfg = dataclasses.replace(cfg, input_engine=args.engine)
    return check_input(query, lake, args.start, args.end, cycle=_duration(args.cycle), config=cfg)


def _stats(args, query, cfg):
    return check_statistics(query, _history(args, query), args.start, args.end, _duration(args.cycle), config=cfg,
                            partitioning=_partitioning(args))


def _forecast(args, query, cfg):
    return check_forecast(query, args.forecast, _history(args, query), config=cfg, partitioning=_partitioning(args))


def _plan(args, query, cfg):
    active = None
    if args.active:
        active = args.active
    elif args.lake:
        active = PlanRegistry(Lake(args.lake), query.name).active()
    cost_fn = model_cost_fn(query, Statistics.load(args.stats)) if args.stats else None
    return check_plan(query, args.plan, active=active, cost_fn=cost_fn, config=cfg)


_GATES = {"input": _input, "stats": _stats, "forecast": _forecast, "plan": _plan}
