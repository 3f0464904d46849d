"""Airflow's command line with SQLite transactions that take the write lock when they begin.

Why: the embedded profile keeps Airflow's metadata in SQLite (WAL mode). A transaction there begins as a
reader and becomes a writer at its first INSERT; if another process (the running scheduler, every second or
so) committed in between, SQLite refuses the upgrade at once with "database is locked", without waiting
(SQLITE_BUSY_SNAPSHOT: waiting could not help, the transaction has read a stale snapshot). ``airflow backfill
create`` reads the DAG for seconds before its first INSERT, so beside a running scheduler it failed that way,
and left an empty backfill row behind (Airflow cleans one up only for PostgreSQL's and MySQL's lock errors).
``BEGIN IMMEDIATE`` takes the write lock first, waiting for it up to the connection's timeout
(``airflow_env.SQLITE_CONNECT_ARGS``, 60 s), so the transaction's reads and writes see one state and its
writes are never refused. This is SQLAlchemy's documented recipe for pysqlite ("Serializable isolation /
Savepoints / Transactional DDL"), applied to the short commands a user runs while Airflow runs (:data:`WRITES`),
not to Airflow's services or migrations.

Run as ``python -m mjoin.loop.sqlite_writes <airflow arguments>``: this imports no Airflow module itself, it
runs Airflow's ``__main__`` the way the ``airflow`` executable does.
"""
from __future__ import annotations

import runpy
import sqlite3
import sys

from sqlalchemy import event
from sqlalchemy.engine import Engine

#: command groups (and ``dags`` subcommands) whose transactions begin IMMEDIATE: short metadata writes a user
#: makes beside the running scheduler (``dags test`` runs a whole DAG in one process and is left alone)
WRITES = {"backfill", "variables", "connections", "pools"}
DAGS_WRITES = {"trigger", "pause", "unpause", "delete"}


def immediate_for(argv: list[str]) -> bool:
    """Whether ``airflow <argv>`` is one of the short metadata writes run with IMMEDIATE transactions."""
    return bool(argv) and (argv[0] in WRITES or (argv[0] == "dags" and len(argv) > 1 and argv[1] in DAGS_WRITES))


def begin_immediate() -> None:
    """From now on every pysqlite connection of this process begins its transactions with ``BEGIN IMMEDIATE``
    (pysqlite's own deferred, DML-only BEGIN switched off; savepoints then work as written, too)."""

    @event.listens_for(Engine, "connect")
    def _no_implicit_begin(dbapi_connection, _record):
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.isolation_level = None

    @event.listens_for(Engine, "begin")
    def _begin_immediate(conn):
        if conn.dialect.name == "sqlite" and conn.dialect.driver == "pysqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")


def main(argv: list[str]) -> None:
    """``airflow <argv>``, with IMMEDIATE transactions when :func:`immediate_for` says so."""
    if immediate_for(argv):
        begin_immediate()
    sys.argv = ["airflow", *argv]
    runpy.run_module("airflow", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
