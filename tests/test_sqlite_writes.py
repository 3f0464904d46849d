"""A backfill created with `python -m mjoin airflow-cli` while another process commits to the SQLite metadata
database every few milliseconds (what the running scheduler does) is created, whole; Airflow's own command
fails there with "database is locked" and leaves an empty backfill behind (the control arm shows the race is
real, so the test can fail)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mjoin.loop.airflow_env import airflow_cmd, airflow_env, ensure_db
from mjoin.loop.sqlite_writes import immediate_for

pytestmark = [pytest.mark.airflow]
PROJECT = Path(__file__).resolve().parent.parent


def test_which_commands_take_the_write_lock_first():
    assert immediate_for(["backfill", "create", "--dag-id", "x"])
    assert immediate_for(["dags", "trigger", "x"]) and immediate_for(["dags", "unpause", "x"])
    assert not immediate_for(["dags", "test", "x"]) and not immediate_for(["dags"])
    assert not immediate_for(["scheduler"]) and not immediate_for(["db", "migrate"]) and not immediate_for([])


class Writer:
    """Commits a small write to the metadata database every ``every`` seconds, as a busy scheduler does."""

    def __init__(self, db: Path, every: float = 0.005):
        self.db, self.every, self.commits = db, every, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        con = sqlite3.connect(self.db, timeout=60)
        con.execute("CREATE TABLE IF NOT EXISTS heartbeat (n INTEGER)")
        while not self.stop.is_set():
            con.execute("INSERT INTO heartbeat VALUES (1)")
            con.commit()
            self.commits += 1
            time.sleep(self.every)
        con.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def _backfills(db: Path) -> list[tuple]:
    con = sqlite3.connect(db, timeout=60)
    try:
        return con.execute("SELECT b.id, count(r.id) FROM backfill b LEFT JOIN backfill_dag_run r "
                           "ON r.backfill_id = b.id GROUP BY b.id ORDER BY b.id").fetchall()
    finally:
        con.close()


def _create(cmd: list[str], env: dict, start: str, end: str) -> subprocess.CompletedProcess:
    return subprocess.run([*cmd, "backfill", "create", "--dag-id", "mjoin_reoptimize", "--from-date", start,
                           "--to-date", end, "--max-active-runs", "1", "--reprocess-behavior", "completed"],
                          env=env, cwd=PROJECT, capture_output=True, text=True, timeout=600)


def test_backfill_create_beside_a_writer_is_created_whole(tmp_path):
    env = airflow_env(tmp_path / "home", str(tmp_path / "lake"))
    env["MJOIN_PERIOD_MINUTES"] = "5"
    ensure_db(env)
    airflow_cmd(["dags", "reserialize"], env, capture=True)
    db = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    airflow = [str(Path(sys.executable).parent / "airflow")]
    mjoin = [sys.executable, "-m", "mjoin", "airflow-cli", "--home", env["AIRFLOW_HOME"], "--lake",
             str(tmp_path / "lake")]
    # Airflow's own command beside the writer: refused (the race is real here), its backfill row left empty
    with Writer(db):
        plain = _create(airflow, env, "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z")
    assert plain.returncode != 0 and "database is locked" in plain.stdout + plain.stderr, \
        (plain.stdout + plain.stderr)[-2000:]
    left = _backfills(db)
    # the backfill the refused command left must not count as running for the next one (the scheduler would
    # mark it complete; here no scheduler runs)
    sqlite3.connect(db).execute("UPDATE backfill SET completed_at = CURRENT_TIMESTAMP").connection.commit()
    # through airflow-cli: created, with a run for each of the 12 periods, while the writer kept committing
    with Writer(db) as w:
        before = w.commits
        made = _create(mjoin, env, "2026-01-02T00:00:00Z", "2026-01-02T01:00:00Z")
        during = w.commits - before
    assert made.returncode == 0 and "Created backfill Dag run" in made.stdout, (made.stdout + made.stderr)[-3000:]
    assert during > 20, during  # the writer really wrote all along
    new = [b for b in _backfills(db) if b not in left]
    assert len(new) == 1 and new[0][1] == 13, (left, new)  # 00:00 .. 01:00 every 5 min: 13 logical dates
