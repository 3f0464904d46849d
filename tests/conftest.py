"""Shared fixtures: one local SparkSession per test session, temporary lakes, query specs."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
# Python workers must use this interpreter; spark-submit must be on PATH.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
# Every JVM the tests start through spark-submit (this session's, the jobs', Airflow's, Spark Connect's; on the
# cluster the drivers) compiles with C1 only: on the tests' small data the JVMs are mostly start-up and warm-up,
# where C2's compiler threads cost more CPU than they win back (test_engine_interval + test_engine_stream: 230 ->
# 181 CPU-s, their JVMs 148 -> 99). A JIT tier changes no result.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession (2 threads, 4 shuffle partitions, no UI), shared by all Spark tests."""
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark

    session = get_spark("mjoin-tests", Resources(spark_master="local[2]", shuffle_partitions=4),
                        conf={"spark.driver.memory": "3g", "spark.sql.warehouse.dir": str(PROJECT / ".pytest_cache" / "warehouse")})
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path):
    from mjoin.lake.layout import Lake

    return Lake(str(tmp_path / "lake"))


@pytest.fixture(scope="session")
def seed_query():
    from mjoin.model.query import load_query

    return load_query("tpcds_returns_by_address")


@pytest.fixture(scope="session")
def two_class_query():
    from mjoin.model.query import load_query

    return load_query("tpcds_returns_by_customer_and_address")


#: the longest modules (real schedulers, kill -9 and restarts, the cluster), first and in this order, so that none of
#: them starts last: pytest-xdist gives each worker one module, then another as soon as its module has two tests
#: left (test_dags_join_job's one test leaves its worker free for the next at once)
LONGEST = ("test_dags", "test_dags_join_job", "test_ui_browser", "test_cluster_airflow", "test_engine_live")


def pytest_collection_modifyitems(config, items):
    """The longest modules first (LONGEST), then the other modules with slow tests, then the rest; collection order
    within (a stable sort), so that under pytest-xdist the longest do not start last."""
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}

    def rank(item):
        name = item.module.__name__
        return (LONGEST.index(name), 0) if name in LONGEST else (len(LONGEST), name not in slow)

    items.sort(key=rank)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test` runs three pytest-xdist workers (Makefile). A module's tests stay on one worker, in order (module
    fixtures such as test_dags' `world` are built once and its tests build on each other), and the
    test_cluster_* modules share one worker (each standalone application takes all the cluster's cores: two
    at once would wait for each other). By path, in the scheduler: `--dist loadgroup` with `xdist_group`
    marks does not group on pytest 9.2 (its structured node ids drop xdist's `@group` suffix,
    pytest-dev/pytest-xdist#1386)."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "cluster" if Path(module).name.startswith("test_cluster_") else module

    return ModuleScheduling(config, log)


@pytest.fixture
def holt_global_fit(monkeypatch):
    """Holt fitted from statsmodels' brute-force start grid in this test (``ForecastConfig.use_brute``), instead of
    the loop's default (SLSQP from statsmodels' heuristic start). On a history whose rate steps up in its last
    cycles SLSQP alone lands in one of two optima depending on the machine's floating point (on the same series:
    a forecast of 526 on one machine, 800 on another, where the global optimum is 800); tests that need Holt's
    trend to overshoot such a step (the forecast bound's) fit from the grid, which finds the global optimum on
    every machine. Holt is still statsmodels' own fit."""
    import dataclasses

    from mjoin.forecast import holt as fc

    holt = fc._holt
    monkeypatch.setattr(fc, "_holt", lambda y, damped, horizon, config:
                        holt(y, damped, horizon, dataclasses.replace(config, use_brute=True)))
