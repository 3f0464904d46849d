"""The lander: until/since respected, counts, idempotent, atomic, conflicts, real-time pacing."""
from __future__ import annotations

import os
import time
from pathlib import Path

import duckdb
import pytest

from mjoin.lake.layout import Lake
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.lander import cycles_bound, land
from mjoin.workloads.tpcds_replay import generate_tpcds
from mjoin.workloads.tpcds_cache import ensure_tables

SF = 0.01
MIN = 60


@pytest.fixture(scope="session")
def workload(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "tpcds-cache"  # shared with test_workloads_tpcds
    ensure_tables(SF, cache)
    return generate_tpcds(tmp_path_factory.mktemp("land") / "w", sf=SF, cache_dir=cache, seed=3, cycle="60s")


def lake_rows(lake: Lake, source: str) -> int:
    files = lake.stream_files(source)
    if not files:
        return 0
    return duckdb.connect().execute(f"SELECT count(*) FROM read_parquet({files!r}, hive_partitioning=false)").fetchone()[0]


def workload_rows(m, source, lo=None, hi=None) -> int:
    files = [os.path.join(m.root, "streams", source, f"arrival={a}", "part-00000.parquet") for a in m.arrivals(source)
             if (lo is None or a >= lo) and (hi is None or a < hi)]
    return duckdb.connect().execute(f"SELECT count(*) FROM read_parquet({files!r})").fetchone()[0] if files else 0


def hidden_entries(root) -> list:
    return [p for p in Path(root).rglob(".*")]


def test_until_is_respected_and_counts_are_right(workload, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    until = workload.start_epoch + 10 * MIN
    r = land(workload.root, lake, until)
    for s in workload.sources:
        expected = [a for a in workload.arrivals(s) if a < until]
        assert lake.arrivals(s) == expected and len(expected) == 10
        assert r.rows_per_source()[s] == lake_rows(lake, s) == workload_rows(workload, s, hi=until)
    assert r.cycles == sorted({a for s in workload.sources for a in workload.arrivals(s) if a < until})
    assert r.files == sum(len(lake.arrivals(s)) for s in workload.sources) and not r.skipped
    assert hidden_entries(lake.root) == []


def test_landing_is_idempotent(workload, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    first = land(workload.root, lake, workload.start_epoch + 5 * MIN)
    stamps = {f: os.stat(f).st_mtime_ns for s in workload.sources for f in lake.stream_files(s)}
    again = land(workload.root, lake, workload.start_epoch + 5 * MIN)
    assert again.landed == [] and len(again.skipped) == first.files
    assert {f: os.stat(f).st_mtime_ns for s in workload.sources for f in lake.stream_files(s)} == stamps
    rest = land(workload.root, lake, None)
    assert len(rest.skipped) == first.files
    for s in workload.sources:
        assert lake_rows(lake, s) == workload.rows(s)  # every row exactly once
        assert first.rows_per_source()[s] + rest.rows_per_source()[s] == workload.rows(s)


def test_since_and_cycles(workload, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    since = workload.start_epoch + 20 * MIN
    until = cycles_bound(workload, 5, since)
    assert until == since + 5 * MIN
    r = land(workload.root, lake, until, since=since)
    assert r.cycles == [int(since) + k * MIN for k in range(5)]
    for s in workload.sources:
        assert lake_rows(lake, s) == workload_rows(workload, s, lo=since, hi=until)
    assert cycles_bound(workload, 3) == workload.first_cycle + 3 * MIN
    with pytest.raises(WorkloadError):
        cycles_bound(workload, -1)


def test_a_failed_copy_leaves_no_cycle_and_no_temp(workload, tmp_path, monkeypatch):
    import mjoin.workloads.lander as lander

    lake = Lake(str(tmp_path / "lake"))
    real = lander.pafs.copy_files
    calls = {"n": 0}

    def flaky(src, dst, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            real(src, dst, **kw)  # the file is (partly) there, then the copy fails
            raise OSError("disk full")
        return real(src, dst, **kw)

    monkeypatch.setattr(lander.pafs, "copy_files", flaky)
    with pytest.raises(OSError, match="disk full"):
        land(workload.root, lake, None)
    landed = [(s, a) for s in workload.sources for a in lake.arrivals(s)]
    assert len(landed) == 2  # the two (source, cycle) folders copied before the failure; the third never appeared
    assert hidden_entries(lake.root) == []
    monkeypatch.setattr(lander.pafs, "copy_files", real)
    r = land(workload.root, lake, None)  # a re-run completes the job
    assert len(r.skipped) == 2
    for s in workload.sources:
        assert lake_rows(lake, s) == workload.rows(s)


def test_a_different_cycle_in_the_lake_is_a_conflict(workload, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    epoch = workload.arrivals("customer")[0]
    path = Path(lake.stream_file("customer", epoch))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not the same parquet file")
    with pytest.raises(WorkloadError, match="already holds a different customer"):
        land(workload.root, lake, None)


def test_stale_temporary_folders_are_removed(workload, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    stale = Path(lake.streams("customer")) / ".arrival=1767225600.0123456789ab.tmp"
    fresh = Path(lake.streams("customer")) / ".arrival=1767225660.ba9876543210.tmp"
    for d in (stale, fresh):
        d.mkdir(parents=True)
        (d / "part-00000.parquet").write_bytes(b"half")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    land(workload.root, lake, workload.start_epoch + MIN)
    assert not stale.exists() and fresh.exists()  # a fresh one may belong to a running lander


def test_realtime_follows_the_simulated_clock(workload, tmp_path):
    now = {"t": 100.0}
    waits, landed_at = [], []

    def sleep(s):
        waits.append(s)
        now["t"] += s

    r = land(workload.root, Lake(str(tmp_path / "lake")), workload.start_epoch + 4 * MIN, speed=30,
             sleep=sleep, clock=lambda: now["t"], on_cycle=lambda e, cycles: landed_at.append((e, now["t"])))
    # cycle k lands when it is over on the simulated clock: (k + 1) * 60 s / 30 = 2 (k + 1) wall seconds
    assert [t - 100.0 for _, t in landed_at] == pytest.approx([2.0, 4.0, 6.0, 8.0])
    assert [e for e, _ in landed_at] == r.cycles
    assert sum(waits) == pytest.approx(8.0)


def test_realtime_rerun_catches_up_without_waiting(workload, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    land(workload.root, lake, workload.start_epoch + 2 * MIN)
    now = {"t": 0.0}
    landed_at = []

    def sleep(s):
        now["t"] += s

    r = land(workload.root, lake, workload.start_epoch + 4 * MIN, speed=60, sleep=sleep, clock=lambda: now["t"],
             on_cycle=lambda e, cycles: landed_at.append(now["t"]))
    assert len(r.skipped) == 2 * len(workload.sources) and len(r.cycles) == 2
    assert landed_at == pytest.approx([1.0, 2.0])  # paced from the first cycle with work, not from the start


@pytest.mark.parametrize("kwargs, field", [({"until": "soon"}, "--until"), ({"until": None, "since": "x"}, "--since"),
                                           ({"until": 10, "since": 20}, "--until"), ({"until": None, "speed": 0}, "--speed")])
def test_bad_bounds(workload, tmp_path, kwargs, field):
    with pytest.raises(WorkloadError) as exc:
        land(workload.root, Lake(str(tmp_path / "lake")), **kwargs)
    assert exc.value.field == field


def test_not_a_workload(tmp_path):
    with pytest.raises(WorkloadError, match="not a workload"):
        land(tmp_path, Lake(str(tmp_path / "lake")), None)


@pytest.mark.spark
def test_spark_sees_landed_cycles_only(spark, workload, tmp_path):
    """Batch and streaming file sources read exactly the landed cycles; a lander's temporary folder is invisible."""
    import shutil

    lake = Lake(str(tmp_path / "lake"))
    r = land(workload.root, lake, workload.start_epoch + 5 * MIN)
    pending = workload.arrivals("customer")[6]
    tmp = Path(lake.streams("customer")) / f".arrival={pending}.0123456789ab.tmp"
    tmp.mkdir()
    shutil.copy(Path(workload.root) / "streams" / "customer" / f"arrival={pending}" / "part-00000.parquet", tmp)
    df = spark.read.parquet(lake.streams("customer"))
    assert df.count() == r.rows_per_source()["customer"]
    assert sorted(x.arrival for x in df.select("arrival").distinct().collect()) == lake.arrivals("customer")
    query = (spark.readStream.schema(df.schema).parquet(lake.streams("customer"))
             .writeStream.format("memory").queryName("landed_customer").trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert spark.table("landed_customer").count() == r.rows_per_source()["customer"]
