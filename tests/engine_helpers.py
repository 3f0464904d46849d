"""Test data for the engine and the independent reference: DuckDB SQL over the same landed files.

The reference never uses engine code: it is one plain SQL query per spec, built from
the spec's predicates, windows and outputs with the textbook semantics
``max(ts) - ts_i < W_i`` for every stream i (ALGORITHMS.md, "Notation").
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

from mjoin.lake import Lake

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
        _TPCDS_CACHE[sf] = {t: con.execute(f"SELECT * FROM {t}").fetch_arrow_table() for t in TPCDS_TABLES}
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
    for t in tables:
        tbl = data[t].append_column("ts", pa.array(ts[t], pa.timestamp("us")))
        arrival = (ts[t] // 1_000_000 - start) // arrival_cycle * arrival_cycle + start
        for a in np.unique(arrival):
            part = tbl.filter(pa.array(arrival == a))
            path = lake.stream_file(t, int(a))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pq.write_table(part, path)
            landed.setdefault(t, []).append(path)
    return {"start": start, "end": start + int(np.ceil(len(order) / rate)), "rows": len(order), "files": landed}


def write_stream_file(lake: Lake, source: str, arrival: int, table: pa.Table, part: int = 0) -> str:
    path = lake.stream_file(source, arrival, part)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)
    return path


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


def reference_sql(query, lake: Lake, start_us: int | None = None, end_us: int | None = None,
                  exclude_files: dict | None = None) -> str:
    """All results of ``query`` over every landed row with valid keys and time, whose newest member
    has ts in [start_us, end_us)."""
    ctes, names = [], []
    for s in query.streams:
        files = [f for f in lake.stream_files(s.source) if f not in (exclude_files or {}).get(s.name, ())]
        file_list = ", ".join(f"'{f}'" for f in files)
        conds = [f"TRY_CAST(\"{k}\" AS BIGINT) IS NOT NULL" for k in s.keys] + [f"{_ts_sql(s)} IS NOT NULL"]
        ctes.append(f"{s.name} AS (SELECT *, {_ts_sql(s)} AS _t FROM read_parquet([{file_list}], union_by_name=true) "
                    f"WHERE {' AND '.join(conds)})")
        names.append(s.name)
    newest = "greatest(" + ", ".join(f"{n}._t" for n in names) + ")"
    where = [f"TRY_CAST({p.left}.\"{p.left_column}\" AS BIGINT) = TRY_CAST({p.right}.\"{p.right_column}\" AS BIGINT)"
             for p in query.predicates]
    where += [f"{newest} - {s.name}._t < {int(round(s.window * 1_000_000))}" for s in query.streams]
    if start_us is not None:
        where.append(f"{newest} >= {start_us}")
    if end_us is not None:
        where.append(f"{newest} < {end_us}")
    select = ", ".join(f"{o.stream}.\"{o.column}\" AS \"{o.name}\"" for o in query.output)
    return (f"WITH {', '.join(ctes)} SELECT {select} FROM {', '.join(names)} WHERE {' AND '.join(where)}")


def reference(query, lake: Lake, start_us=None, end_us=None, exclude_files=None) -> pd.DataFrame:
    con = duckdb_connect()
    try:
        return con.execute(reference_sql(query, lake, start_us, end_us, exclude_files)).fetch_df()
    finally:
        con.close()


def multiset(df: pd.DataFrame, columns=None) -> Counter:
    """Rows as a multiset (for result comparison regardless of order)."""
    columns = list(columns or df.columns)
    norm = df[columns].astype(object).where(df[columns].notna(), None)
    return Counter(tuple(_plain(v) for v in row) for row in norm.itertuples(index=False, name=None))


def _plain(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


def assert_same_results(actual: pd.DataFrame, expected: pd.DataFrame, what: str = "") -> None:
    cols = list(expected.columns)
    a, e = multiset(actual, cols), multiset(expected, cols)
    missing, extra = e - a, a - e
    assert not missing and not extra, (
        f"{what}: {len(actual)} rows vs reference {len(expected)}; "
        f"{sum(missing.values())} missing (e.g. {list(missing)[:3]}), {sum(extra.values())} extra (e.g. {list(extra)[:3]})")
