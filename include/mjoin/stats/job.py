"""The statistics job (Spark): every cycle of an interval, per key group, into the history.

    run_statistics(spark, query, lake, start, end, cycle_seconds, config=StatsConfig(...)) -> StatsRun

reads each stream's landed rows once (the interval plus the window lead-in),
caches them, computes lambda, kappa, window_tuples per stream and q, m, s (so
gamma, mu) per directed edge for every cycle and key group, and the per-key rate
histogram, then replaces those cycles in the Parquet history
(:mod:`mjoin.stats.history`). ``mode="exact"`` computes everything exactly
(:mod:`mjoin.stats.exact`); ``mode="sketch"`` bounds memory for large key domains
(:mod:`mjoin.stats.sketchmode`). The summary reports the job's own wall time,
skipped files, NULL keys and unusable event times.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone

import pandas as pd

from ..partition import num_groups, rule_problems
from ..statistics import EdgeStats, GroupStats, Statistics, StatisticsError, StreamStats
from ..timeutil import iso, to_epoch
from . import exact, history
from .sources import US, Grid, load_streams

log = logging.getLogger(__name__)

MODES = ("exact", "sketch")


class StatsJobError(StatisticsError):
    """A statistics job that cannot run as asked (bad interval, cycle, partitioning, mode)."""


@dataclass
class StatsConfig:
    mode: str = "exact"
    partitioning: dict | None = None  # a plan's partitioning rule (mjoin.partition); None: one group 0
    histogram_buckets: int = 1024  # 0: exact keys (one row per key: only for small key domains)
    prune_arrivals: bool = True
    sketch: "object | None" = None  # mjoin.sketch.SketchConfig for mode="sketch" (defaults if None)

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
    if int(config.histogram_buckets) < 0:
        raise StatsJobError(f"histogram buckets must be >= 1 (or 0 for exact keys), got {config.histogram_buckets}")
    problems = rule_problems(config.partitioning, query)
    if problems:
        raise StatsJobError("partitioning cannot be used: " + "; ".join(problems))


def compute_statistics(spark, query, lake, start, end, cycle_seconds, config: StatsConfig | None = None) -> StatsRun:
    """Statistics of every cycle of ``[start, end)`` (nothing is written)."""
    from pyspark import StorageLevel

    config = config or StatsConfig()
    _check_config(query, config)
    grid = make_grid(start, end, cycle_seconds)
    t_start = time.perf_counter()
    timings = {}
    classes = list(query.attribute_classes)
    stream_classes = [[classes.index(c) for c in query.classes_of(s)] for s in query.stream_names]
    class_members = {ci: [sid for sid, cs in enumerate(stream_classes) if ci in cs] for ci in range(len(classes))}
    windows_us = [exact.micros(s.window) for s in query.streams]

    base, reports = load_streams(spark, query, lake, grid, config.partitioning, prune_arrivals=config.prune_arrivals)
    base = base.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        t = time.perf_counter()
        counts = exact.cycle_counts(base, grid, len(classes))
        timings["read_and_count"] = time.perf_counter() - t
        t = time.perf_counter()
        wt = exact.window_tuples(base, grid, windows_us)
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
            sketch_info = None
        else:
            from ..sketch import SketchConfig
            from . import sketchmode

            config = replace(config, sketch=config.sketch or SketchConfig())
            t = time.perf_counter()
            kap, edges, sketch_info = sketchmode.sketch_statistics(spark, base, grid, windows_us, stream_classes,
                                                                   class_members, config.sketch)
            timings["sketch"] = time.perf_counter() - t
    finally:
        base.unpersist()
    t = time.perf_counter()
    run = _assemble(query, grid, config, counts, wt, kap, edges, hist, stream_classes, classes)
    timings["assemble"] = time.perf_counter() - t
    run.summary = _summary(query, grid, config, counts, hist, reports, stream_classes, classes)
    if sketch_info:
        run.summary["sketch"] = sketch_info
    run.summary["wall_seconds"] = {"compute": time.perf_counter() - t_start, **timings}
    return run


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
    rows_by_cycle = dict(iter(run.rows.groupby(run.rows["cycle_start"].map(to_epoch).astype("int64"))))
    hist_by_cycle = {}
    if len(run.histogram):
        hist_by_cycle = dict(iter(run.histogram.groupby(run.histogram["cycle_start"].map(to_epoch).astype("int64"))))
    for j in range(grid.n):
        e = grid.start_epoch(j)
        history.write_cycle(root, query.name, e, rows_by_cycle[e], run.cycle_meta[e],
                            hist_by_cycle.get(e, pd.DataFrame(columns=history.HISTOGRAM_COLUMNS)))
    run.summary["wall_seconds"]["write"] = time.perf_counter() - t
    run.summary["wall_seconds"]["total"] = time.perf_counter() - t_start
    run.summary["out"] = history.query_dir(root, query.name)
    run.summary["summary_file"] = history.write_run_summary(root, query.name, run.summary)
    return run


# ---- assembling the schema's rows ------------------------------------------------------

def _lookup(df: pd.DataFrame, keys: list[str], value: str) -> dict:
    if df is None or df.empty:
        return {}
    sub = df.dropna(subset=keys)
    return {tuple(int(x) for x in k): float(v) for k, v in zip(sub[keys].itertuples(index=False, name=None), sub[value])}


def _assemble(query, grid, config, counts, wt, kap, edges, hist, stream_classes, classes) -> StatsRun:
    tau = grid.tau
    groups = list(range(num_groups(config.partitioning)))
    rows_of = _lookup(counts, ["sid", "g", "j"], "rows")
    wt_of = _lookup(wt, ["sid", "g", "j"], "window_tuples")
    kap_of = _lookup(kap, ["sid", "ci", "g", "j"], "kappa")
    q_of = _lookup(edges, ["l", "r", "g", "j"], "q")
    m_of = _lookup(edges, ["l", "r", "g", "j"], "m")
    s_of = _lookup(edges, ["l", "r", "g", "j"], "s")
    sid_of = {s: i for i, s in enumerate(query.stream_names)}
    # NULL keys of each cycle, per stream and key column; rows whose partitioning key is NULL
    valid = counts[(counts["j"] >= 0) & (counts["j"] < grid.n)] if len(counts) else counts
    all_rows, meta = [], {}
    computed_at = iso(datetime.now(timezone.utc))
    for j in range(grid.n):
        epoch = grid.start_epoch(j)
        gs_all = {}
        for g in groups:
            gs = GroupStats()
            for s in query.stream_names:
                sid = sid_of[s]
                n = rows_of.get((sid, g, j), 0.0)
                gs.streams[s] = StreamStats(lam=n / tau, kappa=kap_of.get((sid, stream_classes[sid][0], g, j), 0.0),
                                            window_tuples=wt_of.get((sid, g, j), 0.0), tuples=n)
            for l, r in query.directed_edges:
                key = (sid_of[l], sid_of[r], g, j)
                gs.edges[(l, r)] = EdgeStats.from_counts(q_of.get(key, 0.0), m_of.get(key, 0.0), s_of.get(key, 0.0))
            gs_all[g] = gs
        st = Statistics(query=query.name, groups=gs_all, kind="measured", cycle_start=iso(epoch), cycle_seconds=tau,
                        partitioning=config.partitioning)
        all_rows += st.to_rows()
        cyc = valid[valid["j"] == j] if len(valid) else valid
        null_keys, null_part, by_class = {}, {}, {}
        for s in query.stream_names:
            sid = sid_of[s]
            mine = cyc[cyc["sid"] == sid] if len(cyc) else cyc
            total = float(mine["rows"].sum()) if len(mine) else 0.0
            null_keys[s] = {query.key_column(s, classes[ci]): total - (float(mine[f"nn{ci}"].sum()) if len(mine) else 0.0)
                            for ci in stream_classes[sid]}
            if config.partitioning:
                null_part[s] = float(mine[mine["g"].isna()]["rows"].sum()) if len(mine) else 0.0
            if len(stream_classes[sid]) > 1:
                by_class[s] = {classes[ci]: {str(g): kap_of.get((sid, ci, g, j), 0.0) for g in groups}
                               for ci in stream_classes[sid]}
        meta[epoch] = {
            "query": query.name, "query_fingerprint": query.fingerprint, "cycle_start": iso(epoch),
            "cycle_seconds": tau, "mode": config.mode, "partitioning": config.partitioning, "groups": len(groups),
            "null_keys": null_keys, "null_partition_key": null_part, "kappa_by_class": by_class,
            "histogram_buckets": int(config.histogram_buckets),
            "run": {"start": iso(grid.t0_us / US), "end": iso(grid.t1_us / US), "computed_at": computed_at},
        }
        if config.mode == "sketch" and config.sketch is not None:
            meta[epoch]["sketch"] = asdict(config.sketch)
    rows = pd.DataFrame(all_rows, columns=list(history.HISTORY_SCHEMA.names))
    rows["cycle_start"] = pd.to_datetime(rows["cycle_start"], utc=True)
    rows.attrs["cycles"] = {iso(e): m for e, m in meta.items()}  # what history.read_history(meta=True) gives
    hist_rows = pd.DataFrame(columns=history.HISTOGRAM_COLUMNS)
    if hist is not None and len(hist):
        h = hist.copy()
        h["query"] = query.name
        h["cycle_start"] = pd.to_datetime([grid.start_epoch(int(j)) for j in h["j"]], unit="s", utc=True)
        h["cycle_seconds"] = tau
        h["stream"] = [query.stream_names[int(i)] for i in h["sid"]]
        h["attr_class"] = [classes[int(i)] for i in h["ci"]]
        h["key_column"] = [query.key_column(s, c) for s, c in zip(h["stream"], h["attr_class"])]
        h["buckets"] = int(config.histogram_buckets)
        hist_rows = h[list(history.HISTOGRAM_COLUMNS)].reset_index(drop=True)
    return StatsRun(rows=rows, histogram=hist_rows, cycle_meta=meta)


def _summary(query, grid, config, counts, hist, reports, stream_classes, classes) -> dict:
    streams = {}
    for sid, s in enumerate(query.stream_names):
        mine = counts[counts["sid"] == sid] if len(counts) else counts
        inside = mine[(mine["j"] >= 0) & (mine["j"] < grid.n)] if len(mine) else mine
        tot = float(inside["rows"].sum()) if len(inside) else 0.0
        rec = reports[s].to_json()
        rec.update({
            "rows_read": int(mine["rows"].sum()) if len(mine) else 0,
            "bad_event_time": int(mine[mine["j"] == -2]["rows"].sum()) if len(mine) else 0,
            "tuples": int(tot),
            "null_keys": {query.key_column(s, classes[ci]): int(tot - (inside[f"nn{ci}"].sum() if len(inside) else 0))
                          for ci in stream_classes[sid]},
        })
        if config.partitioning:
            rec["null_partition_key"] = int(inside[inside["g"].isna()]["rows"].sum()) if len(inside) else 0
        if hist is not None and len(hist):
            h = hist[hist["sid"] == sid]
            B = config.histogram_buckets
            rec["histogram_exact_keys"] = {
                classes[ci]: bool(B == 0 or len(hh) == 0 or (hh["kmin"].min() >= 0 and hh["kmax"].max() < B))
                for ci in stream_classes[sid] for hh in [h[h["ci"] == ci]]}
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

