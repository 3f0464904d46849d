from datetime import datetime, timezone

import pytest

from mjoin.model.timeutil import cycles, format_duration, iso, parse_duration, parse_time, to_micros


@pytest.mark.parametrize("text, seconds", [(90, 90), ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400),
                                           ("500ms", 0.5), ("1.5m", 90), (" 3 min ", 180)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "ten", "-5s", "5 lightyears", True])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_format_roundtrip():
    for s in (1, 59, 60, 90, 300, 3600, 86400, 0.5):
        assert parse_duration(format_duration(s)) == s


def test_times():
    t = parse_time("2026-01-01T00:10:00Z")
    assert t == datetime(2026, 1, 1, 0, 10, tzinfo=timezone.utc)
    assert parse_time(t.timestamp()) == t
    assert parse_time("2026-01-01 00:10:00") == t  # naive means UTC
    assert iso(t) == "2026-01-01T00:10:00Z"
    assert to_micros(t) == int(t.timestamp()) * 1_000_000
    with pytest.raises(ValueError, match="not a time"):
        parse_time("yesterday")


def test_cycles():
    cs = cycles("2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", 20)
    assert [iso(c) for c in cs] == ["2026-01-01T00:00:00Z", "2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z"]
    assert len(cycles(0, 50, 20)) == 3  # the last cycle is partial
    assert cycles(10, 10, 5) == []
