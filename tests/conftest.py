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
