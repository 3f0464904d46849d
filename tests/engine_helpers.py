"""Test data for the engine and the independent reference: DuckDB SQL over the same landed files.

The reference never uses engine code: it is one plain SQL query per spec, built from
the spec's predicates, windows and outputs with the textbook semantics
``max(ts) - ts_i < W_i`` for every stream i (docs/algorithms.md, "Notation").
"""
from __future__ import annotations

import os
import random
from collections import Counter
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mjoin.lake.layout import Lake

T0 = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp())  # replay start, epoch seconds
TPCDS_TABLES = ("customer", "store_returns", "web_returns", "catalog_returns")
_TPCDS_CACHE: dict = {}


def duckdb_connect(tpcds: bool = False):
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False,
                                 "allow_unsigned_extensions": True, "threads": 1})
    if tpcds:
        import duckdb_extension_tpcds

        ext = os.path.join(os.path.dirname(duckdb_extension_tpcds.__file__), "extensions/v1.5.5/tpcds.duckdb_extension")
        con.execute(f"LOAD '{ext}'")
    return con


def tpcds_tables(sf: float = 0.01) -> dict:
    """The four tables of the seed query as Arrow tables (generated once per process)."""
    if sf not in _TPCDS_CACHE:
        con = duckdb_connect(tpcds=True)
        con.execute(f"CALL dsdgen(sf={sf})")
        _TPCDS_CACHE[sf] = {t: con.execute(f"SELECT * FROM {t}").to_arrow_table() for t in TPCDS_TABLES}
        con.close()
    return _TPCDS_CACHE[sf]


def replay_tpcds(lake: Lake, sf: float = 0.01, *, rate: float = 5.0, arrival_cycle: int = 60, seed: int = 7,
                 start: int = T0, tables=TPCDS_TABLES) -> dict:
    """The paper's replay: interleave the tables in one seeded random order, ``ts = start + i / rate``,
    land each arrival cycle as ``<lake>/streams/<table>/arrival=<epoch>/part-00000.parquet``."""
    data = tpcds_tables(sf)
    order = [(t, i) for t in tables for i in range(data[t].num_rows)]
    random.Random(seed).shuffle(order)
    ts = {t: np.zeros(data[t].num_rows, dtype=np.int64) for t in tables}
    for pos, (t, i) in enumerate(order):
        ts[t][i] = int(round((start + pos / rate) * 1_000_000))
    landed = {}
    parts = {}
    for t in tables:
        tbl = data[t].append_column("ts", pa.array(ts[t], pa.timestamp("us")))
        arrival = (ts[t] // 1_000_000 - start) // arrival_cycle * arrival_cycle + start
        for a in np.unique(arrival):
            parts[(int(a), t)] = tbl.filter(pa.array(arrival == a))
    # land in arrival order, with modification times in that order (the streaming file source
    # takes files oldest first when it limits the files per batch)
    for k, (a, t) in enumerate(sorted(parts, key=lambda at: (at[0], tables.index(at[1])))):
        path = write_stream_file(lake, t, a, parts[(a, t)])
        os.utime(path, ns=(0, (a * 1000 + k % len(tables)) * 1_000_000))
        landed.setdefault(t, []).append(path)
    return {"start": start, "end": start + int(np.ceil(len(order) / rate)), "rows": len(order), "files": landed}


def land_first_arrivals(stage: Lake, lake: Lake, n: int, tables=TPCDS_TABLES) -> list[int]:
    """Copy the first ``n`` arrival cycles of ``tables`` from ``stage`` into ``lake`` (file by file);
    returns those arrivals."""
    import shutil

    arrivals = sorted({a for t in tables for a in stage.arrivals(t)})[:n]
    for t in tables:
        for a in arrivals:
            for f in stage.stream_files(t, a, a + 1):
                dst = lake.stream_file(t, a)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(f, dst)
    return arrivals


def write_stream_file(lake: Lake, source: str, arrival: int, table: pa.Table, part: int = 0) -> str:
    path = lake.stream_file(source, arrival, part)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)
    return path


def write_null_time_copy(lake: Lake, arrival: int) -> None:
    """Into web_returns' ``arrival`` folder, a copy of its file whose first two rows have no event time (row-level
    ``bad_time`` rejects) and whose order numbers are new (the copy is not a duplicate of the file)."""
    t = pq.read_table(lake.stream_file("web_returns", arrival))
    ts = t.column("ts").to_pylist()
    ts[0] = ts[1] = None
    pq.write_table(t.set_column(t.schema.get_field_index("ts"), "ts", pa.array(ts, t.schema.field("ts").type))
                   .set_column(t.schema.get_field_index("wr_order_number"), "wr_order_number",
                               pa.array(range(10**9, 10**9 + t.num_rows), pa.int64())),
                   os.path.join(lake.arrival_dir("web_returns", arrival), "null_ts.parquet"))


@pytest.fixture(autouse=True)
def no_leaked_queries():
    """Autouse where imported: after each test, stop any streaming query still active in the shared
    SparkSession (a leaked query would keep running batches and break the next test), then fail
    the test that leaked it."""
    yield
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession() or SparkSession._instantiatedSession
    leaked = [q.name for q in session.streams.active] if session is not None else []
    for q in session.streams.active if leaked else ():
        q.stop()
    assert not leaked, f"streaming queries left running: {leaked}"


# ---- the reference -------------------------------------------------------------------------


def _ts_sql(stream) -> str:
    """DuckDB expression for a stream's event time in epoch microseconds."""
    et = stream.event_time
    col = f'"{et.column}"'
    t = stream.columns[et.column]
    if t == "timestamp":
        return f"epoch_us(TRY_CAST({col} AS TIMESTAMP))"
    if t in ("long", "int", "short"):
        return f"(TRY_CAST({col} AS BIGINT) * 1000000)"
    if t == "double":
        return f"CAST(round({col} * 1000000) AS BIGINT)"
    if t == "string":
        fmt = et.format.replace("yyyy", "%Y").replace("MM", "%m").replace("dd", "%d").replace("HH", "%H") \
            .replace("mm", "%M").replace("ss", "%S")
        return f"epoch_us(TRY_STRPTIME({col}, '{fmt}'))"
    raise NotImplementedError(t)


def _key_sql(col: str) -> str:
    """A join key as DuckDB sees it: integral values only (``"12"`` and ``3.0`` are keys, ``"x9"``
    and ``2.5`` are not)."""
    d = f"TRY_CAST(trim(CAST({col} AS VARCHAR)) AS DOUBLE)"
    return f"(CASE WHEN {d} = floor({d}) THEN CAST({d} AS BIGINT) END)"


def reference_sql(query, lake: Lake, start_us: int | None = None, end_us: int | None = None,
                  exclude_files: dict | None = None, exclude_ids: dict | None = None) -> str:
    """All results of ``query`` over every landed row with valid keys and time, whose newest member
    has ts in [start_us, end_us). ``exclude_files``: stream -> paths not to read (rejected files);
    ``exclude_ids``: stream -> (id column, ids) rows to leave out (e.g. rows that arrived late)."""
    ctes, names = [], []
    for s in query.streams:
        files = [f for f in lake.stream_files(s.source) if f not in (exclude_files or {}).get(s.name, ())]
        file_list = ", ".join(f"'{f}'" for f in files)
        conds = [f"{_key_sql(chr(34) + k + chr(34))} IS NOT NULL" for k in s.keys] + [f"{_ts_sql(s)} IS NOT NULL"]
        if exclude_ids and exclude_ids.get(s.name) and exclude_ids[s.name][1]:
            col, ids = exclude_ids[s.name]
            conds.append(f"\"{col}\" NOT IN ({', '.join(str(int(i)) for i in ids)})")
        keys = ", ".join(f"{_key_sql(chr(34) + k + chr(34))} AS \"_key_{k}\"" for k in s.keys)
        ctes.append(f"{s.name} AS (SELECT *, {_ts_sql(s)} AS _t, {keys} "
                    f"FROM read_parquet([{file_list}], union_by_name=true) WHERE {' AND '.join(conds)})")
        names.append(s.name)
    newest = "greatest(" + ", ".join(f"{n}._t" for n in names) + ")"
    where = [f"{p.left}.\"_key_{p.left_column}\" = {p.right}.\"_key_{p.right_column}\"" for p in query.predicates]
    where += [f"{newest} - {s.name}._t < {int(round(s.window * 1_000_000))}" for s in query.streams]
    where += [f'abs({b.left}."{b.left_column}" - {b.right}."{b.right_column}") <= {b.width}'
              for b in getattr(query, "bands", ())]
    if start_us is not None:
        where.append(f"{newest} >= {start_us}")
    if end_us is not None:
        where.append(f"{newest} < {end_us}")
    select = ", ".join(f"{o.stream}.\"{o.column}\" AS \"{o.name}\"" for o in query.output)
    return (f"WITH {', '.join(ctes)} SELECT {select} FROM {', '.join(names)} WHERE {' AND '.join(where)}")


def reference(query, lake: Lake, start_us=None, end_us=None, exclude_files=None, exclude_ids=None) -> pd.DataFrame:
    con = duckdb_connect()
    try:
        return con.execute(reference_sql(query, lake, start_us, end_us, exclude_files, exclude_ids)).fetch_df()
    finally:
        con.close()


def synthetic_with_reference(root, start: int, end: int, **generate) -> tuple:
    """``(lake, query, DuckDB's rows over [start, end))`` of a synthetic workload generated into ``root``
    (``generate``: :func:`mjoin.workloads.synthetic.generate_synthetic`'s parameters)."""
    from mjoin.model.query import load_query
    from mjoin.workloads.synthetic import generate_synthetic

    generate_synthetic(root, **generate)
    query = load_query(str(root / "query.yaml"))
    lake = Lake(str(root))
    return lake, query, reference(query, lake, start * 1_000_000, end * 1_000_000)


def multiset(df: pd.DataFrame, columns=None) -> Counter:
    """Rows as a multiset (for result comparison regardless of order)."""
    columns = list(columns or df.columns)
    norm = df[columns].astype(object).where(df[columns].notna(), None)
    return Counter(tuple(_plain(v) for v in row) for row in norm.itertuples(index=False, name=None))


def _plain(v):
    from decimal import Decimal

    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating, Decimal)):  # DuckDB's pandas frames give decimals as floats
        return float(v)
    return v


def assert_same_results(actual: pd.DataFrame, expected: pd.DataFrame, what: str = "") -> None:
    cols = list(expected.columns)
    a, e = multiset(actual, cols), multiset(expected, cols)
    missing, extra = e - a, a - e
    assert not missing and not extra, (
        f"{what}: {len(actual)} rows vs reference {len(expected)}; "
        f"{sum(missing.values())} missing (e.g. {list(missing)[:3]}), {sum(extra.values())} extra (e.g. {list(extra)[:3]})")


# ---- synthetic data: skewed keys, NULL keys, out-of-order and late rows, bad input ----------

SYNTH_SPEC = {
    "spec_version": 1,
    "name": "synth3",
    "description": "three streams, asymmetric windows, three event-time encodings",
    "lateness": "20s",
    "streams": [
        {"name": "a", "source": "sa", "event_time": {"column": "t", "format": "yyyy-MM-dd HH:mm:ss"},
         "window": "60s", "columns": {"t": "string", "ka": "long", "ida": "long"}, "keys": ["ka"]},
        {"name": "b", "source": "sb", "event_time": "ts", "window": "30s",
         "columns": {"ts": "timestamp", "kb": "long", "idb": "long", "vb": "double"}, "keys": ["kb"]},
        {"name": "c", "source": "sc", "event_time": "e", "window": "45s",
         "columns": {"e": "long", "kc": "long", "idc": "long"}, "keys": ["kc"]},
    ],
    "predicates": ["a.ka = b.kb", "b.kb = c.kc"],
    "output": ["a.ida", "b.idb", "c.idc", "b.vb", "a.ka AS k"],
}
WAVE = 100  # seconds of arrival per wave (= one micro-batch)


def synth_query():
    from mjoin.model.query import parse_query

    return parse_query(SYNTH_SPEC, source="synth3")


def make_synthetic(lake: Lake, seed: int = 3, n: int = 180, waves: int = 4, start: int = T0) -> dict:
    """Land ``waves`` arrival waves of streams a, b, c (one file per stream and wave, plus one odd
    file per wave), modification times in wave order. Returns what an independent observer knows:
    rows per wave, the defects planted, the late rows (by id) under the engine's watermark rule."""
    rng = np.random.default_rng(seed)
    out = {"start": start, "files": {}, "planted": {}, "late_ids": {"a": [], "b": [], "c": []},
           "rejected_files": {}, "rows": {}}
    ids = {"a": 0, "b": 100_000, "c": 200_000}
    # the engine's rule (mjoin.engine.watermark): each stream's watermark is its max accepted event time
    # minus the lateness, the job's is the minimum over the streams (none is idle here: each wave holds
    # all three), taken when the batch (= the wave) starts
    max_accepted: dict = {}  # stream -> max event time (micros) of its rows accepted so far
    lateness = 20 * 1_000_000
    for w in range(waves):
        arrival = start + w * WAVE
        wm = min(max_accepted.values()) - lateness if len(max_accepted) == 3 else None
        wave_max = dict(max_accepted)
        files = []
        for s in ("a", "b", "c"):
            m = n // 3
            key = np.minimum(rng.zipf(1.6, m), 40).astype(float)  # skewed: key 1 is hot
            key[rng.random(m) < 0.06] = np.nan  # NULL keys
            # event time: mostly a little before arrival; 8% out of order by 40-70 s (late if past the watermark)
            t = arrival + rng.uniform(0, WAVE, m) - rng.uniform(0, 10, m)
            lag = rng.random(m) < 0.08
            t[lag] -= rng.uniform(40, 70, lag.sum())
            t = np.floor(t) if s in ("a", "c") else np.round(t, 6)
            bad_time = (rng.random(m) < 0.04) & ~np.isnan(key)
            idv = np.arange(ids[s], ids[s] + m)
            ids[s] += m
            defects = {"null_key": int(np.isnan(key).sum()), "bad_time": int(bad_time.sum())}
            valid = ~np.isnan(key) & ~bad_time
            t_us = (t * 1_000_000).astype(np.int64)
            late = valid & (t_us < wm) if wm is not None else np.zeros(m, dtype=bool)
            defects["late"] = int(late.sum())
            out["late_ids"][s] += idv[late].tolist()
            acc = valid & ~late
            if acc.any():
                wave_max[s] = max(wave_max.get(s, int(t_us[acc].max())), int(t_us[acc].max()))
            kcol = pa.array([None if np.isnan(k) else int(k) for k in key], pa.int64())
            if s == "a":
                tv = [None if bt and i % 2 else ("garbage" if bt else
                      datetime.fromtimestamp(x, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S"))
                      for i, (x, bt) in enumerate(zip(t, bad_time))]
                tbl = pa.table({"t": pa.array(tv, pa.string()), "ka": kcol, "ida": pa.array(idv, pa.int64())})
            elif s == "b":
                tv = pa.array([None if bt else int(x * 1_000_000) for x, bt in zip(t, bad_time)], pa.int64())
                tbl = pa.table({"ts": tv.cast(pa.timestamp("us")), "kb": kcol, "idb": pa.array(idv, pa.int64()),
                                "vb": pa.array(rng.normal(size=m))})
            else:
                tv = pa.array([None if bt else int(x) for x, bt in zip(t, bad_time)], pa.int64())
                tbl = pa.table({"e": tv, "kc": kcol, "idc": pa.array(idv, pa.int64())})
            files.append((f"s{s}", arrival, tbl, 0))
            out["planted"].setdefault(w, {})[s] = defects
            out["rows"].setdefault(w, {})[s] = int(acc.sum())
        # the odd file of the wave: rejected whole by a rule of the landing contract (mjoin.lake.contract), as the
        # input gate rejects it; (stream, rows, quarantine reason)
        if w == 0:  # stream a without its id column
            files.append(("sa", arrival, pa.table({"t": ["2026-01-01 00:00:01"] * 5, "ka": pa.array([1] * 5, pa.int64())}), 1))
            out["rejected_files"][w] = ("a", 5, "schema_mismatch")
        elif w == 1:  # stream b with string keys ("12" would convert, but the spec says long)
            wm1 = max(wave_max.values()) if wave_max else start * 1_000_000
            tt = pa.array([wm1 - 1_000_000] * 4, pa.int64()).cast(pa.timestamp("us"))
            files.append(("sb", arrival, pa.table({"ts": tt, "kb": ["12", " 7", "x9", None],
                                                    "idb": pa.array([900_001, 900_002, 900_003, 900_004]),
                                                    "vb": [0.5, 0.25, 0.125, 1.0]}), 1))
            out["rejected_files"][w] = ("b", 4, "schema_mismatch")
        elif w == 2:  # stream c with double keys
            e = (max(wave_max.values()) // 1_000_000) if wave_max else start
            files.append(("sc", arrival, pa.table({"e": pa.array([e, e], pa.int64()), "kc": [3.0, 2.5],
                                                    "idc": pa.array([900_011, 900_012], pa.int64())}), 1))
            out["rejected_files"][w] = ("c", 2, "schema_mismatch")
        else:  # not Parquet at all
            files.append(("sb", arrival, None, 1))
            out["rejected_files"][w] = ("b", None, "unreadable")
        for k, (source, a, tbl, part) in enumerate(files):
            path = lake.stream_file(source, a, part)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if tbl is None:
                with open(path, "wb") as fh:
                    fh.write(b"this is not parquet")
            else:
                pq.write_table(tbl, path)
            os.utime(path, ns=(0, (a * 1000 + k) * 1_000_000))
            out["files"].setdefault(w, []).append(path)
        max_accepted = wave_max
    out["end"] = start + waves * WAVE
    return out


# ---- the streaming job as an OS process of its own -------------------------------------------------

PROJECT = __import__("pathlib").Path(__file__).resolve().parent.parent


def job_env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(PROJECT / "include")] + [p for p in os.environ.get(
        "PYTHONPATH", "").split(os.pathsep) if p]), MJOIN_SHUFFLE_PARTITIONS="2", MJOIN_SPARK_MASTER="local[2]",
        **extra)


def start_job(lake: Lake, log, *args, spark_submit: bool = True):
    """``python -m mjoin run <args> --lake <lake>`` (or ``spark-submit jobs/join.py``) in a session of its
    own, so that a test can kill its whole process group."""
    import subprocess
    import sys

    if spark_submit:
        cmd = [os.path.join(os.path.dirname(sys.executable), "spark-submit"), "--master", "local[2]",
               "--conf", "spark.ui.enabled=false", "--driver-memory", "1g", str(PROJECT / "jobs" / "join.py")]
    else:
        cmd = [sys.executable, "-m", "mjoin", "run"]
    with open(log, "w") as fh:
        return subprocess.Popen(cmd + list(args) + ["--lake", lake.root], stdout=fh, stderr=subprocess.STDOUT,
                                env=job_env(), start_new_session=True)


def kill_tree(proc, started: bool = True) -> None:
    """SIGKILL the job's whole process tree: spark-submit's JVM, the Python driver, and PySpark's
    worker daemon with its workers (the daemon runs in a process group of its own). ``started``: the job is
    known to be past its Spark start (at least three processes); False for a kill at any moment."""
    import signal

    import psutil

    root = psutil.Process(proc.pid)
    tree = [root] + root.children(recursive=True)
    assert not started or len(tree) >= 3, [p.name() for p in tree]  # JVM or launcher, driver, workers
    os.killpg(proc.pid, signal.SIGKILL)
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=60)
    assert not alive, alive
    proc.wait(60)
