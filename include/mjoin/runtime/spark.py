"""The one place a SparkSession is made (Spark code only; never imported by pure modules)."""
from __future__ import annotations

import atexit
import os
import socket
import sys
import uuid
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from mjoin.runtime.jvm import jar_path
from mjoin.runtime.resources import Resources

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


class SparkConnectUnavailable(RuntimeError):
    """``MJOIN_SPARK_REMOTE`` names a Spark Connect server that does not answer."""


def get_spark(app_name: str = "mjoin", resources: Resources | None = None, conf: dict | None = None, *,
              allow_remote: bool = False):
    """Get (or create) the SparkSession for ``resources``, with :data:`BASE_CONF` applied.

    ``allow_remote``: a job that runs over Spark Connect (DataFrame API only, no SparkContext) gets a
    session of ``resources.spark_remote`` when one is set and the process is not a spark-submit."""
    resources = resources or Resources.from_env()
    if allow_remote and resources.spark_remote and not os.environ.get("SPARK_SUBMIT_ARGS_SET_MASTER"):
        return connect_session(resources, conf, name=app_name)
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
    jar = _jvm_jar()
    if jar and jar not in settings.get("spark.driver.extraClassPath", ""):  # mjoin's JVM class (mjoin.runtime.jvm)
        settings["spark.driver.extraClassPath"] = os.pathsep.join(
            p for p in (settings.get("spark.driver.extraClassPath"), jar) if p)
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


def _jvm_jar() -> str | None:
    """mjoin's built JVM class (:mod:`mjoin.runtime.jvm`), when ``make setup`` could build it."""
    return jar_path()


def is_remote(spark) -> bool:
    """Is ``spark`` a Spark Connect session?"""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session_info(spark) -> dict:
    """What kind of session a job ran in (recorded in job summaries)."""
    if is_remote(spark):
        return {"session": "connect", "remote": getattr(spark, "_mjoin_remote", "")}
    return {"session": "classic", "master": spark.sparkContext.master}


def tcp_problem(host: str, port: int, timeout: float = 5.0) -> str | None:
    """None if ``host:port`` accepts a TCP connection, else the reason."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc}"


def _reachable(url: str) -> str | None:
    """None if the Spark Connect server ``sc://host:port[/;params]`` accepts a TCP connection, else the reason."""
    u = urlparse(url)
    return tcp_problem(u.hostname or "localhost", u.port or 15002)


#: how many stable session ids a job kind tries before it gives up (each expired one is skipped)
SESSION_GENERATIONS = 32


def session_url(remote: str, name: str, generation: int = 0) -> str:
    """``remote`` with a stable ``session_id`` for job kind ``name`` (unless it names one): every process of
    that kind joins the same server session, whose Python workers are already running (a new session
    starts its own: ~1.5 s per run, more than the statistics of a 15-minute interval at sf 0.1)."""
    if "session_id=" in remote:
        return remote
    sid = uuid.uuid5(uuid.NAMESPACE_URL, f"mjoin/{name}/{generation}")
    sep = "" if ";" in remote or remote.endswith("/") else "/"
    return f"{remote}{sep};session_id={sid}"


def _close_quietly(spark) -> None:
    """Close a Connect session's channel (not the server session: the next process joins it again) and make
    its ``__del__`` a no-op: a gRPC close left to ``__del__`` at interpreter exit can wait forever."""
    client = spark.client
    try:
        client.close()
    except Exception:
        pass
    client.close = lambda *args, **kwargs: None


def connect_session(resources: Resources, conf: dict | None = None, name: str = "mjoin"):
    """A session of the Spark Connect server ``resources.spark_remote``, with the runtime SQL settings of
    :data:`BASE_CONF` (the server's static settings are its own: ``python -m mjoin spark-connect start``).
    Processes of the same ``name`` share one server session (:func:`session_url`); one the server has
    closed or expired is skipped for the next stable id. Fails at once with
    :class:`SparkConnectUnavailable` if the server does not answer (the client itself would retry for minutes)."""
    # (a process holds either an in-process session or Connect sessions: pyspark.sql.functions builds the
    # columns of one kind per process, so the two cannot be mixed)

    why = _reachable(resources.spark_remote)
    if why:
        raise SparkConnectUnavailable(
            f"MJOIN_SPARK_REMOTE={resources.spark_remote} does not answer ({why}); start a server with "
            "`python -m mjoin spark-connect start` or unset MJOIN_SPARK_REMOTE to run Spark in-process")
    settings = {k: v for k, v in BASE_CONF.items() if k.startswith("spark.sql.")}
    settings["spark.sql.shuffle.partitions"] = str(resources.shuffle_partitions)
    settings.update({k: v for k, v in {**resources.spark_conf, **(conf or {})}.items() if k.startswith("spark.sql.")})
    explicit = "session_id=" in resources.spark_remote
    for generation in range(1 if explicit else SESSION_GENERATIONS):
        url = session_url(resources.spark_remote, name, generation)
        spark = SparkSession.builder.remote(url).create()
        try:
            spark.conf.set("spark.sql.shuffle.partitions", settings["spark.sql.shuffle.partitions"])
        except Exception as exc:  # the first call: a closed or expired session id is refused here
            if "SESSION_CLOSED" in str(exc) and not explicit:
                _close_quietly(spark)
                continue
            raise
        for k, v in settings.items():
            try:
                spark.conf.set(k, v)
            except Exception:  # a static setting: the server's own value stands
                pass
        spark._mjoin_remote = resources.spark_remote
        spark._mjoin_session_url = url
        if generation:  # a refused attempt became the default session when it was created: this one is
            type(spark)._set_default_and_active_session(spark)

        atexit.register(_close_quietly, spark)  # at exit, before gRPC's teardown (a close left to __del__ can hang)
        return spark
    raise SparkConnectUnavailable(f"the server {resources.spark_remote} refused {SESSION_GENERATIONS} session ids "
                                  f"of {name!r} as closed; restart it or put a session_id in MJOIN_SPARK_REMOTE")
