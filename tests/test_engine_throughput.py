"""The throughput work's shortcuts keep behaviour: the quarantine's row JSON built column by column equals
the per-row formula, result fingerprints do not depend on how rows are split into files, the streaming job's
checkpoint file manager is chosen for local lakes only and restored after the run."""
from __future__ import annotations

import datetime
import decimal
import json
import random

import pyarrow as pa
import pytest

from mjoin.engine.normalize import _spark_string, raw_json
from mjoin.engine.results import fingerprint_tables


def _per_row(table: pa.Table) -> list:
    """What the quarantine wrote per row before (and still means)."""
    return [json.dumps({c: _spark_string(v) for c, v in r.items() if v is not None}, separators=(",", ":"))
            for r in table.to_pylist()]


def _random_table(seed: int, n: int = 800) -> pa.Table:
    rng = random.Random(seed)

    def maybe(v):
        return None if rng.random() < 0.5 else v

    def ts():
        return datetime.datetime(2026, 1, 1) + datetime.timedelta(
            seconds=rng.randint(-10**9, 10**8), microseconds=rng.choice([0, 500000, 1, rng.randint(0, 999999)]))

    return pa.table({
        "i": pa.array([maybe(rng.randint(-10**12, 10**12)) for _ in range(n)], pa.int64()),
        "u8": pa.array([maybe(rng.randint(0, 255)) for _ in range(n)], pa.uint8()),
        "d2": pa.array([maybe(decimal.Decimal(rng.randint(-10**6, 10**6)).scaleb(-2)) for _ in range(n)],
                       pa.decimal128(9, 2)),
        "d8": pa.array([maybe(decimal.Decimal(rng.randint(-999, 999)).scaleb(-8)) for _ in range(n)],
                       pa.decimal128(12, 8)),
        "s": pa.array([maybe(rng.choice(["a", 'q"uo\\te', "é ü", "x\ny", "", "日本"])) for _ in range(n)]),
        "f": pa.array([maybe(rng.choice([1.5, 1e-7, 3.0, -0.0, 1e20])) for _ in range(n)], pa.float64()),
        "b": pa.array([maybe(rng.random() < 0.5) for _ in range(n)], pa.bool_()),
        "day": pa.array([maybe(datetime.date(2020, 1, 1) + datetime.timedelta(days=rng.randint(0, 999)))
                         for _ in range(n)], pa.date32()),
        "ts": pa.array([maybe(ts()) for _ in range(n)], pa.timestamp("us", tz="UTC")),
        "ts_ms": pa.array([maybe(ts().replace(microsecond=rng.choice([0, 5000]))) for _ in range(n)],
                          pa.timestamp("ms")),
        "ts_s": pa.array([maybe(ts().replace(microsecond=0)) for _ in range(n)], pa.timestamp("s")),
        "cat": pa.array([maybe(rng.choice(["p", "q"])) for _ in range(n)]).dictionary_encode(),
    })


@pytest.mark.parametrize("seed", [1, 2])
def test_raw_json_equals_the_per_row_formula(seed):
    t = _random_table(seed)
    t = pa.concat_tables([t, pa.table({f.name: pa.nulls(3, f.type) for f in t.schema})])
    got = raw_json(t)
    assert got == _per_row(t)
    assert "{}" in got  # rows whose every value is NULL (pyarrow's skip-join would drop them)
    one = t.select(["i"])
    assert raw_json(one) == _per_row(one)
    assert raw_json(t.select([])) == ["{}"] * t.num_rows


def test_fingerprint_is_independent_of_how_rows_are_split():
    t = _random_table(3).drop_columns(["cat"])
    whole = fingerprint_tables([t])
    rng = random.Random(0)
    order = list(range(t.num_rows))
    rng.shuffle(order)
    shuffled = t.take(pa.array(order))
    cuts = sorted(rng.sample(range(1, t.num_rows), 5))
    parts = [shuffled.slice(a, b - a) for a, b in zip([0] + cuts, cuts + [t.num_rows])]
    parts.append(t.slice(0, 0))
    assert fingerprint_tables(parts) == whole
    # a part without a NULL in an integer column hashes its values as the whole table does
    no_null = t.filter(pa.compute.is_valid(t.column("i")))
    assert fingerprint_tables([no_null.slice(0, 10), no_null.slice(10)]) == fingerprint_tables([no_null])
    # and a different multiset differs
    assert fingerprint_tables([t.slice(1)]) != whole


@pytest.mark.spark
def test_checkpoint_manager_for_local_lakes_only(spark, tmp_path):
    from mjoin.engine.stream import CHECKPOINT_MANAGER_KEY, checkpoint_manager
    from mjoin.lake import Lake

    name = checkpoint_manager(spark, Lake(str(tmp_path)))
    assert name is not None and name.endswith("FileSystemBasedCheckpointFileManager")
    spark._jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(name)
    assert checkpoint_manager(spark, Lake(f"file://{tmp_path}")) == name
    assert checkpoint_manager(spark, Lake("s3a://bucket/lake")) is None
    assert spark.conf.get(CHECKPOINT_MANAGER_KEY, None) is None  # nothing set by asking
