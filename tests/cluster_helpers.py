"""The native cluster of `make cluster-up` for the tests marked `cluster` (tests/test_cluster_*.py).

The tests never start the cluster themselves (CI's .ci/run and `make test-cluster` do, and stop it
after): they find it from ``.cluster/cluster.json`` (or ``MJOIN_CLUSTER_DIR``) and skip, with the
reason, when it is not up, or when CI said why it could not start it (``MJOIN_CLUSTER_UNAVAILABLE``).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mjoin.runtime import cluster

PROJECT = Path(__file__).resolve().parent.parent


def cluster_dir() -> Path:
    return Path(os.environ.get("MJOIN_CLUSTER_DIR") or cluster.DEFAULT_DIR)


def require_cluster(postgres: bool = False) -> dict:
    """The cluster's status, or skip the test with the reason it is not up."""
    why = os.environ.get("MJOIN_CLUSTER_UNAVAILABLE")
    if why:
        pytest.skip(f"native cluster unavailable: {why}")
    st = cluster.status(cluster_dir())
    if not st["up"]:
        pytest.skip(f"native cluster not up ({st['problem']}): make test-cluster runs these tests on one")
    if st["alive_workers"] < 2:
        pytest.skip(f"the cluster has {st['alive_workers']} workers; these tests need 2")
    if postgres and "postgres" not in st["components"]:
        pytest.skip("the cluster runs without PostgreSQL (--no-postgres)")
    return st


def job_env(extra: dict | None = None) -> dict:
    """A job's environment on the cluster: the cluster profile's Spark settings, this interpreter."""
    env = dict(os.environ)
    env.update(cluster.env(cluster_dir()))
    env.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")})
    env.pop("SPARK_SUBMIT_ARGS_SET_MASTER", None)
    env.update(extra or {})
    return env
