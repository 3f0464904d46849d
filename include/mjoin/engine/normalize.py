"""Landed files -> the engine's frame rows, with bad input quarantined, never crashing the job.

Per file, the Parquet footer is checked on the driver (pyarrow) against the
stream's declared columns; a file that misses a column or holds a type Spark
cannot read or convert is rejected as a whole (reason ``bad_schema``). The
accepted files are read by Spark in groups of identical schema (so one odd file
can neither fail nor silently re-type the others), and every row is normalised:

- ``_ts``: event time in epoch microseconds (ALGORITHMS.md: time windows);
- ``_k_<class>``: the join keys as int64;
- ``<stream>__<col>``: the output columns, cast to their declared types;
- ``_reason``: why the row is rejected, or null: ``null_key``, ``bad_type`` (a
  key or output value that does not convert, e.g. ``"abc"`` or ``1.5`` for a long
  key), ``bad_time`` (no or unparsable event time), ``late`` (earlier than the
  watermark).

Every cast is a ``try_`` form: Spark 4 runs in ANSI mode, where a plain cast of
``"abc"`` to bigint fails the whole job.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from .. import fsutil
from .compiled import EngineQuery, key_name, payload_name

log = logging.getLogger(__name__)

REASONS = ("null_key", "bad_type", "bad_time", "late", "bad_schema")
_SPARK_TYPES = {"long": "bigint", "int": "int", "short": "smallint", "string": "string", "double": "double",
                "float": "float", "boolean": "boolean", "date": "date", "timestamp": "timestamp"}


def sql_type(spec_type: str) -> str:
    """Spark SQL type name of a spec column type."""
    return _SPARK_TYPES.get(spec_type, spec_type)


def _kind(t: pa.DataType) -> str | None:
    """Coarse class of a Parquet column's Arrow type (None: not something we read)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_timestamp(t):
        return "ts_ns" if t.unit == "ns" else "ts"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_boolean(t):
        return "bool"
    return None


_NUMERIC = {"int", "float", "decimal", "string"}
_ACCEPTS = {
    "long": _NUMERIC, "int": _NUMERIC, "short": _NUMERIC, "double": _NUMERIC, "float": _NUMERIC,
    "string": {"int", "float", "decimal", "string", "ts", "date", "bool"},
    "boolean": {"bool", "string", "int"},
    "date": {"date", "ts", "ts_ns", "string"},
    "timestamp": {"ts", "ts_ns", "date", "string", "int", "float", "decimal"},
}


def _accepts(spec_type: str, kind: str | None) -> bool:
    if kind is None:
        return False
    if spec_type.startswith("decimal"):
        return kind in _NUMERIC
    return kind in _ACCEPTS[spec_type]


@dataclass
class FileReject:
    stream: str
    path: str
    reason: str
    detail: str
    rows: int | None

    def to_json(self) -> dict:
        return {"stream": self.stream, "path": self.path, "reason": self.reason, "detail": self.detail, "rows": self.rows}


@dataclass
class Inspected:
    """Accepted files by schema signature, and the rejected files."""

    groups: dict = field(default_factory=dict)  # (stream, signature) -> (arrow schema, [paths])
    rejects: list = field(default_factory=list)


def _used_columns(stream) -> set:
    used = set(stream.keys)
    if stream.event_time.column:
        used.add(stream.event_time.column)
    return used


def inspect_files(query, eq: EngineQuery, stream_files: dict) -> Inspected:
    """Check every file's footer against its stream's declared columns."""
    out = Inspected()
    for name, files in stream_files.items():
        stream = query.stream(name)
        used = _used_columns(stream) | {c for c, _ in eq.payload[name]}
        for path in files:
            try:
                fs, p = fsutil.resolve(path)
                with fs.open_input_file(p) as fh:
                    meta = pq.ParquetFile(fh)
                    schema, rows = meta.schema_arrow, meta.metadata.num_rows
            except Exception as exc:  # not Parquet, truncated, unreadable: the file is rejected, never the job
                out.rejects.append(FileReject(name, path, "bad_schema", f"not a readable Parquet file ({exc})", None))
                continue
            problems = []
            for col, spec_type in stream.columns.items():
                if col not in schema.names:
                    problems.append(f"missing column {col}")
                    continue
                try:
                    _read_type(schema.field(col).type)
                except (ValueError, KeyError):
                    problems.append(f"column {col} has type {schema.field(col).type}, which mjoin does not read")
                    continue
                if col in used and not _accepts(spec_type, _kind(schema.field(col).type)):
                    problems.append(f"column {col} is {schema.field(col).type}, cannot be read as {spec_type}")
            if problems:
                out.rejects.append(FileReject(name, path, "bad_schema", "; ".join(problems), rows))
                continue
            sig = tuple((c, str(schema.field(c).type)) for c in sorted(stream.columns))
            entry = out.groups.setdefault((name, sig), (schema, []))
            entry[1].append(path)
    return out


def _read_type(t: pa.DataType) -> str:
    """The Spark type Spark's Parquet reader gives a column of Arrow type ``t`` (with
    nanosecond timestamps read as long, spark.sql.legacy.parquet.nanosAsLong)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_unsigned_integer(t):
        return {8: "smallint", 16: "int", 32: "bigint", 64: "decimal(20,0)"}[t.bit_width]
    if pa.types.is_integer(t):
        return {8: "tinyint", 16: "smallint", 32: "int", 64: "bigint"}[t.bit_width]
    if pa.types.is_floating(t):
        return {32: "float", 64: "double"}[t.bit_width]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_timestamp(t):
        return "bigint" if t.unit == "ns" else "timestamp"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_boolean(t):
        return "boolean"
    raise ValueError(f"unsupported type {t}")


def read_schema(schema: pa.Schema, columns: list) -> str:
    """DDL of the declared columns as Spark reads them: an explicit schema, so Spark neither
    infers it (a job per read) nor reads the columns the query does not use."""
    return ", ".join(f"`{c}` {_read_type(schema.field(c).type)}" for c in columns)


# ---- Spark expressions ----------------------------------------------------------------


def _q(col: str) -> str:
    return f"`{col}`"


def _as_long_key(col: str, kind: str) -> str:
    c = _q(col)
    if kind == "int":
        return f"try_cast({c} AS BIGINT)"
    if kind in ("float", "decimal"):
        return f"CASE WHEN {c} = floor({c}) THEN try_cast({c} AS BIGINT) END"  # 1.5 is not a key
    return f"try_cast(trim({c}) AS BIGINT)"


def _as_type(col: str, kind: str, spec_type: str) -> str:
    c = _q(col)
    if spec_type in ("long", "int", "short"):
        return f"try_cast({_as_long_key(col, kind)} AS {sql_type(spec_type)})"
    if kind == "ts_ns":  # read as long nanoseconds (spark.sql.legacy.parquet.nanosAsLong)
        inner = f"timestamp_micros({c} div 1000)"
        return inner if spec_type == "timestamp" else f"try_cast({inner} AS {sql_type(spec_type)})"
    if spec_type == "timestamp" and kind in ("int", "float", "decimal"):
        return f"timestamp_micros(try_cast(round({c} * 1000000) AS BIGINT))"
    return f"try_cast({c} AS {sql_type(spec_type)})"


def _event_micros(stream, schema: pa.Schema, src) -> str:
    """Spark SQL for the stream's event time in epoch microseconds (null when unusable)."""
    et = stream.event_time
    if et.expr is not None:
        dtype = src.selectExpr(et.expr).schema[0].dataType.simpleString()
        e = f"({et.expr})"
        kind = ("ts" if dtype.startswith("timestamp") else "date" if dtype == "date" else "string" if dtype == "string"
                else "int" if dtype in ("bigint", "int", "smallint", "tinyint") else "float")
    else:
        e = _q(et.column)
        kind = _kind(schema.field(et.column).type)
    if kind == "ts":
        return f"unix_micros(CAST({e} AS TIMESTAMP))"
    if kind == "ts_ns":
        return f"({e} div 1000)"
    if kind == "date":
        return f"unix_micros(CAST({e} AS TIMESTAMP))"
    if kind == "int":
        return f"try_multiply(CAST({e} AS BIGINT), 1000000)"  # epoch seconds
    if kind in ("float", "decimal"):
        return f"try_cast(round({e} * 1000000) AS BIGINT)"
    if et.format:
        fmt = et.format.replace("'", "\\'")
        return f"unix_micros(try_to_timestamp({e}, '{fmt}'))"
    return f"unix_micros(try_cast({e} AS TIMESTAMP))"


def normalize_group(spark, query, eq: EngineQuery, stream_name: str, schema: pa.Schema, paths: list,
                    late_before: int | None = None):
    """(frame rows with ``_reason``, raw rows for the quarantine) of one group of same-schema files."""
    from pyspark.sql import functions as F

    stream = query.stream(stream_name)
    src = spark.read.schema(read_schema(schema, list(stream.columns))).parquet(*paths)
    ts_sql = _event_micros(stream, schema, src)
    cols = [F.lit(1).cast("tinyint").alias("_kind"), F.lit(eq.index(stream_name)).cast("int").alias("_s"),
            F.expr(ts_sql).alias("_ts")]
    null_key, bad_type = [], []
    for c in eq.stream_classes[stream_name]:
        col = eq.key_columns[(stream_name, c)]
        expr = _as_long_key(col, _kind(schema.field(col).type))
        cols.append(F.expr(expr).alias(key_name(c)))
        null_key.append(f"{_q(col)} IS NULL")
        bad_type.append(f"({_q(col)} IS NOT NULL AND {expr} IS NULL)")
    for col, spec_type in eq.payload[stream_name]:
        expr = _as_type(col, _kind(schema.field(col).type), spec_type)
        cols.append(F.expr(expr).alias(payload_name(stream_name, col)))
        bad_type.append(f"({_q(col)} IS NOT NULL AND {expr} IS NULL)")
    reason = (f"CASE WHEN {' OR '.join(null_key)} THEN 'null_key' WHEN {' OR '.join(bad_type)} THEN 'bad_type' "
              f"WHEN ({ts_sql}) IS NULL THEN 'bad_time' ")
    if late_before is not None:
        reason += f"WHEN ({ts_sql}) < {int(late_before)} THEN 'late' "
    reason += "END"
    raw = F.to_json(F.struct(*[F.col(_q(c)).cast("string").alias(c) for c in stream.columns]))
    bad = F.expr(reason).isNotNull()
    return src.select(*cols, F.expr(reason).alias("_reason"),
                      F.when(bad, F.col("_metadata.file_path")).alias("_file"), F.when(bad, raw).alias("_raw"))


def normalize_streams(spark, query, eq: EngineQuery, inspected: Inspected, late_before: int | None = None):
    """Frame rows of every accepted file, with ``_reason`` (null: valid) and, for rejected rows,
    ``_file`` and ``_raw`` (the row as JSON) for the quarantine; None when there is no file."""
    frame = None
    for (name, _sig), (schema, paths) in sorted(inspected.groups.items(), key=lambda kv: (kv[0][0], kv[1][1][0])):
        norm = normalize_group(spark, query, eq, name, schema, paths, late_before)
        frame = norm if frame is None else frame.unionByName(norm, allowMissingColumns=True)
    return frame


#: quarantined rows up to this count are collected and written by the driver (one small Spark
#: job per batch instead of one write job per stream); more are written by Spark.
DRIVER_WRITE_LIMIT = 100_000


def write_quarantine(frame, counts: dict, rejects: list, out_lake, query_name: str, eq: EngineQuery,
                     batch_id: int | None = None) -> None:
    """Rejected rows (reason, file, the row as JSON) under ``quarantine/<query>/<stream>/rows/batch=<B>/``
    and rejected files in ``.../files-batch=<B>.json``. ``counts``: stream -> reason -> rows; with
    ``batch_id`` None the frame carries a ``_batch`` column (interval runs)."""
    import json

    from pyspark.sql import functions as F

    streams = [s for s, reasons in counts.items() if any(n for r, n in reasons.items() if r != "bad_schema")]
    total = sum(n for s in streams for r, n in counts[s].items() if r != "bad_schema")
    if streams:
        bad = frame.where(F.col("_reason").isNotNull() & F.col("_s").isin([eq.index(s) for s in streams]))
        batch_col = F.col("_batch") if batch_id is None else F.lit(batch_id)
        bad = bad.select(F.col("_s"), batch_col.cast("int").alias("batch"), F.col("_reason").alias("reason"),
                         F.col("_file").alias("file"), F.col("_raw").alias("row"))
        if total <= DRIVER_WRITE_LIMIT:
            _write_quarantine_rows(bad.toArrow(), out_lake, query_name, eq)
        else:
            for s in streams:
                base = fsutil.join(out_lake.quarantine(query_name, s), "rows")
                part = bad.where(F.col("_s") == eq.index(s)).drop("_s")
                if batch_id is None:
                    part.write.mode("overwrite").partitionBy("batch").parquet(base)
                else:
                    part.drop("batch").write.mode("overwrite").parquet(fsutil.join(base, f"batch={batch_id}"))
    by_stream: dict = {}
    for r in rejects:
        by_stream.setdefault(r.stream, []).append(r.to_json())
    for stream, items in by_stream.items():
        name = f"files-batch={batch_id if batch_id is not None else 1}.json"
        fsutil.atomic_write_text(fsutil.join(out_lake.quarantine(query_name, stream), name), json.dumps(items, indent=1))


def _write_quarantine_rows(table: pa.Table, out_lake, query_name: str, eq: EngineQuery) -> None:
    import numpy as np

    s_col = np.asarray(table.column("_s").to_numpy(zero_copy_only=False))
    b_col = np.asarray(table.column("batch").to_numpy(zero_copy_only=False))
    rest = table.drop_columns(["_s", "batch"])
    for s, b in sorted({(int(x), int(y)) for x, y in zip(s_col, b_col)}):
        part = rest.filter(pa.array((s_col == s) & (b_col == b)))
        sink = pa.BufferOutputStream()
        pq.write_table(part, sink)
        path = fsutil.join(out_lake.quarantine(query_name, eq.streams[s]), "rows", f"batch={b}", "part-00000.parquet")
        fsutil.atomic_write_bytes(path, sink.getvalue().to_pybytes())
