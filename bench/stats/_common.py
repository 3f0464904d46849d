"""Shared by the statistics and forecast benchmarks: workloads landed in a lake, machine info, output.

Workloads (all in the seed query's schema, ``tpcds_returns_by_address``):

- ``land_tpcds_replay``: TPC-DS (DuckDB's dsdgen) customer, store/web/catalog returns
  replayed as four streams in one random interleaving at a constant total rate
  (the paper's seed experiment; the workloads team's ``mjoin generate tpcds`` replaces it later);
- ``land_drifting``: synthetic streams whose rates, key skew and key overlap drift over time;
- ``land_skewed``: right-shifted Zipf keys over a large domain (the skimmed-sketch paper's data).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z
COLUMNS = {  # the seed query's streams: (source, key column, other columns)
    "cu": ("customer", "c_current_addr_sk", ["c_customer_sk"]),
    "sr": ("store_returns", "sr_addr_sk", ["sr_ticket_number", "sr_item_sk"]),
    "wr": ("web_returns", "wr_refunded_addr_sk", ["wr_order_number", "wr_item_sk"]),
    "cr": ("catalog_returns", "cr_refunded_addr_sk", ["cr_order_number", "cr_item_sk"]),
}


def machine_info() -> dict:
    import duckdb
    import pyspark
    import statsmodels

    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        git = None
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "platform": platform.platform(), "cpus": os.cpu_count(),
        "load_average": os.getloadavg(), "python": sys.version.split()[0],
        "versions": {"pyspark": pyspark.__version__, "statsmodels": statsmodels.__version__, "numpy": np.__version__,
                     "pandas": pd.__version__, "pyarrow": pa.__version__, "duckdb": duckdb.__version__},
        "git": git,
        "note": "shared 2-core machine with other engineers' tests running: timings are noisy",
    }


def write_json(path, doc) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {path}")


def spark_session():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "include"))
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    return get_spark("mjoin-bench", Resources(spark_master="local[2]", shuffle_partitions=4),
                     conf={"spark.driver.memory": "4g"})


def land(lake, stream_name: str, ts: np.ndarray, keys: np.ndarray, others: dict | None = None,
         arrival_every: int = 60) -> None:
    """Write one stream's rows (ts epoch seconds, keys with NaN = NULL) by arrival partition."""
    source, key_col, other_cols = COLUMNS[stream_name]
    order = np.argsort(ts, kind="stable")
    ts, keys = np.asarray(ts)[order], np.asarray(keys, float)[order]
    others = {c: np.asarray(v)[order] for c, v in (others or {}).items()}
    arrival = (np.floor(ts / arrival_every) * arrival_every).astype(np.int64)
    bounds = np.flatnonzero(np.diff(arrival)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(ts)]):
        sl = slice(lo, hi)
        cols = {"ts": pa.array(np.round(ts[sl] * 1e6).astype(np.int64), type=pa.timestamp("us", tz="UTC")),
                key_col: pa.array(pd.array(np.where(np.isnan(keys[sl]), np.nan, keys[sl])).astype("Int64"), pa.int64())}
        for c in other_cols:
            v = others.get(c, np.arange(lo, hi))
            cols[c] = pa.array(pd.array(np.asarray(v[sl] if c in others else v, float)).astype("Int64"), pa.int64())
        path = lake.stream_file(source, int(arrival[lo]))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table(cols), path)


def tpcds_tables(sf: float) -> dict:
    """The four tables' key columns at scale factor ``sf`` (DuckDB's TPC-DS generator)."""
    import duckdb
    import duckdb_extension_tpcds

    ext = Path(duckdb_extension_tpcds.__file__).parent / "extensions" / f"v{duckdb.__version__}" / "tpcds.duckdb_extension"
    con = duckdb.connect()
    con.execute(f"LOAD '{ext}'")
    t = time.perf_counter()
    con.execute(f"CALL dsdgen(sf={sf})")
    print(f"dsdgen sf={sf}: {time.perf_counter() - t:.1f}s")
    out = {}
    for name, (table, key, others) in COLUMNS.items():
        out[name] = con.execute(f"SELECT {', '.join([key] + others)} FROM {table}").df()
    return out


def land_tpcds_replay(lake, sf: float, rate: float, seed: int = 0, t0: int = T0) -> tuple[int, int, dict]:
    """Replay the four tables as streams, rows of all tables in one random order, ``rate`` rows/s in total."""
    tables = tpcds_tables(sf)
    rng = np.random.default_rng(seed)
    total = sum(len(df) for df in tables.values())
    slots = rng.permutation(total)
    ts_all = t0 + np.floor(slots / rate * 1000) / 1000  # ms resolution
    pos, counts = 0, {}
    for name, df in tables.items():
        n = len(df)
        ts = ts_all[pos:pos + n]
        pos += n
        _, key, others = COLUMNS[name]
        land(lake, name, ts, df[key].to_numpy(dtype=float), {c: df[c].to_numpy(dtype=float) for c in others})
        counts[name] = n
    return t0, int(t0 + np.ceil(total / rate)), counts


def zipf_keys(rng, n: int, z: float, domain: int) -> np.ndarray:
    p = 1.0 / np.arange(1, domain + 1) ** z
    return rng.choice(domain, n, p=p / p.sum())


def land_skewed(lake, duration: int, rate: float, z: float, domain: int, shifts: dict, seed: int = 0,
                t0: int = T0) -> tuple[int, int]:
    """Right-shifted Zipf keys (paper's synthetic data): stream s's keys are ``zipf + shifts[s]``, permuted."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(domain * 2)
    for name in COLUMNS:
        n = rng.poisson(rate * duration)
        ts = t0 + np.floor(rng.uniform(0, duration, n) * 1000) / 1000
        keys = perm[(zipf_keys(rng, n, z, domain) + shifts.get(name, 0)) % (2 * domain)].astype(float)
        land(lake, name, ts, keys)
    return t0, t0 + duration


def land_drifting(lake, duration: int, seed: int = 0, t0: int = T0, base_rate: float = 20.0,
                  domain: int = 2000) -> tuple[int, int]:
    """Drifting workload: per stream a rate trend plus a slow wave, and a hot key set that moves at a
    different speed in every stream, so lambda, kappa, gamma and mu all drift."""
    rng = np.random.default_rng(seed)
    specs = {"cu": (1.0, 0.8, 0.0, 0.3), "sr": (1.5, -0.4, 0.002, 1.1), "wr": (0.6, 1.5, 0.005, 0.7),
             "cr": (1.0, 0.3, -0.003, 1.4)}  # rate factor, rate drift over the run, key drift (keys/s), skew
    for name, (factor, drift, key_speed, z) in specs.items():
        secs = np.arange(duration)
        lam = base_rate * factor * (1 + drift * secs / duration) * (1 + 0.15 * np.sin(2 * np.pi * secs / 600))
        n = rng.poisson(np.maximum(lam, 0.1))
        ts = np.repeat(secs, n) + rng.uniform(0, 1, n.sum())
        ts = t0 + np.floor(ts * 1000) / 1000
        skew = z + 0.3 * (ts - t0) / duration  # skew grows: mu drifts
        keys = np.empty(len(ts))
        for zz in np.unique(np.round(skew, 2)):
            sel = np.round(skew, 2) == zz
            keys[sel] = zipf_keys(rng, int(sel.sum()), float(zz), domain)
        keys = (keys + np.floor(key_speed * (ts - t0) * domain / 100)) % domain
        keys[rng.random(len(keys)) < 0.01] = np.nan
        land(lake, name, ts, keys)
    return t0, t0 + duration
