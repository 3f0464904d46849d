"""Workloads: TPC-DS tables and synthetic drifting data as streams, and the lander that replays them.

A workload is a folder::

    <workload>/manifest.json                                   what it holds (manifest.py)
    <workload>/streams/<source>/arrival=<epoch>/part-00000.parquet   the lake's input layout
    <workload>/rejected/<source>/part-00000.parquet            rows without event time (event-time replay)
    <workload>/query.yaml, schedule.parquet                    synthetic only: its spec, the schedule per cycle

Public API: :func:`generate_tpcds`, :func:`generate_synthetic`, :func:`land`,
:func:`load_manifest`, :func:`load_schedule`.
"""
from mjoin.workloads.errors import ScheduleError, WorkloadError
from mjoin.workloads.lander import LandResult, LandedCycle, cycles_bound, land
from mjoin.workloads.manifest import Manifest, load_manifest
from mjoin.workloads.params import DEFAULT_CYCLE, DEFAULT_START
from mjoin.workloads.presets import PRESETS
from mjoin.workloads.schedule import Schedule, load_schedule, parse_schedule
from mjoin.workloads.synthetic import generate_synthetic
from mjoin.workloads.tpcds_cache import ensure_tables
from mjoin.workloads.tpcds_replay import TPCDS_QUERIES, generate_tpcds

__all__ = [
    "DEFAULT_CYCLE", "DEFAULT_START", "LandResult", "LandedCycle", "Manifest", "PRESETS", "Schedule", "ScheduleError",
    "TPCDS_QUERIES", "WorkloadError", "cycles_bound", "ensure_tables", "generate_synthetic", "generate_tpcds", "land",
    "load_manifest", "load_schedule", "parse_schedule",
]
