"""The statistics job (Spark): every cycle of an interval, per key group, into the history.

    run_statistics(spark, query, lake, start, end, cycle_seconds, config=StatsConfig(...)) -> StatsRun

reads each stream's landed rows once (the interval plus the window lead-in),
computes lambda, kappa, window_tuples per stream and q, m, s (so gamma, mu) per
directed edge for every cycle and key group, and the per-key rate histogram, then
replaces those cycles in the Parquet history (:mod:`mjoin.stats.history`).
``mode="exact"`` computes everything exactly, by default in one Spark job
(:func:`mjoin.stats.exact.one_pass`, ``method="pass"``, whose kernel runs on the driver when the
interval's files hold at most ``driver_rows`` rows, else on the executors; ``method="sql"``: one Spark
SQL aggregation per statistic over the cached rows); ``mode="sketch"`` bounds memory
for large key domains (:mod:`mjoin.stats.sketchmode`). The summary reports the job's
own wall time, skipped files, NULL keys and unusable event times.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone

import numpy as np
import pandas as pd
from pyspark import StorageLevel

from mjoin.model.keygroups import num_groups, rule_problems
from mjoin.model.statistics import Statistics, StatisticsError
from mjoin.model.timeutil import iso, to_epoch
from mjoin.runtime.spark import session_info
from mjoin.stats import exact, history, sketchmode
from mjoin.stats.bands import apply_bands
from mjoin.stats.sketch import SketchConfig
from mjoin.stats.sources import (US, DriverReadUnsupported, Grid, checked_files, driver_read_problem, load_streams,
                                 read_routed)

log = logging.getLogger(__name__)

MODES = ("exact", "sketch")
METHODS = ("pass", "sql")  # exact mode: one Spark job with a numpy pass per partition, or Spark SQL aggregations


class StatsJobError(StatisticsError):
    """A statistics job that cannot run as asked (bad interval, cycle, partitioning, mode)."""


@dataclass
class StatsConfig:
    mode: str = "exact"
    partitioning: dict | None = None  # a plan's partitioning rule (mjoin.model.keygroups); None: one group 0
    histogram_buckets: int = 1024  # 0: exact keys (one row per key: only for small key domains)
    prune_arrivals: bool = True
    sketch: "object | None" = None  # mjoin.stats.sketch.SketchConfig for mode="sketch" (defaults if None)
    method: str = "pass"  # exact mode: "pass" (one Spark job) or "sql" (one aggregation per statistic)
    # exact pass: run the kernel on the driver when the files to read hold at most this many rows (times
    # the attribute classes; Parquet footers); 0: always on the executors. The kernel's peak memory is
    # about 370 bytes per row (TPC-DS sf 1, 600k rows: 220 MB), so the default stays under ~400 MB
    driver_rows: int = 1_000_000
    # per-cell statistics in the same pass (exact pass mode, queries on one attribute class): per key bucket
    # pmod(key, B) and per key range (R equal ranges of [0, 2^k) >= the keys), what the optimizer needs to
    # price key-to-group rules it has not run (mjoin.optimizer.partitioning); 0: none
    key_buckets: int = 64
    key_ranges: int = 64
    # exact pass with the kernel on the driver: read the interval's files with pyarrow there too (no Spark job),
    # where that gives exactly Spark's rows (sources.driver_read_problem); False: collect them with Spark
    driver_read: bool = True

    def to_json(self) -> dict:
        d = asdict(self)
        d["sketch"] = None if self.sketch is None else asdict(self.sketch)
        return d


@dataclass
class StatsRun:
    rows: pd.DataFrame  # tidy rows of every cycle (statistics.ROW_COLUMNS)
    histogram: pd.DataFrame  # history.HISTOGRAM_COLUMNS
    cycle_meta: dict  # cycle epoch -> _cycle.json content
    summary: dict = field(default_factory=dict)
    #: per-cell statistics: kind ("buckets", "ranges") -> (cell rule, tidy rows with group = cell)
    cells: dict = field(default_factory=dict)

    def snapshot(self, cycle_start) -> Statistics:
        return history.snapshot(self.rows, cycle_start)


def make_grid(start, end, cycle_seconds) -> Grid:
    t0, t1 = to_epoch(start), to_epoch(end)
    try:
        tau = float(cycle_seconds)
    except (TypeError, ValueError):
        raise StatsJobError(f"cycle {cycle_seconds!r} is not a number of seconds") from None
    if not tau > 0 or tau != int(tau):
        raise StatsJobError(f"cycle must be a positive whole number of seconds, got {cycle_seconds!r}")
    if t0 != int(t0) or t1 != int(t1):
        raise StatsJobError(f"--from and --to must be whole seconds, got {iso(t0)} and {iso(t1)}")
    if t1 <= t0:
        raise StatsJobError(f"empty interval: --to {iso(t1)} is not after --from {iso(t0)}")
    if (t1 - t0) % tau:
        n = int((t1 - t0) // tau)
        raise StatsJobError(f"[{iso(t0)}, {iso(t1)}) is not a whole number of {tau:g}s cycles; "
                            f"use --to {iso(t0 + n * tau)} or {iso(t0 + (n + 1) * tau)}")
    return Grid(int(t0) * US, int(t1) * US, int(tau) * US)


def _check_config(query, config: StatsConfig) -> None:
    if config.mode not in MODES:
        raise StatsJobError(f"mode {config.mode!r}: use one of {', '.join(MODES)}")
    if config.method not in METHODS:
        raise StatsJobError(f"method {config.method!r}: use one of {', '.join(METHODS)}")
    if int(config.driver_rows) < 0:
        raise StatsJobError(f"driver rows must be >= 0 (0: always run the kernel on the executors), got {config.driver_rows}")
    if int(config.key_buckets) < 0 or int(config.key_ranges) < 0:
        raise StatsJobError(f"key buckets and key ranges must be >= 0 (0: none), got {config.key_buckets}, "
                            f"{config.key_ranges}")
    if int(config.histogram_buckets) < 0:
        raise StatsJobError(f"histogram buckets must be >= 1 (or 0 for exact keys), got {config.histogram_buckets}")
    problems = rule_problems(config.partitioning, query)
    if problems:
        raise StatsJobError("partitioning cannot be used: " + "; ".join(problems))


def compute_statistics(spark, query, lake, start, end, cycle_seconds, config: StatsConfig | None = None) -> StatsRun:
    """Statistics of every cycle of ``[start, end)`` (nothing is written)."""
    config = config or StatsConfig()
    _check_config(query, config)
    grid = make_grid(start, end, cycle_seconds)
    t_start = time.perf_counter()
    timings = {}
    classes = query.all_classes  # band classes (PSP) are keyed by their band column; their edges: stats.bands
    stream_classes = [[classes.index(c) for c in query.all_classes_of(s)] for s in query.stream_names]
    class_members = {ci: [sid for sid, cs in enumerate(stream_classes) if ci in cs] for ci in range(len(classes))}
    windows_us = [exact.micros(s.window) for s in query.streams]

    files = checked_files(query, lake, grid, prune_arrivals=config.prune_arrivals)
    reports = files[0]
    routed_bound = sum(reports[s].rows_in_files * len(stream_classes[sid]) for sid, s in enumerate(query.stream_names))
    one_pass = config.mode == "exact" and config.method == "pass"
    on_driver = one_pass and 0 < routed_bound <= int(config.driver_rows)
    read_problem = ("off (driver_read = False)" if not config.driver_read else
                    driver_read_problem(spark, query)) if on_driver else "the kernel runs on the executors"
    base = None
    if read_problem is not None:
        base, _ = load_streams(spark, query, lake, grid, config.partitioning, prune_arrivals=config.prune_arrivals,
                               files=files)
    timings["plan"] = time.perf_counter() - t_start  # listing and checking the landed files
    cell_sets, cell_note = cell_rules(query, config, reports)
    sketch_info = kernel_where = None
    cell_frames = []
    if one_pass:
        t = time.perf_counter()
        cells = tuple(kernel_cells(r) for r in cell_sets.values())
        res = None
        if read_problem is None:
            try:
                res = exact.driver_pass(read_routed, query, grid, config.partitioning, files[1], windows_us,
                                        stream_classes, class_members, config.histogram_buckets, cells)
            except DriverReadUnsupported as exc:
                read_problem = str(exc)
                base, _ = load_streams(spark, query, lake, grid, config.partitioning,
                                       prune_arrivals=config.prune_arrivals, files=files)
        if res is None:
            partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
            res = exact.one_pass(base, grid, windows_us, stream_classes, class_members, config.histogram_buckets,
                                 partitions, on_driver=on_driver, cells=cells)
        cell_frames = res["cells"]
        kernel_where = {"where": "driver" if on_driver else "executors", "rows_bound": routed_bound,
                        "driver_rows": int(config.driver_rows),
                        "read": "pyarrow on the driver" if read_problem is None else "spark"}
        if on_driver and read_problem is not None:
            kernel_where["read_note"] = read_problem
        log.info("statistics kernel on the %s (at most %d routed rows; driver_rows %d; read by %s)",
                 kernel_where["where"], routed_bound, config.driver_rows, kernel_where["read"])
        timings["one_pass"] = time.perf_counter() - t
        timings.update({f"one_pass_{k}": v for k, v in res["seconds"].items()})
        counts, wt, kap, edges, hist = (res[k] for k in ("counts", "window_tuples", "kappa", "edges", "histogram"))
        key_range = res["key_range"]
    else:
        counts, wt, kap, edges, hist, sketch_info, config = _sql_path(spark, base, grid, config, windows_us,
                                                                      stream_classes, class_members, timings)
        key_range = {}
        if hist is not None and len(hist):
            kr = hist.groupby(["sid", "ci"]).agg(lo=("kmin", "min"), hi=("kmax", "max"))
            key_range = {(int(a), int(c)): (int(r.lo), int(r.hi)) for (a, c), r in kr.iterrows()}
    t = time.perf_counter()
    run = assemble_run(query, grid, config, {"counts": counts, "window_tuples": wt, "kappa": kap, "edges": edges,
                                             "histogram": hist, "cells": cell_frames}, cell_sets)
    timings["assemble"] = time.perf_counter() - t
    if getattr(query, "bands", ()):  # edges a band filters: their matches as the engine keeps them

        t = time.perf_counter()
        run.rows = apply_bands(run.rows, query, lake, grid)
        timings["bands"] = time.perf_counter() - t
    run.summary = _summary(query, grid, config, counts, key_range, reports, stream_classes, classes)
    run.summary["cells"] = {"sets": {kind: rule for kind, (rule, _) in run.cells.items()}, "note": cell_note}
    if sketch_info:
        run.summary["sketch"] = sketch_info
    if kernel_where:
        run.summary["kernel"] = kernel_where
    run.summary["wall_seconds"] = {"compute": time.perf_counter() - t_start, **timings}
    run.summary["spark"] = session_info(spark)
    return run


def assemble_run(query, grid: Grid, config: StatsConfig, frames: dict, cell_sets: dict | None = None) -> StatsRun:
    """The tidy rows, per-cycle meta, histogram and per-cell rows of every cycle of ``grid`` from the summed
    partial counts (``frames``: what :func:`mjoin.stats.kernel.reduce_partials` gives; ``cell_sets``: the cell
    rules, ``{kind: rule}``, in the order of ``frames["cells"]``). The standalone job and the streaming job's
    own statistics (:mod:`mjoin.stats.emitted`) both assemble with it: one schema, one assembly."""
    classes = query.all_classes
    stream_classes = [[classes.index(c) for c in query.all_classes_of(s)] for s in query.stream_names]
    run = _assemble(query, grid, config, frames["counts"], frames["window_tuples"], frames["kappa"], frames["edges"],
                    frames.get("histogram"), stream_classes, classes)
    for (kind, rule), fr in zip((cell_sets or {}).items(), frames.get("cells") or []):
        rows = _assemble(query, grid, replace(config, partitioning=rule), fr["counts"], fr["window_tuples"],
                         fr["kappa"], fr["edges"], None, stream_classes, classes).rows
        rows.attrs.clear()
        run.cells[kind] = (rule, rows)
    for m in run.cycle_meta.values():
        m["cells"] = {kind: rule for kind, (rule, _) in run.cells.items()}
    run.rows.attrs["cycles"] = {iso(e): m for e, m in run.cycle_meta.items()}
    return run


def write_run(root: str, query, grid: Grid, run: StatsRun) -> None:
    """Replace the cycles of ``grid`` in the history under ``root`` with ``run``'s (each cycle folder atomically:
    the per-cell rows first, so a cycle present has its cells)."""
    history.check_grid(root, query.name, grid.t0_us / US, grid.t1_us / US, grid.tau)
    epochs = [grid.start_epoch(j) for j in range(grid.n)]
    for kind, (_, rows) in run.cells.items():
        history.write_cells(root, query.name, kind, epochs, rows)
    history.write_cycles(root, query.name, epochs, run.rows, run.cycle_meta, run.histogram)


def cell_rules(query, config: StatsConfig, reports) -> tuple[dict, str]:
    """``({kind: cell rule}, note)``: the key cells whose statistics this run computes in the same pass.

    ``buckets``: ``{"method": "hash", "groups": B}`` (cell = ``pmod(key, B)``); ``ranges``: a range rule of
    ``R`` equal ranges of ``[0, 2^k)``, ``2^k`` the smallest power of two above every key of the interval's
    files (from their Parquet footers; negative keys fall in the first range), so the cells stay the same
    from run to run while the key domain stays under ``2^k``. None when the run cannot compute them (the
    note says why): they need exact mode's one pass and a query on one attribute class (a cell is then a
    function of every join key, so matches stay within a cell)."""
    if not (config.key_buckets or config.key_ranges):
        return {}, "off (key_buckets = key_ranges = 0)"
    if config.mode != "exact" or config.method != "pass":
        return {}, "per-cell statistics are computed by exact mode's one pass only (--mode exact --method pass)"
    classes = query.all_classes
    if len(classes) != 1:
        return {}, f"per-cell statistics need a query on one attribute class ({query.name} has {len(classes)})"
    cls = classes[0]
    out, notes = {}, []
    if config.key_buckets:
        out["buckets"] = {"method": "hash", "attr_class": cls, "groups": int(config.key_buckets)}
    if config.key_ranges:
        hi, unknown = None, []
        for s in query.streams:
            col = query.key_column(s.name, cls)
            rng = reports[s.name].key_range.get(col, ())  # (): no file, or only NULL keys
            if rng is None:
                unknown.append(s.name)
            elif rng:
                hi = rng[1] if hi is None else max(hi, rng[1])
        if unknown:
            notes.append(f"no key ranges: the Parquet footers of {', '.join(unknown)} have no key statistics")
        elif hi is None or hi < 1:
            notes.append("no key ranges: no positive key in the interval's files")
        else:
            span = 1 << int(hi).bit_length()  # smallest power of two > hi
            r = min(int(config.key_ranges), span)
            width = span // r
            out["ranges"] = {"method": "range", "attr_class": cls, "bounds": [width * i for i in range(1, r)]}
    return out, "; ".join(notes)


def kernel_cells(rule: dict) -> tuple:
    """A cell rule as :attr:`mjoin.stats.kernel.Params.cells` takes it."""
    if rule["method"] == "hash":
        return ("mod", int(rule["groups"]))
    return ("range", tuple(int(b) for b in rule["bounds"]))


def _sql_path(spark, base, grid, config, windows_us, stream_classes, class_members, timings):
    """Exact mode with ``method="sql"`` and sketch mode: Spark aggregations over the cached rows."""
    nclasses = len(class_members)
    base = base.persist(StorageLevel.MEMORY_AND_DISK)
    sketch_info = None
    try:
        t = time.perf_counter()
        counts = exact.cycle_counts(base, grid, nclasses)
        timings["read_and_count"] = time.perf_counter() - t
        t = time.perf_counter()
        wt = exact.window_tuples(base, grid, windows_us, stream_classes)
        timings["window_tuples"] = time.perf_counter() - t
        t = time.perf_counter()
        hist = exact.histogram(base, grid, stream_classes, config.histogram_buckets)
        timings["histogram"] = time.perf_counter() - t
        if config.mode == "exact":
            t = time.perf_counter()
            kap = exact.kappa(base, grid, windows_us, stream_classes)
            timings["kappa"] = time.perf_counter() - t
            t = time.perf_counter()
            edges = exact.edge_counts(base, grid, windows_us, class_members)
            timings["edges"] = time.perf_counter() - t
        else:
            config = replace(config, sketch=config.sketch or SketchConfig())
            t = time.perf_counter()
            kap, edges, sketch_info = sketchmode.sketch_statistics(spark, base, grid, windows_us, stream_classes,
                                                                   class_members, config.sketch)
            timings["sketch"] = time.perf_counter() - t
    finally:
        base.unpersist()
    return counts, wt, kap, edges, hist, sketch_info, config


def run_statistics(spark, query, lake, start, end, cycle_seconds, *, out=None,
                   config: StatsConfig | None = None) -> StatsRun:
    """Compute the statistics of ``[start, end)`` and replace those cycles in the history.

    ``out`` is the history root (default ``<lake>/stats``, see :func:`history.history_root`)."""
    t_start = time.perf_counter()
    root = str(out) if out else history.history_root(lake)
    grid = make_grid(start, end, cycle_seconds)
    history.check_grid(root, query.name, grid.t0_us / US, grid.t1_us / US, grid.tau)
    run = compute_statistics(spark, query, lake, start, end, cycle_seconds, config)
    t = time.perf_counter()
    write_run(root, query, grid, run)
    run.summary["wall_seconds"]["write"] = time.perf_counter() - t
    run.summary["wall_seconds"]["total"] = time.perf_counter() - t_start
    run.summary["out"] = history.query_dir(root, query.name)
    run.summary["summary_file"] = history.write_run_summary(root, query.name, run.summary)
    return run


# ---- assembling the schema's rows ------------------------------------------------------

def _dense(df: pd.DataFrame, keys: list[str], value: str, shape: tuple, valid=None) -> np.ndarray:
    """A frame of ``(keys..., value)`` as a dense array (rows with a NULL or out-of-range key are left out)."""
    arr = np.zeros(shape, dtype=np.float64)
    if df is None or df.empty:
        return arr
    idx = [df[k].to_numpy(dtype=np.float64) for k in keys]  # NULL -> NaN (numpy: pandas' dropna was most of it)
    ok = np.ones(len(df), dtype=bool)
    for i, n in zip(idx, shape):
        ok &= (i >= 0) & (i < n)  # False for NaN
    np.add.at(arr, tuple(i[ok].astype(np.int64) for i in idx), df[value].to_numpy(dtype=np.float64)[ok])
    return arr


def _keyed(counts: pd.DataFrame, stream_classes) -> pd.DataFrame:
    """``counts`` with a column ``keyed``: each row's NN of its stream's first class."""
    if counts is None or not len(counts):
        return pd.DataFrame(columns=["sid", "g", "j", "keyed"])
    first = np.array([cs[0] for cs in stream_classes], dtype=np.int64)[counts["sid"].to_numpy(dtype=np.int64)]
    out = counts.copy()
    out["keyed"] = 0.0
    for ci in np.unique(first):
        sel = first == ci
        out.loc[sel, "keyed"] = counts.loc[sel, f"nn{ci}"].to_numpy(dtype=np.float64)
    return out


def _assemble(query, grid, config, counts, wt, kap, edges, hist, stream_classes, classes) -> StatsRun:
    """The tidy rows (``Statistics.to_rows`` order: per cycle and group, the streams, then the edges), the
    per-cycle meta and the histogram rows, built column-wise."""
    tau, n = grid.tau, grid.n
    G = num_groups(config.partitioning)
    names = list(query.stream_names)
    S = len(names)
    sid_of = {s: i for i, s in enumerate(names)}
    C = len(classes)
    # tuples: the rows with a key (the first class's NN: a row with a NULL key is not in the join's state, and
    # the readers give a row with a NULL in any of its stream's keys a NULL key in every class)
    tuples = _dense(_keyed(counts, stream_classes), ["sid", "g", "j"], "keyed", (S, G, n))
    wts = _dense(wt, ["sid", "g", "j"], "window_tuples", (S, G, n))
    kap_all = _dense(kap, ["sid", "ci", "g", "j"], "kappa", (S, C, G, n))
    kappa = kap_all[np.arange(S), [cs[0] for cs in stream_classes]]  # (S, G, n): over the first class
    if edges is not None and len(edges):
        edges = edges.rename(columns={"l": "l_", "r": "r_"})
    qa, ma, sa = (_dense(edges, ["l_", "r_", "g", "j"], v, (S, S, G, n)) for v in ("q", "m", "s"))
    pairs = [(sid_of[l], sid_of[r]) for l, r in query.directed_edges]
    E = len(pairs)
    # rows: cycle-major, then group, then S stream rows and E edge rows
    per_group = S + E
    total = n * G * per_group
    j_idx = np.repeat(np.arange(n), G * per_group)
    g_idx = np.tile(np.repeat(np.arange(G), per_group), n)
    pos = np.tile(np.arange(per_group), n * G)
    is_stream = pos < S
    st_i = np.where(is_stream, pos, 0)
    ed_i = np.where(is_stream, 0, pos - S)
    li = np.array([p[0] for p in pairs] or [0])[ed_i]
    ri = np.array([p[1] for p in pairs] or [0])[ed_i]
    nan = np.full(total, np.nan)
    tup = np.where(is_stream, tuples[st_i, g_idx, j_idx], nan)
    q = np.where(is_stream, nan, qa[li, ri, g_idx, j_idx])
    m = np.where(is_stream, nan, ma[li, ri, g_idx, j_idx])
    s_ = np.where(is_stream, nan, sa[li, ri, g_idx, j_idx])
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma = np.where(q > 0, m / q, 0.0)  # EdgeStats.from_counts, Eq. 9-10
        mu = np.where(m > 0, s_ / m, 1.0)
    edge_names = np.array([l for l, _ in query.directed_edges] or [""], dtype=object)
    right_names = np.array([r for _, r in query.directed_edges] or [""], dtype=object)
    stream_names = np.array(names, dtype=object)
    epochs = np.array([grid.start_epoch(j) for j in range(n)], dtype=np.int64)
    rows = pd.DataFrame({
        "query": query.name,
        "cycle_start": pd.to_datetime(epochs[j_idx], unit="s", utc=True),
        "cycle_seconds": float(tau),
        "group": g_idx.astype(np.int64),
        "entity": np.where(is_stream, "stream", "edge").astype(object),
        "stream": np.where(is_stream, stream_names[st_i], edge_names[ed_i]),
        "right": np.where(is_stream, None, right_names[ed_i]),
        "lambda": tup / tau,
        "kappa": np.where(is_stream, kappa[st_i, g_idx, j_idx], nan),
        "window_tuples": np.where(is_stream, wts[st_i, g_idx, j_idx], nan),
        "tuples": tup,
        "gamma": np.where(is_stream, nan, gamma),
        "mu": np.where(is_stream, nan, mu),
        "q": q, "m": m, "s": s_,
    }, columns=list(history.HISTORY_SCHEMA.names))
    # per-cycle meta: NULL keys per stream and key column, rows whose partitioning key is NULL
    valid = counts[(counts["j"] >= 0) & (counts["j"] < n)] if len(counts) else counts
    all_rows = np.zeros((S, n))
    nn = np.zeros((S, C, n))
    null_part = np.zeros((S, n))
    if len(valid):
        sj = (valid["sid"].to_numpy(dtype=np.int64), valid["j"].to_numpy(dtype=np.int64))
        np.add.at(all_rows, sj, valid["rows"].to_numpy(dtype=np.float64))
        for ci in range(C):
            np.add.at(nn[:, ci], sj, valid[f"nn{ci}"].to_numpy(dtype=np.float64))
        gnull = valid["g"].isna().to_numpy()
        np.add.at(null_part, (sj[0][gnull], sj[1][gnull]), valid["rows"].to_numpy(dtype=np.float64)[gnull])
    groups = range(G)
    meta = {}
    computed_at = iso(datetime.now(timezone.utc))
    for j in range(n):
        epoch = int(epochs[j])
        null_keys = {s: {query.key_column(s, classes[ci]): float(all_rows[sid, j] - nn[sid, ci, j])
                         for ci in stream_classes[sid]} for sid, s in enumerate(names)}
        by_class = {s: {classes[ci]: {str(g): float(kap_all[sid, ci, g, j]) for g in groups} for ci in stream_classes[sid]}
                    for sid, s in enumerate(names) if len(stream_classes[sid]) > 1}
        meta[epoch] = {
            "query": query.name, "query_fingerprint": query.fingerprint, "cycle_start": iso(epoch),
            "cycle_seconds": tau, "mode": config.mode, "source": "standalone",
            "partitioning": config.partitioning, "groups": G,
            "null_keys": null_keys,
            "null_partition_key": ({s: float(null_part[sid, j]) for sid, s in enumerate(names)}
                                   if config.partitioning else {}),
            "kappa_by_class": by_class,
            "histogram_buckets": int(config.histogram_buckets),
            "run": {"start": iso(grid.t0_us / US), "end": iso(grid.t1_us / US), "computed_at": computed_at},
        }
        if config.mode == "sketch" and config.sketch is not None:
            meta[epoch]["sketch"] = asdict(config.sketch)
    rows.attrs["cycles"] = {iso(e): m for e, m in meta.items()}  # what history.read_history(meta=True) gives
    hist_rows = pd.DataFrame(columns=history.HISTOGRAM_COLUMNS)
    if hist is not None and len(hist):
        h = pd.DataFrame({
            "query": query.name,
            "cycle_start": pd.to_datetime(epochs[hist["j"].to_numpy(dtype=np.int64)], unit="s", utc=True),
            "cycle_seconds": float(tau),
            "stream": stream_names[hist["sid"].to_numpy(dtype=np.int64)],
        })
        cls = np.array(classes, dtype=object)[hist["ci"].to_numpy(dtype=np.int64)]
        h["attr_class"] = cls
        keycol = {(s, c): query.key_column(s, c) for s in names for c in classes}
        h["key_column"] = [keycol[(s, c)] for s, c in zip(h["stream"], cls)]
        h["buckets"] = int(config.histogram_buckets)
        h["bucket"] = hist["bucket"].to_numpy(dtype=np.int64)
        h["tuples"] = hist["tuples"].to_numpy(dtype=np.int64)
        hist_rows = h[list(history.HISTOGRAM_COLUMNS)]
    return StatsRun(rows=rows, histogram=hist_rows, cycle_meta=meta)


def _summary(query, grid, config, counts, key_range, reports, stream_classes, classes) -> dict:
    streams = {}
    for sid, s in enumerate(query.stream_names):
        mine = counts[counts["sid"] == sid] if len(counts) else counts
        inside = mine[(mine["j"] >= 0) & (mine["j"] < grid.n)] if len(mine) else mine
        tot = float(inside["rows"].sum()) if len(inside) else 0.0
        first = stream_classes[sid][0]
        rec = reports[s].to_json()
        rec.update({
            "rows_read": int(mine["rows"].sum()) if len(mine) else 0,
            "bad_event_time": int(mine[mine["j"] == -2]["rows"].sum()) if len(mine) else 0,
            "tuples": int(inside[f"nn{first}"].sum()) if len(inside) else 0,  # rows with a key (NULL keys apart)
            "null_keys": {query.key_column(s, classes[ci]): int(tot - (inside[f"nn{ci}"].sum() if len(inside) else 0))
                          for ci in stream_classes[sid]},
        })
        if config.partitioning:
            rec["null_partition_key"] = int(inside[inside["g"].isna()]["rows"].sum()) if len(inside) else 0
        if key_range:
            B = config.histogram_buckets
            rec["histogram_exact_keys"] = {
                classes[ci]: bool(B == 0 or (sid, ci) not in key_range
                                  or (key_range[(sid, ci)][0] >= 0 and key_range[(sid, ci)][1] < B))
                for ci in stream_classes[sid]}
        streams[s] = rec
    return {
        "query": query.name, "mode": config.mode, "start": iso(grid.t0_us / US), "end": iso(grid.t1_us / US),
        "cycle_seconds": grid.tau, "cycles": grid.n, "groups": num_groups(config.partitioning),
        "partitioning": config.partitioning, "histogram_buckets": int(config.histogram_buckets),
        "streams": streams,
        "null_keys": sum(sum(v["null_keys"].values()) for v in streams.values()),
        "bad_event_time": sum(v["bad_event_time"] for v in streams.values()),
        "rejected_files": sum(len(v["rejected_files"]) for v in streams.values()),
    }

