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
from mjoin.engine.config import EngineConfig, EngineError

#: name -> module of the public API imported on first use (PEP 562), so that importing a light submodule
#: (``engine.source``, which Spark's Python source runner unpickles at every streaming query's start) does not
#: import pandas and the whole engine: that cost the start of every streaming run ~0.4 s (bench/streaming)
_LAZY = {"RunSummary": "interval", "StreamSummary": "stream", "read_metrics": "metrics",
         "committed_batches": "results", "read_results": "results", "result_fingerprint": "results"}

#: the engines a run can use: mjoin's own, and Spark's chained stream-stream joins as the baseline
#: (mjoin.engine.native depends on the core, never the other way round)
ENGINES = ("mjoin", "spark-native")


def _check(engine: str) -> None:
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r} ({', '.join(ENGINES)})")


def run_interval(spark, query, plan, lake, start, end, cycle, out, *, engine: str = "mjoin", config=None,
                 pipelined: bool = True):
    """See :func:`mjoin.engine.interval.run_interval` (``engine="spark-native"``:
    :func:`mjoin.engine.native.run_native_interval`)."""
    _check(engine)
    if engine == "spark-native":
        from mjoin.engine.native import run_native_interval

        return run_native_interval(spark, query, plan, lake, start, end, cycle, out, config=config)
    from mjoin.engine.interval import run_interval as run

    return run(spark, query, plan, lake, start, end, cycle, out, config=config, pipelined=pipelined)


def run_stream(spark, query, lake, *, engine: str = "mjoin", **kwargs):
    """See :func:`mjoin.engine.stream.run_stream` (``engine="spark-native"``:
    :func:`mjoin.engine.native.run_native_stream`)."""
    _check(engine)
    if engine == "spark-native":
        from mjoin.engine.native import run_native_stream

        kwargs.pop("plan", None)
        return run_native_stream(spark, query, lake, **kwargs)
    from mjoin.engine.stream import run_stream as run

    return run(spark, query, lake, **kwargs)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["EngineConfig", "EngineError", "RunSummary", "StreamSummary", "run_interval", "run_stream",
           "read_metrics", "read_results", "committed_batches", "result_fingerprint"]
