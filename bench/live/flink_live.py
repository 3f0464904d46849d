"""The live harness's Flink side (``--system flink_multijoin``), in the project's venv: what the harness needs to run
Flink 2.3's MultiJoin on the same landed feed as mjoin and to time it the way it times mjoin.

- :class:`CsvMirror`: the Flink wheel reads no Parquet (``../shared/notes/flink-peer.md``), so every staged
  arrival folder is converted to one CSV file ahead of time (``<run>/flink/.staging``, the columns the join needs,
  timestamps as epoch microseconds, NULL as ``\\N``: ``peers.csv_copies``' format; outside the timed part) and
  renamed into ``<run>/flink/streams/<stream>/arrival=<epoch>/`` right after the feeder lands the Parquet folder
  (the feeder's ``on_folder`` callback): the same schedule, one rename per folder, its own landing record.
- :func:`job_description`: the offline peer's job (``peers.flink_job``: the tables and the SQL text, one place for
  them) over the mirror's directories, each source monitored every ``monitor`` seconds, a CSV file sink committed
  on each checkpoint, the REST port; ``flink_live_job.py`` runs it in the Flink venv.
- :class:`FlinkProgress`: what the job has committed, from the REST API of its mini-cluster. An arrival is
  *processed* once the MultiJoin vertex has read as many records as every folder up to that arrival holds
  (``read-records``, refreshed every 500 ms: rows are never filtered before the join, so the counts meet); it is
  *committed* by the first completed checkpoint triggered after that (the sink's files for it are then
  committed: results visible, as mjoin's at a batch's commit). Each completed checkpoint that committed a newer
  arrival is one "batch" for the harness's lag and latency. Conservative: the processed time is the poll's
  (every ~0.25 s, counts up to 0.5 s old), so an arrival can be attributed to one checkpoint later than the one
  that carried it.
- :func:`fingerprint`: the committed rows of the sink, fingerprinted by the engine's own function
  (``peers.fingerprint_table``), to compare with the interval run's.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
FLINK_PY = PROJECT / "bench" / "evaluation" / ".flink-venv" / "bin" / "python"
JOB_SCRIPT = HERE / "flink_live_job.py"

import sys  # noqa: E402

sys.path.insert(0, str(PROJECT / "bench" / "evaluation"))
import peers  # noqa: E402  (the Flink SQL, the CSV format, the fingerprint of a peer's rows)


def available() -> bool:
    return FLINK_PY.exists()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CsvMirror:
    """CSV copies of the staged feed, renamed into Flink's source directories on the feeder's schedule."""

    def __init__(self, query, root: Path):
        self.query = query
        self.root = Path(root)
        self.staging = self.root / ".staging"
        self.streams = self.root / "streams"
        self.by_source: dict = {}
        for s in query.streams:
            self.by_source.setdefault(s.source, []).append(s)
        self.columns = {s.name: peers._needed_columns(query, s) for s in query.streams}
        self.record: list = []  # one line per renamed folder: the feeder's line with this rename's time
        self.errors: list = []
        for s in query.streams:
            (self.streams / s.name).mkdir(parents=True, exist_ok=True)

    def stage(self, plan) -> float:
        """Convert every staged Parquet folder of ``plan`` to CSV (before the feed starts); seconds taken."""
        t = time.perf_counter()
        for f in plan.folders:
            src = Path(plan.staging) / f.source / f"arrival={f.arrival}"
            for s in self.by_source.get(f.source, []):
                cols = self.columns[s.name]
                parts = [pq.read_table(p, columns=cols) for p in sorted(src.glob("*.parquet"))]
                table = pa.concat_tables(parts) if parts else None
                out = self.staging / s.name / f"arrival={f.arrival}"
                out.mkdir(parents=True, exist_ok=True)
                if table is None or table.num_rows == 0:
                    continue
                arrays = []
                for c in cols:
                    a = table.column(c)
                    if s.columns[c] == "timestamp":
                        a = pc.cast(pc.cast(a, pa.timestamp("us", tz=a.type.tz if pa.types.is_timestamp(a.type) else None)),
                                    pa.int64())
                    else:
                        a = pc.cast(a, peers.ARROW_TYPES[s.columns[c]])
                    arrays.append(pc.fill_null(pc.cast(a, pa.string()), peers.NULL_LITERAL))
                pacsv.write_csv(pa.table(arrays, names=cols), out / "part-0.csv",
                                pacsv.WriteOptions(include_header=False, quoting_style="none"))
        return time.perf_counter() - t

    def land(self, line: dict) -> dict:
        """The feeder landed ``line``'s Parquet folder: rename its CSV copies into place (per stream reading that
        source); the line with this landing's time, also kept in :attr:`record`."""
        for s in self.by_source.get(line["source"], []):
            src = self.staging / s.name / f"arrival={line['arrival']}"
            try:
                os.rename(src, self.streams / s.name / f"arrival={line['arrival']}")
            except OSError as exc:  # recorded; the run's results then differ
                self.errors.append(repr(exc))
        out = {**line, "parquet_landed": line["landed"], "landed": round(time.time(), 6)}
        self.record.append(out)
        return out


def job_description(query, mirror: CsvMirror, *, sink: Path, checkpoint_dir: Path, checkpoint_seconds: float,
                    rest_port: int, monitor_seconds: float = 1.0, parallelism: int = 2) -> dict:
    copies = {s.name: {"path": str(mirror.streams / s.name), "columns": mirror.columns[s.name]} for s in query.streams}
    job = peers.flink_job(query, copies, "multijoin", parallelism=parallelism)
    for t in job["tables"]:
        t["options"] = {"source.monitor-interval": f"{monitor_seconds:g} s"}
    job.update(sink=str(sink), checkpoint_dir=str(checkpoint_dir), checkpoint_seconds=checkpoint_seconds,
               rest_port=rest_port)
    return job


def _get(port: int, path: str, timeout: float = 5.0):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return json.loads(r.read())


class FlinkProgress:
    """The Flink job's committed "batches" (completed checkpoints that committed a newer arrival), read from its
    REST API, in the shape of the harness's ``Committed``: checkpoint id -> (commit time, newest arrival, rows)."""

    def __init__(self, port: int, log: Path, mirror: CsvMirror, folders_per_arrival: dict, poll: float = 0.25):
        self.port, self.log, self.mirror = port, Path(log), mirror
        self.folders_per_arrival = folders_per_arrival
        self.job_id = None
        self.started: dict = {}
        self.batches: dict = {}
        self.processed: dict = {}  # arrival -> poll time at which the join had read all its rows
        self.reads: list = []  # (time, MultiJoin read-records)
        self.checkpoints: dict = {}  # id -> the REST entry (completed ones)
        self.errors: list = []
        self.poll = poll
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    # -- start-up
    def ready(self) -> bool:
        """The job printed its id and runs (REST: RUNNING, every vertex running)."""
        if self.job_id is None:
            with contextlib.suppress(FileNotFoundError):
                for line in self.log.read_text(errors="replace").splitlines():
                    if line.startswith("FLINK_LIVE_STARTED "):
                        self.started = json.loads(line.split(" ", 1)[1])
                        self.job_id = self.started["job_id"]
        if self.job_id is None:
            return False
        try:
            j = _get(self.port, f"/jobs/{self.job_id}")
        except Exception:
            return False
        return j.get("state") == "RUNNING" and all(v.get("status") == "RUNNING" for v in j.get("vertices", []))

    def start_polling(self) -> None:
        self._thread = threading.Thread(target=self._run, name="flink-poll", daemon=True)
        self._thread.start()

    def stop_polling(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._poll()
            except Exception as exc:  # the REST endpoint is gone when the job is: recorded
                if len(self.errors) < 20:
                    self.errors.append(repr(exc))

    def _poll(self) -> None:
        now = time.time()
        j = _get(self.port, f"/jobs/{self.job_id}")
        read = sum(int((v.get("metrics") or {}).get("read-records", 0)) for v in j.get("vertices", [])
                   if "MultiJoin" in v.get("name", ""))
        with self.lock:
            self.reads.append((round(now, 3), read))
            cum = 0
            per: dict = {}
            for x in sorted(self.mirror.record, key=lambda x: x["arrival"]):
                per.setdefault(x["arrival"], []).append(x)
            for a in sorted(per):
                cum += sum(x["rows"] for x in per[a])
                if a in self.processed:
                    continue
                if len(per[a]) < self.folders_per_arrival.get(a, 0) or read < cum:
                    break
                self.processed[a] = now
        cps = _get(self.port, f"/jobs/{self.job_id}/checkpoints")
        with self.lock:
            for c in cps.get("history", []):
                if c.get("status") == "COMPLETED" and c["id"] not in self.checkpoints:
                    self.checkpoints[c["id"]] = {k: c.get(k) for k in ("id", "trigger_timestamp", "latest_ack_timestamp",
                                                                        "end_to_end_duration", "state_size",
                                                                        "checkpointed_size")}

    # -- the harness's view
    def update(self) -> dict:
        with self.lock:
            prev = max((b["newest_arrival"] for b in self.batches.values()), default=None)
            for cid in sorted(self.checkpoints):
                if cid in self.batches or any(b > cid for b in self.batches):
                    continue
                c = self.checkpoints[cid]
                trig = c["trigger_timestamp"] / 1000.0
                done = [a for a, t in self.processed.items() if t <= trig]
                newest = max(done) if done else None
                if newest is None or (prev is not None and newest <= prev):
                    continue
                rows = sum(x["rows"] for x in self.mirror.record if x["arrival"] <= newest)
                self.batches[cid] = {"committed": c["latest_ack_timestamp"] / 1000.0, "newest_arrival": newest,
                                     "rows_in": rows, "checkpoint_triggered": trig,
                                     "processed": self.processed[newest],
                                     "checkpoint_seconds": (c.get("end_to_end_duration") or 0) / 1000.0,
                                     "state_size": c.get("state_size")}
                prev = newest
        return self.batches

    def newest_arrival(self):
        xs = [b["newest_arrival"] for b in self.batches.values()]
        return max(xs) if xs else None

    def summary(self) -> dict:
        with self.lock:
            return {"job_id": self.job_id, "operators": self.started.get("operators"),
                    "plan": self.started.get("plan"), "gateway_seconds": self.started.get("gateway_seconds"),
                    "completed_checkpoints": len(self.checkpoints),
                    "checkpoints": [self.checkpoints[c] for c in sorted(self.checkpoints)],
                    "processed": {str(a): t for a, t in sorted(self.processed.items())},
                    "multijoin_read_records_last": self.reads[-1] if self.reads else None,
                    "poll_errors": self.errors[:5]}


def fingerprint(query, sink: Path, work: Path) -> dict:
    """The committed rows of Flink's file sink (part files; in-progress ones are hidden), fingerprinted by
    ``mjoin.engine.results.result_fingerprint`` as the interval run's are."""
    schema = peers.result_schema(query)
    rows = peers.read_csv_results(str(sink), schema) if Path(sink).exists() else schema.empty_table()
    return peers.fingerprint_table(rows, schema, Path(work))
