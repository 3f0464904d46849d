"""The baseline: the same query as Spark's own chained stream-stream inner joins.

What a Spark user would write today: inner joins in the spec's stream order (the
written order; join reordering is off and streaming queries do not reorder),
watermarks on the sources only (delay = the spec's lateness), join conditions =
key equality plus the pairwise time bounds of the windows, so that the results
equal mjoin's: ``ts_r > ts_m - W_r`` and ``ts_r < ts_m + W_m`` for every stream
``m`` already joined. Spark allows one event-time column per join input, so the
partial result keeps the first stream's event time as its event-time column
(its bounds with every later stream let Spark purge the join state) and the
other bounds are plain filters on the microsecond columns.

Interval evaluation: Spark runs stream-stream joins only in a streaming query,
so the interval's validated rows are written as one file per stream and cycle
(``<out>/native/input/<stream>/``; file 0 holds the warm-up rows before
``start``) and a query with ``maxFilesPerTrigger = 1`` per source and trigger
``availableNow`` processes one cycle per micro-batch. A result belongs to the
interval when its newest member has ``ts`` in ``[start, end)``.
"""
from __future__ import annotations

import json
import logging
import re
import time
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mjoin.engine.compiled import MICROS, EngineQuery, key_name
from mjoin.engine.config import EngineConfig, EngineError
from mjoin.engine.frame import arrow_frame_schema, frame_ddl, sql_type
from mjoin.engine.inputs import as_lake, as_query
from mjoin.engine.interval import RunSummary, clear_outputs, read_interval
from mjoin.engine.metrics import shuffle_bytes, write_jsonl, write_record
from mjoin.engine.normalize import add_counts
from mjoin.engine.results import write_parquet
from mjoin.engine.sparkplan import apply_engine_conf, restore_conf
from mjoin.engine.stream import StreamSummary
from mjoin.model.eventtime import event_time_sql, spark_kind
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)


def native_columns(eq: EngineQuery, stream: str) -> list[tuple[str, str]]:
    """(input column, frame column) of one stream's native input: everything prefixed by the stream."""
    cols = [(f"{stream}___ts", "_ts")]
    cols += [(f"{stream}__{key_name(c)}", key_name(c)) for c in eq.stream_classes[stream]]
    cols += [(p, p) for p in eq.payload_columns(stream)]
    return cols


def join_chain(eq: EngineQuery, sources: dict):
    """Spark's chained stream-stream inner joins in the canonical (written) order.
    ``sources``: stream -> streaming DataFrame with :func:`native_columns` and ``<s>__t`` (event time,
    with a watermark)."""
    first = eq.streams[0]
    joined, df = [first], sources[first]
    for r in eq.streams[1:]:
        conds = []
        for c in eq.stream_classes[r]:
            m = next((j for j in joined if c in eq.stream_classes[j]), None)
            if m is not None:
                conds.append(F.col(f"{m}__{key_name(c)}") == F.col(f"{r}__{key_name(c)}"))
        if not conds:
            raise EngineError(f"spark-native joins in the spec's order: {r} shares no key with {', '.join(joined)} "
                              "before it; reorder the spec's streams")
        wr, wf = eq.window_us[r], eq.window_us[first]
        conds.append(F.expr(f"{r}__t > {first}__t - INTERVAL {wr} MICROSECONDS"))
        conds.append(F.expr(f"{r}__t < {first}__t + INTERVAL {wf} MICROSECONDS"))
        for m in joined[1:]:
            conds.append(F.expr(f"{r}___ts > {m}___ts - {wr} AND {r}___ts < {m}___ts + {eq.window_us[m]}"))
        cond = conds[0]
        for c in conds[1:]:
            cond = cond & c
        df = df.join(sources[r], cond, "inner").drop(f"{r}__t")  # one event-time column per join input
        joined.append(r)
    newest = F.greatest(*[F.col(f"{s}___ts") for s in eq.streams])
    return df.select(*[F.col(p).alias(name) for name, p in eq.output], newest.alias("_newest"))


def plan_info(sq) -> dict:
    """Join strategies and join order from the running query's physical plan."""
    try:
        text = sq._jsq.explainInternal(False)
    except Exception as exc:  # the plan is informative only
        return {"error": str(exc)}
    joins = re.findall(r"(\w*Join\w*) \[([^\]]*)\], \[([^\]]*)\]", text)
    order = []
    for _, left, right in reversed(joins):  # innermost join first
        lstream = left.split("__")[0].strip()
        if not order:
            order.append(lstream)
        order.append(right.split("__")[0].strip())
    return {"strategies": [j[0] for j in joins], "join_order": order, "physical_plan": text}


def native_plan(spark, query, lake) -> str:
    """The physical plan of the baseline's join over ``lake``'s streams, without running it."""
    df = _stream_sources_join(spark, as_query(query), as_lake(lake))
    return spark.sparkContext._jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "simple")


def quiet_join_helper_warnings(spark) -> None:
    """Spark logs a WARN with a stack trace for every join conjunct it cannot turn into a state
    bound (our plain microsecond bounds); they are expected, so silence that logger."""
    try:
        jvm = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.ERROR
        for name in ("org.apache.spark.sql.catalyst.analysis.StreamingJoinHelper",
                     "org.apache.spark.sql.execution.streaming.StreamingJoinHelper"):
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception:  # logging only
        pass


def write_batch_results(df, results_root: str, batch_id: int, eq: EngineQuery) -> int:
    """One micro-batch's results, replacing an earlier attempt, then its ``_SUCCESS``; returns the rows."""
    d = fsutil.join(results_root, f"batch={batch_id}")
    fsutil.remove(d)
    df.write.mode("overwrite").parquet(d)
    rows = sum(pq.read_metadata(fsutil.resolve(fsutil.join(d, n))[1]).num_rows
               for n in fsutil.listdir(d) if n.endswith(".parquet"))
    fsutil.atomic_write_text(fsutil.join(d, "_SUCCESS"), json.dumps(
        {"batch_id": batch_id, "rows": rows, "columns": [n for n, _ in eq.output], "engine": "spark-native"}))
    return rows


def run_native_interval(spark, query, plan, lake, start, end, cycle, out, *, config: EngineConfig | None = None):
    """The interval of :func:`mjoin.engine.runs.run_interval` through Spark's chained stream-stream joins."""
    config = config or EngineConfig()
    query = as_query(query)
    eq = EngineQuery.from_query(query)
    in_lake, out_lake = as_lake(lake), as_lake(out)
    if plan is not None:
        log.info("spark-native joins in the spec's written order; the plan is not used")
    t_run = time.perf_counter()
    clear_outputs(out_lake, query.name)
    work = fsutil.join(out_lake.state(query.name), "native")
    before = apply_engine_conf(spark)
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "100000")
    try:
        data = read_interval(spark, query, eq, in_lake, out_lake, start, end, cycle, config=config)
        counts = data.rejected_counts()
        # one input file per stream and cycle (warm-up = file 0), oldest first
        frame_schema = arrow_frame_schema(eq)
        t_write = time.perf_counter()
        valid = data.valid()
        table = None if valid is None else valid.select(
            "_s", "_batch", "_ts", *[key_name(c) for c in eq.classes], *eq.all_payload_columns).toArrow()

        s_col = np.asarray(table.column("_s").to_numpy(zero_copy_only=False)) if table is not None else None
        b_col = np.asarray(table.column("_batch").to_numpy(zero_copy_only=False)) if table is not None else None
        for b in range(0, data.n_batches + 1):
            for i, s in enumerate(eq.streams):
                cols = native_columns(eq, s)
                schema = pa.schema([pa.field(n, frame_schema.field(f).type) for n, f in cols])
                if table is not None:
                    part = table.filter(pa.array((s_col == i) & (b_col == b))).select([f for _, f in cols])
                    part = pa.Table.from_arrays(part.columns, schema=schema)
                else:
                    part = schema.empty_table()
                write_parquet(fsutil.join(work, "input", s, f"cycle={b:06d}.parquet"), part,
                             mtime_ms=1_000_000_000_000 + b * 1000 + i)
        input_seconds = time.perf_counter() - t_write
        sources = {}
        for s in eq.streams:
            schema = StructType.fromDDL(", ".join(f"`{n}` {t}" for n, t in _ddl(eq, s)))
            df = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
                  .parquet(fsutil.join(work, "input", s)))
            df = df.withColumn(f"{s}__t", F.expr(f"timestamp_micros({s}___ts)")) \
                .withWatermark(f"{s}__t", f"{eq.lateness_us // 1000} milliseconds")
            sources[s] = df
        quiet_join_helper_warnings(spark)
        joined = join_chain(eq, sources)
        results_root = out_lake.results(query.name)
        metrics_dir = out_lake.metrics(query.name)
        per_batch: dict = {}

        def write_batch(df, batch_id):
            t0 = time.perf_counter()
            group = f"mjoin-native-{query.name}-{batch_id}-{time.time_ns()}"
            spark.sparkContext.setJobGroup(group, f"spark-native {query.name} batch {batch_id}", False)
            kept = df.where((F.col("_newest") >= data.start_us) & (F.col("_newest") < data.end_us)).drop("_newest")
            rows = write_batch_results(kept, results_root, batch_id, eq)
            per_batch[batch_id] = {"result_rows": rows, "sink_seconds": time.perf_counter() - t0,
                                   "shuffle_bytes": shuffle_bytes(spark, group)}

        t0 = time.perf_counter()
        sq = (joined.writeStream.foreachBatch(write_batch).outputMode("append")
              .option("checkpointLocation", fsutil.join(work, "checkpoint"))
              .trigger(availableNow=True).start())
        sq.awaitTermination()
        stream_seconds = time.perf_counter() - t0
        info = plan_info(sq)
        progress = list(sq.recentProgress)
    finally:
        restore_conf(spark, before)
    records = []
    for p in progress:
        b = int(p["batchId"])
        if b not in per_batch:
            continue
        rows_in = {s: 0 for s in eq.streams}
        for src in p.get("sources", []):
            m = re.search(r"/input/([^/\]]+)", src.get("description", ""))
            if m and m.group(1) in rows_in:
                rows_in[m.group(1)] += int(src.get("numInputRows", 0))
        ops = p.get("stateOperators", [])
        c0 = data.start_us + (b - 1) * data.cycle_us
        rec = {
            "query": eq.name, "engine": "spark-native", "mode": "interval", "batch_id": b, "plan_version": None,
            "plan_strategy": "written-order", "plan_switch": None,
            "interval": None if b == 0 or b > data.n_batches else
            [iso(c0 / MICROS), iso(min(c0 + data.cycle_us, data.end_us) / MICROS)],
            "started_at": p.get("timestamp"), "wall_seconds": p["durationMs"].get("triggerExecution", 0) / 1000,
            "rows_in": rows_in, "quarantined": {s: counts.get(b, {}).get(s, {}) for s in eq.streams},
            "result_rows": per_batch[b]["result_rows"],
            "state_tuples": {"total": sum(int(o.get("numRowsTotal", 0)) for o in ops)},
            "state_operators": [{k: o.get(k) for k in ("operatorName", "numRowsTotal", "numRowsUpdated",
                                                       "memoryUsedBytes", "numRowsDroppedByWatermark")} for o in ops],
            "state_backend": "spark-state-store", "chains": [], "prefilter": None,
            "shuffle_bytes": per_batch[b]["shuffle_bytes"],
            "stage_seconds": {k: v / 1000 for k, v in p["durationMs"].items()},
            "join_strategies": info.get("strategies"), "join_order": info.get("join_order"),
        }
        write_record(metrics_dir, rec)
        records.append(rec)
    metrics_path = write_jsonl(metrics_dir, records)
    fsutil.atomic_write_text(fsutil.join(work, "physical_plan.txt"), info.get("physical_plan", ""))
    warm = [r for r in records if r["batch_id"] == 0]
    cycles = [r for r in records if r["batch_id"] >= 1]
    return RunSummary(
        query=query.name, engine="spark-native", mode="interval",
        interval=[iso(data.start_us / MICROS), iso(data.end_us / MICROS)], cycle_seconds=data.cycle_us / MICROS,
        plan_version=None, plan_strategy="written-order", batches=data.n_batches,
        result_rows=sum(r["result_rows"] for r in records), wall_seconds=time.perf_counter() - t_run,
        batch_seconds=sum(r["wall_seconds"] for r in cycles), prepare_seconds=data.seconds + input_seconds,
        warmup_seconds=sum(r["wall_seconds"] for r in warm),
        rows_in={s: sum(r["rows_in"][s] for r in cycles) for s in eq.streams},
        quarantined=add_counts({}, *[counts[b] for b in range(1, data.n_batches + 1) if b in counts]),
        metrics_path=metrics_path, results_path=results_root,
        extra={"join_strategies": info.get("strategies"), "join_order": info.get("join_order"),
               "stream_seconds": stream_seconds, "micro_batches": len(progress),
               "max_state_tuples": max([r["state_tuples"]["total"] for r in records], default=0)})


def _ddl(eq: EngineQuery, stream: str):
    types = dict(frame_ddl(eq))
    return [(n, types[f]) for n, f in native_columns(eq, stream)]


def _stream_sources_join(spark, query, lake):
    """The baseline's join over the landed files of ``lake`` (streaming sources with the spec's schema)."""

    eq = EngineQuery.from_query(query)
    sources = {}
    for s in query.streams:
        ddl = ", ".join(f"`{c}` {sql_type(t)}" for c, t in s.columns.items())
        fsutil.makedirs(lake.streams(s.source))
        raw = (spark.readStream.schema(ddl).option("recursiveFileLookup", "true")
               .option("pathGlobFilter", "*.parquet").parquet(lake.streams(s.source)))
        et = s.event_time  # the engine's rule, for the column's type as this read declares it (the spec's)
        ts = event_time_sql(et, None if et.expr else spark_kind(sql_type(s.columns[et.column])), raw)
        cols = [F.expr(ts).alias(f"{s.name}___ts")]
        cols += [F.expr(f"try_cast(`{eq.key_columns[(s.name, c)]}` AS BIGINT)").alias(f"{s.name}__{key_name(c)}")
                 for c in eq.stream_classes[s.name]]
        cols += [F.col(f"`{c}`").alias(f"{s.name}__{c}") for c, _ in eq.payload[s.name]]
        df = raw.select(*cols).where(" AND ".join([f"{s.name}___ts IS NOT NULL"] + [
            f"{s.name}__{key_name(c)} IS NOT NULL" for c in eq.stream_classes[s.name]]))
        sources[s.name] = df.withColumn(f"{s.name}__t", F.expr(f"timestamp_micros({s.name}___ts)")) \
            .withWatermark(f"{s.name}__t", f"{eq.lateness_us // 1000} milliseconds")
    return join_chain(eq, sources)


def run_native_stream(spark, query, lake, *, trigger="availableNow", interval=None, config=None, timeout=None):
    """Spark's chained stream-stream joins over the landed files (streaming mode of the baseline).

    Assumes clean input: a file Spark cannot read fails the query (mjoin quarantines it), and rows
    with a NULL or non-integral key or no event time are filtered out (not quarantined)."""
    query = as_query(query)
    lake = as_lake(lake)
    eq = EngineQuery.from_query(query)
    t_run = time.perf_counter()
    before = apply_engine_conf(spark)
    results_root = lake.results(query.name)
    metrics_dir = lake.metrics(query.name)
    records = []
    try:
        quiet_join_helper_warnings(spark)
        joined = _stream_sources_join(spark, query, lake).drop("_newest")

        def write_batch(df, batch_id):
            t0 = time.perf_counter()
            rows = write_batch_results(df, results_root, batch_id, eq)
            rec = {"query": eq.name, "engine": "spark-native", "mode": "stream", "batch_id": batch_id,
                   "plan_version": None, "plan_strategy": "written-order", "plan_switch": None, "interval": None,
                   "started_at": iso(datetime.now(timezone.utc)), "result_rows": rows,
                   "sink_seconds": time.perf_counter() - t0, "state_backend": "spark-state-store", "chains": [],
                   "prefilter": None, "rows_in": {}, "quarantined": {}}
            write_record(metrics_dir, rec)
            records.append(rec)

        writer = (joined.writeStream.foreachBatch(write_batch).outputMode("append")
                  .option("checkpointLocation", fsutil.join(lake.checkpoints(query.name), "native")))
        writer = writer.trigger(availableNow=True) if trigger == "availableNow" else \
            writer.trigger(processingTime=f"{float(interval)} seconds")
        sq = writer.start()
        try:
            sq.awaitTermination(timeout) if timeout else sq.awaitTermination()
        finally:
            if sq.isActive:
                sq.stop()
        info = plan_info(sq)
    finally:
        restore_conf(spark, before)
    return StreamSummary(query=query.name, engine="spark-native", trigger=trigger,
                         batches=[r["batch_id"] for r in records], result_rows=sum(r["result_rows"] for r in records),
                         wall_seconds=time.perf_counter() - t_run, plan_versions={}, plan_switches=[], rows_in={},
                         quarantined={}, metrics_path=metrics_dir, results_path=results_root,
                         checkpoint=fsutil.join(lake.checkpoints(query.name), "native"),
                         extra={"join_strategies": info.get("strategies"), "join_order": info.get("join_order")})
