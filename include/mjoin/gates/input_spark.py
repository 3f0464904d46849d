"""The input gate's Spark option: count NULL keys and late/future event times with one Spark scan.

For raw input too big to read on the driver. One aggregation per stream and set of
usable columns (a multi-file read needs one schema; files whose footer cannot be
read are reported from pyarrow anyway). The event
time is computed by the statistics job's own SQL (:func:`mjoin.stats.sources.event_time_sql`:
a time column, a string ``format`` parsed with ``try_to_timestamp``, or an ``expr``), so
the gate and the stats job agree on every row. The counts land in the same per-file
summary as the pyarrow path, so the same pandas suites check them: GX on the raw Spark frame would take seconds per expectation
(docs/gates.md), one aggregation computes every count at once.
"""
from __future__ import annotations

import math
import os
from urllib.parse import unquote, urlparse

from pyspark.sql import functions as F

from mjoin.runtime.spark import get_spark
from mjoin.stats.sources import event_time_sql


def _norm(path: str) -> str:
    """A comparable form of a local path or a ``file:`` URI as Spark's input_file_name() writes it."""
    if path.startswith("file:"):
        path = unquote(urlparse(path).path)
    if "://" in path:
        return path.rstrip("/")
    return os.path.abspath(path)


def scan_with_spark(spark, stream, paths: list[str], lo: float, future_allowance: float | None, *, keys: list[str],
                    timed: bool, columns: list[str] | None = None) -> dict:
    """``{path: counts}`` for ``paths`` of one stream that share one schema: NULL-key rows where ``keys``
    (all the stream's join keys, or none) are given; late (before ``lo``), future (at or after the file's arrival
    epoch + ``future_allowance`` seconds: :func:`mjoin.lake.contract.future_from_us`; None: none), NULL event
    times and min/max event time where ``timed`` (the event time can be computed from the files). ``columns``: the
    columns to read (None: all, for an ``expr`` that may use any)."""
    if not paths or (not keys and not timed):
        return {}


    if spark is None:
        spark = get_spark("mjoin-gate-input")
    df = spark.read.parquet(*paths)
    if columns is not None:
        df = df.select(*columns)
    df = df.withColumn("_file", F.input_file_name())
    aggs = [F.count(F.lit(1)).alias("rows")]
    if keys:
        any_null = None
        for k in keys:
            cond = F.col(k).isNull()
            any_null = cond if any_null is None else (any_null | cond)
        aggs.append(F.sum(F.when(any_null, 1).otherwise(0)).alias("null_key_rows"))
    if timed:
        df = df.withColumn("_ts", F.expr(event_time_sql(stream, df)).cast("double") / F.lit(1e6))
        if future_allowance is None:
            future = F.lit(0)
        else:  # the file's arrival epoch from its folder, as the engine takes it (mjoin.lake.contract.arrival_of)
            arrival = F.expr("try_cast(regexp_extract(_file, 'arrival=([0-9]+)/[^/]*$', 1) AS DOUBLE)")
            future = F.when(F.col("_ts") >= arrival + F.lit(float(future_allowance)), 1).otherwise(0)
        aggs += [F.sum(F.when(F.col("_ts") < F.lit(lo), 1).otherwise(0)).alias("late"),
                 F.sum(future).alias("future"),
                 F.min("_ts").alias("ts_min"), F.max("_ts").alias("ts_max"),
                 F.sum(F.when(F.col("_ts").isNull(), 1).otherwise(0)).alias("null_ts")]
    by_file = {_norm(r["_file"]): r.asDict() for r in df.groupBy("_file").agg(*aggs).collect()}
    out = {}
    for p in paths:
        r = by_file.get(_norm(p))
        if r is None:  # an empty file has no rows to group
            r = {"null_key_rows": 0, "late": 0, "future": 0, "ts_min": None, "ts_max": None, "null_ts": 0}
        counts = {}
        if keys:
            counts["null_key_rows"] = int(r["null_key_rows"] or 0)
        if timed:
            counts.update({"late": int(r["late"] or 0), "future": int(r["future"] or 0),
                           "ts_min": math.nan if r["ts_min"] is None else float(r["ts_min"]),
                           "ts_max": math.nan if r["ts_max"] is None else float(r["ts_max"]),
                           "null_ts": int(r["null_ts"] or 0)})
        out[p] = counts
    return out
