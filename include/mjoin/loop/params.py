"""Defaults and limits of the DAG params (the trigger form), importable at DAG-parse time.

Light on purpose: no numpy, pandas, Spark, statsmodels or great-expectations here (not
even ``mjoin.gates``, whose package imports pandas), so the scheduler's parsing of
``dags/`` stays cheap (tests check what parsing imports and how long it takes). Names
that live elsewhere are repeated here and checked by tests: the strategy names equal
``mjoin.optimizer.strategies.STRATEGIES`` (and ``mjoin.evaluation.evaluate.STRATEGIES``). Gate thresholds are
not repeated at all: a param left empty (null) means "the default of
:class:`mjoin.gates.config.GateConfig`", the one place of gate defaults, and the ``gates``
overrides are checked against GateConfig when the run starts (its ``prepare`` task fails
naming the unknown key and the known ones).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from mjoin.model.query import QUERIES_DIR
from mjoin.runtime.jvm import jar_path
from mjoin.runtime.resources import spark_bin, spark_remote_from_env

#: the re-optimization period = the DAG schedule (minutes); one run covers [logical_date - PERIOD, logical_date)
PERIOD_MINUTES = int(os.environ.get("MJOIN_PERIOD_MINUTES", "5"))
STRATEGY_NAMES = ("fixed", "selectivity_first", "greedy", "dppick", "exact", "dppick_query", "dppick_match",
                  "exact_query", "exact_match")
#: what mjoin_evaluate compares (= mjoin.evaluation.evaluate.STRATEGIES; a test checks it)
EVAL_STRATEGY_NAMES = ("fixed", "selectivity_first", "greedy", "dppick", "exact", "dppick_query", "dppick_match",
                       "dppick_nosmooth", "oracle", "exact_pmjoin", "oracle_pmjoin")
DEFAULT_QUERY = os.environ.get("MJOIN_QUERY", "tpcds_returns_by_address")
#: the JSON-schema type of a text param whose empty value means "the default": Airflow's trigger form marks a
#: param required (its Trigger button disabled while the field is empty) unless the type allows null
OPTIONAL_TEXT = ["null", "string"]


def query_choices() -> list[str]:
    """The ``query`` param's choices: the spec names present ($MJOIN_QUERIES, include/queries/) and
    ``MJOIN_QUERY`` (a name or a path), so a bad name is refused when the run is triggered (a 400)."""
    dirs = [Path(d) for d in os.environ.get("MJOIN_QUERIES", "").split(os.pathsep) if d] + [QUERIES_DIR]
    names = {p.stem for d in dirs if d.is_dir() for p in d.iterdir() if p.suffix in (".yaml", ".yml")}
    return sorted(names | {DEFAULT_QUERY})


#: name -> (default, JSON-schema type, extra schema, description)
REOPTIMIZE_PARAMS = {
    "query": (DEFAULT_QUERY, "string", {"enum": query_choices()},
              "query spec: a spec in include/queries/ (or $MJOIN_QUERIES; MJOIN_QUERY may name a YAML path)"),
    "strategy": ("exact", "string", {"enum": list(STRATEGY_NAMES)}, "probe-order optimizer"),
    "partition_method": ("auto", "string", {"enum": ["auto", "none", "hash", "range", "rate", "cost"]},
                         "PMJoin key groups: how the key-to-group rule is made (auto: the cheapest method; none: one "
                         "group; hash, range, rate: rank vectors of the streams' rates clustered, cost: the buckets' "
                         "best orders clustered)"),
    "partition_groups": ("auto", "string", {"enum": ["auto", "1", "2", "4", "8", "16"]},
                         "number of key groups D (auto: the cheapest, one group unless partitioning pays by the cost "
                         "model with its per-group overhead)"),
    "length": (60, "integer", {"minimum": 2, "maximum": 10000}, "L: statistics cycles the forecast reads"),
    "cycle": (10, "integer", {"minimum": 1, "maximum": 3600}, "tau: statistics cycle in seconds"),
    "forecast_bound": (True, "boolean", {}, "a Holt forecast outside the range the forecast gate accepts (the last "
                                             "forecast_window cycles' range +- forecast_spread_k spreads) becomes the "
                                             "series' last value instead of failing the gate"),
    "improvement_threshold": (None, ["null", "number"], {"minimum": 0, "maximum": 1},
                              "deploy only if the estimated cost drops by at least this fraction (empty: the gate "
                              "config's default; gates.improvement_threshold, if given, wins)"),
    "gates": ({}, "object", {},
              "gate threshold overrides for this run, e.g. {\"null_key_fraction_max\": 0.2, \"min_history\": 5} "
              "(keys and defaults: docs/gates.md; an unknown key fails the run at prepare)"),
    "dry_run": (False, "boolean", {}, "optimize and gate, do not deploy"),
    "calibrate": (True, "boolean", {}, "refit the cost model's coefficients from the live join's newest batches "
                                       "before optimizing (a weak fit keeps the previous model)"),
    "mode": ("auto", "string", {"enum": ["auto", "cycle", "continuous"]},
             "auto: continuous while the streaming join job of the query runs (mjoin_join_job), else cycle; "
             "cycle: join each interval in this run (availableNow); continuous: the running join job hot-reloads "
             "the new plan (backfill runs always use cycle)"),
    "job_statistics": (True, "boolean", {}, "continuous mode: the statistics step uses the cycles the running join "
                                             "job emitted (it computes them from its state; docs/statistics.md); off, "
                                             "or when the job emitted none or not all, the statistics job reads the "
                                             "streams"),
    "landing_allowance": (30, "integer", {"minimum": 0, "maximum": 86400},
                          "seconds after a cycle's end after which a source without a folder for it counts as having "
                          "no rows in it (a cycle every source has landed, or passed, is complete at once)"),
    "deploy_timeout": (600, "integer", {"minimum": 5, "maximum": 86400},
                       "continuous mode: seconds to wait for the running job to switch before rolling back"),
    # optional text params: null (the form's empty field) means the default; a plain "string" type would make the
    # UI's trigger form require text in them (Airflow marks a param required unless its type allows null)
    "workload": (None, OPTIONAL_TEXT, {}, "cycle mode: land each interval from this generated workload folder "
                                          "(empty: data lands by itself)"),
    "lake": (None, OPTIONAL_TEXT, {}, "lake root (empty: MJOIN_LAKE or the project's .lake)"),
    "namespace": (None, OPTIONAL_TEXT, {}, "lake namespace (empty: live; backfills default to eval/backfill)"),
    "initial_order": (None, OPTIONAL_TEXT, {}, "comma-separated stream order for the fixed strategy / the first plan "
                                               "(empty: the spec's order)"),
    "interval_end": (None, OPTIONAL_TEXT, {}, "ISO-8601 end of the interval the run judges (empty: the run's logical "
                                              "date; the demo replays its simulated clock with it)"),
}


def spark_env() -> dict:
    """``env_vars`` of every SparkSubmitOperator: spark-submit on PATH and this interpreter for the
    Python workers, whatever environment the Airflow worker was started with."""
    bin_dir = spark_bin()
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bin_dir]
    return {"PATH": os.pathsep.join([bin_dir, *rest]), "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}


def spark_conf() -> dict:
    """``conf`` of every SparkSubmitOperator: the machine-sized shuffle, no UI, and mjoin's JVM class on the
    driver's class path when ``make setup`` built it (:mod:`mjoin.runtime.jvm`: the streaming join's checkpoint
    logs without a process fork per write)."""
    conf = {"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false"}
    jar = jar_path()
    if jar:
        conf["spark.driver.extraClassPath"] = jar
    return conf


def spark_remote() -> str:
    """``MJOIN_SPARK_REMOTE`` (a Spark Connect URL) or ""; set, the DAGs run the statistics step in
    that server's warm session instead of a fresh spark-submit (mjoin.runtime.resources)."""
    return spark_remote_from_env()
