"""TPC-DS tables from DuckDB's dsdgen, generated offline once per scale factor and cached as Parquet.

The extension ships inside the ``duckdb_extension_tpcds`` wheel; it is loaded by
path with extension autoinstall/autoload off (a plain ``INSTALL tpcds`` goes to
the network). dsdgen is deterministic; the cache stores each table sorted by
its primary key so that the row order (and everything derived from it) is
deterministic too, whatever DuckDB's thread scheduling.

Cache: ``$MJOIN_CACHE/tpcds/sf=<sf>/<table>.parquet`` (default ``MJOIN_CACHE`` =
``<project>/.cache``), plus ``meta.json`` with row counts and versions. A cache
folder is staged under a hidden name and renamed into place, so concurrent
runs never see half a cache.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
import uuid
from pathlib import Path

import duckdb

from mjoin.runtime.resources import PROJECT_DIR
from mjoin.workloads.errors import WorkloadError

log = logging.getLogger(__name__)

#: The four streams of the seed query, in the order the paper's replay concatenates them.
STREAM_TABLES = ("customer", "store_returns", "web_returns", "catalog_returns")
#: Dimensions the event-time replay joins.
DIMENSION_TABLES = ("date_dim", "time_dim")
#: Primary keys (TPC-DS spec), used to store each table in a deterministic order.
PRIMARY_KEYS = {
    "customer": ("c_customer_sk",),
    "store_returns": ("sr_item_sk", "sr_ticket_number"),
    "web_returns": ("wr_item_sk", "wr_order_number"),
    "catalog_returns": ("cr_item_sk", "cr_order_number"),
    "date_dim": ("d_date_sk",),
    "time_dim": ("t_time_sk",),
}
#: dsdgen below sf=0.01 never returns (measured: sf=0.005 and 0.001 spin at 100% CPU for >20 min).
MIN_SF = 0.01
EXTENSION_VERSION = "v1.5.5"
#: A staged cache folder older than this was left by a killed run and is removed (SF=100 takes ~40 min).
STALE_STAGE_SECONDS = 6 * 3600


def check_sf(sf) -> float:
    """A usable scale factor (float >= 0.01), or a :class:`WorkloadError`."""
    try:
        value = float(sf)
    except (TypeError, ValueError):
        raise WorkloadError(f"{sf!r} is not a number", "--sf") from None
    if not math.isfinite(value) or value < MIN_SF:
        raise WorkloadError(f"{sf!r} is below {MIN_SF} (dsdgen does not terminate for smaller scale factors)", "--sf")
    return value


def sf_label(sf: float) -> str:
    """Folder spelling of a scale factor: 0.01 -> '0.01', 10.0 -> '10'."""
    return f"{float(sf):g}"


def default_cache_dir() -> Path:
    """``$MJOIN_CACHE`` or ``<project>/.cache``."""
    return Path(os.environ.get("MJOIN_CACHE") or PROJECT_DIR / ".cache")


def extension_path() -> str:
    """The tpcds extension file shipped inside the duckdb_extension_tpcds wheel."""
    try:
        import duckdb_extension_tpcds
    except ImportError:
        raise WorkloadError("the duckdb-extension-tpcds package is not installed (see requirements.txt)") from None
    path = os.path.join(os.path.dirname(duckdb_extension_tpcds.__file__), "extensions", EXTENSION_VERSION, "tpcds.duckdb_extension")
    if not os.path.exists(path):
        raise WorkloadError(f"the tpcds extension is not at {path}; duckdb and duckdb-extension-tpcds must both be {EXTENSION_VERSION[1:]}")
    return path


def connect(database: str = ":memory:", memory_limit: str | None = None):
    """A DuckDB connection with the tpcds extension loaded from the wheel (never from the network)."""
    config = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
              "allow_unsigned_extensions": True}
    if memory_limit:
        config["memory_limit"] = memory_limit
    con = duckdb.connect(database, config=config)
    con.execute("SET enable_progress_bar = false")
    con.execute(f"LOAD '{extension_path()}'")
    return con


def cache_path(sf, cache_dir=None) -> Path:
    """Folder of the cached tables for one scale factor."""
    return Path(cache_dir or default_cache_dir()) / "tpcds" / f"sf={sf_label(check_sf(sf))}"


def _complete(folder: Path) -> bool:
    meta = folder / "meta.json"
    if not meta.exists():
        return False
    tables = json.loads(meta.read_text()).get("rows", {})
    return all(t in tables and (folder / f"{t}.parquet").exists() for t in STREAM_TABLES + DIMENSION_TABLES)


def ensure_tables(sf, cache_dir=None, memory_limit: str = "4GB") -> Path:
    """Generate (once) and return the cache folder holding the stream and dimension tables for ``sf``."""
    sf = check_sf(sf)
    final = cache_path(sf, cache_dir)
    if _complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.*.tmp"):  # left by a killed run (a live one is younger)
        if time.time() - stale.stat().st_mtime > STALE_STAGE_SECONDS:
            shutil.rmtree(stale, ignore_errors=True)
    stage = final.parent / f".{final.name}.{uuid.uuid4().hex[:12]}.tmp"
    stage.mkdir()
    try:
        t0 = time.monotonic()
        # A disk-backed database lets DuckDB spill: SF=10 is 4.4 GB of tables.
        con = connect(str(stage / "dsdgen.duckdb"), memory_limit=memory_limit)
        con.execute(f"SET temp_directory = '{stage / 'spill'}'")
        con.execute(f"CALL dsdgen(sf={sf!r})")
        rows = {}
        for table in STREAM_TABLES + DIMENSION_TABLES:
            order = ", ".join(PRIMARY_KEYS[table])
            con.execute(f"COPY (SELECT * FROM {table} ORDER BY {order}) TO '{stage / f'{table}.parquet'}' "
                        "(FORMAT parquet, COMPRESSION zstd)")
            rows[table] = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]

        con.close()
        (stage / "dsdgen.duckdb").unlink(missing_ok=True)
        (stage / "dsdgen.duckdb.wal").unlink(missing_ok=True)
        shutil.rmtree(stage / "spill", ignore_errors=True)
        meta = {"sf": sf, "rows": rows, "duckdb": duckdb.__version__, "extension": EXTENSION_VERSION,
                "order": {t: list(PRIMARY_KEYS[t]) for t in rows}, "seconds": round(time.monotonic() - t0, 1)}
        (stage / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        log.info("dsdgen sf=%s: %s in %.1fs -> %s", sf_label(sf), rows, meta["seconds"], final)
        if final.exists():  # an incomplete leftover, or another process finished first
            if _complete(final):
                shutil.rmtree(stage, ignore_errors=True)
                return final
            shutil.rmtree(final)
        try:
            os.replace(stage, final)
        except OSError:
            if not _complete(final):
                raise
            shutil.rmtree(stage, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return final


def table_file(sf, table: str, cache_dir=None) -> Path:
    """Path of one cached table (generating the cache if needed)."""
    if table not in PRIMARY_KEYS:
        raise WorkloadError(f"unknown table {table!r} (cached: {', '.join(PRIMARY_KEYS)})")
    return ensure_tables(sf, cache_dir) / f"{table}.parquet"


def cached_rows(sf, cache_dir=None) -> dict:
    """Row counts per cached table."""
    return json.loads((ensure_tables(sf, cache_dir) / "meta.json").read_text())["rows"]
