"""Exact statistics of every cycle of an interval from the cached stream rows (Spark).

Definitions (docs/statistics.md; cycle ``j`` is ``[T_j, T_j + tau)``, ``e_j = T_j + tau``):

- ``tuples[s][j]``: rows of ``s`` with ``T_j <= ts < e_j``;
- window state of ``s`` at ``t``: rows with ``t - W_s < ts <= t``; ``window_tuples`` and
  ``kappa`` (distinct non-NULL keys) of the state at ``e_j``;
- edge ``(l, r)``: for each ``l`` row ``u`` of the cycle with a non-NULL key, its matches are
  the ``r`` rows ``v`` with the same key and ``ts_u - W_r < ts_v <= ts_u``; ``q`` counts the
  lookups, ``m`` those with a match, ``s`` the matches (Eq. 9-10).

Two implementations, the same numbers (tests compare both with pandas/DuckDB):

- :func:`one_pass` (the default, ``StatsConfig.method = "pass"``): one Spark job. Each
  stream's rows are read once (only the needed columns), routed once per attribute class
  of the stream to a partition by key (one shuffle), and each partition computes every
  per-cycle partial count in numpy (:mod:`mjoin.stats.kernel`, like the engine's operator);
  the partials are summed on the driver after a single collect. When the interval is small
  (``StatsConfig.driver_rows``, judged from the files' Parquet footers before reading), the
  narrow rows are collected as Arrow instead and the same kernel runs once on the driver over
  all of them: no shuffle and no Python worker round trip, which at these sizes is most of
  the job (a whole interval holds every key's rows, so the kernel's one precondition holds).
- ``method = "sql"``: plain Spark SQL over the cached rows, one aggregation per statistic
  (five or more Spark jobs; sketch mode reuses its counts, window_tuples and histogram):

  - window_tuples(e_j) = #{ts <= e_j} - #{ts + W <= e_j}: every row adds +1 at the first cycle
    end at or after ``ts`` and -1 at the first one at or after ``ts + W``; prefix sums on the driver.
  - kappa: a row is in the state at the cycle ends ``ja..jc``; per key those ranges are merged
    (running max of ``jc`` over the key's rows sorted by ``ja``) and each merged run adds +1 at
    its start and -1 after its end; prefix sums on the driver.
  - edges, one pass per attribute class: the rows of every stream of the class become an
    *insert* event at ``ts`` and an *expire* event at ``ts + W_s``; sorted per key, the running
    sum of ``r``'s events (RANGE frame: all events at times ``<= ts_u``) is exactly the number of
    ``r`` rows in ``r``'s window at ``ts_u``. That is a sort of ``2N`` rows per class instead of
    a band join whose output grows with the square of a hot key's rows.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import Window, functions as F

from mjoin.stats import kernel
from mjoin.stats.sources import US, Grid, case_sid, cdiv, fdiv


def _pdf(df) -> pd.DataFrame:
    return df.toPandas()


def one_pass(base, grid: Grid, windows_us: list[int], stream_classes: list[list[int]],
             class_members: dict[int, list[int]], buckets: int, partitions: int, *, on_driver: bool = False,
             cells: tuple = ()) -> dict:
    """Every exact statistic of the interval in one Spark job (see the module doc); the frames of
    :func:`mjoin.stats.kernel.reduce_partials`, plus ``seconds`` (Spark job, reduce) and ``partial_rows``.
    ``on_driver``: collect the routed rows and run the kernel once on the driver (small intervals).
    ``cells``: per-cell statistics in the same pass (``kernel.Params.cells``; one attribute class only)."""
    params = kernel_params(grid, windows_us, stream_classes, class_members, buckets, cells)
    if on_driver:
        return run_on_driver(route(base, stream_classes, buckets, None), params)
    return run_partials(route(base, stream_classes, buckets, partitions), params)


def driver_pass(read, query, grid: Grid, rule, usable, windows_us, stream_classes, class_members, buckets: int,
                cells: tuple = ()) -> dict:
    """:func:`one_pass` with the kernel on the driver over the rows ``read(query, grid, rule, usable,
    stream_classes)`` gives (:func:`mjoin.stats.sources.read_routed`: the same rows, read with pyarrow, no Spark
    job)."""
    params = kernel_params(grid, windows_us, stream_classes, class_members, buckets, cells)
    t = time.perf_counter()
    rows = read(query, grid, rule, usable, stream_classes)
    t_read = time.perf_counter()
    out = kernel.partials(rows, params)
    return _summed(out, params, {"read": t_read - t, "kernel": time.perf_counter() - t_read})


def kernel_params(grid: Grid, windows_us, stream_classes, class_members, buckets: int, cells: tuple = ()):
    return kernel.Params(grid.t0_us, grid.t1_us, grid.tau_us, tuple(int(w) for w in windows_us),
                         tuple(cs[0] for cs in stream_classes),
                         tuple(tuple(class_members[ci]) for ci in range(len(class_members))), int(buckets),
                         tuple(cells))


def route(base, stream_classes: list[list[int]], buckets: int, partitions: int | None):
    """``(ci, sid, t, g, key)``: every row once per attribute class of its stream (from the same scan),
    repartitioned by key into ``partitions`` (by histogram bucket when there are at least 256 buckets,
    so that every histogram cell is in one partition; NULL keys spread by time); ``None``: not
    repartitioned (for a collect)."""
    nclasses = 1 + max(c for cs in stream_classes for c in cs)
    if nclasses == 1:
        routed = base.select(F.lit(0).alias("ci"), "sid", "t", "g", F.col("k0").alias("key"))
    else:
        pairs = ", ".join(f"{ci}, k{ci}" for ci in range(nclasses))
        member = case_sid([f"ci IN ({', '.join(map(str, cs))})" for cs in stream_classes], "false")
        routed = (base.select("sid", "t", "g", F.expr(f"stack({nclasses}, {pairs}) AS (ci, key)"))
                  .where(member).select(F.col("ci").cast("int").alias("ci"), "sid", "t", "g", "key"))
    if partitions is None:
        return routed
    part = f"pmod(key, {int(buckets)})" if buckets >= 256 else "key"
    return routed.repartition(int(partitions), F.col("ci"), F.expr(f"coalesce({part}, t)"))


def run_partials(routed, params) -> dict:
    """The kernel over every partition of ``routed`` (a ``mapInArrow`` task each), one collect, the sum."""
    def run(batches):
        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if tables:
            yield from kernel.partials(pa.concat_tables(tables), params).to_batches()

    t = time.perf_counter()
    out = routed.mapInArrow(run, kernel.OUT_DDL).toArrow()
    return _summed(out, params, {"spark_job": time.perf_counter() - t})


def run_on_driver(routed, params) -> dict:
    """The kernel once over all of ``routed``, collected as Arrow (the same outputs as :func:`run_partials`)."""
    t = time.perf_counter()
    rows = routed.toArrow()
    t_collected = time.perf_counter()
    out = kernel.partials(rows, params)
    return _summed(out, params, {"spark_job": t_collected - t, "kernel": time.perf_counter() - t_collected})


def _summed(out, params, seconds: dict) -> dict:
    """The kernel's partial counts summed (:func:`mjoin.stats.kernel.reduce_partials`), with the phases'
    ``seconds`` (plus ``reduce``) and ``partial_rows``."""
    t = time.perf_counter()
    res = kernel.reduce_partials(out, params, len(params.class_members))
    res["seconds"] = {**seconds, "reduce": time.perf_counter() - t}
    res["partial_rows"] = out.num_rows
    return res


def cycle_counts(base, grid: Grid, nclasses: int) -> pd.DataFrame:
    """Per ``(sid, g, j)``: rows and non-NULL keys per class. ``j = -2``: NULL event time,
    ``-1``: lead-in before T0, ``n``: exactly at T1 (window state only)."""
    j = (f"CASE WHEN t IS NULL THEN -2 WHEN t < {grid.t0_us} THEN -1 "
         f"WHEN t >= {grid.t1_us} THEN {grid.n} ELSE {fdiv(f't - {grid.t0_us}', grid.tau_us)} END")
    aggs = [F.count(F.lit(1)).alias("rows")] + [F.count(f"k{i}").alias(f"nn{i}") for i in range(nclasses)]
    return _pdf(base.withColumn("j", F.expr(j)).groupBy("sid", "g", "j").agg(*aggs))


def window_tuples(base, grid: Grid, windows_us: list[int], stream_classes: list[list[int]]) -> pd.DataFrame:
    """Per ``(sid, g, j)``: tuples in the window state at the end of cycle ``j`` (rows with a key: a row with a
    NULL key is not in the join's state)."""
    w = case_sid(windows_us)
    ja = cdiv(f"t - {grid.t0_us + grid.tau_us}", grid.tau_us)
    jb = cdiv(f"t + ({w}) - {grid.t0_us + grid.tau_us}", grid.tau_us)
    keyed = case_sid([f"k{cs[0]} IS NOT NULL" for cs in stream_classes], "false")
    ev = (base.where(f"t IS NOT NULL AND g IS NOT NULL AND ({keyed})")
          .select("sid", "g", F.expr(f"stack(2, greatest({ja}, 0), 1, greatest({jb}, 0), -1) AS (j, d)"))
          .where(f"j < {grid.n}")
          .groupBy("sid", "g", "j").agg(F.sum("d").alias("d")))
    return _prefix(_pdf(ev), ["sid", "g"], grid.n, "window_tuples")


def kappa(base, grid: Grid, windows_us: list[int], stream_classes: list[list[int]]) -> pd.DataFrame:
    """Per ``(sid, ci, g, j)``: distinct non-NULL keys of class ``ci`` in the state at the end of cycle ``j``."""
    w = case_sid(windows_us)
    ja = f"greatest({cdiv(f't - {grid.t0_us + grid.tau_us}', grid.tau_us)}, 0)"
    jc = f"least({fdiv(f't + ({w}) - 1 - {grid.t0_us + grid.tau_us}', grid.tau_us)}, {grid.n - 1})"
    parts = []
    for ci in sorted({c for cs in stream_classes for c in cs}):
        sids = [sid for sid, cs in enumerate(stream_classes) if ci in cs]
        parts.append(base.where(f"sid IN ({', '.join(map(str, sids))}) AND t IS NOT NULL AND g IS NOT NULL "
                                f"AND k{ci} IS NOT NULL")
                     .select("sid", F.lit(ci).alias("ci"), "g", F.col(f"k{ci}").alias("key"),
                             F.expr(ja).alias("ja"), F.expr(jc).alias("jc")))
    if not parts:
        return pd.DataFrame(columns=["sid", "ci", "g", "j", "kappa"])
    rows = parts[0]
    for p in parts[1:]:
        rows = rows.unionByName(p)
    # Per key, the rows' ranges [ja, jc] sorted by ja; the part of a range not covered by the
    # ranges before it starts after their max jc (one sort per key, no pre-aggregation: keys
    # rarely repeat within a cycle, so grouping first would only add a shuffle).
    prev = F.max("jc").over(Window.partitionBy("sid", "ci", "g", "key").orderBy("ja", "jc")
                            .rowsBetween(Window.unboundedPreceding, -1))
    runs = (rows.where("ja <= jc").withColumn("a", F.greatest(F.col("ja"), F.coalesce(prev + 1, F.col("ja"))))
            .where("a <= jc")
            .select("sid", "ci", "g", F.expr("stack(2, a, 1, jc + 1, -1) AS (j, d)"))
            .where(f"j < {grid.n}")
            .groupBy("sid", "ci", "g", "j").agg(F.sum("d").alias("d")))
    return _prefix(_pdf(runs), ["sid", "ci", "g"], grid.n, "kappa")


def edge_counts(base, grid: Grid, windows_us: list[int], class_members: dict[int, list[int]]) -> pd.DataFrame:
    """Per ``(ci, g, j, l, r)``: lookups ``q``, successful lookups ``m`` and matches ``s`` of edge ``l -> r``."""
    out = []
    for ci, sids in class_members.items():
        if len(sids) < 2:
            continue
        w = case_sid(windows_us)
        rows = base.where(f"sid IN ({', '.join(map(str, sids))}) AND t IS NOT NULL AND g IS NOT NULL AND k{ci} IS NOT NULL")
        ins = rows.select(F.col(f"k{ci}").alias("key"), "g", "sid", F.col("t").alias("time"), F.lit(1).alias("ev"),
                          F.expr(f"t >= {grid.t0_us} AND t < {grid.t1_us}").alias("probe"))
        exp = (rows.select(F.col(f"k{ci}").alias("key"), "g", "sid", F.expr(f"t + ({w})").alias("time"),
                           F.lit(-1).alias("ev"), F.lit(False).alias("probe"))
               .where(f"time < {grid.t1_us}"))
        events = ins.unionByName(exp)
        # RANGE frame: the running sum includes every event with time <= the current one
        # (ties included), i.e. r rows with ts_v <= ts_u minus those with ts_v + W_r <= ts_u.
        win = (Window.partitionBy("key", "g").orderBy("time")
               .rangeBetween(Window.unboundedPreceding, Window.currentRow))
        for r in sids:
            events = events.withColumn(f"c{r}", F.sum(F.when(F.col("sid") == r, F.col("ev")).otherwise(0)).over(win))
        probes = events.where("probe").withColumn("j", F.expr(fdiv(f"time - {grid.t0_us}", grid.tau_us)))
        aggs = [F.count(F.lit(1)).alias("q")]
        for r in sids:
            aggs += [F.count(F.when(F.col(f"c{r}") > 0, 1)).alias(f"m{r}"), F.sum(f"c{r}").alias(f"s{r}")]
        pdf = _pdf(probes.groupBy("g", "j", "sid").agg(*aggs))
        for rec in pdf.to_dict("records"):
            for r in sids:
                if r != rec["sid"]:
                    out.append({"ci": ci, "g": rec["g"], "j": rec["j"], "l": rec["sid"], "r": r, "q": rec["q"],
                                "m": rec[f"m{r}"], "s": rec[f"s{r}"] or 0})
    return pd.DataFrame(out, columns=["ci", "g", "j", "l", "r", "q", "m", "s"])


def histogram(base, grid: Grid, stream_classes: list[list[int]], buckets: int) -> pd.DataFrame:
    """Per ``(sid, ci, j, bucket)``: rows of the cycle with ``pmod(key, buckets) = bucket`` (``buckets = 0``:
    ``bucket = key``); plus the key range, which tells whether the buckets are exact keys."""
    parts = []
    for ci in sorted({c for cs in stream_classes for c in cs}):
        sids = [sid for sid, cs in enumerate(stream_classes) if ci in cs]
        parts.append(base.where(f"sid IN ({', '.join(map(str, sids))}) AND t >= {grid.t0_us} AND t < {grid.t1_us} "
                                f"AND k{ci} IS NOT NULL")
                     .select("sid", F.lit(ci).alias("ci"), F.expr(fdiv(f"t - {grid.t0_us}", grid.tau_us)).alias("j"),
                             F.col(f"k{ci}").alias("key")))
    if not parts:
        return pd.DataFrame(columns=["sid", "ci", "j", "bucket", "tuples", "kmin", "kmax"])
    rows = parts[0]
    for p in parts[1:]:
        rows = rows.unionByName(p)
    bucket = f"pmod(key, {int(buckets)})" if buckets else "key"  # 0 buckets: exact keys
    agg = (rows.groupBy("sid", "ci", "j", F.expr(bucket).alias("bucket"))
           .agg(F.count(F.lit(1)).alias("tuples"), F.min("key").alias("kmin"), F.max("key").alias("kmax")))
    return _pdf(agg)


def _prefix(deltas: pd.DataFrame, keys: list[str], n: int, name: str) -> pd.DataFrame:
    """Turn ``(keys..., j, d)`` deltas into ``(keys..., j, name)`` prefix sums over ``j = 0..n-1``."""
    if deltas.empty or n <= 0:
        return pd.DataFrame(columns=keys + ["j", name])
    out = []
    for key, grp in deltas.groupby(keys, dropna=True):
        arr = np.zeros(n, dtype=np.int64)
        np.add.at(arr, grp["j"].astype(np.int64).to_numpy(), grp["d"].astype(np.int64).to_numpy())
        vals = np.cumsum(arr)
        key = key if isinstance(key, tuple) else (key,)
        frame = pd.DataFrame({k: [v] * n for k, v in zip(keys, key)})
        frame["j"] = np.arange(n)
        frame[name] = vals
        out.append(frame)
    return pd.concat(out, ignore_index=True)


def micros(seconds: float) -> int:
    return int(round(seconds * US))
