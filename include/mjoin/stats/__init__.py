"""Statistics of a query's streams per cycle (ALGORITHMS.md, "Statistics per cycle").

- :mod:`mjoin.stats.history`: the Parquet history in the lake, read back with
  pyarrow/pandas (no Spark): ``read_history``, ``snapshot``, ``read_histogram``.
- :mod:`mjoin.stats.job`: the Spark job that computes the statistics of an
  interval (exact or sketch mode) and writes the history.

This package's ``__init__`` imports nothing, so the forecast and the gates can
import :mod:`mjoin.stats.history` without pulling in Spark.
"""
