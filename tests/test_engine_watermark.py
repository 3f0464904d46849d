"""The streaming job's event-time rules (pure: mjoin.engine.watermark)."""
from __future__ import annotations

from mjoin.engine.watermark import Watermarks

S = ("a", "b", "c")
SEC = 1_000_000


def test_minimum_over_streams_and_monotone():
    w = Watermarks().advance({"a": 100 * SEC}, S, 0, 60 * SEC)
    assert w.watermark is None  # b and c have not started: nothing is late yet
    w = w.advance({"b": 90 * SEC, "c": 95 * SEC}, S, 0, 60 * SEC)
    assert w.watermark == 90 * SEC  # the slowest stream decides
    w = w.advance({"a": 200 * SEC}, S, 2 * SEC, 600 * SEC)  # a runs ahead: b still decides, minus lateness
    assert w.watermark == 90 * SEC  # never goes back (90 - 2 would be lower)
    w = w.advance({"b": 150 * SEC, "c": 140 * SEC}, S, 2 * SEC, 600 * SEC)
    assert w.watermark == 138 * SEC and w.idle == ()


def test_one_stream_ahead_makes_nothing_late():
    """A micro-batch holding later files of one stream (a boundary inside an arrival cycle)."""
    w = Watermarks().advance({"a": 10 * SEC, "b": 10 * SEC, "c": 10 * SEC}, S, 0, 60 * SEC)
    w = w.advance({"a": 40 * SEC}, S, 0, 60 * SEC)
    assert w.watermark == 10 * SEC  # b's and c's rows of 10..40 s are still accepted


def test_idle_stream_holds_the_watermark_at_most_idle_timeout_behind():
    w = Watermarks().advance({"a": 10 * SEC, "b": 10 * SEC, "c": 10 * SEC}, S, 0, 30 * SEC)
    for t in (20, 30, 40, 50, 60, 70):
        w = w.advance({"a": t * SEC, "b": t * SEC}, S, 0, 30 * SEC)
    assert w.idle == ("c",)
    assert w.watermark == 40 * SEC  # 70 - 30: the state of a and b stays bounded
    w = w.advance({"c": 72 * SEC}, S, 0, 30 * SEC)  # c resumes: rows >= 40 s were accepted
    assert w.idle == () and w.watermark == 70 * SEC


def test_stream_without_rows_becomes_idle_after_the_timeout():
    w = Watermarks().advance({"a": 100 * SEC, "b": 100 * SEC}, S, 0, 30 * SEC)
    assert w.watermark is None and w.first_ts == 100 * SEC
    w = w.advance({"a": 125 * SEC, "b": 125 * SEC}, S, 0, 30 * SEC)
    assert w.watermark is None  # c may still start at 100 s
    w = w.advance({"a": 140 * SEC, "b": 140 * SEC}, S, 0, 30 * SEC)
    assert w.idle == ("c",) and w.watermark == 110 * SEC


def test_legacy_manifest_reads_as_one_watermark():
    w = Watermarks.from_manifest({"max_ts": 50 * SEC}, S, 5 * SEC)
    assert w.watermark == 45 * SEC and w.max_ts == {s: 50 * SEC for s in S}
    doc = Watermarks().advance({"a": SEC, "b": SEC, "c": SEC}, S, 0, SEC).to_json()
    assert Watermarks.from_manifest({"event_time": doc, "max_ts": 0}, S, 0) == \
        Watermarks(max_ts={s: SEC for s in S}, first_ts=SEC, watermark=SEC, idle=())


def test_event_time_promise_moves_a_silent_stream():
    """A punctuation 'no later tuple before T' of a stream without data lets the watermark pass it."""
    w = Watermarks().advance({"a": 100 * SEC, "b": 100 * SEC}, S, 0, 600 * SEC)
    assert w.watermark is None  # c may still start anywhere
    w = w.advance({}, S, 0, 600 * SEC, promised={"c": 90 * SEC})
    assert w.watermark == 90 * SEC and w.promised == {"c": 90 * SEC}
    w = w.advance({"a": 120 * SEC, "b": 120 * SEC}, S, 5 * SEC, 600 * SEC, promised={"c": 130 * SEC})
    assert w.watermark == 115 * SEC  # a and b (120 - 5) hold it now; c promised beyond
    assert Watermarks.from_manifest({"event_time": w.to_json()}, S, 5 * SEC) == w
