"""The statistics history: tidy rows per cycle in Parquet, read back without Spark.

Layout under a history root (``<lake>/stats`` by default, ``--out DIR`` replaces it)::

    <root>/<query>/cycle=<epoch>/part-00000.parquet          tidy rows of one cycle (statistics.ROW_COLUMNS)
    <root>/<query>/cycle=<epoch>/_cycle.json                 how the cycle was computed (mode, partitioning,
                                                             NULL keys, per-class kappa, run)
    <root>/<query>/_histogram/cycle=<epoch>/part-00000.parquet   per-key rate histogram of the cycle
    <root>/<query>/_runs/<from>-<to>.json                    job summaries (wall time, rejected input)
    <root>/<query>/_cells/<kind>/cycle=<epoch>/part-00000.parquet   the same tidy rows per key cell
                                                             (``group`` = cell; kind ``buckets``: pmod(key, B),
                                                             ``ranges``: key ranges); the cell rule is in the
                                                             cycle's ``_cycle.json`` (``cells``)

``<epoch>`` is the cycle start in whole epoch seconds. A cycle folder is
replaced as a whole (written under a dot-name, then renamed into place), so
re-running an interval replaces its cycles and never duplicates them. Readers
skip names starting with ``.`` or ``_``, so they never see a half-written cycle.

This module uses pyarrow and pandas only: the forecast and the gates read the
history without a SparkSession.
"""
from __future__ import annotations

import json
import logging
import re
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from mjoin.model.statistics import ROW_COLUMNS, Statistics, StatisticsError, json_default
from mjoin.model.timeutil import iso, parse_time, to_epoch
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)

CYCLE_DIR = re.compile(r"^cycle=(-?\d+)$")
PART_FILE = "part-00000.parquet"
META_FILE = "_cycle.json"
HISTOGRAM_DIR = "_histogram"
CELLS_DIR = "_cells"
CELL_KINDS = ("buckets", "ranges")
RUNS_DIR = "_runs"

_NUMERIC = ("lambda", "kappa", "window_tuples", "tuples", "gamma", "mu", "q", "m", "s")
#: Parquet schema of the history: exactly ``statistics.ROW_COLUMNS``.
HISTORY_SCHEMA = pa.schema(
    [("query", pa.string()), ("cycle_start", pa.timestamp("us", tz="UTC")), ("cycle_seconds", pa.float64()),
     ("group", pa.int64()), ("entity", pa.string()), ("stream", pa.string()), ("right", pa.string())]
    + [(c, pa.float64()) for c in _NUMERIC])
assert tuple(HISTORY_SCHEMA.names) == ROW_COLUMNS
#: Parquet schema of the per-key rate histogram (tuples per key bucket ``pmod(key, buckets)``).
HISTOGRAM_SCHEMA = pa.schema([
    ("query", pa.string()), ("cycle_start", pa.timestamp("us", tz="UTC")), ("cycle_seconds", pa.float64()),
    ("stream", pa.string()), ("attr_class", pa.string()), ("key_column", pa.string()),
    ("buckets", pa.int64()), ("bucket", pa.int64()), ("tuples", pa.int64()),
])
HISTOGRAM_COLUMNS = tuple(HISTOGRAM_SCHEMA.names)


class HistoryError(StatisticsError):
    """A history that cannot be written or read as asked (overlapping cycle grids, no such query)."""


# ---- paths ------------------------------------------------------------------------

def history_root(lake) -> str:
    """The default history root of a lake (``Lake.stats(query)`` without the query)."""
    path = str(lake.stats("_"))
    return path[: -len("/_")]


def query_dir(root, query_name: str) -> str:
    return fsutil.join(root, query_name)


def cycle_name(cycle_epoch: int) -> str:
    return f"cycle={int(cycle_epoch)}"


def _cycle_epoch(value) -> int:
    e = to_epoch(value)
    if e != int(e):
        raise HistoryError(f"cycle start {value!r} is not a whole second")
    return int(e)


def resolve_query_dir(root, query_name: str | None = None) -> tuple[str, str]:
    """``(folder of the query's cycles, query name)`` for a root or a query folder.

    ``root`` may be the history root (then ``query_name`` picks the query, or the only
    query in it is used) or the query's own folder (it holds ``cycle=*`` folders)."""
    names = fsutil.listdir(root)
    if any(CYCLE_DIR.match(n) for n in names):
        name = query_name or str(root).rstrip("/").replace("\\", "/").split("/")[-1]
        return str(root), name
    if query_name:
        qd = query_dir(root, query_name)
        if not fsutil.is_dir(qd):
            raise HistoryError(f"no statistics history for query {query_name!r} under {root}")
        return qd, query_name
    queries = [n for n in names if not n.startswith((".", "_")) and fsutil.is_dir(fsutil.join(root, n))]
    if len(queries) == 1:
        return query_dir(root, queries[0]), queries[0]
    if not queries:
        raise HistoryError(f"{root} holds no statistics history (no cycle=<epoch> folders, no query folders)")
    raise HistoryError(f"{root} holds the histories of several queries ({', '.join(queries)}); name one")


def list_cycles(root, query_name: str, start=None, end=None) -> list[int]:
    """Cycle starts (epoch seconds) stored for a query with ``start <= cycle < end``, ascending."""
    return _epochs_in(query_dir(root, query_name), start, end)


def _epochs_in(folder, start=None, end=None) -> list[int]:
    lo = None if start is None else to_epoch(start)
    hi = None if end is None else to_epoch(end)
    out = []
    for n in fsutil.listdir(folder):
        m = CYCLE_DIR.match(n)
        if m:
            e = int(m.group(1))
            if (lo is None or e >= lo) and (hi is None or e < hi):
                out.append(e)
    return sorted(out)


# ---- writing ------------------------------------------------------------------------

def _table(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    df = df.copy()
    for c in schema.names:
        if c not in df.columns:
            df[c] = None
    df = df[list(schema.names)]
    if "cycle_start" in df.columns:
        df["cycle_start"] = pd.to_datetime(df["cycle_start"], utc=True)
    return pa.Table.from_pandas(df, schema=schema, preserve_index=False)


def _write_dir_atomically(final: str, files: dict) -> None:
    """Write ``{name: bytes | pa.Table}`` into a fresh folder and rename it over ``final``."""
    fs, final_p = fsutil.resolve(final)
    parent, name = final_p.rsplit("/", 1)
    fs.create_dir(parent, recursive=True)
    tag = uuid.uuid4().hex[:12]
    tmp = f"{parent}/.tmp-{name}-{tag}"
    fs.create_dir(tmp, recursive=True)
    for fname, content in files.items():
        if isinstance(content, pa.Table):
            pq.write_table(content, f"{tmp}/{fname}", filesystem=fs, compression="zstd")
        else:
            with fs.open_output_stream(f"{tmp}/{fname}") as f:
                f.write(content)
    for attempt in range(5):
        old = None
        if fs.get_file_info(final_p).type != pafs.FileType.NotFound:
            old = f"{parent}/.old-{name}-{tag}-{attempt}"
            try:
                fs.move(final_p, old)
            except OSError:
                continue  # another writer moved it first; look again
        try:
            fs.move(tmp, final_p)
        except OSError:
            continue  # another writer put its folder in place between our two renames; retry
        if old is not None:
            fs.delete_dir(old)
        return
    fs.delete_dir(tmp)
    raise HistoryError(f"could not replace {final} (concurrent writers?)")


def write_cycle(root, query_name: str, cycle_start, rows: pd.DataFrame, meta: dict | None = None,
                histogram: pd.DataFrame | None = None) -> str:
    """Replace one cycle of the history (rows, meta, histogram); returns the cycle folder."""
    epoch = _cycle_epoch(cycle_start)
    _check_query(rows, query_name)
    return _write_one(query_dir(root, query_name), epoch, _table(rows, HISTORY_SCHEMA), meta,
                      None if histogram is None else _table(histogram, HISTOGRAM_SCHEMA))


def _check_query(rows: pd.DataFrame, query_name: str) -> None:
    if len(rows) and set(rows["query"].unique()) != {query_name}:
        raise HistoryError(f"rows of query {sorted(rows['query'].unique())} written to the history of {query_name!r}")


def _write_one(qd: str, epoch: int, rows: pa.Table, meta: dict | None, histogram: pa.Table | None) -> str:
    if histogram is not None:
        _write_dir_atomically(fsutil.join(qd, HISTOGRAM_DIR, cycle_name(epoch)), {PART_FILE: histogram})
    files = {PART_FILE: rows,
             META_FILE: json.dumps(meta or {}, indent=1, default=json_default, allow_nan=False).encode()}
    final = fsutil.join(qd, cycle_name(epoch))
    _write_dir_atomically(final, files)
    return final


def _by_cycle(table: pa.Table) -> tuple[dict, pa.Table]:
    """Row ranges of a table per cycle start (epoch seconds), after sorting it by cycle."""
    if table.num_rows == 0:
        return {}, table
    table = table.sort_by([("cycle_start", "ascending")])
    us = table.column("cycle_start").cast(pa.int64()).to_numpy()
    cuts = np.flatnonzero(np.diff(us)) + 1
    starts = np.r_[0, cuts]
    ends = np.r_[cuts, len(us)]
    return {int(us[a] // 1_000_000): (int(a), int(b)) for a, b in zip(starts, ends)}, table


def write_cycles(root, query_name: str, epochs, rows: pd.DataFrame, meta: dict,
                 histogram: pd.DataFrame | None = None) -> list[str]:
    """Replace the cycles ``epochs`` (each one folder, atomically): the rows of all of them in one frame
    (converted to Arrow once, then sliced per cycle), ``meta`` per epoch, and the histogram rows (every
    listed cycle gets a histogram file, maybe empty, unless ``histogram`` is None)."""
    epochs = [_cycle_epoch(e) for e in epochs]
    _check_query(rows, query_name)
    qd = query_dir(root, query_name)
    ranges, rows_t = _by_cycle(_table(rows, HISTORY_SCHEMA))
    hranges, hist_t = _by_cycle(_table(histogram, HISTOGRAM_SCHEMA)) if histogram is not None else ({}, None)

    def one(epoch):
        a, b = ranges.get(epoch, (0, 0))
        h = None
        if hist_t is not None:
            ha, hb = hranges.get(epoch, (0, 0))
            h = hist_t.slice(ha, hb - ha)
        return _write_one(qd, epoch, rows_t.slice(a, b - a), meta.get(epoch), h)

    if len(epochs) < 4:
        return [one(e) for e in epochs]
    # small files and renames: a few threads hide the file system's latency (each cycle is its own folder)
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, epochs))


def write_cells(root, query_name: str, kind: str, epochs, rows: pd.DataFrame) -> list[str]:
    """Replace the per-cell rows (``group`` = cell) of the cycles ``epochs`` (each one folder, atomically; a
    cycle without rows gets an empty file). Written before the cycles themselves by the statistics job."""
    if kind not in CELL_KINDS:
        raise HistoryError(f"unknown cell kind {kind!r} ({', '.join(CELL_KINDS)})")
    epochs = [_cycle_epoch(e) for e in epochs]
    _check_query(rows, query_name)
    cd = fsutil.join(query_dir(root, query_name), CELLS_DIR, kind)
    ranges, rows_t = _by_cycle(_table(rows, HISTORY_SCHEMA))

    def one(epoch):
        a, b = ranges.get(epoch, (0, 0))
        final = fsutil.join(cd, cycle_name(epoch))
        _write_dir_atomically(final, {PART_FILE: rows_t.slice(a, b - a)})
        return final

    if len(epochs) < 4:
        return [one(e) for e in epochs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, epochs))


def read_cells(root, query_name: str | None, kind: str, start=None, end=None) -> pd.DataFrame:
    """Per-cell tidy rows (``group`` = cell) of the stored cycles in ``[start, end)`` that have them, sorted by
    cycle; ``df.attrs["rules"]`` maps each cycle's ISO start to its cell rule (``_cycle.json``'s ``cells``)."""
    qd, name = resolve_query_dir(root, query_name)
    cd = fsutil.join(qd, CELLS_DIR, kind)
    fs, base = fsutil.resolve(qd)
    _, cbase = fsutil.resolve(cd)
    rules, paths = {}, []
    for e in _epochs_in(qd, start, end):
        rule = (_read_meta_path(fs, f"{base}/{cycle_name(e)}/{META_FILE}").get("cells") or {}).get(kind)
        p = f"{cbase}/{cycle_name(e)}/{PART_FILE}"
        if rule and fs.get_file_info(p).type == pafs.FileType.File:
            rules[iso(e)] = rule
            paths.append(p)
    df = _read_files(paths, HISTORY_SCHEMA, fs).to_pandas()
    df = df.sort_values(["cycle_start", "group", "entity", "stream", "right"], kind="stable",
                        na_position="first").reset_index(drop=True)
    df.attrs["rules"] = rules
    return df


def write_run_summary(root, query_name: str, summary: dict) -> str:
    path = fsutil.join(query_dir(root, query_name), RUNS_DIR,
                       f"{int(to_epoch(summary['start']))}-{int(to_epoch(summary['end']))}.json")
    fsutil.atomic_write_text(path, json.dumps(summary, indent=1, default=json_default))
    return path


def check_grid(root, query_name: str, start, end, cycle_seconds: float) -> None:
    """Refuse to write cycles that would overlap stored cycles of another grid (phase or length).

    Looks at the stored cycles inside ``[start, end)`` (they will be replaced: they must be on
    the same grid) and at the last stored cycle before ``start`` (it must end by ``start``)."""
    t0, t1 = to_epoch(start), to_epoch(end)
    qd = query_dir(root, query_name)
    stored = _epochs_in(qd)
    before = [e for e in stored if e < t0]
    inside = [e for e in stored if t0 <= e < t1]

    def length(e):
        return (read_cycle_meta(root, query_name, e) or {}).get("cycle_seconds") or cycle_seconds

    for e in inside:
        if (e - t0) % cycle_seconds or length(e) != cycle_seconds:
            raise HistoryError(f"the history of {query_name} holds cycle {iso(e)} ({length(e):g}s) that overlaps the "
                               f"new {cycle_seconds:g}s cycles [{iso(t0)}, {iso(t1)}) on another grid; use the same "
                               f"cycle grid (one history has one cycle length) or remove {cycle_name(e)}")
    if before:
        e = before[-1]
        if e + length(e) > t0:
            raise HistoryError(f"the history of {query_name} holds cycle {iso(e)} ({length(e):g}s) that overlaps the "
                               f"new cycles from {iso(t0)} on another grid; use the same cycle grid or remove "
                               f"{cycle_name(e)}")
        if length(e) != cycle_seconds:
            raise HistoryError(f"the history of {query_name} has {length(e):g}s cycles (last before the interval: "
                               f"{iso(e)}); the new cycles are {cycle_seconds:g}s (one history has one cycle length)")


# ---- reading ------------------------------------------------------------------------

def _read_files(paths: list[str], schema: pa.Schema, fs) -> pa.Table:
    if not paths:
        return schema.empty_table()
    return pads.dataset(paths, schema=schema, format="parquet", filesystem=fs).to_table()


def empty_history() -> pd.DataFrame:
    return HISTORY_SCHEMA.empty_table().to_pandas()


def read_history(root, query_name: str | None = None, start=None, end=None, *, meta: bool = False) -> pd.DataFrame:
    """Tidy rows of the cycles with ``start <= cycle_start < end``, sorted by cycle.

    ``root`` is the history root or the query's folder (see :func:`resolve_query_dir`).
    With ``meta=True``, ``df.attrs["cycles"]`` maps each cycle's ISO start to its ``_cycle.json``.
    """
    qd, name = resolve_query_dir(root, query_name)
    epochs = _epochs_in(qd, start, end)
    fs, base = fsutil.resolve(qd)
    paths = []
    for e in epochs:
        p = f"{base}/{cycle_name(e)}/{PART_FILE}"
        if fs.get_file_info(p).type == pafs.FileType.File:
            paths.append(p)
        else:
            log.warning("history cycle %s of %s has no %s; skipped", iso(e), name, PART_FILE)
    df = _read_files(paths, HISTORY_SCHEMA, fs).to_pandas()
    if len(df) and set(df["query"].unique()) - {name}:
        df = df[df["query"] == name]
    df = df.sort_values(["cycle_start", "group", "entity", "stream", "right"], kind="stable",
                        na_position="first").reset_index(drop=True)
    if meta:
        df.attrs["cycles"] = {iso(e): _read_meta_path(fs, f"{base}/{cycle_name(e)}/{META_FILE}") for e in epochs}
    return df


def _read_meta_path(fs, path) -> dict:
    if fs.get_file_info(path).type != pafs.FileType.File:
        return {}
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def read_cycle_meta(root, query_name: str, cycle_start) -> dict:
    """The ``_cycle.json`` of one stored cycle ({} if absent)."""
    fs, base = fsutil.resolve(query_dir(root, query_name))
    return _read_meta_path(fs, f"{base}/{cycle_name(_cycle_epoch(cycle_start))}/{META_FILE}")


def read_histogram(root, query_name: str | None = None, start=None, end=None) -> pd.DataFrame:
    """Per-key rate histogram rows (``HISTOGRAM_COLUMNS``) of the cycles in ``[start, end)``."""
    qd, name = resolve_query_dir(root, query_name)
    hd = fsutil.join(qd, HISTOGRAM_DIR)
    fs, base = fsutil.resolve(hd)
    paths = [p for e in _epochs_in(hd, start, end)
             if fs.get_file_info(p := f"{base}/{cycle_name(e)}/{PART_FILE}").type == pafs.FileType.File]
    df = _read_files(paths, HISTOGRAM_SCHEMA, fs).to_pandas()
    return df.sort_values(["cycle_start", "stream", "attr_class", "bucket"], kind="stable").reset_index(drop=True)


def cycle_starts(history: pd.DataFrame) -> list[pd.Timestamp]:
    return sorted(pd.to_datetime(history["cycle_start"], utc=True).unique())


def snapshot(history: pd.DataFrame, cycle_start) -> Statistics:
    """One measured cycle of a history frame as :class:`~mjoin.model.statistics.Statistics`."""
    at = pd.Timestamp(parse_time(cycle_start))
    starts = pd.to_datetime(history["cycle_start"], utc=True)
    rows = history[starts == at]
    if rows.empty:
        have = cycle_starts(history)
        span = f"{iso(have[0])} .. {iso(have[-1])}" if have else "none"
        raise StatisticsError(f"the history holds no cycle starting at {iso(at)} (cycles: {span})")
    st = Statistics.from_rows(_records(rows), kind="measured")
    meta = (history.attrs.get("cycles") or {}).get(iso(at)) or {}
    st.partitioning = meta.get("partitioning")
    st.meta = {k: meta[k] for k in ("mode", "null_keys", "kappa_by_class", "run") if k in meta}
    return st


def _records(df: pd.DataFrame) -> list[dict]:
    """Rows as dicts with NaN -> None and numpy scalars -> Python (what ``Statistics.from_rows`` expects)."""
    out = []
    for rec in df.to_dict("records"):
        out.append({k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in rec.items()})
    return out
