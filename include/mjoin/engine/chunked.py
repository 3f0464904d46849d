"""An interval's input on the driver in chunks of consecutive batches, read and routed on a thread of its own
while the operator runs the chunks before it (docs/engine.md, "Small intervals on the driver").

On the driver a pipelined interval run read, normalised, batched and routed all of its rows, and only then ran
the operator, on one thread: on 2 cores one of them idle at a time. Here the batches ``0..n`` are cut into
``chunks`` ranges; a producer thread reads, for the range ``[lo, hi)``, every accepted file that can hold a row
of a batch before ``hi`` and was not read yet (by the footer's earliest event time: a row of batch ``b < hi``
has ``ts < start + (hi - 1) * cycle``; a file whose footer does not bound its times is read with the first
range), keeps the rows of later batches for their range, and routes and sorts the range's rows exactly as the
whole interval's are (:func:`mjoin.engine.interval.route_rows`), while the operator's task consumes the ranges
before it in order. Concatenated, the ranges are the whole interval's routed rows in its order by batch, class,
bucket, stream and key (rows equal in all five may come in another order: their files are read in another
order; nothing the operator reports depends on it). A file found unreadable on the way is quarantined and
counted in batch 1's input after the stage (:attr:`mjoin.engine.batch.BatchInput.late_rejects`)."""
from __future__ import annotations

import math
import queue
import threading
import time

import numpy as np
import pyarrow as pa

from .. import contract
from .interval import DeferredLocal, IntervalInput, batch_local, route_rows
from .normalize import _groups, normalize_files

#: ranges handed over but not yet consumed (bounds the rows held ahead of the operator)
AHEAD = 2


def chunk_edges(n_batches: int, chunks: int) -> list[tuple[int, int]]:
    """Batches ``0..n_batches`` cut into at most ``chunks`` consecutive ranges ``[lo, hi)`` of (nearly) equal
    length."""
    total = n_batches + 1
    k = max(1, min(chunks, total))
    size = math.ceil(total / k)
    return [(lo, min(total, lo + size)) for lo in range(0, total, size)]


class RoutedChunks:
    """The routed rows of a driver-path interval (``data.local`` a :class:`DeferredLocal`), produced range by range
    on a thread (:meth:`record_batches`); what ``run_pipelined`` takes in place of the whole routed table."""

    def __init__(self, runner, data: IntervalInput, punct: pa.Table | None, chunks: int):
        assert isinstance(data.local, DeferredLocal)
        self.runner, self.data, self.punct = runner, data, punct
        self.edges = chunk_edges(data.n_batches, chunks)
        self.work_seconds = 0.0  # the producer's time: reading, normalising, batching, routing
        self.wait_seconds = 0.0  # the consumer's time waiting for a range (the input on the critical path)
        self.files_read = 0
        self._late: list = []
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(maxsize=AHEAD)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        previous = data.late_rejects
        data.late_rejects = lambda: self.late_rejects() + (previous() if previous is not None else [])

    def late_rejects(self) -> list:
        """The files found unreadable since the last call (quarantined already by the producer)."""
        with self._lock:
            out, self._late = self._late, []
        return out

    # ---- the producer -------------------------------------------------------------------------------
    def _files(self) -> list:
        """``[(earliest event time or None, group index, path)]`` in reading order: unknown times first."""
        inspected = self.data.local.inspected
        files = [(gi, name, p) for gi, (name, _schema, paths) in enumerate(_groups(inspected)) for p in paths]
        bounds = contract.ts_bounds_us([inspected.accepted.get((name, p)) for _, name, p in files])
        out = [(None if b is None else b[0], gi, p) for (gi, _, p), b in zip(files, bounds)]
        out.sort(key=lambda f: (f[0] is not None, f[0] or 0))
        return out

    def _read(self, files: list) -> list:
        """The rows of ``files`` normalised, each with its batch (rows outside the interval dropped)."""
        d, local = self.data, self.data.local
        groups = _groups(local.inspected)
        eq = self.runner.eq
        by_group: dict = {}
        for _, gi, p in files:
            by_group.setdefault(gi, []).append(p)
        out = []
        for gi, paths in sorted(by_group.items()):
            name, fschema, _ = groups[gi]
            t, rejects = normalize_files(local.query, eq, local.inspected, name, fschema, paths)
            if rejects:
                with self._lock:
                    self._late += rejects
            if t is None:
                continue
            b = batch_local(t.column("_ts"), t.column("_s").to_numpy(), eq, d.start_us, d.end_us, d.cycle_us)
            keep = np.flatnonzero(b >= 0)
            out.append(t.take(pa.array(keep)).append_column(pa.field("_batch", pa.int32()),
                                                            pa.array(b[keep].astype(np.int32))))
        self.files_read += len(files)
        return out

    def _produce(self) -> None:
        d = self.data
        try:
            files = self._files()
            held: list = []  # rows read for later ranges
            pos = 0
            for lo, hi in self.edges:
                if self._stop.is_set():
                    return
                t0 = time.perf_counter()
                last = hi > d.n_batches
                t_hi = d.start_us + (hi - 1) * d.cycle_us  # a row of a batch before hi has ts < t_hi
                take = []
                while pos < len(files) and (last or files[pos][0] is None or files[pos][0] < t_hi):
                    take.append(files[pos])
                    pos += 1
                held += self._read(take) if take else []
                rows, later = [], []
                for t in held:
                    b = t.column("_batch").to_numpy()
                    now = b < hi
                    if now.all():
                        rows.append(t)
                    elif now.any():
                        rows.append(t.filter(pa.array(now)))
                        later.append(t.filter(pa.array(~now)))
                    else:
                        later.append(t)
                held = later
                table = pa.concat_tables(rows) if rows else None
                punct = None
                if self.punct is not None:
                    pb = self.punct.column("_batch").to_numpy()
                    sel = (pb >= lo) & (pb < hi)
                    punct = self.punct.filter(pa.array(sel)) if sel.any() else None
                routed = route_rows(self.runner, table, range(lo, hi), punct)
                self.work_seconds += time.perf_counter() - t0
                self._put(("rows", routed))
            self._put(("end", None))
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(("error", exc))

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    # ---- the consumer -------------------------------------------------------------------------------
    def record_batches(self):
        """The routed rows of every range in order, as Arrow record batches (the operator's task input)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="mjoin-chunked-input", daemon=True)
            self._thread.start()
        try:
            while True:
                t0 = time.perf_counter()
                kind, value = self._queue.get()
                self.wait_seconds += time.perf_counter() - t0
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield from value.to_batches()
        finally:
            self._stop.set()
            self._thread.join()
