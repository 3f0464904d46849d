"""The one place a SparkSession is made (Spark code only; never imported by pure modules)."""
from __future__ import annotations

import os
import sys

from .resources import Resources

#: Settings every mjoin Spark job runs with. Join reordering is off so that Spark
#: executes the order it is given (the plan's, or the written order for the
#: native baseline); shuffle partitions are sized to the machine, not Spark's
#: 200 (on 2 cores that made every micro-batch take ~54 s).
BASE_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.cbo.enabled": "false",
    "spark.sql.cbo.joinReorder.enabled": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.parquet.compression.codec": "zstd",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
}


def get_spark(app_name: str = "mjoin", resources: Resources | None = None, conf: dict | None = None):
    """Get (or create) the SparkSession for ``resources``, with :data:`BASE_CONF` applied."""
    from pyspark.sql import SparkSession

    resources = resources or Resources.from_env()
    # Python workers must run the same interpreter (and venv) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if not os.environ.get("SPARK_SUBMIT_ARGS_SET_MASTER") and "spark.master" not in (conf or {}):
        builder = builder.master(resources.spark_master)
    settings = dict(BASE_CONF)
    settings["spark.sql.shuffle.partitions"] = str(resources.shuffle_partitions)
    settings["spark.ui.enabled"] = os.environ.get("MJOIN_SPARK_UI", "false")
    settings.update(resources.spark_conf)
    settings.update(conf or {})
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    # Runtime SQL settings also apply when the session already existed.
    for k, v in settings.items():
        if k.startswith("spark.sql.") and k != "spark.sql.warehouse.dir":
            try:
                spark.conf.set(k, v)
            except Exception:  # static settings cannot change at runtime; the builder set them
                pass
    spark.sparkContext.setLogLevel(os.environ.get("MJOIN_SPARK_LOG_LEVEL", "WARN"))
    return spark
