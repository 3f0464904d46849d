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


@pytest.fixture(scope="session")
def spark():
    """A real local SparkSession (2 threads, 4 shuffle partitions, no UI), shared by all Spark tests."""
    from mjoin.resources import Resources
    from mjoin.sparkutil import get_spark

    session = get_spark("mjoin-tests", Resources(spark_master="local[2]", shuffle_partitions=4),
                        conf={"spark.driver.memory": "3g", "spark.sql.warehouse.dir": str(PROJECT / ".pytest_cache" / "warehouse")})
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path):
    from mjoin.lake import Lake

    return Lake(str(tmp_path / "lake"))


@pytest.fixture(scope="session")
def seed_query():
    from mjoin.query import load_query

    return load_query("tpcds_returns_by_address")


@pytest.fixture(scope="session")
def two_class_query():
    from mjoin.query import load_query

    return load_query("tpcds_returns_by_customer_and_address")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Groups for pytest-xdist's `--dist loadgroup` (`make test` runs two workers): a module's tests stay on
    one worker, in order (module fixtures such as test_dags' `world` are built once and its tests build on
    each other); every test marked `cluster` shares one worker (each standalone application takes all the
    cluster's cores, two at once would wait for each other); modules with slow tests come first, so that the
    longest do not start last. Without xdist the groups are inert and only the order changes."""
    for item in items:
        group = "cluster" if item.get_closest_marker("cluster") else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module.__name__ not in slow)  # stable: collection order within
