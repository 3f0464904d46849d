"""Workloads: TPC-DS tables and synthetic drifting data as streams, and the lander that replays them.

A workload is a folder::

    <workload>/manifest.json                                   what it holds (manifest.py)
    <workload>/streams/<source>/arrival=<epoch>/part-00000.parquet   the lake's input layout
    <workload>/rejected/<source>/part-00000.parquet            rows without event time (event-time replay)
    <workload>/query.yaml, schedule.parquet                    synthetic only: its spec, the schedule per cycle

Entry points: :func:`~mjoin.workloads.tpcds_replay.generate_tpcds`,
:func:`~mjoin.workloads.synthetic.generate_synthetic` (drift :mod:`~mjoin.workloads.presets`,
:mod:`~mjoin.workloads.schedule`), :func:`~mjoin.workloads.lander.land`,
:func:`~mjoin.workloads.manifest.load_manifest`; errors in :mod:`~mjoin.workloads.errors`.
"""
