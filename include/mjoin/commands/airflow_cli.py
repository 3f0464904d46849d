"""python -m mjoin airflow-cli ...: the `airflow` command line with this project's Airflow environment."""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from mjoin.commands import UserError
from mjoin.loop.airflow_env import airflow_cmd, airflow_env, ensure_db

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

The metadata database is created on first use. Exit code: airflow's. On SQLite, `backfill create` (one
transaction) is tried again, up to 3 times, when SQLite answers "database is locked": it can refuse the write
of a transaction that has already read while the running scheduler writes, however long it waits for the
lock (nothing was created then)."""

#: attempts of a ``backfill create`` that SQLite refused with "database is locked" (nothing created: one transaction)
LOCKED_ATTEMPTS = 3
LOCKED = "database is locked"


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
    if argv[:2] == ["backfill", "create"] and "--dry-run" not in argv and \
            env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite").startswith("sqlite"):
        return _retry_locked(argv, env)
    return airflow_cmd(argv, env, check=False).returncode


def _retry_locked(argv: list[str], env: dict) -> int:
    """``airflow <argv>`` with its output passed through as it comes, run again (up to :data:`LOCKED_ATTEMPTS` in
    all) while it fails with SQLite's "database is locked"."""
    exe = str(Path(sys.executable).parent / "airflow")
    for attempt in range(1, LOCKED_ATTEMPTS + 1):
        proc = subprocess.Popen([exe, *argv], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        locked = False
        for line in proc.stdout:
            sys.stdout.write(line)
            locked = locked or LOCKED in line
        rc = proc.wait()
        if rc == 0 or not locked or attempt == LOCKED_ATTEMPTS:
            return rc
        print(f"airflow-cli: SQLite refused the write ({LOCKED}; nothing was created): trying again "
              f"({attempt + 1}/{LOCKED_ATTEMPTS})", flush=True)
        time.sleep(2 * attempt)
    return rc
