"""The event time of a row in epoch microseconds: the one rule (docs/algorithms.md, "Notation").

The engine decides what joins, so its rule is the rule; the statistics job, the input gate, the
spark-native baseline and the driver-side (pyarrow) readers all use this module. The *kind* of an event
time comes from the type Spark reads (a landed file's Arrow type, an ``expr``'s Spark type), then:

====================  ===========================================  ==========================================
kind                  Spark SQL (:func:`micros_sql`)               note
====================  ===========================================  ==========================================
``ts``                ``unix_micros(CAST(e AS TIMESTAMP))``        s/ms/us, with or without a zone (UTC session)
``ts_ns``             ``(e div 1000)``                             ns read as long (``nanosAsLong``): truncates
``date``              ``unix_micros(CAST(e AS TIMESTAMP))``        midnight UTC
``int``               ``try_multiply(try_cast(e AS BIGINT), 1e6)``  epoch seconds; NULL on overflow
``float``/``decimal`` ``try_cast(round(try_multiply(e, 1e6))        epoch seconds; ROUND half away from zero
                      AS BIGINT)``                                 (Spark's HALF_UP); NULL: NaN, inf, overflow
``string``            ``unix_micros(try_to_timestamp(e, fmt))``    with the spec's ``format``; without one
                      / ``unix_micros(try_cast(e AS TIMESTAMP))``  Spark's own timestamp parsing
other                 ``CAST(NULL AS BIGINT)``                     no time: the row's event time is unusable
====================  ===========================================  ==========================================

:func:`micros_arrow` computes the same numbers with pyarrow/numpy on the driver (every kind but
``string``, which stays Spark's to parse). Pure: imports neither Spark nor Airflow.
"""
from __future__ import annotations

from decimal import ROUND_HALF_UP, Context, Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

US = 1_000_000
KINDS = ("ts", "ts_ns", "date", "int", "float", "decimal", "string")
_I64_MAX = np.iinfo(np.int64).max
_SPARK_INTEGRAL = ("bigint", "int", "smallint", "tinyint")


def arrow_info(t: pa.DataType) -> tuple[str, str] | None:
    """(kind, Spark type as Spark's Parquet reader gives it) of an Arrow column type, with nanosecond
    timestamps read as long (``spark.sql.legacy.parquet.nanosAsLong``); None: Spark does not read it."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_unsigned_integer(t):
        return "int", {8: "smallint", 16: "int", 32: "bigint", 64: "decimal(20,0)"}[t.bit_width]
    if pa.types.is_integer(t):
        return "int", {8: "tinyint", 16: "smallint", 32: "int", 64: "bigint"}[t.bit_width]
    if pa.types.is_floating(t):
        return ("float", {32: "float", 64: "double"}[t.bit_width]) if t.bit_width in (32, 64) else None
    if pa.types.is_decimal(t):
        return "decimal", f"decimal({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string", "string"
    if pa.types.is_timestamp(t):
        return ("ts_ns", "bigint") if t.unit == "ns" else ("ts", "timestamp")
    if pa.types.is_date(t):
        return "date", "date"
    if pa.types.is_boolean(t):
        return "bool", "boolean"
    return None


def arrow_kind(t: pa.DataType) -> str | None:
    """The kind of an Arrow column type (:func:`arrow_info`)."""
    info = arrow_info(t)
    return info[0] if info else None


def spark_kind(spark_type: str) -> str | None:
    """The kind of a Spark type name (``DataType.simpleString()``: an ``expr``'s type, a column as read)."""
    if spark_type.startswith("timestamp"):
        return "ts"
    if spark_type.startswith("decimal"):
        return "decimal"
    return {"date": "date", "string": "string", "float": "float", "double": "float",
            **{t: "int" for t in _SPARK_INTEGRAL}}.get(spark_type)


def micros_sql(e: str, kind: str | None, fmt: str | None = None) -> str:
    """Spark SQL for the event time ``e`` (a SQL expression of kind ``kind``) in epoch microseconds, NULL
    when unusable (every cast a ``try_`` form: ANSI mode fails the job on a plain cast that fails)."""
    if kind in ("ts", "date"):
        return f"unix_micros(CAST({e} AS TIMESTAMP))"
    if kind == "ts_ns":
        return f"({e} div 1000)"
    if kind == "int":
        return f"try_multiply(try_cast({e} AS BIGINT), {US})"  # epoch seconds
    if kind in ("float", "decimal"):
        return f"try_cast(round(try_multiply({e}, {US})) AS BIGINT)"
    if kind == "string":
        if fmt:
            quoted = fmt.replace("'", "\\'")
            return f"unix_micros(try_to_timestamp({e}, '{quoted}'))"
        return f"unix_micros(try_cast({e} AS TIMESTAMP))"
    return "CAST(NULL AS BIGINT)"


def event_time_sql(event_time, column_kind: str | None, src=None) -> str:
    """Spark SQL for a stream's event time (``query.EventTime``) in epoch microseconds: its column of kind
    ``column_kind`` (the type Spark reads), or its ``expr`` typed by Spark on the DataFrame ``src``."""
    if event_time.expr is not None:
        if src is None:
            raise ValueError("an expr event time needs the DataFrame it is evaluated on (Spark types it)")
        return micros_sql(f"({event_time.expr})", spark_kind(src.selectExpr(event_time.expr).schema[0].dataType
                                                            .simpleString()))
    return micros_sql(f"`{event_time.column}`", column_kind, event_time.format)


# ---- the same numbers on the driver ------------------------------------------------------------------


def _round_half_up(x: np.ndarray) -> np.ndarray:
    """Spark's ``round(x)`` of doubles: half away from zero, exact (``x - trunc(x)`` is exact in binary)."""
    r = np.trunc(x)
    return r + np.sign(x) * (np.abs(x - r) >= 0.5)


def _decimal_micros(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``try_cast(round(try_multiply(d, 1000000)) AS BIGINT)`` of decimals, exactly as Spark: the product's
    type ``decimal(p + 8, s)`` (the literal is ``decimal(7,0)``), above precision 38 cut to
    ``decimal(38, max(38 - (p + 8 - s), min(s, 6)))`` with HALF_UP, NULL where it overflows; then HALF_UP
    to an integer and NULL outside a bigint. Per distinct value in Python (decimal event times are rare)."""
    p, s = arr.type.precision, arr.type.scale
    rp, rs = p + 8, s
    if rp > 38:
        rs = max(38 - (rp - rs), min(rs, 6))
        rp = 38
    ctx = Context(prec=200)
    enc = pc.dictionary_encode(arr)
    vals, oks = [], []
    for d in enc.dictionary.to_pylist():
        prod = ctx.multiply(d, Decimal(US)).quantize(Decimal(1).scaleb(-rs), ROUND_HALF_UP, ctx)
        whole = int(prod.to_integral_value(ROUND_HALF_UP, ctx))
        ok = abs(prod) < Decimal(10) ** (rp - rs) and -_I64_MAX - 1 <= whole <= _I64_MAX
        vals.append(whole if ok else 0)
        oks.append(ok)
    idx = enc.indices.fill_null(0).to_numpy(zero_copy_only=False) if len(enc.dictionary) else np.zeros(len(arr), int)
    if not vals:
        return np.zeros(len(arr), np.int64), np.zeros(len(arr), bool)
    return np.asarray(vals, np.int64)[idx], np.asarray(oks, bool)[idx]


def micros_arrow(arr: pa.Array | pa.ChunkedArray, kind: str | None) -> pa.Array:
    """:func:`micros_sql` computed with pyarrow/numpy: int64 epoch microseconds, NULL when unusable
    (a UTC session: zone-less timestamps and dates at UTC). ``string`` is Spark's to parse: ValueError."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    ok = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if kind == "ts":
        if arr.type.unit == "ns":
            raise ValueError("nanosecond timestamps are kind ts_ns (Spark reads them as long)")
        v = pc.cast(pc.cast(arr, pa.timestamp("us", arr.type.tz)), pa.int64()).fill_null(0).to_numpy()
    elif kind == "ts_ns":  # long nanoseconds div 1000: truncated toward zero
        ns = pc.cast(arr, pa.int64()).fill_null(0).to_numpy()
        v = ns // 1000 + ((ns % 1000 != 0) & (ns < 0))
    elif kind == "date":
        v = pc.cast(pc.cast(arr, pa.date32()), pa.int32()).fill_null(0).to_numpy().astype(np.int64) * (86_400 * US)
    elif kind == "int":
        if pa.types.is_uint64(arr.type):  # read as decimal(20,0): try_cast to bigint is NULL above 2^63 - 1
            big = np.asarray(arr.fill_null(0).to_numpy(), dtype=np.uint64) > np.uint64(_I64_MAX)
            ok &= ~big
            arr = pc.if_else(pa.array(big), pa.scalar(0, arr.type), arr)
        s = pc.cast(arr, pa.int64()).fill_null(0).to_numpy()
        ok &= (s >= -(_I64_MAX // US)) & (s <= _I64_MAX // US)  # try_multiply: NULL on overflow
        v = np.where(ok, s, 0) * US
    elif kind == "float":
        x = pc.cast(arr, pa.float64()).fill_null(0.0).to_numpy() * float(US)  # float * int: double in Spark
        with np.errstate(invalid="ignore"):
            r = _round_half_up(np.where(np.isfinite(x), x, 0.0))
        # try_cast double -> bigint: NULL unless floor(r) <= Long.MaxValue and ceil(r) >= Long.MinValue (both
        # compared as doubles, so 2^63 itself passes and saturates)
        ok &= np.isfinite(x) & (r <= 2.0 ** 63) & (r >= -(2.0 ** 63))
        v = np.where(ok & (r >= 2.0 ** 63), _I64_MAX, np.where(ok & (r < 2.0 ** 63), r, 0).astype(np.int64))
    elif kind == "decimal":
        v, dok = _decimal_micros(arr)
        ok &= dok
    elif kind == "string":
        raise ValueError("a string event time is Spark's to parse (try_to_timestamp)")
    else:  # no time: every row's event time unusable, as micros_sql's NULL
        return pa.nulls(len(arr), pa.int64())
    return pa.array(np.where(ok, v, 0).astype(np.int64), pa.int64(), mask=~ok)
