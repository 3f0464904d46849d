"""The Apache Flink peer: one multi-way join in PyFlink's Table API, streaming mode, on a local mini-cluster.

Runs in its own virtualenv (``bench/evaluation/.flink-venv``, ``requirements-flink.txt``), not the project's:
it never imports mjoin. ``run_evaluation.py`` writes the job description (tables as CSV folders, the SQL text
built from the query spec by ``peers.flink_sql``, the variant) and reads back one JSON document on stdout.

    .flink-venv/bin/python flink_job.py JOB.json

Variants (``job["variant"]``):

- ``multijoin``: ``table.optimizer.multi-join.enabled = true``: FLIP-516's ``StreamingMultiJoinOperator`` (one
  operator for the chain of equi-joins on the common key); the windows are the join's non-equi conditions on
  the BIGINT event times (microseconds), so nothing is ever purged from its state;
- ``binary``: the same SQL with the option off: Flink's chain of binary regular joins (the same state);
- ``interval``: event-time interval joins: each stream's ``rt`` (milliseconds) is a rowtime attribute with a
  watermark, each binary join bounds the two newest streams by ``rt`` (a superset of the exact window), and the
  exact microsecond conditions remain as the join's residual predicate; state is purged by watermark.

Where the time goes is measured, not guessed: ``gateway_seconds`` (JVM and py4j gateway), ``noop_job_seconds``
(a one-row job into a blackhole sink, twice: the first starts the mini-cluster,
the second is the fixed cost of deploying and finishing a job), ``plan_seconds`` (explain),
then per sink the end-to-end job time (``execute_sql`` to ``wait()``): ``blackhole`` (the join alone: the
timed number) and, with ``job["verify_to"]``, a CSV file sink (the rows to fingerprint; the final checkpoint
commits the files when the bounded sources end). Peak resident memory of the JVM is sampled every 50 ms.
``job["timing"] = false`` runs only the CSV sink (what the test uses to compare results).
"""
from __future__ import annotations

import json
import os
import re
import sys
import threading
import time


def _rss_tree(pid: int) -> int:
    """Resident bytes of ``pid`` and its children (the py4j JVM is a child of this process)."""
    total = 0
    pids = [pid]
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        parts = f.read().rsplit(")", 1)[1].split()
                    if int(parts[1]) == pid:
                        pids.append(int(entry))
                except (OSError, IndexError, ValueError):
                    continue
        for p in pids:
            try:
                with open(f"/proc/{p}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1]) * 1024
            except OSError:
                continue
    except OSError:
        pass
    return total


class PeakRss:
    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_tree(os.getpid()))
            self._stop.wait(0.05)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def _ddl(table: dict, interval: bool) -> str:
    cols = ", ".join(f"`{n}` {t}" for n, t in table["columns"])
    if interval:
        ts = table["ts"]
        cols += f", rt AS TO_TIMESTAMP_LTZ(`{ts}` / 1000, 3), WATERMARK FOR rt AS rt"
    # more options, e.g. the live runner's 'source.monitor-interval' (bench/live/flink_live_job.py)
    extra = "".join(f", '{k}' = '{v}'" for k, v in (table.get("options") or {}).items())
    return (f"CREATE TABLE `{table['name']}` ({cols}) WITH ('connector' = 'filesystem', "
            f"'path' = 'file://{table['path']}', 'format' = 'csv', 'csv.null-literal' = '\\N'{extra})")


def main(path: str) -> int:
    job = json.loads(open(path).read())
    variant = job["variant"]
    out = {"variant": variant, "pid": os.getpid()}
    with PeakRss() as rss:
        t0 = time.perf_counter()
        from pyflink.table import EnvironmentSettings, TableEnvironment

        env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
        cfg = env.get_config()
        cfg.set("parallelism.default", str(job.get("parallelism", 2)))
        cfg.set("table.optimizer.multi-join.enabled", "true" if variant == "multijoin" else "false")
        cfg.set("restart-strategy.type", "none")  # a failure ends the job (the default restarts forever)
        for k, v in (job.get("config") or {}).items():
            cfg.set(k, str(v))
        out["gateway_seconds"] = time.perf_counter() - t0

        env.execute_sql("CREATE TABLE `_one` (x INT) WITH ('connector' = 'datagen', 'number-of-rows' = '1')")
        env.execute_sql("CREATE TABLE `_void` (x INT) WITH ('connector' = 'blackhole')")
        noop = []
        for _ in range(2 if job.get("timing", True) else 0):  # the first starts the mini-cluster, the second is a job's fixed cost on it
            t = time.perf_counter()
            env.execute_sql("INSERT INTO `_void` SELECT x FROM `_one`").wait()
            noop.append(time.perf_counter() - t)
        out["noop_job_seconds"] = noop

        for table in job["tables"]:
            env.execute_sql(_ddl(table, variant == "interval"))
        sql = job["sql"]
        t = time.perf_counter()
        plan = env.explain_sql(sql)
        out["plan_seconds"] = time.perf_counter() - t
        optimized = plan.split("== Optimized Execution Plan ==")[-1]
        out["operators"] = {op: len(re.findall(rf"(?<![A-Za-z]){op}\(", optimized))
                            for op in ("MultiJoin", "Join", "IntervalJoin")}
        out["plan"] = optimized.strip()
        cols = ", ".join(f"`{n}` {t}" for n, t in job["output"])
        env.execute_sql(f"CREATE TABLE `_bh` ({cols}) WITH ('connector' = 'blackhole')")
        runs = []
        for _ in range(int(job.get("repeats", 1)) if job.get("timing", True) else 0):
            t = time.perf_counter()
            env.execute_sql(f"INSERT INTO `_bh` {sql}").wait()
            runs.append(time.perf_counter() - t)
        out["blackhole_seconds"] = runs
        if job.get("verify_to"):
            # the file sink commits its files on checkpoints; when the bounded sources end, the final checkpoint
            # commits the rest (not needed for the blackhole runs, whose end would wait for it)
            cfg.set("execution.checkpointing.interval", "2 s")
            cfg.set("execution.checkpointing.storage", "filesystem")  # the JobManager's heap refuses > 5 MB
            cfg.set("execution.checkpointing.dir", "file://" + job["verify_to"].rstrip("/") + "-checkpoints")
            env.execute_sql(f"CREATE TABLE `_csv` ({cols}) WITH ('connector' = 'filesystem', "
                            f"'path' = 'file://{job['verify_to']}', 'format' = 'csv')")
            t = time.perf_counter()
            env.execute_sql(f"INSERT INTO `_csv` {sql}").wait()
            out["csv_sink_seconds"] = time.perf_counter() - t
    out["peak_rss_bytes"] = rss.peak
    import pyflink

    out["versions"] = {"pyflink": getattr(pyflink, "__version__", None) or _dist_version(), "python": sys.version.split()[0]}
    print("FLINK_JOB_RESULT " + json.dumps(out))
    return 0


def _dist_version():
    from importlib.metadata import version

    return version("apache-flink")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
