"""The throughput work's shortcuts keep behaviour: the quarantine's row JSON built column by column equals
the per-row formula, result fingerprints do not depend on how rows are split into files, the streaming job's
checkpoint file manager is chosen for local lakes only and restored after the run, and mjoin's own manager
(mjoin.runtime.jvm) writes the logs as Spark's does, atomically, without checksum files."""
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
    from mjoin.lake.layout import Lake

    from mjoin.runtime.jvm import CHECKPOINT_MANAGER, jar_path

    name = checkpoint_manager(spark, Lake(str(tmp_path)))
    # mjoin's own when make setup built its jar (the session then has it on the class path), else Spark's
    assert name == CHECKPOINT_MANAGER if jar_path() else name.endswith("FileSystemBasedCheckpointFileManager")
    spark._jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(name)
    assert checkpoint_manager(spark, Lake(f"file://{tmp_path}")) == name
    assert checkpoint_manager(spark, Lake("s3a://bucket/lake")) is None
    assert spark.conf.get(CHECKPOINT_MANAGER_KEY, None) is None  # nothing set by asking


@pytest.mark.spark
def test_local_checkpoint_file_manager_writes_atomically(spark, tmp_path):
    """mjoin.spark.LocalCheckpointFileManager through py4j, as Spark's logs call it: createAtomic, write,
    close renames into place (no temporary or .crc file left); refusing to overwrite; cancel."""
    from mjoin.runtime.jvm import CHECKPOINT_MANAGER, _javac, jar_path

    if jar_path() is None:
        assert _javac() is None, "a JDK is installed but mjoin's jar is not built: run python -m mjoin.runtime.jvm"
        pytest.skip("no JDK here: mjoin's checkpoint file manager is not built (Spark's is used)")
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    root = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/ckpt")
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    cls = loader.loadClass(CHECKPOINT_MANAGER)
    assert cls.getName() == CHECKPOINT_MANAGER
    fm = jvm.mjoin.spark.LocalCheckpointFileManager(root, conf)
    fm.mkdirs(root)
    target = jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/ckpt/offsets/0")
    out = fm.createAtomic(target, False)
    out.write(bytearray(b"v1\n{}\n"))
    assert not (tmp_path / "ckpt" / "offsets" / "0").exists()  # invisible until closed
    out.close()
    assert (tmp_path / "ckpt" / "offsets" / "0").read_bytes() == b"v1\n{}\n"
    assert sorted(p.name for p in (tmp_path / "ckpt" / "offsets").iterdir()) == ["0"]  # no temp, no .crc
    assert fm.exists(target)
    again = fm.createAtomic(target, False)
    again.write(bytearray(b"other"))
    with pytest.raises(Exception, match="FileAlreadyExists|already exists"):
        again.close()
    assert (tmp_path / "ckpt" / "offsets" / "0").read_bytes() == b"v1\n{}\n"
    cancelled = fm.createAtomic(jvm.org.apache.hadoop.fs.Path(f"file://{tmp_path}/ckpt/commits/0"), False)
    cancelled.write(bytearray(b"x"))
    cancelled.cancel()
    assert not (tmp_path / "ckpt" / "commits" / "0").exists()
    # no checksum files; the refused overwrite leaves its temporary file, as Spark's own manager does
    assert not [p for p in (tmp_path / "ckpt").rglob("*") if p.name.endswith(".crc")]
    assert not list((tmp_path / "ckpt" / "commits").iterdir())
    stream = fm.open(target)
    assert bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream)) == b"v1\n{}\n"
    stream.close()
