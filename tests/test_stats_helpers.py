"""Helpers for the statistics tests: small stream data in a lake, and the statistics computed
independently of the Spark job (pandas for streams, a DuckDB band join for edges), straight
from the definitions in docs/statistics.md.

No tests here; the test modules import these functions.
"""
from __future__ import annotations

import os

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from mjoin.model.query import parse_query

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z

#: four streams of one attribute class with DIFFERENT windows (a bug that swaps W_l and
#: W_r shows); stream d never gets any data.
FOUR_STREAMS = {
    "spec_version": 1, "name": "stats_test",
    "streams": [
        {"name": "a", "source": "src_a", "event_time": "ts", "window": "90s",
         "columns": {"ts": "timestamp", "ka": "long", "pa": "long"}, "keys": ["ka"]},
        {"name": "b", "source": "src_b", "event_time": "ts", "window": "150s",
         "columns": {"ts": "timestamp", "kb": "long"}, "keys": ["kb"]},
        {"name": "c", "source": "src_c", "event_time": "ts", "window": "40s",
         "columns": {"ts": "timestamp", "kc": "int"}, "keys": ["kc"]},
        {"name": "d", "source": "src_d", "event_time": "ts", "window": "60s",
         "columns": {"ts": "timestamp", "kd": "long"}, "keys": ["kd"]},
    ],
    "predicates": ["a.ka = b.kb", "b.kb = c.kc", "a.ka = d.kd"],
    "output": ["a.pa"],
}


def four_streams_query():
    return parse_query(FOUR_STREAMS)


def make_rows(rng, n, t_lo, t_hi, keys, null_frac=0.1, whole_seconds=True, column="key"):
    """``n`` rows with ts uniform in [t_lo, t_hi) (epoch seconds) and keys drawn from ``keys``."""
    ts = rng.uniform(t_lo, t_hi, n)
    # whole seconds (many ties) or milliseconds (float64 keeps ms exact enough for the references)
    ts = np.floor(ts) if whole_seconds else np.floor(ts * 1000) / 1000
    k = rng.choice(np.asarray(keys), n).astype("float")
    k[rng.random(n) < null_frac] = np.nan
    return pd.DataFrame({"ts": ts, column: k})


_ARROW = {"long": pa.int64(), "int": pa.int32(), "short": pa.int16()}


def write_stream(lake, stream, df: pd.DataFrame, arrival_every: int = 60):
    """Land ``df`` (ts in epoch seconds, the stream's key columns) in ``<lake>/streams/<source>/arrival=<a>/``."""
    arrival = (np.floor(df["ts"].to_numpy() / arrival_every) * arrival_every).astype(np.int64)
    for a in np.unique(arrival):
        part = df[arrival == a]
        cols = {"ts": pa.array(np.round(part["ts"].to_numpy() * 1e6).astype(np.int64), type=pa.timestamp("us", tz="UTC"))}
        for c, typ in stream.columns.items():
            if c == "ts":
                continue
            src = part[c] if c in part.columns else pd.Series(np.arange(len(part)), index=part.index)
            cols[c] = pa.array(src.astype("Int64"), type=_ARROW.get(typ, pa.int64()))
        path = lake.stream_file(stream.source, int(a))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table(cols), path)


def _groups(df, column, groups):
    """Group of every row: 0 without groups; -1 (no group) where the partitioning key is NULL."""
    if groups is None:
        return np.zeros(len(df), dtype=np.int64)
    fn, _, _ = groups
    k = df[column].to_numpy(dtype=float) if len(df) else np.zeros(0)
    g = np.full(len(df), -1, dtype=np.int64)
    ok = ~np.isnan(k)
    g[ok] = fn(k[ok].astype(np.int64))
    return g


def keyed_rows(df: pd.DataFrame, stream) -> pd.DataFrame:
    """The rows of ``df`` with every key of ``stream`` (docs/statistics.md, "Definitions": NULL keys)."""
    cols = [c for c in stream.keys if c in df.columns]
    return df[df[cols].notna().all(axis=1)] if cols and len(df) else df


def _ngroups(groups):
    return 1 if groups is None else groups[1]


def _empty(query, s):
    return pd.DataFrame({"ts": pd.Series([], dtype=float), **{k: pd.Series([], dtype=float) for k in query.stream(s).keys}})


def reference_streams(query, data: dict, t0: float, n: int, tau: float, groups=None) -> pd.DataFrame:
    """pandas: tuples, lambda, window_tuples, kappa per (cycle, group, stream), of the rows with every key
    (a row with a NULL in any of its stream's keys is what the engine quarantines: in no statistic).

    ``groups``: ``(key array -> group array, number of groups, attr_class)``; None: one group 0."""
    out = []
    for s in query.streams:
        df = keyed_rows(data.get(s.name, _empty(query, s.name)), s)
        kcol = query.key_column(s.name, query.classes_of(s.name)[0])
        g = _groups(df, query.key_column(s.name, groups[2]) if groups else None, groups)
        for gid in range(_ngroups(groups)):
            mine = df[g == gid]
            for j in range(n):
                a, e = t0 + j * tau, t0 + (j + 1) * tau
                cyc = mine[(mine.ts >= a) & (mine.ts < e)]
                state = mine[(mine.ts > e - s.window) & (mine.ts <= e)]
                out.append({"j": j, "group": gid, "stream": s.name, "tuples": len(cyc), "lambda": len(cyc) / tau,
                            "window_tuples": len(state), "kappa": state[kcol].dropna().nunique()})
    return pd.DataFrame(out)


def reference_edges(query, data: dict, t0: float, n: int, tau: float, groups=None) -> pd.DataFrame:
    """DuckDB band join: q, m, s per (cycle, group, l, r) straight from the definition."""
    con = duckdb.connect()
    out = []
    for l, r in query.directed_edges:
        e = query.edge(l, r)
        frames = {}
        for side, name in (("L", l), ("R", r)):
            df = keyed_rows(data.get(name, _empty(query, name)), query.stream(name)).copy()
            df["g"] = _groups(df, query.key_column(name, groups[2]) if groups else None, groups)
            df["key"] = df[e.column_of(name)].astype("Int64")  # NaN -> NULL (DuckDB would compare NaN as a value)
            frames[side] = df.reset_index(drop=True)
        L, R = frames["L"], frames["R"]
        L["id"] = np.arange(len(L))
        con.register("L", L[["id", "ts", "key", "g"]])
        con.register("R", R[["ts", "key", "g"]])
        w_r = query.stream(r).window
        res = con.execute(f"""
            WITH p AS (SELECT * FROM L WHERE key IS NOT NULL AND g >= 0 AND ts >= {t0} AND ts < {t0 + n * tau}),
                 mt AS (SELECT p.id, p.ts, p.g, count(R.key) AS c
                        FROM p LEFT JOIN R ON R.key = p.key AND R.g = p.g AND R.ts > p.ts - {w_r} AND R.ts <= p.ts
                        GROUP BY p.id, p.ts, p.g)
            SELECT CAST(floor((ts - {t0}) / {tau}) AS BIGINT) AS j, g, count(*) AS q,
                   count(*) FILTER (WHERE c > 0) AS m, coalesce(sum(c), 0) AS s
            FROM mt GROUP BY 1, 2""").df()
        con.unregister("L")
        con.unregister("R")
        got = {(int(x.j), int(x.g)): x for x in res.itertuples()}
        for gid in range(_ngroups(groups)):
            for j in range(n):
                x = got.get((j, gid))
                q, m, s_ = (0, 0, 0) if x is None else (int(x.q), int(x.m), int(x.s))
                out.append({"j": j, "group": gid, "stream": l, "right": r, "q": q, "m": m, "s": s_,
                            "gamma": m / q if q else 0.0, "mu": s_ / m if m else 1.0})
    return pd.DataFrame(out)


def measured(rows: pd.DataFrame, t0: float, tau: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Split the job's tidy rows into stream and edge frames keyed like the references."""
    rows = rows.copy()
    rows["j"] = ((rows["cycle_start"].map(lambda x: x.timestamp()) - t0) / tau).round().astype(int)
    st = rows[rows.entity == "stream"][["j", "group", "stream", "tuples", "lambda", "window_tuples", "kappa"]]
    ed = rows[rows.entity == "edge"][["j", "group", "stream", "right", "q", "m", "s", "gamma", "mu"]]
    return st.reset_index(drop=True), ed.reset_index(drop=True)


def compare(got: pd.DataFrame, want: pd.DataFrame, keys: list[str], cols: list[str]):
    """Assert the same rows and equal values; returns the merged frame."""
    assert not got.duplicated(keys).any(), f"duplicate rows:\n{got[got.duplicated(keys, keep=False)].head(20)}"
    merged = want.merge(got, on=keys, how="outer", suffixes=("_want", "_got"), indicator=True)
    missing = merged[merged["_merge"] != "both"]
    assert missing.empty, f"rows only on one side:\n{missing.head(20)}"
    for c in cols:
        bad = merged[~np.isclose(merged[f"{c}_want"].astype(float), merged[f"{c}_got"].astype(float), rtol=1e-12, atol=1e-12)]
        assert bad.empty, f"{c} differs:\n{bad[keys + [c + '_want', c + '_got']].head(20)}"
    return merged


def canon(st):
    """A snapshot's values independent of the order of streams and edges."""
    return {g: ({s: v.as_dict() for s, v in gs.streams.items()}, {e: v.as_dict() for e, v in gs.edges.items()})
            for g, gs in st.groups.items()}
