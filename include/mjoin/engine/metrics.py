"""Per-batch metrics records: writing them idempotently, reading them back, Spark's shuffle bytes.

One JSON document per batch, ``<lake>/metrics/<query>/batch=<B>.json``, replaced
atomically (a re-run of a batch after a crash replaces its record, never adds a
second one): what a micro-batch (streaming, per-batch interval runs) writes. Interval
runs write ``metrics.jsonl`` (one line per batch) at the end; a pipelined interval run
(the default) writes only that, one file for all its batches (it is re-run whole,
never resumed). :func:`read_metrics` reads either form.
"""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess

import numpy as np

from mjoin.lake.layout import Lake
from mjoin.runtime import fsutil

BATCH_FILE = re.compile(r"^batch=(\d+)\.json$")
JSONL = "metrics.jsonl"


def write_record(metrics_dir: str, record: dict) -> str:
    path = fsutil.join(metrics_dir, f"batch={int(record['batch_id'])}.json")
    fsutil.atomic_write_text(path, json.dumps(record, sort_keys=True, default=_jsonable))
    return path


def write_jsonl(metrics_dir: str, records: list[dict]) -> str:
    path = fsutil.join(metrics_dir, JSONL)
    text = "".join(json.dumps(r, sort_keys=True, default=_jsonable) + "\n" for r in records)
    fsutil.atomic_write_text(path, text)
    return path


def _jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _metrics_dir(path_or_lake, query) -> str:
    if query is not None:
        lake = path_or_lake if isinstance(path_or_lake, Lake) else Lake(str(path_or_lake))
        return lake.metrics(query if isinstance(query, str) else query.name)
    return str(path_or_lake)


def read_metrics(path_or_lake_query, query=None) -> list[dict]:
    """Metrics records sorted by batch id. ``path_or_lake_query``: a ``metrics.jsonl`` file, a metrics
    folder, a ``(lake, query)`` pair, or a lake (root or :class:`~mjoin.lake.layout.Lake`) with ``query``."""
    if isinstance(path_or_lake_query, tuple):
        path_or_lake_query, query = path_or_lake_query
    path = _metrics_dir(path_or_lake_query, query)
    records = {}
    if fsutil.is_dir(path):
        for name in fsutil.listdir(path):
            if BATCH_FILE.match(name):
                rec = json.loads(fsutil.read_text(fsutil.join(path, name)))
                records[rec["batch_id"]] = rec
        if not records and fsutil.exists(fsutil.join(path, JSONL)):
            path = fsutil.join(path, JSONL)
    if not fsutil.is_dir(path):
        if not fsutil.exists(path):
            raise FileNotFoundError(f"no metrics at {path}")
        for line in fsutil.read_text(path).splitlines():
            if line.strip():
                rec = json.loads(line)
                records[rec["batch_id"]] = rec  # a later line for the same batch wins
    return [records[b] for b in sorted(records)]


# ---- Spark: shuffle bytes of the jobs of one batch --------------------------------------


def shuffle_bytes(spark, job_group: str) -> dict:
    """Shuffle bytes read and written by the jobs tagged ``job_group`` (Spark's status store:
    filled by the AppStatusListener whether or not the UI runs)."""
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    store = sc._jsc.sc().statusStore()
    read = written = 0
    stages = 0
    for job in tracker.getJobIdsForGroup(job_group):
        info = tracker.getJobInfo(job)
        for sid in (info.stageIds if info else []):
            try:
                data = store.lastStageAttempt(sid)
            except Exception:  # stage evicted from the store (spark.ui.retainedStages) or skipped
                continue
            read += int(data.shuffleReadBytes())
            written += int(data.shuffleWriteBytes())
            stages += 1
    return {"read": read, "written": written, "stages": stages}


def stage_times(spark, job_group: str, detail: bool = False) -> list[dict]:
    """Per Spark stage of the jobs tagged ``job_group``: its name, wall time (submission to completion),
    the tasks' run and CPU time, rows and bytes read from files and shuffles, bytes written to the
    shuffle. The stage that writes a shuffle from files is the input (read, normalise, route); the
    one that reads it runs the operator. ``detail``: also deserialisation, GC, shuffle records and
    times, peak execution memory and spills (profiles, bench/scale)."""
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    store = sc._jsc.sc().statusStore()
    out = []
    for job in sorted(tracker.getJobIdsForGroup(job_group)):
        info = tracker.getJobInfo(job)
        for sid in sorted(info.stageIds if info else []):
            try:
                d = store.lastStageAttempt(sid)
            except Exception:  # evicted or skipped
                continue
            sub, done = d.submissionTime(), d.completionTime()
            wall = (done.get().getTime() - sub.get().getTime()) / 1000 if sub.isDefined() and done.isDefined() else None
            out.append({"job": job, "stage": sid, "name": str(d.name()).split(" at ")[0], "tasks": int(d.numTasks()),
                        "wall_seconds": wall, "task_seconds": int(d.executorRunTime()) / 1000,
                        "task_cpu_seconds": int(d.executorCpuTime()) / 1e9,
                        "input_rows": int(d.inputRecords()), "input_bytes": int(d.inputBytes()),
                        "shuffle_read_bytes": int(d.shuffleReadBytes()),
                        "shuffle_write_bytes": int(d.shuffleWriteBytes()),
                        "kind": "input" if int(d.shuffleWriteBytes()) and not int(d.shuffleReadBytes()) else
                        "operator" if int(d.shuffleReadBytes()) else "other"})
            if detail:
                out[-1].update({
                    "deserialize_seconds": int(d.executorDeserializeTime()) / 1000,
                    "gc_seconds": int(d.jvmGcTime()) / 1000,
                    "shuffle_write_records": int(d.shuffleWriteRecords()),
                    "shuffle_write_seconds": int(d.shuffleWriteTime()) / 1e9,
                    "shuffle_read_records": int(d.shuffleReadRecords()),
                    "shuffle_fetch_wait_seconds": int(d.shuffleFetchWaitTime()) / 1000,
                    "peak_execution_memory": int(d.peakExecutionMemory()),
                    "spilled_bytes": int(d.memoryBytesSpilled()), "disk_spilled_bytes": int(d.diskBytesSpilled())})
    return out


def git_commit(cwd) -> str | None:
    """The commit a benchmark ran (recorded with its results), or None outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=cwd).stdout.strip() or None
    except OSError:
        return None


def machine() -> dict:
    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "load_average": list(os.getloadavg())}
