"""The live feed (`python -m mjoin live`, `make airflow`): a TPC-DS replay landing in real time from now.

A fake wall clock (advanced by the feed's own sleeps) makes real time instant: the test checks *when*
each cycle lands on that clock, not by waiting for it.
"""
from __future__ import annotations

import pytest

from mjoin.lake.layout import Lake
from mjoin.workloads.live import SOURCES, live_start, run_live

CYCLE = 10
NOW = 1767226125.3  # 2026-01-01T00:08:45.3Z


class Clock:
    def __init__(self, t: float):
        self.t = t
        self.sleeps = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def test_backlog_lands_at_once_then_each_cycle_at_its_end_and_a_restart_continues(tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    clock = Clock(NOW)
    landed = []
    feed = run_live(lake, sf=0.01, cycle=CYCLE, chunk="60s", backlog="30s", until=NOW + 40, workdir=tmp_path / "w",
                    sleep=clock.sleep, wall_clock=clock, on_cycle=lambda e, c: landed.append((e, clock.t, len(c))))
    current = NOW - NOW % CYCLE  # 00:08:40
    epochs = [e for e, _, _ in landed]
    assert epochs == [current - 30 + k * CYCLE for k in range(8)]  # 00:08:10 .. 00:09:20 (before until)
    for e, at, files in landed:
        assert files == len(SOURCES)  # every source lands in every cycle at sf 0.01
        if e + CYCLE <= NOW:
            assert at == NOW  # the backlog and the cycles already over: at once
        else:
            assert at == pytest.approx(e + CYCLE)  # the others exactly when they end on the wall clock
    assert feed.chunks == 2 and feed.start == current - 30  # the second chunk covers 00:09:10 and 00:09:20
    assert sorted(lake.arrivals("customer")) == epochs
    assert not list((tmp_path / "w").iterdir())  # landed chunks are removed
    # a restart continues after the newest landed cycle (never rewrites one: landing is idempotent per cycle)
    assert live_start(lake, CYCLE, 30, clock.t) == epochs[-1] + CYCLE
    t1 = clock.t + 95  # down for longer than the backlog: a gap, not a conflict
    later = Clock(t1)
    again = run_live(lake, sf=0.01, cycle=CYCLE, chunk="60s", backlog="30s", until=t1, workdir=tmp_path / "w",
                     sleep=later.sleep, wall_clock=later, seed=5)
    assert again.start == t1 - t1 % CYCLE - 30 > epochs[-1] + CYCLE and again.cycles == 4


def test_chunk_must_be_whole_cycles(tmp_path):
    from mjoin.workloads.errors import WorkloadError

    with pytest.raises(WorkloadError, match="whole number of cycles"):
        run_live(tmp_path, cycle=10, chunk="25s", until=NOW, wall_clock=lambda: NOW)
