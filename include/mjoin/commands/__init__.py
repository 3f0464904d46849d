"""CLI commands, one module each (``python -m mjoin <command>``, see :mod:`mjoin.cli`).

A command module defines ``NAME``, ``HELP`` (plain string constants), ``add_arguments(parser)`` and
``run(args) -> int``. Only the command a user runs is imported: the top-level ``--help`` reads every
command's ``NAME`` and ``HELP`` from its source, so a command module imports what it needs at its top.
"""
from __future__ import annotations


class UserError(Exception):
    """An error caused by input the user can fix: printed without a traceback, exit 2."""
