"""The Spark multi-way stream join engine: per-bucket vectorised index nested loops following the
plan's probe orders, interval evaluation, streaming with hot plan reload and exactly-once output,
quarantine, metrics, and Spark's own chained joins as a baseline (docs/engine.md).

- :mod:`~mjoin.engine.runs`: ``run_interval`` and ``run_stream``, the entry points;
- :mod:`~mjoin.engine.interval`, :mod:`~mjoin.engine.stream`: the two ways to run;
- :mod:`~mjoin.engine.batch` (one micro-batch, committed) and :mod:`~mjoin.engine.pipelined`
  (every batch of an interval in one job per stage), over :mod:`~mjoin.engine.operator` (the probes);
- the input: :mod:`~mjoin.engine.source` (the streaming source), :mod:`~mjoin.engine.normalize`,
  :mod:`~mjoin.engine.frame`, :mod:`~mjoin.engine.routing`; the state: :mod:`~mjoin.engine.state`;
- the outputs: :mod:`~mjoin.engine.results`, :mod:`~mjoin.engine.metrics`;
- the streaming job's control: :mod:`~mjoin.engine.control`, :mod:`~mjoin.engine.watermark`.

This ``__init__`` imports nothing: Spark's Python source runner unpickles :mod:`mjoin.engine.source`
at every streaming query's start, and importing the whole engine there cost ~0.4 s a start.
"""
