"""What a stage's task does around the operator, on Spark's executors or on the driver: run a task function
over a stage's rows (as one Spark job, or on driver threads that each play one Spark task), split off and
write the rejected rows, read a stage's partial results back, and the ``pause_in_task`` fault injection."""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark import TaskContext

from mjoin.engine.operator import KIND_REJECT
from mjoin.engine.results import write_parquet
from mjoin.engine.sparkplan import physical_info
from mjoin.runtime import fsutil
from mjoin.runtime.pools import shared_pool

log = logging.getLogger(__name__)

#: the "partition" a thread of a batch run on the driver plays (``run_task``); None: not such a thread
_DRIVER_TASK = threading.local()


def partition_id() -> int:
    part = getattr(_DRIVER_TASK, "part", None)
    if part is not None:
        return part

    tc = TaskContext.get()
    return tc.partitionId() if tc is not None else 0


def split_rejects(t: pa.Table) -> tuple[pa.Table, pa.Table | None]:
    """A task's rows without the rejected ones, and the rejected ones (None if there are none)."""
    kind = np.asarray(t.column("_kind").to_numpy(zero_copy_only=False), dtype=np.int8)
    bad = kind == KIND_REJECT
    if not bad.any():
        return t, None
    return t.filter(pa.array(~bad)), t.filter(pa.array(bad))


def rejects_by_stream(rej: pa.Table, streams: tuple):
    """``(stream, rows, reason -> count)`` per stream of a task's rejected rows; ``rows``: the quarantine's
    columns (reason, file, row = the row as JSON)."""
    s_idx = np.asarray(rej.column("_s").to_numpy(zero_copy_only=False), dtype=np.int64)
    uniq = np.unique(s_idx)
    for si in uniq:
        part = rej if len(uniq) == 1 else rej.filter(pa.array(s_idx == si))
        counts = pc.value_counts(part.column("_reason"))
        yield (streams[int(si)],
               pa.table({"reason": part.column("_reason"), "file": part.column("_file"), "row": part.column("_raw")}),
               {str(r): int(c) for r, c in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist())})


def write_rejects(rej: pa.Table, quarantine_root: str, streams: tuple, batch: int, tag: str) -> dict:
    """Rejected rows of one batch to ``<quarantine>/<stream>/rows/batch=<B>/part-<tag>.parquet`` (reason, file,
    row); returns stream -> reason -> rows."""
    counts: dict = {}
    for stream, rows, c in rejects_by_stream(rej, streams):
        write_parquet(fsutil.join(quarantine_root, stream, "rows", f"batch={batch}", f"part-{tag}.parquet"), rows)
        counts[stream] = c
    return counts


def run_task(fn, table: pa.Table, threads: int = 1) -> list[dict]:
    """Run a stage's task function on the driver over ``table``: its (class, bucket) groups split over
    ``threads`` "partitions" by bucket, each run on a thread of its own as Spark runs its tasks (the
    operator's work is mostly Arrow and numpy, which release the GIL, and file writes)."""
    if threads <= 1 or table.num_rows == 0:
        return _run_partition(fn, table, 0)
    part = np.mod(np.asarray(table.column("_b").fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64), threads)
    parts = [table.filter(pa.array(part == i)) for i in range(threads)]
    docs = list(shared_pool("driver-task", threads).map(lambda i: _run_partition(fn, parts[i], i), range(threads)))
    return [d for part_docs in docs for d in part_docs]


def spark_stage(fn, df) -> tuple[list[dict], dict]:
    """A stage as one Spark job: the task function ``fn`` mapped over ``df``'s partitions; (its documents,
    the physical plan)."""
    mapped = df.mapInArrow(fn, "doc string")
    plan = physical_info(mapped)
    return [json.loads(r.doc) for r in mapped.collect()], plan


def driver_stage(threads: int):
    """``run_stage(fn, table)`` of a stage on the driver (:func:`run_task`), the counterpart of :func:`spark_stage`."""
    def run_stage(fn, table: pa.Table) -> tuple[list[dict], dict]:
        return run_task(fn, table, threads), {"where": "driver", "threads": threads}

    return run_stage


def read_parts(folder: str) -> list[pa.Table]:
    """Every Parquet file in ``folder`` (a stage's partial results), in name order."""

    parts = []
    for name in fsutil.listdir(folder):
        fs, p = fsutil.resolve(fsutil.join(folder, name))
        with fs.open_input_file(p) as fh:
            parts.append(pq.read_table(fh))
    return parts


def _run_partition(fn, table: pa.Table, part: int) -> list[dict]:
    _DRIVER_TASK.part = part
    try:
        return [json.loads(d) for rb in fn(iter(table.to_batches())) for d in rb.column(0).to_pylist()]
    finally:
        _DRIVER_TASK.part = None


def fault_pause_in_task(marker: str, batch_id: int, seconds: float) -> None:
    """Fault injection (``pause_in_task``): the first attempt of partition 0's task records where it runs and
    sleeps, so a test can kill that worker mid-batch; a retry (the marker exists) does not pause."""

    tc = TaskContext.get()
    # once per batch: a retried attempt, or the task of a retried stage, finds the marker and goes on
    if partition_id() != 0 or (tc is not None and tc.attemptNumber()) or fsutil.exists(marker):
        return

    fsutil.atomic_write_text(marker, json.dumps({"batch_id": batch_id, "pid": os.getpid(), "pgid": os.getpgid(0),
                                                 "host": socket.gethostname()}))
    log.error("fault injection: task of batch %d pausing %ss in process %d", batch_id, seconds, os.getpid())
    time.sleep(seconds)
