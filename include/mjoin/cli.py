"""``python -m mjoin <command>``: one subcommand per module in ``mjoin.commands``.

A command module defines ``NAME``, ``HELP``, ``add_arguments(parser)`` and
``run(args) -> int``; it is found automatically, so each feature adds its own
file. Errors a user can fix (bad spec, bad plan, missing file) print one clear
line and exit 2; gate failures exit 1.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

from mjoin import commands as _commands


#: the top-level --help text (plain text: the module docstring above is reST)
DESCRIPTION = """mjoin: multi-way stream joins on Spark, re-optimized by Airflow.

Options of a command: python -m mjoin <command> --help
Exit codes: 0 ok, 1 a gate or check failed, 2 bad input (spec, plan, file, arguments)."""


class UserError(Exception):
    """An error caused by input the user can fix: printed without a traceback, exit 2."""


def _command_modules():
    mods = []
    for info in pkgutil.iter_modules(_commands.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{_commands.__name__}.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods.append(mod)
    return sorted(mods, key=lambda m: m.NAME)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mjoin", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    sub.required = True
    for mod in _command_modules():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from mjoin.model.plan import PlanError
    from mjoin.model.query import QuerySpecError
    from mjoin.model.schemas import SchemaError
    from mjoin.model.statistics import StatisticsError

    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:  # e.g. `python -m mjoin ... | head`: the reader left, not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UserError, QuerySpecError, PlanError, StatisticsError, SchemaError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
