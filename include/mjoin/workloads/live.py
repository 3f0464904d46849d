"""A live source for the embedded setup: a TPC-DS replay landing into the lake in real time, from "now".

The DAGs read whatever lands under ``<lake>/streams/<source>/arrival=<epoch>/`` (docs/workloads.md,
the landing contract). With no real source attached, this feed makes the embedded setup live
(``make airflow`` runs it beside Airflow, ``python -m mjoin live`` alone): it generates a TPC-DS
workload (the paper's replay) whose event times are wall-clock times starting ``backlog`` before
the current cycle, lands the cycles already over at once (so the first scheduled run has history to
forecast from) and every later cycle when it ends on the wall clock, and generates the next
``chunk`` (the next seed) while the current one lands, until stopped or ``until``.

A restart continues after the newest cycle already in the lake (landing is idempotent per cycle and
never rewrites one), so stopping and starting the feed leaves a gap, not a conflict.
"""
from __future__ import annotations

import logging
import math
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso, parse_duration, to_epoch
from mjoin.runtime.resources import PROJECT_DIR
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.lander import land
from mjoin.workloads.tpcds_replay import generate_tpcds

log = logging.getLogger(__name__)

SOURCES = ("customer", "store_returns", "web_returns", "catalog_returns")


@dataclass
class LiveFeed:
    """What a :func:`run_live` call did (chunks generated, cycles and rows landed)."""

    lake: str
    start: float
    chunks: int = 0
    cycles: int = 0
    rows: dict = field(default_factory=dict)


def live_start(lake: Lake, cycle: float, backlog: float, now: float) -> float:
    """The first cycle of the feed: ``backlog`` before the current cycle, after the newest landed one."""
    current = math.floor(now / cycle) * cycle
    newest = [lake.arrivals(s)[-1] for s in SOURCES if lake.arrivals(s)]
    start = current - math.floor(backlog / cycle) * cycle
    if newest:
        start = max(start, math.floor(max(newest) / cycle) * cycle + cycle)
    return start


def run_live(lake, *, sf: float = 0.1, cycle=10, chunk="1h", backlog="10m", seed: int = 0, workdir=None,
             until=None, sleep=time.sleep, wall_clock=time.time, on_cycle=None, keep: bool = False) -> LiveFeed:
    """Feed ``lake`` with a real-time TPC-DS replay (see the module docstring); returns when ``until``
    (ISO-8601 or epoch seconds) is reached, or never. ``sleep`` may raise to stop the feed between cycles.
    The workloads go to ``workdir`` (default ``<project>/.cache/live``) and are removed once landed."""
    lake = lake if isinstance(lake, Lake) else Lake(str(lake))
    cycle_s, chunk_s, backlog_s = parse_duration(cycle), parse_duration(chunk), parse_duration(backlog)
    if cycle_s <= 0 or chunk_s < cycle_s or chunk_s % cycle_s:
        raise WorkloadError(f"the chunk ({chunk_s:g} s) must be a whole number of cycles ({cycle_s:g} s)", "--chunk")
    stop_at = None if until is None else to_epoch(until)
    workdir = Path(workdir or PROJECT_DIR / ".cache" / "live")
    workdir.mkdir(parents=True, exist_ok=True)
    start = live_start(lake, cycle_s, backlog_s, wall_clock())
    feed = LiveFeed(lake=lake.root, start=start)
    log.info("live TPC-DS sf=%g feed into %s from %s (%g s cycles, %g s chunks)", sf, lake.root, iso(start), cycle_s,
             chunk_s)

    def make(k: int):
        t = start + k * chunk_s
        out = workdir / f"chunk-{int(t)}"
        return generate_tpcds(out, sf=sf, duration=chunk_s, cycle=cycle_s, start=iso(t), seed=seed + k, overwrite=True)

    def landed(epoch, cycles):
        feed.cycles += 1
        for c in cycles:
            feed.rows[c.source] = feed.rows.get(c.source, 0) + c.rows
        if on_cycle is not None:
            on_cycle(epoch, cycles)

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="live-gen")
    upcoming = pool.submit(make, 0)
    k = 0
    try:
        while upcoming is not None:
            manifest = upcoming.result()
            feed.chunks += 1
            upcoming = None
            if stop_at is None or start + (k + 1) * chunk_s < stop_at:
                upcoming = pool.submit(make, k + 1)  # the next chunk is ready before this one ends
            try:
                land(manifest, lake, stop_at, sleep=sleep, wall_clock=wall_clock, on_cycle=landed)
            finally:
                if not keep:
                    shutil.rmtree(manifest.root, ignore_errors=True)
            k += 1
    finally:
        pool.shutdown(wait=True)
        if upcoming is not None and not keep and upcoming.exception() is None:
            shutil.rmtree(upcoming.result().root, ignore_errors=True)
    return feed
