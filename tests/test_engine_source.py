"""The streaming source's file log (pure file operations, no Spark): arrival order whatever the
modification times, a folder's punctuations after its data, compaction, and the driver's reading of a
batch's positions from Spark's offset log."""
from __future__ import annotations

import json
import os

from mjoin.runtime import fsutil
from mjoin.engine import source
from mjoin.lake.layout import Lake


def _land(lake: Lake, src: str, arrival: int, names, mtime: float) -> None:
    d = lake.arrival_dir(src, arrival)
    os.makedirs(d, exist_ok=True)
    for n in names:
        p = os.path.join(d, n)
        open(p, "w").write("x")
        os.utime(p, (mtime, mtime))


def test_discover_orders_by_arrival_not_mtime_and_puts_punctuations_after_data(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    _land(lake, "b", 200, ["part-00000.parquet", "punctuation-0.json"], 1.0)
    _land(lake, "a", 200, ["part-00000.parquet", "notes.txt", ".hidden.parquet"], 3.0)
    _land(lake, "a", 100, ["part-00000.parquet", "part-00001.parquet"], 9.0)
    flog = source.FileLog(source.file_log_dir(str(tmp_path / "ckpt")))
    new = source.discover(lake, ["a", "b"], flog, recheck_seconds=600)
    assert [(e.arrival, e.source, os.path.basename(e.path), e.kind) for e in new] == [
        (100, "a", "part-00000.parquet", "data"), (100, "a", "part-00001.parquet", "data"),
        (200, "a", "part-00000.parquet", "data"), (200, "b", "part-00000.parquet", "data"),
        (200, "b", "punctuation-0.json", "punctuation")]
    assert source.discover(lake, ["a", "b"], flog, 600) == []  # nothing twice
    _land(lake, "a", 100, ["part-00002.parquet"], 0.0)  # a late file in a recent folder: rechecked
    assert [os.path.basename(e.path) for e in source.discover(lake, ["a", "b"], flog, 600)] == ["part-00002.parquet"]
    reread = source.FileLog(flog.root)  # a restart reads the same log
    assert [e.to_json() for e in reread.entries] == [e.to_json() for e in flog.entries]


def test_compaction_keeps_what_a_batch_still_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "COMPACT_SEGMENTS", 2)
    lake = Lake(str(tmp_path / "lake"))
    flog = source.FileLog(source.file_log_dir(str(tmp_path / "ckpt")))
    for k in range(5):
        _land(lake, "a", 100 + 10 * k, ["part-00000.parquet"], 1.0)
        source.discover(lake, ["a"], flog, 0)
    flog.compact(3)  # segments 0, 1, 2 are committed
    fresh = source.FileLog(flog.root)
    assert fresh.base_seq == 3 and [e.seq for e in fresh.between(3, 5)] == [3, 4]
    _land(lake, "a", 100, ["part-00009.parquet"], 1.0)  # an old folder, not rechecked: known from known.json
    assert source.discover(lake, ["a"], fresh, 0) == []


def test_batch_offsets_from_sparks_offset_log(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    for b, seq in ((0, 3), (1, 3), (2, 8)):
        fsutil.atomic_write_text(fsutil.join(ckpt, "offsets", str(b)), "v1\n" + json.dumps({"batchWatermarkMs": 0})
                                 + "\n" + json.dumps({"seq": seq}))
    assert source.batch_offsets(ckpt, 0) == (0, 3)
    assert source.batch_offsets(ckpt, 1) == (3, 3)  # an empty batch
    assert source.batch_offsets(ckpt, 2) == (3, 8)
    assert source.batch_offsets(ckpt, 3) is None  # not planned yet
    fsutil.atomic_write_text(fsutil.join(ckpt, "offsets", "4"), "v1\n{}\n{\"offset\": 1}")
    assert source.batch_offsets(ckpt, 4) is None  # not this source's offset: the job reads the source instead
