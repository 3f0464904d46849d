"""The Spark session settings every engine job runs with (a fixed physical plan per batch), and what
Spark planned: the operators, exchanges and joins of a stage's executed plan, recorded per batch."""
from __future__ import annotations

import re

#: session settings every engine job runs with: a fixed physical plan per batch (no AQE
#: re-planning, which in the trial decided which state escaped a shuffle and inverted the
#: optimizer's ranking), no join reordering, and nanosecond Parquet timestamps readable.
ENGINE_CONF = {
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.cbo.enabled": "false",
    "spark.sql.cbo.joinReorder.enabled": "false",
    "spark.sql.legacy.parquet.nanosAsLong": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # the engine reads lists of files it has listed and judged itself: above this many paths Spark lists
    # them again in a distributed job per read (one per stream and schema: 4 jobs, 4.5 s of a 6.6 s read
    # of 720 files at sf 0.1); the driver's file status calls cost a few ms
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "1000000",
}


def apply_engine_conf(spark) -> dict:
    """Set :data:`ENGINE_CONF` on the session; returns the previous values (for :func:`restore_conf`)."""
    before = {}
    for k, v in ENGINE_CONF.items():
        before[k] = spark.conf.get(k, None)
        spark.conf.set(k, v)
    return before


def restore_conf(spark, before: dict) -> None:
    for k, v in before.items():
        if v is None:
            spark.conf.unset(k)
        else:
            spark.conf.set(k, v)


def conf_in_effect(spark) -> dict:
    """The settings that decide the physical plan, as the session has them now (recorded per batch)."""
    out = {k: spark.conf.get(k, None) for k in ENGINE_CONF}
    out["spark.sql.shuffle.partitions"] = spark.conf.get("spark.sql.shuffle.partitions", None)
    out["spark.python.worker.reuse"] = spark.sparkContext.getConf().get("spark.python.worker.reuse", "true")
    return out


_NODE = re.compile(r"^[\s:|+\-]*(?:\*\(\d+\)\s*)?([A-Za-z]\w*)")


_EXCHANGE = re.compile(r"Exchange (\w+\([^)]*\))")


def physical_info(df) -> dict:
    """What Spark will execute for ``df``, read from its executed physical plan (the same plan
    ``collect`` then runs): operator names, join nodes (none: the probes run in the Python
    tasks), exchanges with their partitioning, and whether adaptive execution wraps it."""
    try:
        text = df._jdf.queryExecution().executedPlan().toString()
    except Exception as exc:  # informative only; never fails a batch
        return {"error": f"{type(exc).__name__}: {exc}"}
    nodes = [m.group(1) for line in text.splitlines() if (m := _NODE.match(line))]
    return {"nodes": nodes, "joins": [n for n in nodes if "Join" in n],
            "exchanges": [re.sub(r"#\d+", "", e) for e in _EXCHANGE.findall(text)],
            "python_operator": next((n for n in nodes if "Arrow" in n or "Python" in n or "Pandas" in n), None),
            "adaptive": "AdaptiveSparkPlan" in text}


def strategies(physical: dict) -> dict:
    """What Spark chose, from the physical plans of a batch's stages: join nodes (expected none: the
    probe orders run as index nested loops in the tasks, so Spark has no join to reorder), the
    exchanges (partitioning) and the Python operator per stage, and whether AQE re-plans."""
    return {"joins": sorted({j for p in physical.values() for j in p.get("joins", [])}),
            "exchanges": {k: p.get("exchanges") for k, p in physical.items()},
            "python_operator": {k: p.get("python_operator") for k, p in physical.items()},
            "adaptive": any(p.get("adaptive") for p in physical.values()),
            "probe": "index-nested-loop (sorted arrays, numpy) in the operator, in the plan's order"}
