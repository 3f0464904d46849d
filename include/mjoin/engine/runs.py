"""The two ways to run a query: an interval (a replay of landed data) or a stream, on mjoin's engine
or, as the baseline, on Spark's own chained stream-stream joins (:mod:`mjoin.engine.native`).

    run_interval(spark, query, plan, lake, start, end, cycle, out, *, engine="mjoin", config=None) -> RunSummary
    run_stream(spark, query, lake, *, trigger="availableNow", interval=None, plan=None, config=None,
               engine="mjoin") -> StreamSummary
"""
from __future__ import annotations

from mjoin.engine import interval, native, stream
from mjoin.engine.config import EngineError

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
        return native.run_native_interval(spark, query, plan, lake, start, end, cycle, out, config=config)
    return interval.run_interval(spark, query, plan, lake, start, end, cycle, out, config=config, pipelined=pipelined)


def run_stream(spark, query, lake, *, engine: str = "mjoin", **kwargs):
    """See :func:`mjoin.engine.stream.run_stream` (``engine="spark-native"``:
    :func:`mjoin.engine.native.run_native_stream`)."""
    _check(engine)
    if engine == "spark-native":
        kwargs.pop("plan", None)
        kwargs.pop("stats", None)  # the job's own statistics: mjoin's engine only
        return native.run_native_stream(spark, query, lake, **kwargs)
    return stream.run_stream(spark, query, lake, **kwargs)
