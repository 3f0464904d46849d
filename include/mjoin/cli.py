"""``python -m mjoin <command>``: one subcommand per module in :mod:`mjoin.commands`.

A command module is found automatically, so each feature adds its own file. Only the module of the
command being run is imported: ``--help`` lists every command from the ``NAME`` and ``HELP`` constants in
its source (read with :mod:`ast`), because importing every command (and so the whole library: pandas,
pyarrow, pyspark, scipy, duckdb) made every start of the CLI cost ~1-3 s. Errors a user can fix (bad spec,
bad plan, missing file) print one clear line and exit 2; gate failures exit 1.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import logging
import os
import pkgutil
import sys
from pathlib import Path

from mjoin import commands
from mjoin.commands import UserError
from mjoin.model.plan import PlanError
from mjoin.model.query import QuerySpecError
from mjoin.model.schemas import SchemaError
from mjoin.model.statistics import StatisticsError

#: the top-level --help text (plain text: the module docstring above is reST)
DESCRIPTION = """mjoin: multi-way stream joins on Spark, re-optimized by Airflow.

Options of a command: python -m mjoin <command> --help
Exit codes: 0 ok, 1 a gate or check failed, 2 bad input (spec, plan, file, arguments)."""


def _constants(path: Path) -> dict:
    """The string constants ``NAME`` and ``HELP`` assigned at the top of a command module's source."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in ("NAME", "HELP"):
            out[node.targets[0].id] = node.value.value
    return out


def command_index() -> dict[str, tuple[str, str]]:
    """``{command name: (module name, help)}`` of every command module, without importing any."""
    index = {}
    for info in pkgutil.iter_modules(commands.__path__):
        if info.name.startswith("_"):
            continue
        const = _constants(Path(commands.__path__[0]) / f"{info.name}.py")
        if "NAME" in const:
            index[const["NAME"]] = (f"{commands.__name__}.{info.name}", const.get("HELP", ""))
    return dict(sorted(index.items()))


def _chosen(argv: list[str], names) -> str | None:
    """The command named in ``argv`` (its first argument that is not an option), if it is one."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in names else None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the arguments of the command named in ``argv`` (the only command module imported)."""
    parser = argparse.ArgumentParser(prog="python -m mjoin", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    sub.required = True
    index = command_index()
    chosen = _chosen(list(argv or []), index)
    for name, (module, help_) in index.items():
        if name != chosen:
            sub.add_parser(name, help=help_)
            continue
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_, description=getattr(mod, "DESCRIPTION", help_),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:  # e.g. `python -m mjoin ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (UserError, QuerySpecError, PlanError, StatisticsError, SchemaError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
