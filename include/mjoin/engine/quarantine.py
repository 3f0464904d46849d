"""The quarantine: what the join engine did not join, with the reason, and its replay into the lake.

Nothing accepted is lost and nothing rejected is dropped silently: the engine writes, per query and
stream (``<lake>[/<ns>]/quarantine/<query>/<stream>/``),

- ``files-batch=<B>.json``: files rejected whole by a rule of the landing contract
  (:mod:`mjoin.lake.contract`): ``{stream, path, reason, rule, detail, rows}`` (the file stays where it
  landed; it is only not joined);
- ``rows/batch=<B>/*.parquet``: rows rejected one by one (``reason``: null_key, bad_type, bad_time,
  late; ``file``: where the row came from; ``row``: the row's declared columns as JSON), one folder per
  batch (streaming micro-batches, per-batch runs); a pipelined interval run writes the rows of all its
  batches to ``rows/batches=<F>-<L>/*.parquet`` with a column ``batch`` instead (a few files per stream
  and run, not one per batch; the folder names of :mod:`mjoin.engine.results`, a batch's own folder
  winning over a range). :func:`rejected_rows` reads both.

:func:`entries` lists both, each with a stable id (``f-<hash>`` for a file, ``r-<stream>-<batch>-<reason>``
for a set of rows). :func:`replay` lands a fixed file, or the quarantined rows (as they are, or a
fixed file given for them), into the lake **as a new arrival** of the stream's source:
``streams/<source>/arrival=<epoch>/part-replay-<id>.parquet``, written to a hidden folder and renamed
into place like the lander does, so the streaming job reads it once like any landed file. A replay
is recorded in ``quarantine/<query>/replays/<id>.json``, created exclusively before landing, so one
entry is replayed at most once (a second replay is refused, naming the first). The replayed rows
then meet the usual rules: in the streaming job, rows whose event time is below the job's watermark
by then are late again (quarantined as ``late``; a query with more ``lateness`` accepts them), and an
interval run over their event time joins them like any other row.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.engine.metrics import read_metrics
from mjoin.engine.normalize import add_counts
from mjoin.engine.results import batch_folders
from mjoin.lake.contract import inspect
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil


class QuarantineError(ValueError):
    """A quarantine request the user can fix (unknown id, already replayed, a fixed file that breaks a rule)."""


@dataclass
class Entry:
    id: str
    kind: str  # "file" | "rows"
    stream: str
    batch: int
    reason: str
    rows: int | None
    detail: str = ""
    path: str = ""  # file: the rejected file; rows: the quarantine folder of the rows
    rule: str | None = None
    replayed: dict | None = None  # the replay record, if replayed

    def to_json(self) -> dict:
        return asdict(self)


def _file_id(path: str) -> str:
    return "f-" + hashlib.sha1(path.encode()).hexdigest()[:12]


def _replays_dir(lake, query: str) -> str:
    return fsutil.join(lake.quarantine(query), "replays")


def _replay_record(lake, query: str, entry_id: str) -> dict | None:
    p = fsutil.join(_replays_dir(lake, query), f"{entry_id}.json")
    return json.loads(fsutil.read_text(p)) if fsutil.exists(p) else None


def entries(lake, query) -> list[Entry]:
    """Every quarantined file and row set of ``query`` in ``lake`` (a :class:`mjoin.lake.layout.Lake`, with its
    namespace), by batch and stream."""
    out = []
    for stream in query.stream_names:
        base = lake.quarantine(query.name, stream)
        for name in fsutil.listdir(base):
            if name.startswith("files-batch=") and name.endswith(".json"):
                batch = int(name[len("files-batch="):-len(".json")])
                for rec in json.loads(fsutil.read_text(fsutil.join(base, name))):
                    out.append(Entry(id=_file_id(rec["path"]), kind="file", stream=stream, batch=batch,
                                     reason=rec["reason"], rows=rec.get("rows"), detail=rec.get("detail", ""),
                                     path=rec["path"], rule=rec.get("rule")))
        rows = rejected_rows(lake, query.name, stream, columns=["reason"], with_folder=True)
        if rows.num_rows:
            counts = rows.group_by(["batch", "reason", "folder"]).aggregate([("reason", "count")]).to_pylist()
            for c in counts:
                out.append(Entry(id=f"r-{stream}-{c['batch']}-{c['reason']}", kind="rows", stream=stream,
                                 batch=c["batch"], reason=c["reason"], rows=c["reason_count"], path=c["folder"]))
    for e in out:
        e.replayed = _replay_record(lake, query.name, e.id)
    return sorted(out, key=lambda e: (e.batch, e.stream, e.kind, e.id))


def rejected_rows(lake, query_name: str, stream: str, columns=None, *, with_folder: bool = False) -> pa.Table:
    """Every row of ``stream`` the join job quarantined, both layouts (a batch's folder ``rows/batch=<B>/`` and
    a pipelined run's ``rows/batches=<F>-<L>/`` with a ``batch`` column; a batch's own folder wins): ``batch``
    (int64), then ``columns`` (default ``reason``, ``file``, ``row``), with ``with_folder`` the folder that
    holds each row (an entry's ``path``)."""
    columns = list(columns or ("reason", "file", "row"))
    rows_dir = fsutil.join(lake.quarantine(query_name, stream), "rows")
    folders = batch_folders(rows_dir, committed_only=False)
    by_folder: dict = {}
    for b in sorted(folders):
        by_folder.setdefault(folders[b], []).append(b)
    tables = []
    for (folder, ranged), bs in by_folder.items():
        for name in fsutil.listdir(folder):
            if not name.endswith(".parquet"):
                continue
            if ranged:
                t = _read(fsutil.join(folder, name), ["batch"] + columns)
                t = t.filter(pc.is_in(t.column("batch"), value_set=pa.array(bs, t.column("batch").type)))
                t = t.set_column(0, "batch", pc.cast(t.column("batch"), pa.int64()))
            else:
                t = _read(fsutil.join(folder, name), columns)
                t = t.add_column(0, "batch", pa.array([bs[0]] * t.num_rows, pa.int64()))
            if with_folder:
                t = t.append_column("folder", pa.array([folder] * t.num_rows, pa.string()))
            tables.append(t)
    if not tables:
        names = ["batch"] + columns + (["folder"] if with_folder else [])
        return pa.table({n: pa.array([], pa.int64() if n == "batch" else pa.string()) for n in names})
    return pa.concat_tables(tables, promote_options="default")


def _read(path: str, columns=None) -> pa.Table:
    fs, p = fsutil.resolve(path)
    with fs.open_input_file(p) as fh:
        return pq.read_table(fh, columns=columns)


def find(lake, query, entry_id: str) -> Entry:
    for e in entries(lake, query):
        if e.id == entry_id:
            return e
    raise QuarantineError(f"no quarantined file or rows with id {entry_id!r} for {query.name} "
                          f"(python -m mjoin quarantine list)")


def rows_of(entry: Entry, query) -> pa.Table:
    """The quarantined rows of a ``rows`` entry with the stream's declared columns and types (values
    that do not convert back are NULL)."""
    stream = query.stream(entry.stream)
    parts = [fsutil.join(entry.path, n) for n in fsutil.listdir(entry.path) if n.endswith(".parquet")]
    table = pa.concat_tables([_read(p) for p in parts], promote_options="default")
    keep = pc.equal(table.column("reason"), entry.reason)
    if "batch" in table.column_names:  # a pipelined run's folder holds the rows of several batches
        keep = pc.and_(keep, pc.equal(table.column("batch"), entry.batch))
    table = table.filter(keep)
    docs = [json.loads(r) for r in table.column("row").to_pylist()]
    cols = {}
    for c, t in stream.columns.items():
        cols[c] = _convert(pa.array([d.get(c) for d in docs], pa.string()), t)
    return pa.table(cols)


_ARROW = {"long": pa.int64(), "int": pa.int32(), "short": pa.int16(), "double": pa.float64(), "float": pa.float32(),
          "boolean": pa.bool_(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"), "string": pa.string()}


def _convert(arr: pa.Array, spec_type: str) -> pa.Array:
    if spec_type == "string":
        return arr
    target = _ARROW.get(spec_type)
    if target is None and spec_type.startswith("decimal("):
        p, s = (int(x) for x in spec_type[len("decimal("):-1].split(","))
        target = pa.decimal128(p, s)
    if spec_type == "timestamp":  # Spark wrote them as "yyyy-MM-dd HH:mm:ss[.SSSSSS]" in UTC, without a zone
        arr = pc.replace_substring(arr, " ", "T")
    try:
        return _cast(arr, target)
    except pa.ArrowInvalid:
        return pa.array([_try(v, target) for v in arr.to_pylist()], target)


def _cast(arr: pa.Array, target) -> pa.Array:
    """``arr`` cast to ``target``; a zoned timestamp parsed as a naive one first, then declared UTC (Arrow
    refuses a string without a zone for a zoned type: every quarantined event time was lost)."""
    if pa.types.is_timestamp(target) and target.tz is not None:
        return pc.cast(pc.cast(arr, pa.timestamp(target.unit)), target)
    return pc.cast(arr, target)


def _try(v, target):
    try:
        return _cast(pa.array([v], pa.string()), target)[0].as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def replay(lake, query, entry_id: str, fixed: str | None = None, *, by: str = "cli", now: float | None = None) -> dict:
    """Land the entry's fixed file (``fixed``) or, for rows, the quarantined rows themselves as a new
    arrival of its stream's source; exactly once per entry. Returns the replay record."""
    entry = find(lake, query, entry_id)
    if entry.replayed:
        r = entry.replayed
        raise QuarantineError(f"{entry_id} was already replayed on {r['at']} by {r['by']} as {r['landed']}")
    stream = query.stream(entry.stream)
    if fixed is None:
        if entry.kind == "file":
            raise QuarantineError(f"{entry_id} is a file rejected by {entry.rule} ({entry.detail}): give the fixed "
                                  "file with --with FIXED.parquet")
        table = rows_of(entry, query)
    else:
        table = _read(fixed)
    # the replayed file must pass the contract's file rules itself
    tmp_check = fsutil.join(lake.quarantine(query.name), "replays", f".check-{uuid.uuid4().hex}.parquet")
    _write(tmp_check, table)
    try:
        problem = inspect(tmp_check, stream).problem()
    finally:
        fsutil.remove(tmp_check)
    if problem:
        raise QuarantineError(f"the replacement for {entry_id} breaks {problem[0]}: {problem[1]}")
    now = time.time() if now is None else now
    record = {"id": entry_id, "kind": entry.kind, "stream": entry.stream, "reason": entry.reason,
              "rows": table.num_rows, "by": by, "at": iso(now), "fixed": fixed, "landed": None}
    rec_path = fsutil.join(_replays_dir(lake, query.name), f"{entry_id}.json")
    if not _create_exclusive(rec_path, json.dumps(record)):
        raise QuarantineError(f"{entry_id} is being or was replayed (see {rec_path})")
    epoch = int(now)
    while fsutil.exists(lake.arrival_dir(stream.source, epoch)):
        epoch += 1
    target = lake.arrival_dir(stream.source, epoch)
    fs, tp = fsutil.resolve(target)
    hidden = f"{os.path.dirname(tp)}/.arrival={epoch}.{uuid.uuid4().hex[:12]}.tmp"
    fs.create_dir(hidden, recursive=True)
    name = f"part-replay-{entry_id}.parquet"
    with fs.open_output_stream(f"{hidden}/{name}") as out:
        pq.write_table(table, out)
    fs.move(hidden, tp)
    record["landed"] = fsutil.join(target, name)
    fsutil.atomic_write_text(rec_path, json.dumps(record))
    return record


def _write(path: str, table: pa.Table) -> None:
    fs, p = fsutil.resolve(path)
    fs.create_dir(os.path.dirname(p), recursive=True)
    with fs.open_output_stream(p) as out:
        pq.write_table(table, out)


def _create_exclusive(path: str, text: str) -> bool:
    """Create ``path`` only if it does not exist (atomic on a local or POSIX filesystem)."""
    fs, p = fsutil.resolve(path)
    fs.create_dir(os.path.dirname(p), recursive=True)
    if fsutil.is_url(path):  # object stores: best effort (check, then write)
        if fsutil.exists(path):
            return False
        fsutil.atomic_write_text(path, text)
        return True
    try:
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return True


def summary(items: list[Entry]) -> dict:
    """Counts per (stream, reason) and per batch: what metrics and the plugin page show."""
    by_reason: dict = {}
    by_batch: dict = {}
    for e in items:
        n = e.rows or 0
        by_reason.setdefault(e.stream, {})[e.reason] = by_reason.get(e.stream, {}).get(e.reason, 0) + n
        by_batch.setdefault(e.batch, {}).setdefault(e.stream, {})[e.reason] = n + by_batch.get(e.batch, {}).get(
            e.stream, {}).get(e.reason, 0)
    return {"by_reason": by_reason, "by_batch": by_batch, "entries": len(items),
            "replayed": sum(1 for e in items if e.replayed)}


def job_report(lake, query_name: str, after_batch: int | None = None) -> dict:
    """What the join job quarantined in its batches after ``after_batch`` (from its metrics): counts per
    stream and reason, the rejected files with their rules, and the newest batch read."""
    try:
        records = read_metrics(lake, query_name)
    except (OSError, ValueError):
        records = []
    new = [r for r in records if after_batch is None or r["batch_id"] > after_batch]
    counts: dict = {}
    for r in new:
        add_counts(counts, r.get("quarantined") or {})
    files = [dict(f, batch_id=r["batch_id"]) for r in new for f in r.get("quarantined_files") or []]
    return {"batches": [new[0]["batch_id"], new[-1]["batch_id"]] if new else None,
            "last_batch": new[-1]["batch_id"] if new else after_batch,
            "rows": sum(n for per in counts.values() for n in per.values()), "by_stream": counts, "files": files}


def per_batch(records: list, limit: int = 20) -> list[dict]:
    """Quarantine counts per batch, stream and reason (nonzero), the newest ``limit`` batches: the rows
    of the plugin page's table."""
    rows = []
    for r in records[-limit:]:
        for stream, reasons in (r.get("quarantined") or {}).items():
            for reason, n in reasons.items():
                if n:
                    rows.append({"batch_id": r["batch_id"], "stream": stream, "reason": reason, "rows": n})
    return rows
