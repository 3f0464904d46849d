"""python -m mjoin airflow-cli ...: the `airflow` command line with this project's Airflow environment."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from mjoin.commands import UserError
from mjoin.loop.airflow_env import airflow_cmd, airflow_env, ensure_db
from mjoin.loop.sqlite_writes import immediate_for

NAME = "airflow-cli"
HELP = "run an airflow command on this project's Airflow (AIRFLOW_HOME=.airflow, dags/, plugins/)"
DESCRIPTION = """Run the `airflow` command line with the environment `make airflow` uses (mjoin.loop.airflow_env):
AIRFLOW_HOME (default .airflow in the project, SQLite), this checkout's dags/ and plugins/, the
Spark connection, MJOIN_LAKE. Everything after `airflow-cli` is passed to `airflow` unchanged,
so the commands of the README work as written from any folder:

  python -m mjoin airflow-cli dags list
  python -m mjoin airflow-cli dags unpause mjoin_reoptimize
  python -m mjoin airflow-cli backfill create --dag-id mjoin_reoptimize \\
      --from-date 2026-01-01T00:10:00Z --to-date 2026-01-01T00:30:00Z --max-active-runs 1 --reprocess-behavior completed

The metadata database is created on first use. Exit code: airflow's. On SQLite, the short writes a user makes
while Airflow runs (`backfill create`, `dags trigger`, ...) take the write lock when their transactions begin
(mjoin.loop.sqlite_writes): beside the running scheduler SQLite would otherwise refuse them with "database is
locked"."""


def add_arguments(p):
    p.add_argument("--home", help="AIRFLOW_HOME (default: $AIRFLOW_HOME or .airflow in the project)")
    p.add_argument("--lake", help="lake root the DAGs use (default: MJOIN_LAKE or .lake)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the airflow command and its arguments")


def run(args) -> int:

    argv = list(args.args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise UserError("give an airflow command, e.g. python -m mjoin airflow-cli dags list")
    env = airflow_env(args.home, args.lake)
    if not (Path(env["AIRFLOW_HOME"]) / "airflow.db").exists():
        ensure_db(env)
    if env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite").startswith("sqlite") and immediate_for(argv):
        return subprocess.run([sys.executable, "-m", "mjoin.loop.sqlite_writes", *argv], env=env).returncode
    return airflow_cmd(argv, env, check=False).returncode
