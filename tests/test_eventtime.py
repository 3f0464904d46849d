"""One event-time rule (mjoin.model.eventtime): for every kind of event time, the engine's Spark path
(normalize_group), its driver path (normalize_local), the statistics job's Spark read (load_streams) and its
driver read (read_routed) put every row in the same microsecond, with the same NULLs for unusable values
(overflow, NaN, infinities, unparsable strings); so does the input gate's Spark scan. String and ``expr`` event times are Spark's to parse: both
driver paths refuse them, and the two Spark paths agree; a decimal ``expr`` is compared with the driver-side
computation (micros_arrow) directly."""
from __future__ import annotations

import decimal
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mjoin.model import eventtime
from mjoin.engine import normalize
from mjoin.engine.sparkplan import apply_engine_conf, restore_conf
from mjoin.engine.compiled import EngineQuery, key_name
from mjoin.lake.layout import Lake
from mjoin.model.query import parse_query
from mjoin.stats import sources

pytestmark = pytest.mark.spark

ARRIVAL = 1_700_000_000
I64 = np.iinfo(np.int64)
LIM = I64.max // 10**6  # epoch seconds whose microseconds still fit a bigint
TIES = [j / 128 for j in (1, -1, 3, -3, 255, -255)]  # x * 1e6 = k + 0.5 exactly: Spark rounds half away from zero
D = decimal.Decimal


def _f64():
    v = [1.5, -1.5, 1e-7, -1e-7, 5e-7, -5e-7, 4.9999999999999994e-7, 2.5e-6, -2.5e-6, ARRIVAL + 0.1234565,
         -(ARRIVAL + 0.0078125), ARRIVAL + 0.0078125, np.nan, np.inf, -np.inf, 1e300,
         9.2233720368547758e12, -9.2233720368547758e12, 9.223372036854e12, 9.3e12, -9.3e12, None] + TIES
    return pa.array(v, pa.float64(), from_pandas=True)


#: stream -> (event-time spec, {column: spec type}, {column: Arrow array}); every stream also has a key k
KINDS = {
    "ts_us": ("t", {"t": "timestamp"}, {"t": pa.array([0, -1, 1, ARRIVAL * 10**6 + 123456, -(10**15) - 7, None],
                                                       pa.timestamp("us"))}),
    "ts_ms": ("t", {"t": "timestamp"}, {"t": pa.array([0, -1, 1, ARRIVAL * 1000 + 999, None], pa.timestamp("ms"))}),
    "ts_ns": ("t", {"t": "timestamp"}, {"t": pa.array([0, -1, -999, -1000, -1001, -1500, 1500, 999,
                                                       ARRIVAL * 10**9 + 123456789, -(ARRIVAL * 10**9) - 1, None],
                                                      pa.timestamp("ns"))}),
    "ts_tz": ("t", {"t": "timestamp"}, {"t": pa.array([0, ARRIVAL * 10**6 + 5, -3, None],
                                                      pa.timestamp("us", "Europe/Berlin"))}),
    "ts_s": ("t", {"t": "timestamp"}, {"t": pa.array([0, ARRIVAL, -ARRIVAL, None], pa.timestamp("s", "UTC"))}),
    "day": ("t", {"t": "date"}, {"t": pa.array([0, -1, 19675, -719162, None], pa.date32())}),
    "i8": ("t", {"t": "int"}, {"t": pa.array([0, 1, -1, 127, -128, None], pa.int8())}),
    "i16": ("t", {"t": "int"}, {"t": pa.array([0, 32767, -32768, None], pa.int16())}),
    "i32": ("t", {"t": "long"}, {"t": pa.array([ARRIVAL, -ARRIVAL, 2**31 - 1, -(2**31), None], pa.int32())}),
    "u32": ("t", {"t": "long"}, {"t": pa.array([0, 2**32 - 1, None], pa.uint32())}),
    "i64": ("t", {"t": "long"}, {"t": pa.array([ARRIVAL, LIM, -LIM, LIM + 1, -LIM - 1, I64.max, I64.min, None],
                                               pa.int64())}),
    "f32": ("t", {"t": "double"}, {"t": pa.array([0.5, -0.5, 2.5e-7, 5e-7, 1e-6, ARRIVAL + 0.25, np.nan, np.inf,
                                                  9.3e12, -9.3e12, None] + TIES, pa.float32(), from_pandas=True)}),
    "f64": ("t", {"t": "double"}, {"t": _f64()}),
    "text": ({"column": "t", "format": "yyyy-MM-dd HH:mm:ss.SSSSSS"}, {"t": "string"},
             {"t": pa.array(["2023-11-14 22:13:20.123456", "1969-12-31 23:59:59.999999", "nope", "", None])}),
    "e_ts": ({"expr": "timestamp_millis(ms)"}, {"ms": "long"}, {"ms": pa.array([ARRIVAL * 1000 + 7, -1, None])}),
    "e_dbl": ({"expr": "ms / 1000"}, {"ms": "long"}, {"ms": pa.array([ARRIVAL * 1000 + 7, -1, -3, 5, None])}),
    "e_dec": ({"expr": "d"}, {"d": "decimal(25,10)"},
              {"d": pa.array([D(x) if x else None for x in
                              ("0.0000005", "-0.0000005", "0.0000004999", "1.00000049", "-0.0000015",
                               "1700000000.0000015", "9223372036854.775807", "9223372036854.775808",
                               "-9223372036854.775808", "-9223372036854.775809", None)], pa.decimal128(25, 10))}),
    # a product above precision 38: Spark cuts it to scale 6 (HALF_UP) before the round
    "e_dec38": ({"expr": "d"}, {"d": "decimal(38,14)"},
                {"d": pa.array([D(x) if x else None for x in
                                ("0.00000049999950", "-0.00000049999950", "0.00000049999949",
                                 "123456789012345678.00000050000000", None)], pa.decimal128(38, 14))}),
}
SPARK_ONLY = {"text", "e_ts", "e_dbl", "e_dec", "e_dec38"}


def _spec():
    names = list(KINDS)
    return {
        "spec_version": 1, "name": "eventtime_rule",
        "streams": [{"name": n, "source": f"src_{n}", "event_time": et, "window": "1s",
                     "columns": {**cols, "k": "long"}, "keys": ["k"]} for n, (et, cols, _) in KINDS.items()],
        "predicates": [f"{a}.k = {b}.k" for a, b in zip(names, names[1:])],
        "output": [f"{names[0]}.k"],
    }


@pytest.fixture(scope="module")
def landed(tmp_path_factory):
    """The query and a lake with one file per stream, row i of a stream keyed 1000 * stream + i."""
    q = parse_query(_spec())
    lake = Lake(str(tmp_path_factory.mktemp("eventtime") / "lake"))
    paths = {}
    for s, (name, (_et, _cols, arrays)) in enumerate(KINDS.items()):
        n = len(next(iter(arrays.values())))
        path = lake.stream_file(f"src_{name}", ARRIVAL)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table({**arrays, "k": pa.array(np.arange(n) + 1000 * s, pa.int64())}), path)
        paths[name] = [path]
    return q, lake, paths


def _by_key(keys, micros) -> dict:
    return {int(k): (None if t is None else int(t)) for k, t in zip(keys, micros)}


def test_every_path_puts_a_row_in_the_same_microsecond(spark, landed):
    q, lake, paths = landed
    eq = EngineQuery.from_query(q)
    kcol = key_name(eq.classes[0])
    names = list(KINDS)
    before = {"spark.sql.legacy.parquet.nanosAsLong": spark.conf.get("spark.sql.legacy.parquet.nanosAsLong", None)}
    try:
        # the statistics job's Spark read, in a session that reads ns timestamps as it does by default (it sets
        # nanosAsLong itself, as the engine does)
        spark.conf.unset("spark.sql.legacy.parquet.nanosAsLong")
        grid = sources.Grid(-(2**63), I64.max, 10**6)
        reports, usable = sources.checked_files(q, lake, grid, prune_arrivals=False)
        assert not [r for rep in reports.values() for r in rep.rejected_files]
        base, _ = sources.load_streams(spark, q, lake, grid, None, prune_arrivals=False, files=(reports, usable))
        stats_spark = {}
        for r in base.select("sid", "t", "k0").collect():
            stats_spark.setdefault(names[r["sid"]], {})[int(r["k0"])] = r["t"]
        # the engine's Spark path
        engine_conf = apply_engine_conf(spark)
        inspected = normalize.inspect_files(q, eq, paths)
        assert not inspected.rejects
        frame = normalize.normalize_streams(spark, q, eq, inspected)
        engine_spark = {}
        for r in frame.select("_s", "_ts", kcol).collect():
            engine_spark.setdefault(eq.streams[r["_s"]], {})[int(r[kcol])] = r["_ts"]
        # the input gate's Spark scan: each file read as it is (no schema), the kind from the type Spark reads
        gate_spark = {}
        frames = []
        for n in names:
            df = spark.read.parquet(paths[n][0])
            frames.append(df.selectExpr(f"'{n}' AS s", f"{sources.event_time_sql(q.stream(n), df)} AS t", "k"))
        for f in frames[1:]:
            frames[0] = frames[0].unionByName(f)
        for r in frames[0].collect():
            gate_spark.setdefault(r["s"], {})[int(r["k"])] = r["t"]
        restore_conf(spark, engine_conf)
    finally:
        restore_conf(spark, before)

    # the engine's driver path and the statistics job's driver read (not for strings and exprs: Spark's)
    local = [n for n in names if normalize.local_supported(q, [n])]
    assert set(names) - set(local) == SPARK_ONLY
    assert sources.driver_read_problem(spark, q) is not None
    sub = normalize.Inspected(groups={g: v for g, v in inspected.groups.items() if g[0] in local})
    table = normalize.normalize_local(q, eq, sub)
    engine_local = {}
    for s, t, k in zip(*(table.column(c).to_pylist() for c in ("_s", "_ts", kcol))):
        engine_local.setdefault(eq.streams[s], {})[k] = t
    routed = sources.read_routed(q, grid, None, {n: (usable[n] if n in local else {}) for n in names},
                                 [[0]] * len(names))
    stats_local = {}
    for s, t, k in zip(*(routed.column(c).to_pylist() for c in ("sid", "t", "key"))):
        stats_local.setdefault(names[s], {})[k] = t

    for n in names:
        arrays = KINDS[n][2]
        assert engine_spark[n] == stats_spark[n], n
        assert gate_spark[n] == engine_spark[n], n
        assert len(engine_spark[n]) == len(next(iter(arrays.values()))), n
        if n in local:
            assert engine_local[n] == engine_spark[n], n
            assert stats_local[n] == engine_spark[n], n
    # decimals (an expr here): the driver-side computation equals Spark's too
    for n in ("e_dec", "e_dec38"):
        col = KINDS[n][2]["d"]
        ours = eventtime.micros_arrow(col, eventtime.arrow_kind(col.type)).to_pylist()
        assert [engine_spark[n][1000 * names.index(n) + i] for i in range(len(col))] == ours, n

    # the cases the rule is about, as Spark computed them
    def got(n):
        return [engine_spark[n][1000 * names.index(n) + i] for i in range(len(engine_spark[n]))]

    assert got("f64")[-6:] == [7813, -7813, 23438, -23438, 1992188, -1992188]  # ties: half away from zero
    assert got("f64")[12:16] == [None] * 4  # NaN, +-inf, 1e300
    assert got("f64")[16:21] == [I64.max, I64.min, int(9.223372036854e12 * 1e6), None, None]  # 2^63 saturates
    assert got("i64")[3:7] == [None, None, None, None]  # try_multiply overflows
    assert got("ts_ns")[:8] == [0, 0, 0, -1, -1, -1, 1, 0]  # div 1000 truncates toward zero
    assert got("text")[2:] == [None, None, None]
    assert got("e_dec")[:5] == [1, -1, 0, 1000000, -2]
    assert got("e_dec")[6:10] == [I64.max, None, I64.min, None]
    assert got("e_dec38")[:3] == [1, -1, 0]  # 0.4999995 -> 0.500000 (scale 6) -> 1
