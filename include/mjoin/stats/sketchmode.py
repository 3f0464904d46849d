"""Sketch mode of the statistics job (Spark side): memory bounded by the sketch sizes, not the key domain.

Time is cut into slices of ``tau / slices_per_cycle``. Per stream, attribute class,
key group and slice, Spark aggregates (no per-key state beyond the bounded parts):

- the exact row count;
- a HyperLogLog sketch of the keys (``hll_sketch_agg``); ``kappa`` at a cycle end is the
  HLL union of the slices in the window (a slice counts when at least half of it is inside);
- the dense keys' exact counts: the dense set of a class and group is the union over its
  streams of the ``dense_keys`` heaviest keys of the interval (``approx_top_k``, a bounded
  frequent-items summary), so every stream skims the same keys;
- the residual (non-dense) keys in a signed hash sketch (``xxhash64`` bucket and sign per
  table, summed per cell);
- the exact counts of a coordinated sample of the non-dense keys (``xxhash64`` below a rate
  chosen so that a window holds about ``sample_keys`` sampled keys).

The driver then estimates, per edge and cycle, ``s`` with the skimmed-sketch join size
and ``m`` from dense keys plus the sample (:mod:`mjoin.stats.sketch`), against ``r``'s window
state as a weighted sum of its slices (weights: :func:`mjoin.stats.sketch.window_weights`,
uniform arrivals within a slice). ``q``, ``lambda``, ``tuples`` and ``window_tuples`` stay
exact (they need no per-key state).

Approximations beyond the sketches: time at slice granularity (probes and the window
boundary), rows exactly at ``T1`` are left out of the last cycle end's kappa.
"""
from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import functions as F

from mjoin.stats import sketch as sk
from mjoin.stats.sources import Grid, fdiv

log = logging.getLogger(__name__)

SAMPLE_SEED = 7919
SAMPLE_SCALE = 1 << 30


def sketch_statistics(spark, base, grid: Grid, windows_us: list[int], stream_classes, class_members,
                      cfg: sk.SketchConfig):
    """``(kappa frame, edge-count frame, info)`` in the shapes :mod:`mjoin.stats.exact` returns."""
    S = int(cfg.slices_per_cycle) or sk.auto_slices(grid.tau, [w / 1e6 for w in windows_us])
    if grid.tau_us % S:
        raise ValueError(f"a cycle of {grid.tau:g}s cannot be cut into {S} slices of whole microseconds")
    delta = grid.tau_us // S
    parts = []
    for ci, sids in class_members.items():
        parts.append(base.where(f"sid IN ({', '.join(map(str, sids))}) AND t IS NOT NULL AND g IS NOT NULL "
                                f"AND k{ci} IS NOT NULL AND t < {grid.t1_us}")
                     .select("sid", F.lit(ci).alias("ci"), "g", F.expr(fdiv(f"t - {grid.t0_us}", delta)).alias("b"),
                             F.col(f"k{ci}").alias("key")))
    sl = parts[0]
    for p in parts[1:]:
        sl = sl.unionByName(p)
    sl = sl.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        # ---- pass 1: slice totals + HLL, the dense candidates, kappa at cycle ends ----------
        slices = sl.groupBy("sid", "ci", "g", "b").agg(F.count(F.lit(1)).alias("n"),
                                                       F.expr(f"hll_sketch_agg(key, {int(cfg.hll_lg_k)})").alias("hll"))
        slices = slices.persist(StorageLevel.MEMORY_AND_DISK)
        totals = slices.select("sid", "ci", "g", "b", "n").toPandas()
        top = (sl.groupBy("sid", "ci", "g")
               .agg(F.expr(f"approx_top_k(key, {int(cfg.dense_keys)}, {int(cfg.top_k_tracked)})").alias("top"))
               .select("ci", "g", F.explode("top").alias("it"))
               .select("ci", "g", F.col("it.item").cast("bigint").alias("key"))
               .distinct().toPandas())
        kap = _kappa(spark, slices, grid, windows_us, stream_classes, S, delta)
        slices.unpersist()
        d_max = float(kap["kappa"].max()) if len(kap) else 0.0
        rate = 1.0 if d_max <= cfg.sample_keys else cfg.sample_keys / d_max
        # ---- pass 2: dense counts, residual sketch cells, the coordinated sample ------------
        # (approx_top_k reports only keys it can vouch for: none when no key stands out)
        dense_df = spark.createDataFrame([(int(r.ci), int(r.g), int(r.key), True) for r in top.itertuples(index=False)],
                                         "ci int, g bigint, key bigint, dense boolean")
        flagged = sl.join(F.broadcast(dense_df), on=["ci", "g", "key"], how="left")
        dense_counts = (flagged.where("dense").groupBy("sid", "ci", "g", "b", "key").agg(F.count(F.lit(1)).alias("n"))
                        .toPandas())
        rest = flagged.where("dense IS NULL")
        threshold = int(math.floor(rate * SAMPLE_SCALE))
        sample = (rest.where(f"pmod(xxhash64(key, {SAMPLE_SEED}), {SAMPLE_SCALE}) < {threshold}" if rate < 1 else "true")
                  .groupBy("sid", "ci", "g", "b", "key").agg(F.count(F.lit(1)).alias("n")).toPandas())
        if rate < 1:
            tables = F.explode(F.array(*[F.struct(F.lit(i).alias("i"), F.expr(f"xxhash64(key, {i})").alias("h"))
                                         for i in range(cfg.depth)]))
            cells = (rest.select("sid", "ci", "g", "b", tables.alias("c"))
                     .select("sid", "ci", "g", "b", F.col("c.i").alias("i"),
                             F.expr(f"pmod(c.h, {int(cfg.width)})").alias("bucket"),
                             F.expr("CASE WHEN c.h < 0 THEN -1 ELSE 1 END").alias("sign"))
                     .groupBy("sid", "ci", "g", "b", "i", "bucket").agg(F.sum("sign").alias("v")).toPandas())
        else:  # the sample holds every non-dense key: the sparse part is exact, no sketch needed
            cells = pd.DataFrame(columns=["sid", "ci", "g", "b", "i", "bucket", "v"])
    finally:
        sl.unpersist()
    summaries = _summaries(totals, dense_counts, sample, cells, cfg, rate)
    edges = _estimate_edges(summaries, totals, grid, windows_us, class_members, kap, cfg, S, delta, rate)
    nbytes = [s.nbytes() for s in summaries.values()]
    info = {
        "slices": len(summaries), "slices_per_cycle": S, "slice_seconds": delta / 1e6, "sample_rate": rate,
        "dense_keys": {f"c{ci}/g{g}": int(n) for (ci, g), n in top.groupby(["ci", "g"]).size().items()} if len(top) else {},
        "max_slice_bytes": int(max(nbytes)) + (1 << cfg.hll_lg_k) if nbytes else 0,
        "total_bytes": int(sum(nbytes)) + len(summaries) * (1 << cfg.hll_lg_k),
        "config_bytes_per_slice": cfg.bytes_per_slice(),
    }
    return kap, edges, info


def _kappa(spark, slices, grid: Grid, windows_us, stream_classes, S: int, delta: int) -> pd.DataFrame:
    """HLL union of the slices in each stream's window at every cycle end."""
    rows = []
    for sid, w in enumerate(windows_us):
        x = w / delta
        for j in range(grid.n):
            end = (j + 1) * S
            for b in range(int(math.ceil(end - x - 0.5)), end):
                rows.append((sid, j, b))
    if not rows:
        return pd.DataFrame(columns=["sid", "ci", "g", "j", "kappa"])
    mapping = spark.createDataFrame(rows, "sid int, j bigint, b bigint")
    out = (slices.join(F.broadcast(mapping), on=["sid", "b"])
           .groupBy("sid", "ci", "g", "j")
           .agg(F.expr("hll_sketch_estimate(hll_union_agg(hll))").alias("kappa"))
           .toPandas())
    return out


def _summaries(totals, dense_counts, sample, cells, cfg, rate) -> dict:
    """One :class:`mjoin.stats.sketch.Skimmed` per ``(sid, ci, g, b)``."""
    out = {}
    for rec in totals.itertuples(index=False):
        out[(int(rec.sid), int(rec.ci), int(rec.g), int(rec.b))] = sk.Skimmed(
            np.zeros(0, np.int64), np.zeros(0), np.zeros((cfg.depth, cfg.width)), float(rec.n), sample_rate=rate)
    keys = ["sid", "ci", "g", "b"]
    for k, grp in dense_counts.groupby(keys):
        s = out[tuple(int(x) for x in k)]
        order = np.argsort(grp["key"].to_numpy())
        s.keys = grp["key"].to_numpy(np.int64)[order]
        s.counts = grp["n"].to_numpy(float)[order]
    for k, grp in sample.groupby(keys):
        s = out[tuple(int(x) for x in k)]
        order = np.argsort(grp["key"].to_numpy())
        s.sample_keys = grp["key"].to_numpy(np.int64)[order]
        s.sample_counts = grp["n"].to_numpy(float)[order]
    for k, grp in cells.groupby(keys):
        s = out[tuple(int(x) for x in k)]
        np.add.at(s.residual, (grp["i"].to_numpy(np.int64), grp["bucket"].to_numpy(np.int64)), grp["v"].to_numpy(float))
    return out


def _estimate_edges(summaries, totals, grid: Grid, windows_us, class_members, kap, cfg, S, delta, rate) -> pd.DataFrame:
    empty = sk.Skimmed.empty(cfg.depth, cfg.width, rate)
    groups = sorted({k[2] for k in summaries})
    weights = {sid: sk.window_weights(w, delta) for sid, w in enumerate(windows_us)}
    window_cache: dict = {}

    def window_of(r, ci, g, a):
        key = (r, ci, g, a)
        if key not in window_cache:
            wts = weights[r]
            parts, ws = [], []
            for k, wt in enumerate(wts):
                s = summaries.get((r, ci, g, a - k))
                if s is not None and wt > 0:
                    parts.append(s)
                    ws.append(wt)
            window_cache[key] = sk.combine(parts, ws) if parts else empty
        return window_cache[key]

    out = []
    for ci, sids in class_members.items():
        if len(sids) < 2:
            continue
        for g in groups:
            for j in range(grid.n):
                for l in sids:
                    probes = [(a, summaries.get((l, ci, g, a))) for a in range(j * S, (j + 1) * S)]
                    probes = [(a, p) for a, p in probes if p is not None and p.total > 0]
                    q = sum(p.total for _, p in probes)
                    for r in sids:
                        if r == l:
                            continue
                        m = s_ = 0.0
                        for a, p in probes:
                            win = window_of(r, ci, g, a)
                            if win.total <= 0:
                                continue
                            m += sk.matched(p, win)
                            s_ += sk.join_size(p, win)
                        m = min(max(m, 0.0), q)
                        s_ = max(s_, m)
                        out.append({"ci": ci, "g": g, "j": j, "l": l, "r": r, "q": q, "m": m, "s": s_})
    return pd.DataFrame(out, columns=["ci", "g", "j", "l", "r", "q", "m", "s"])
