"""The one row schema that flows through a batch (Spark and Arrow spellings of it), and the narrower
part of it that crosses the input shuffle.

``_kind`` tells a delta (1) from a partial result (2), a bucket tick (0, so
that every bucket is visited and purged each batch) and a rejected row (3, which
the task that receives it writes to the quarantine); ``_c``/``_b`` are the
attribute class and key bucket the row is routed to; ``_chain``/``_grp``/
``_step``/``_lo``/``_hi`` describe a partial result between stages (``_hi`` also a
punctuation's highest key); ``_reason``/``_file``/``_raw`` a rejected row (why, where
from, the row as JSON).

Payload: a delta carries only its own stream's payload, in the *slots* (``_v<n>``): the
streams share them by type (stream s's j-th payload column of type T is in the j-th slot of
type T), so a delta row holds as many payload columns as the widest stream, not all of them.
A partial result carries the payload of every stream joined so far, under its own name
(``<stream>__<col>``, as state files and results do). The operator maps a delta's slots back to
its stream's names once per (bucket, stream), by renaming columns (:func:`delta_columns`).

Two layouts of this one frame: :func:`input_ddl`, what stage 1 gets (deltas, ticks, rejects,
punctuations: no partial-result columns), the rows that cross the one shuffle of a batch or an
interval; :func:`frame_ddl`, all of it (later stages, where partial results meet the deltas
replayed into their class). Every input-layout column is a frame column of the same type. When no
row of a run's (or batch's) files can be rejected (their footers say so: :mod:`mjoin.lake.contract`),
the input layout leaves out the three reject columns (``input_ddl(eq, rejects=False)``).
"""
from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import _parse_datatype_string

from mjoin.engine.compiled import EngineQuery, key_name, payload_name

META = [("_kind", "tinyint"), ("_c", "int"), ("_b", "int"), ("_s", "int"), ("_ts", "bigint")]
PARTIAL = [("_chain", "int"), ("_grp", "int"), ("_step", "int"), ("_lo", "bigint")]
HI = [("_hi", "bigint")]  # a partial result's latest time bound; a punctuation's highest key
REJECT = [("_reason", "string"), ("_file", "string"), ("_raw", "string")]
_SPARK_TYPES = {"long": "bigint", "int": "int", "short": "smallint", "string": "string", "double": "double",
                "float": "float", "boolean": "boolean", "date": "date", "timestamp": "timestamp"}


def sql_type(spec_type: str) -> str:
    """Spark SQL type name of a spec column type."""
    return _SPARK_TYPES.get(spec_type, spec_type)


def payload_slots(eq: EngineQuery) -> tuple[list[tuple[str, str]], dict[str, list[tuple[str, str]]]]:
    """(the slots as ``[(name, type)]``, stream -> ``[(payload column, its slot)]`` in payload order): the
    j-th payload column of type T of any stream is in the j-th slot of type T."""
    slots: list = []
    by_type: dict = {}  # type -> slot names of that type, in order
    of: dict = {}
    for s in eq.streams:
        used: dict = {}
        of[s] = []
        for col, spec_type in eq.payload[s]:
            t = sql_type(spec_type)
            j = used.get(t, 0)
            used[t] = j + 1
            names = by_type.setdefault(t, [])
            if j == len(names):
                names.append(f"_v{len(slots)}")
                slots.append((names[-1], t))
            of[s].append((payload_name(s, col), names[j]))
    return slots, of


def delta_columns(eq: EngineQuery, stream: str) -> list[str]:
    """Where a delta of ``stream`` holds its state columns (:meth:`EngineQuery.state_columns`, same order):
    its time, its class keys, its payload slots."""
    return ["_ts"] + [key_name(c) for c in eq.stream_classes[stream]] + [slot for _, slot in payload_slots(eq)[1][stream]]


def input_ddl(eq: EngineQuery, rejects: bool = True) -> list[tuple[str, str]]:
    """Stage 1's rows (what crosses the input shuffle): deltas, ticks, rejected rows, punctuations. ``rejects``
    False: without the reject columns, for the rows of files none of whose rows can be rejected (the operator
    reads them only from rejected rows, ``_kind`` 3, which then do not exist)."""
    return (list(META) + [(key_name(c), "bigint") for c in eq.classes] + payload_slots(eq)[0] + list(HI)
            + (list(REJECT) if rejects else []))


def frame_ddl(eq: EngineQuery) -> list[tuple[str, str]]:
    """The whole frame: the input layout's columns plus a partial result's (its chain, step, time bounds and
    every stream's payload by name)."""
    slots, _ = payload_slots(eq)
    cols = list(META) + [(key_name(c), "bigint") for c in eq.classes] + slots + list(PARTIAL) + list(HI)
    for s in eq.streams:
        for col, spec_type in eq.payload[s]:
            cols.append((payload_name(s, col), sql_type(spec_type)))
    return cols + list(REJECT)


def spark_schema(ddl: list[tuple[str, str]]):
    """A layout as a Spark StructType, from one DDL string (one JVM parse, not one per column)."""
    return _parse_datatype_string(", ".join(f"`{n}` {t}" for n, t in ddl))


def spark_frame_schema(eq: EngineQuery):
    return spark_schema(frame_ddl(eq))


def spark_input_schema(eq: EngineQuery, rejects: bool = True):
    return spark_schema(input_ddl(eq, rejects))


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


def arrow_schema(ddl: list[tuple[str, str]]) -> pa.Schema:
    return pa.schema([pa.field(n, _arrow_type(t)) for n, t in ddl])


def arrow_frame_schema(eq: EngineQuery) -> pa.Schema:
    return arrow_schema(frame_ddl(eq))


def arrow_input_schema(eq: EngineQuery, rejects: bool = True) -> pa.Schema:
    return arrow_schema(input_ddl(eq, rejects))


def arrow_result_schema(eq: EngineQuery) -> pa.Schema:
    frame = arrow_frame_schema(eq)
    return pa.schema([pa.field(name, frame.field(col).type) for name, col in eq.output])


def to_layout(table: pa.Table, schema: pa.Schema, extra=()) -> pa.Table:
    """``table`` in the layout ``schema`` (a frame or input schema): its columns of that layout, in order,
    missing ones as nulls, then the columns named in ``extra`` (e.g. ``_batch``)."""
    have = set(table.column_names)
    n = table.num_rows
    cols = [table.column(f.name).cast(f.type) if f.name in have else pa.nulls(n, f.type) for f in schema]
    fields = list(schema)
    for name in extra:
        if name in have:
            cols.append(table.column(name))
            fields.append(table.schema.field(name))
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def spark_slot_exprs(eq: EngineQuery, have) -> dict[str, str]:
    """Spark SQL for each slot over rows that carry payload by name (normalised rows, ``have``: their
    columns): the payload column of the row's stream (``_s``) that the slot holds."""
    slots, of = payload_slots(eq)
    exprs = {}
    for slot, t in slots:
        whens = [f"WHEN {eq.index(s)} THEN `{name}`" for s in eq.streams for name, sl in of[s] if sl == slot and name in have]
        exprs[slot] = f"CAST(CASE _s {' '.join(whens)} END AS {t})" if whens else f"CAST(NULL AS {t})"
    return exprs
