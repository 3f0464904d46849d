"""The one row schema that flows through a batch (Spark and Arrow spellings of it).

``_kind`` tells a delta (1) from a partial result (2), a bucket tick (0, so
that every bucket is visited and purged each batch) and a rejected row (3, which
the task that receives it writes to the quarantine); ``_c``/``_b`` are the
attribute class and key bucket the row is routed to; ``_chain``/``_grp``/
``_step``/``_lo``/``_hi`` describe a partial result between stages;
``_reason``/``_file``/``_raw`` a rejected row (why, where from, the row as JSON).
"""
from __future__ import annotations

import pyarrow as pa

from .compiled import EngineQuery, key_name
from .normalize import sql_type

META = [("_kind", "tinyint"), ("_c", "int"), ("_b", "int"), ("_s", "int"), ("_ts", "bigint")]
PARTIAL = [("_chain", "int"), ("_grp", "int"), ("_step", "int"), ("_lo", "bigint"), ("_hi", "bigint")]
REJECT = [("_reason", "string"), ("_file", "string"), ("_raw", "string")]


def frame_ddl(eq: EngineQuery) -> list[tuple[str, str]]:
    cols = list(META) + [(key_name(c), "bigint") for c in eq.classes] + list(PARTIAL)
    for s in eq.streams:
        for col, spec_type in eq.payload[s]:
            cols.append((f"{s}__{col}", sql_type(spec_type)))
    return cols + list(REJECT)


def spark_frame_schema(eq: EngineQuery):
    """The frame as a Spark StructType, from one DDL string (one JVM parse, not one per column)."""
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(", ".join(f"`{n}` {t}" for n, t in frame_ddl(eq)))


def _arrow_type(sql: str) -> pa.DataType:
    simple = {"tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(), "bigint": pa.int64(),
              "string": pa.string(), "double": pa.float64(), "float": pa.float32(), "boolean": pa.bool_(),
              "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC")}
    if sql in simple:
        return simple[sql]
    if sql.startswith("decimal("):
        p, s = sql[len("decimal("):-1].split(",")
        return pa.decimal128(int(p), int(s))
    raise ValueError(f"no Arrow type for {sql}")


def arrow_frame_schema(eq: EngineQuery) -> pa.Schema:
    return pa.schema([pa.field(n, _arrow_type(t)) for n, t in frame_ddl(eq)])


def arrow_result_schema(eq: EngineQuery) -> pa.Schema:
    frame = arrow_frame_schema(eq)
    return pa.schema([pa.field(name, frame.field(col).type) for name, col in eq.output])
