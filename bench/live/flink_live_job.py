"""Flink 2.3's MultiJoin, live: the streaming job the live harness runs as ``flink_multijoin`` (in the Flink venv).

Runs in its own virtualenv (``bench/evaluation/.flink-venv``, ``make flink-venv``), not the project's: it never
imports mjoin. ``bench/live/flink_live.py`` writes the job description (the same tables and SQL text as the
offline peer, ``peers.flink_job``, plus each table's ``'source.monitor-interval'``) and this script runs it:

- the tables: ``bench/evaluation/flink_job.py``'s DDL (one place for the peer's tables and SQL), filesystem CSV
  sources over the directories the harness fills in real time (one folder per arrival, renamed into place),
  continuously monitored (unbounded: the job never ends on its own);
- ``table.optimizer.multi-join.enabled = true``: the plan holds one ``MultiJoin`` operator (checked, printed);
- the sink: a filesystem CSV sink, whose part files are committed on each checkpoint (every
  ``checkpoint_seconds``): the results become visible at a checkpoint, as mjoin's at a batch's commit;
- a local mini-cluster with its REST endpoint on ``rest_port`` (the harness reads the job's record counts and
  completed checkpoints there) and the metric fetcher refreshed every 500 ms.

    .flink-venv/bin/python flink_live_job.py JOB.json     # prints FLINK_LIVE_STARTED {...}, then runs until stopped
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "evaluation"))

from flink_job import _ddl  # noqa: E402  (the offline peer's tables: one place for them)


def main(path: str) -> int:
    job = json.loads(open(path).read())
    t0 = time.perf_counter()
    from pyflink.table import EnvironmentSettings, TableEnvironment

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    cfg = env.get_config()
    settings = {
        "parallelism.default": job.get("parallelism", 2),
        "table.optimizer.multi-join.enabled": "true",
        "restart-strategy.type": "none",  # a failure ends the job (and the harness sees it)
        "execution.checkpointing.interval": f"{int(round(float(job['checkpoint_seconds']) * 1000))} ms",
        "execution.checkpointing.storage": "filesystem",  # the JobManager's heap refuses > 5 MB
        "execution.checkpointing.dir": "file://" + job["checkpoint_dir"],
        "rest.port": job["rest_port"],
        "rest.address": "127.0.0.1",
        "rest.bind-address": "127.0.0.1",
        "metrics.fetcher.update-interval": "500 ms",
        "web.checkpoints.history": 1000,
        **(job.get("config") or {}),
    }
    for k, v in settings.items():
        cfg.set(k, str(v))
    gateway = time.perf_counter() - t0
    for table in job["tables"]:
        env.execute_sql(_ddl(table, False))
    cols = ", ".join(f"`{n}` {t}" for n, t in job["output"])
    env.execute_sql(f"CREATE TABLE `_results` ({cols}) WITH ('connector' = 'filesystem', "
                    f"'path' = 'file://{job['sink']}', 'format' = 'csv')")
    insert = f"INSERT INTO `_results` {job['sql']}"
    optimized = env.explain_sql(insert).split("== Optimized Execution Plan ==")[-1]
    operators = {op: len(re.findall(rf"(?<![A-Za-z]){op}\(", optimized)) for op in ("MultiJoin", "Join", "IntervalJoin")}
    t = time.perf_counter()
    result = env.execute_sql(insert)
    job_id = str(result.get_job_client().get_job_id())
    import pyflink

    print("FLINK_LIVE_STARTED " + json.dumps({
        "job_id": job_id, "operators": operators, "plan": optimized.strip(), "gateway_seconds": round(gateway, 2),
        "submit_seconds": round(time.perf_counter() - t, 2),
        "versions": {"apache-flink": getattr(pyflink, "__version__", None) or _dist_version(),
                     "python": sys.version.split()[0]}}), flush=True)
    result.wait()  # unbounded sources: until the harness stops the process group
    return 0


def _dist_version():
    from importlib.metadata import version

    return version("apache-flink")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
