"""The interval input path's driver work: the lake listed once per source, the accepted files
read by Spark through globs that match exactly them, and the footer read once per file."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mjoin.lake import contract
from mjoin.engine import source
from mjoin.lake.layout import Lake


def _write(path, n: int, start: int = 0, nulls: bool = False) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = [None if nulls and i % 3 == 0 else start + i for i in range(n)]
    table = pa.table({"k": pa.array(ids, pa.int64()), "ts": pa.array([1_700_000_000 + i for i in range(n)], pa.int64())})
    pq.write_table(table, path, row_group_size=max(1, n // 3))
    return str(path)


def test_landed_lists_what_stream_and_punctuation_files_list(tmp_path):
    lake = Lake(str(tmp_path))
    root = tmp_path / "streams"
    for a in (30, 10, 20):
        _write(root / "s" / f"arrival={a}" / "part-00001.parquet", 5)
        _write(root / "s" / f"arrival={a}" / "part-00000.parquet", 5)
    (root / "s" / "arrival=20" / "punctuation-0.json").write_text("{}")
    (root / "s" / "arrival=20" / "notes.txt").write_text("not landed data")
    (root / "s" / "arrival=20" / "deeper").mkdir()
    _write(root / "s" / "arrival=20" / "deeper" / "part-00000.parquet", 2)  # not in an arrival folder itself
    (root / "s" / "stray.parquet").write_text("outside the arrival folders")
    got = lake.landed("s")
    assert [p for _, p, kind in got if kind == "data"] == lake.stream_files("s")
    assert [(a, p) for a, p, kind in got if kind == "punctuation"] == lake.punctuation_files("s")
    assert [a for a, _, kind in got if kind == "data"] == [10, 10, 20, 20, 30, 30]
    assert lake.stream_files("s", 15, 30) == [p for a, p, kind in got if kind == "data" and a == 20]
    assert lake.landed("missing") == [] and lake.stream_files("missing") == []
    # the streaming job's file log takes the same files, kinds and arrivals (one rule: Lake.landed_kind)
    flog = source.FileLog(str(tmp_path / "log"))
    found = source.discover(lake, ["s"], flog, recheck_seconds=600)
    assert sorted((e.arrival, e.path, e.kind) for e in found) == sorted(got)


def test_footer_read_once_gives_the_same_facts(tmp_path):
    """One pass over the column chunks gives the fingerprint and event-time facts the separate passes gave."""
    a = _write(tmp_path / "a.parquet", 10, nulls=True)
    b = _write(tmp_path / "b.parquet", 10)
    md = pq.read_metadata(a)
    schema = pq.read_schema(a)
    stats = contract._chunk_stats(md)
    assert md.num_row_groups > 1 and stats["k"][0] == 4 and stats["k"][1:3] == [1, 8] and stats["k"][3:] == [True, True]
    assert contract.footer_fingerprint(md, schema) == contract.footer_fingerprint(md, schema, stats)
    assert contract.footer_fingerprint(md, schema) != contract.footer_fingerprint(pq.read_metadata(b), pq.read_schema(b))
    assert contract._event_time_stats(md, schema, "ts", stats) == (0, 1_700_000_009.0)
    assert contract._event_time_stats(md, schema, "k", stats)[0] == 4
    assert contract._event_time_stats(md, schema, "nope", stats) == (None, None)


@pytest.mark.spark
def test_read_files_reads_exactly_the_given_files(spark, tmp_path):
    """The glob read takes only the files the contract accepted (not a rejected neighbour), and a file gone
    since its footer was read is Spark's error, never silently left out."""
    from mjoin.engine.normalize import read_files

    folder = tmp_path / "streams" / "s"
    paths = [_write(folder / f"arrival={a}" / "part-00000.parquet", 4, start=10 * a) for a in range(6)]
    _write(folder / "arrival=6" / "part-00000.parquet", 4, start=1000)  # e.g. quarantined: not to be read
    df = read_files(spark, "k bigint, ts bigint", paths)
    assert sorted(r.k for r in df.collect()) == sorted(10 * a + i for a in range(6) for i in range(4))
    assert sorted(df.inputFiles()) == sorted("file://" + p for p in paths)
    gone = folder / "arrival=3" / "part-00000.parquet"
    gone.unlink()
    with pytest.raises(Exception, match="PATH_NOT_FOUND|does not exist"):
        read_files(spark, "k bigint, ts bigint", paths).collect()


