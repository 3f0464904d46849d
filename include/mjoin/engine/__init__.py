"""The Spark multi-way stream join engine (issue 7): per-bucket vectorised index nested loops
following the plan's probe orders, interval evaluation, streaming with hot plan reload and
exactly-once output, quarantine, metrics, and Spark's own chained joins as a baseline.

Public API (see docs/engine.md)::

    run_interval(spark, query, plan, lake, start, end, cycle, out, *, engine="mjoin", config=None) -> RunSummary
    run_stream(spark, query, lake, *, trigger="availableNow", interval=None, plan=None, config=None,
               engine="mjoin") -> StreamSummary
    read_metrics(path_or_lake_query, query=None) -> list[dict]
    read_results(path_or_lake_query, query=None, *, with_batch=False) -> pandas.DataFrame
    EngineConfig
"""
from .config import EngineConfig, EngineError
from .interval import RunSummary, run_interval
from .metrics import read_metrics
from .results import committed_batches, read_results, result_fingerprint


def run_stream(*args, **kwargs):
    """See :func:`mjoin.engine.stream.run_stream`."""
    from .stream import run_stream as _run

    return _run(*args, **kwargs)


def __getattr__(name):
    if name == "StreamSummary":
        from .stream import StreamSummary

        return StreamSummary
    raise AttributeError(name)


__all__ = ["EngineConfig", "EngineError", "RunSummary", "StreamSummary", "run_interval", "run_stream",
           "read_metrics", "read_results", "committed_batches", "result_fingerprint"]
