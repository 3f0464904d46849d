"""Resources: what differs between the embedded default and a cluster, and nothing else.

Logic never reads the environment; it receives a :class:`Resources` (or the
values in it). ``MJOIN_PROFILE=local`` (default) runs everything in-process on
this machine: local Spark, a lake folder in the project, Airflow on SQLite.
``MJOIN_PROFILE=cluster`` expects ``MJOIN_LAKE`` (a Hadoop filesystem URL) and
``MJOIN_SPARK_MASTER`` (e.g. ``spark://host:7077``); DAGs take the Spark master
from the Airflow connection ``spark_default`` instead.

    MJOIN_LAKE            lake root (default <project>/.lake)
    MJOIN_SPARK_MASTER    Spark master (default local[*])
    MJOIN_SPARK_CONF      extra Spark settings, "k=v,k=v"
    MJOIN_SHUFFLE_PARTITIONS   default 2 x cores
    MJOIN_SPARK_REMOTE    a long-lived Spark Connect server, ``sc://host:port`` (default: none).
                          Set, the statistics step of the DAGs runs in that server's warm session
                          instead of a fresh spark-submit (``python -m mjoin spark-connect start``
                          runs one on this machine; docs/statistics.md, "Cost")
"""
from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[3]


def _parse_conf(text: str) -> dict:
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        if "=" not in item:
            raise ValueError(f"MJOIN_SPARK_CONF item {item!r} is not key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def spark_remote_from_env(env=None) -> str:
    """``MJOIN_SPARK_REMOTE`` checked (a Spark Connect URL, ``sc://host:port``), or ""."""
    env = os.environ if env is None else env
    remote = env.get("MJOIN_SPARK_REMOTE", "").strip()
    if remote and not remote.startswith("sc://"):
        raise ValueError(f"MJOIN_SPARK_REMOTE={remote!r}: expected a Spark Connect URL, sc://host:port")
    return remote


@dataclass(frozen=True)
class Resources:
    profile: str = "local"
    lake: str = str(PROJECT_DIR / ".lake")
    spark_master: str = "local[*]"
    shuffle_partitions: int = 2 * (os.cpu_count() or 2)
    spark_conf: dict = field(default_factory=dict)
    spark_remote: str = ""  # "sc://host:port": jobs that can run over Spark Connect use this server

    @classmethod
    def from_env(cls, env=None) -> "Resources":
        env = os.environ if env is None else env
        profile = env.get("MJOIN_PROFILE", "local")
        if profile not in ("local", "cluster"):
            raise ValueError(f"MJOIN_PROFILE={profile!r}: use local or cluster")
        remote = spark_remote_from_env(env)
        if profile == "cluster" and not env.get("MJOIN_LAKE"):
            raise ValueError("MJOIN_PROFILE=cluster needs MJOIN_LAKE (e.g. hdfs://namenode:8020/mjoin)")
        return cls(
            profile=profile,
            lake=env.get("MJOIN_LAKE", str(PROJECT_DIR / ".lake")),
            spark_master=env.get("MJOIN_SPARK_MASTER", "local[*]"),
            shuffle_partitions=int(env.get("MJOIN_SHUFFLE_PARTITIONS", 2 * (os.cpu_count() or 2))),
            spark_conf=_parse_conf(env.get("MJOIN_SPARK_CONF", "")),
            spark_remote=remote,
        )


def pyspark_dir() -> Path | None:
    """The installed PySpark package's folder, located without importing it (an import costs ~0.4 s, and the
    DAG files' parsing reaches this)."""
    spec = importlib.util.find_spec("pyspark")
    if spec and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return None


def spark_bin() -> str:
    """The folder holding ``spark-submit``: beside this interpreter (the project's venv), else pyspark's own."""
    here = Path(sys.executable).parent
    if (here / "spark-submit").exists():
        return str(here)
    home = pyspark_dir()
    return str(home / "bin") if home else str(here)
