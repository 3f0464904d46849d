"""Statistics of a query's streams per cycle (docs/algorithms.md, "Statistics per cycle").

- :mod:`mjoin.stats.history`: the Parquet history in the lake, read back with
  pyarrow/pandas (no Spark): ``read_history``, ``snapshot``, ``read_histogram``.
- :mod:`mjoin.stats.job`: the Spark job that computes the statistics of an
  interval (exact or sketch mode) and writes the history.

Beside them: the per-edge kernels (``kernel``, ``exact``), the sketch mode (``sketchmode``, ``sketch``), the
statistics per key cell (``cells``), of band predicates (``bands``), and as the engine holds its state under
punctuations (``effective``). The forecast and the gates read :mod:`mjoin.stats.history` without Spark.
"""
