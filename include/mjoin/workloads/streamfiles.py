"""Write a stream as Parquet files by arrival cycle, in the lake's input layout.

``<root>/streams/<source>/arrival=<epoch>/part-00000.parquet`` where ``<epoch>`` is
the start of the arrival cycle (a multiple of the cycle length, in epoch
seconds) and ``ts`` is a Parquet TIMESTAMP(MICROS, UTC). Only cycles that hold
at least one row get a file; the manifest lists them.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.lake.layout import Lake
from mjoin.model.query import DECIMAL, Stream

TS = "ts"
TS_TYPE = pa.timestamp("us", tz="UTC")
#: Parquet settings of every stream file (zstd like the Spark jobs; fixed so equal data gives equal bytes).
PARQUET_OPTIONS = {"compression": "zstd"}


def ts_array(ts_us: np.ndarray) -> pa.Array:
    """Epoch microseconds as the ``ts`` column type."""
    return pa.array(np.asarray(ts_us, dtype=np.int64), type=pa.int64()).cast(TS_TYPE)


def arrival_epochs(ts_us: np.ndarray, cycle_seconds: int) -> np.ndarray:
    """Start (epoch seconds) of the arrival cycle of each instant: ``floor(ts / cycle) * cycle``."""
    step = int(cycle_seconds) * 1_000_000
    return (np.asarray(ts_us, dtype=np.int64) // step) * int(cycle_seconds)


def write_stream(root, source: str, table: pa.Table, cycle_seconds: int) -> dict:
    """Write ``table`` (rows in arrival order, ``ts`` non-decreasing) as one file per arrival cycle.

    Returns ``{"arrivals": [epoch, ...], "files": n, "rows": n}``.
    """
    if TS not in table.column_names or table.schema.field(TS).type != TS_TYPE:
        raise ValueError(f"{source}: the table needs a {TS} column of type {TS_TYPE}")
    ts_us = table.column(TS).cast(pa.int64()).to_numpy()
    if len(ts_us) and np.any(np.diff(ts_us) < 0):
        raise ValueError(f"{source}: rows are not in arrival order (ts decreases)")
    lake = Lake(str(root))
    arrivals = arrival_epochs(ts_us, cycle_seconds)
    cuts = np.flatnonzero(np.diff(arrivals)) + 1
    bounds = np.concatenate([[0], cuts, [len(arrivals)]]).astype(np.int64)
    epochs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b <= a:
            continue
        epoch = int(arrivals[a])
        path = lake.stream_file(source, epoch)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(table.slice(int(a), int(b - a)), path, **PARQUET_OPTIONS)
        epochs.append(epoch)
    return {"arrivals": epochs, "files": len(epochs), "rows": table.num_rows}


def null_counts(table: pa.Table, columns) -> dict:
    """NULLs per column (the manifest's ``null_keys``)."""
    return {c: int(table.column(c).null_count) for c in columns}


def cast_columns(table: pa.Table, types: dict) -> pa.Table:
    """Cast the named columns (e.g. join keys to int64, so Spark reads them as long)."""
    for name, typ in types.items():
        i = table.column_names.index(name)
        if table.schema.field(i).type != typ:
            table = table.set_column(i, pa.field(name, typ), pc.cast(table.column(i), typ))
    return table


_SPEC_TYPES = {
    "long": [pa.int64()], "int": [pa.int32()], "short": [pa.int16()],
    "double": [pa.float64()], "float": [pa.float32()], "boolean": [pa.bool_()],
    "string": [pa.string(), pa.large_string()], "date": [pa.date32()],
}


def spec_type_ok(spec_type: str, arrow_type: pa.DataType) -> bool:
    """Does a Parquet column of ``arrow_type`` read in Spark as the spec's ``spec_type``?"""
    if spec_type == "timestamp":
        return pa.types.is_timestamp(arrow_type)
    m = DECIMAL.match(spec_type)
    if m:
        return pa.types.is_decimal(arrow_type) and (arrow_type.precision, arrow_type.scale) == (int(m.group(1)), int(m.group(2)))
    return any(arrow_type == t for t in _SPEC_TYPES.get(spec_type, []))


def spec_mismatches(schema: pa.Schema, stream: Stream) -> list[str]:
    """Columns a query stream declares that the data lacks or types differently (empty: compatible)."""
    out = []
    for col, typ in stream.columns.items():
        if col not in schema.names:
            out.append(f"{stream.name}.{col} is missing")
        elif not spec_type_ok(typ, schema.field(col).type):
            out.append(f"{stream.name}.{col} is {schema.field(col).type}, the spec says {typ}")
    return out
