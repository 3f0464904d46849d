"""Landed files -> the engine's frame rows, with bad input quarantined, never crashing the job.

Per file, the landing contract's file-level rules (:mod:`mjoin.lake.contract`, the input gate's rules:
readable, key columns present, schema as declared, event time not all NULL, not a duplicate of an
earlier file) are checked on the driver from the Parquet footer; a file that breaks one is
quarantined whole with the rule's name and a reason (``unreadable``, ``missing_key``,
``schema_mismatch``, ``no_event_time``, ``duplicate_file``). The accepted files are read in groups of
identical schema (so one odd file can neither fail nor silently re-type the others): on the driver
(:func:`normalize_local`) or in Spark's tasks (:func:`scan_streams`) by :func:`read_group` (each file of a group
or chunk of a group on a thread pool) and the rules in Arrow (:func:`normalize_arrow`, one copy for both), or by Spark's
file source and one SQL projection per group (:func:`normalize_group`: event times Spark parses,
string patterns or expressions); every row is normalised:

- ``_ts``: event time in epoch microseconds (docs/algorithms.md, "Notation");
- ``_k_<class>``: the join keys as int64;
- ``<stream>__<col>``: the output columns, cast to their declared types;
- ``_reason``: why the row is rejected, or null: ``null_key``, ``bad_type`` (a value that does not
  convert), ``bad_time`` (no or unparsable event time), ``future`` (at or after its arrival folder's epoch
  plus the future allowance: :func:`mjoin.lake.contract.future_from_us`), ``late`` (earlier than the
  watermark).

Every cast is a ``try_`` form: Spark 4 runs in ANSI mode, where a plain cast that fails fails the
whole job.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import functions as F

from mjoin.engine.compiled import EngineQuery, key_name, payload_name
from mjoin.engine.frame import (arrow_frame_schema, arrow_input_schema, arrow_schema, payload_slots, spark_schema,
                                sql_type)
from mjoin.engine.results import write_parquet
from mjoin.lake import contract
from mjoin.model import eventtime, punctuation as pmod
from mjoin.runtime import fsutil
from mjoin.runtime.pools import shared_pool

#: row-level reasons, then the file-level ones (a whole file quarantined by a rule of mjoin.lake.contract)
ROW_REASONS = ("null_key", "bad_type", "bad_time", "late", "future")
#: and a punctuation file that does not follow mjoin.model.punctuation's format (``future``: rows one by one, or a
#: mostly future file whole, the contract's ``input.event_time_not_future``)
REASONS = ROW_REASONS + tuple(r for r in contract.FILE_REASONS if r not in ROW_REASONS) + ("bad_punctuation",)
#: Spark SQL: the arrival epoch (seconds) of the file a row was read from (NULL: not in an arrival folder)
ARRIVAL_SQL = "try_cast(regexp_extract({path}, 'arrival=([0-9]+)/[^/]*$', 1) AS BIGINT)"
#: slack of :meth:`Inspected.prune_outside` around the footer's event-time bounds (1 ms: a file this close to the
#: interval's edge is read)
PRUNE_MARGIN_US = 1_000

def _arrow_info(t: pa.DataType) -> tuple[str, str] | None:
    """(kind, Spark type as Spark's Parquet reader gives it) of an Arrow column type
    (:func:`mjoin.model.eventtime.arrow_info`)."""
    return eventtime.arrow_info(t)


def _kind(t: pa.DataType) -> str | None:
    return eventtime.arrow_kind(t)


@dataclass
class FileReject:
    stream: str
    path: str
    reason: str  # a quarantine reason of mjoin.lake.contract.RULES
    detail: str
    rows: int | None
    rule: str | None = None  # the contract's rule (the input gate's expectation name)

    def to_json(self) -> dict:
        return {"stream": self.stream, "path": self.path, "reason": self.reason, "rule": self.rule,
                "detail": self.detail, "rows": self.rows}


@dataclass
class Inspected:
    """Accepted files by schema signature, and the rejected files."""

    groups: dict = field(default_factory=dict)  # (stream, signature) -> (arrow schema, [paths])
    rejects: list = field(default_factory=list)
    rows: int = 0  # rows of the accepted files (footers)
    ts_max: dict = field(default_factory=dict)  # (stream, path) -> latest event time by the footer, every file
    accepted: dict = field(default_factory=dict)  # (stream, path) -> contract.FileFacts of the accepted files
    #: where Spark's tasks report the files they found unreadable (:func:`scan_streams`: the session's accumulator
    #: of (token, stream, path, detail), and this input's token), and the files :meth:`collect_unreadable` took
    reports: object = None
    token: str | None = None
    reported: set = field(default_factory=set)
    #: the future allowance in micros (None: no row is future) and, per accepted file (stream, path), the event
    #: time from which its rows are future (:func:`mjoin.lake.contract.future_from_us`)
    future_allowance_us: int | None = None
    future_from: dict = field(default_factory=dict)

    def future_bounds(self, stream: str, paths) -> list:
        """The future bound (epoch micros, or None) of each of ``paths`` of ``stream``."""
        return [self.future_from.get((stream, p)) for p in paths]

    def unreadable(self, stream: str, path: str, detail: str) -> FileReject:
        """An accepted file whose data does not read, quarantined whole (``unreadable``, rule
        ``input.files_readable``, its footer's row count, taken out of the accepted rows)."""
        facts = self.accepted.pop((stream, path), None)
        rows = facts.rows if facts is not None else None
        self.rows -= rows or 0
        rej = FileReject(stream, path, contract.RULES["input.files_readable"], detail, rows, "input.files_readable")
        self.rejects.append(rej)
        return rej

    def collect_unreadable(self) -> list:
        """The files the tasks of :func:`scan_streams` reported unreadable since the last call, quarantined
        (:meth:`unreadable`: added to ``rejects``): call it after a Spark job that ran the input (a task
        retried reports twice: each file is taken once)."""
        out = []
        for token, stream, path, detail in (self.reports.value if self.reports is not None else []):
            if token == self.token and (stream, path) not in self.reported:
                self.reported.add((stream, path))
                out.append(self.unreadable(stream, path, detail))
        return out

    def prune_outside(self, window_us: dict, start_us: int, end_us: int) -> dict:
        """Take out of the accepted files those whose every row lies outside an interval's rows: a row of stream
        ``s`` is read iff ``start - W_s < ts < end`` (the warm-up and the batches, :func:`mjoin.engine.interval.
        batch_local`; every other row is dropped, a NULL time counts in batch 1), so a file whose footer bounds
        all of its rows' usable event times (:func:`mjoin.lake.contract.ts_bounds_us`) at or before
        ``start - W_s`` or at or after ``end`` gives the interval nothing. Such files are not read; they were
        judged by the contract like the others (quarantine and duplicates are unchanged). Returns stream ->
        files taken out."""
        out: dict = {}
        keys = [(stream, p) for (stream, _), (_, paths) in self.groups.items() for p in paths]
        bounds_of = dict(zip(keys, contract.ts_bounds_us([self.accepted.get(k) for k in keys])))
        for (stream, sig), (schema, paths) in list(self.groups.items()):
            keep = []
            for p in paths:
                facts = self.accepted.get((stream, p))
                bounds = bounds_of[(stream, p)]
                if bounds is None or (start_us - window_us[stream] < bounds[1] + PRUNE_MARGIN_US
                                      and bounds[0] - PRUNE_MARGIN_US < end_us):
                    keep.append(p)
                    continue
                del self.accepted[(stream, p)]
                self.rows -= facts.rows or 0
                out[stream] = out.get(stream, 0) + 1
            if keep:
                self.groups[(stream, sig)] = (schema, keep)
            else:
                del self.groups[(stream, sig)]
        return out

    def can_reject(self, stream: str, paths, late_before: int | None = None) -> bool:
        """Whether a row of one of the accepted ``paths`` of ``stream`` can be quarantined (a row rule of
        :func:`normalize_group`; ``late_before``: the watermark, if rows before it are late), by the footers:
        :meth:`mjoin.lake.contract.FileFacts.rows_can_be_rejected` (a file not inspected here: it can)."""
        for p in paths:
            facts = self.accepted.get((stream, p))
            if facts is None or facts.rows_can_be_rejected(late_before, self.future_from.get((stream, p))):
                return True
        return False


def inspect_files(query, eq: EngineQuery, stream_files: dict, seen: contract.Seen | None = None,
                  future_allowance: float | None = None) -> Inspected:
    """The contract's file-level rules for every file (``stream_files``: stream -> paths, each stream's
    in arrival order); ``seen``: the files accepted before (duplicates of them are rejected; the files
    accepted here are added to it); ``future_allowance``: seconds after a file's arrival epoch from which its
    rows are ``future`` (:func:`mjoin.lake.contract.future_allowance`; None: no row is): a mostly future file
    is rejected whole, the others get their bound (:attr:`Inspected.future_from`)."""
    out = Inspected(future_allowance_us=None if future_allowance is None else int(round(future_allowance * 1e6)))
    bands = {name: tuple(eq.key_columns[(name, c)] for c in eq.stream_classes[name] if eq.is_band(c)) for name in stream_files}
    items = [(path, query.stream(name), None, bands[name]) for name, files in stream_files.items() for path in files]
    unread_of: dict = {}  # (stream, declared columns' types) -> the columns Spark does not read (once per schema)
    for facts in contract.inspect_all(items):
        out.ts_max[(facts.stream, facts.path)] = facts.ts_max
        problem = facts.problem()
        if problem is None and facts.schema is not None:
            columns = query.stream(facts.stream).columns
            key = (facts.stream, tuple(facts.schema.field(c).type for c in columns))
            unread = unread_of.get(key)
            if unread is None:
                unread = unread_of[key] = [c for c, t in zip(columns, key[1]) if _arrow_info(t) is None]
            if unread:  # allowed by the spec but not by Spark's Parquet reader (e.g. string views)
                problem = ("input.schema_matches_spec", f"column(s) {', '.join(unread)} of a type Spark does not read")
        bound = contract.future_from_us(facts.path, future_allowance)
        if problem is None and bound is not None:
            why = contract.future_problem(facts, query.stream(facts.stream), bound)
            if why:
                problem = ("input.event_time_not_future", why)
        if problem is None and seen is not None:
            earlier = seen.duplicate_of(facts)
            if earlier:
                problem = ("input.no_duplicate_files", f"repeats {earlier[0]} ({earlier[1]})")
        if problem is not None:
            rule, detail = problem
            out.rejects.append(FileReject(facts.stream, facts.path, contract.RULES[rule], detail, facts.rows, rule))
            continue
        if bound is not None:
            out.future_from[(facts.stream, facts.path)] = bound
        if seen is not None:  # remembered until the watermark passes its latest accepted time, never a future one
            seen.add(facts, ts_max=None if facts.ts_max is None or bound is None else min(facts.ts_max, bound / 1e6))
        stream = query.stream(facts.stream)
        sig = tuple((c, str(facts.schema.field(c).type)) for c in sorted(stream.columns))
        entry = out.groups.setdefault((facts.stream, sig), (facts.schema, []))
        entry[1].append(facts.path)
        out.accepted[(facts.stream, facts.path)] = facts
        out.rows += facts.rows or 0
    return out


def _read_type(t: pa.DataType) -> str:
    info = _arrow_info(t)
    if info is None:
        raise ValueError(f"unsupported type {t}")
    return info[1]


def read_schema(schema: pa.Schema, columns: list) -> str:
    """DDL of the declared columns as Spark reads them: an explicit schema, so Spark neither
    infers it (a job per read) nor reads the columns the query does not use."""
    return ", ".join(f"`{c}` {_read_type(schema.field(c).type)}" for c in columns)


# ---- Spark expressions ----------------------------------------------------------------


def _q(col: str) -> str:
    return f"`{col}`"


def _str(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: characters a local lake path may hold to be read through a glob (Hadoop's glob syntax escapes nothing else)
_GLOB_SAFE = re.compile(r"[A-Za-z0-9=_.+\-/]*")


def read_files(spark, ddl: str, paths: list):
    """The Parquet files ``paths`` (checked by the contract) read with the explicit schema ``ddl``.

    Local files under one folder are named by two brace globs (``<folder>/{a,b,...}``) rather than one
    path each: for a list of paths Spark checks every one exists on 40 new threads before listing them
    (~0.4 ms a file, most of a 720-file read's driver time); a glob's matches are not checked again. The
    glob must match exactly the files given (else the plain list, whose missing file is an error). Two
    globs, not one: with a single path Spark first looks for a streaming sink's log under it. Remote
    lakes keep the list (a glob of literal paths is one sequential status call each)."""
    reader = spark.read.schema(ddl)
    prefix = os.path.commonprefix(paths)
    prefix = prefix[:prefix.rfind("/") + 1]
    if len(paths) < 4 or not prefix.startswith("/") or not all(_GLOB_SAFE.fullmatch(p) for p in paths):
        return reader.parquet(*paths)
    half = len(paths) // 2
    globs = [prefix + "{" + ",".join(p[len(prefix):] for p in part) + "}" for part in (paths[:half], paths[half:])]
    try:
        df = reader.parquet(*globs)
        if len(df._jdf.inputFiles()) == len(set(paths)):
            return df
    except Exception:  # noqa: BLE001 - a glob matching nothing: the list names the missing file
        pass
    return reader.parquet(*paths)  # a file gone since the contract read its footer: Spark's own error


def _as_long_key(col: str, kind: str) -> str:
    c = _q(col)
    if kind == "int":
        return f"try_cast({c} AS BIGINT)"
    if kind in ("float", "decimal"):
        return f"CASE WHEN {c} = floor({c}) THEN try_cast({c} AS BIGINT) END"  # 1.5 is not a key
    return f"try_cast(trim({c}) AS BIGINT)"


def _as_type(col: str, kind: str, spec_type: str) -> str:
    c = _q(col)
    if spec_type in ("long", "int", "short"):
        return f"try_cast({_as_long_key(col, kind)} AS {sql_type(spec_type)})"
    if kind == "ts_ns":  # read as long nanoseconds (spark.sql.legacy.parquet.nanosAsLong)
        inner = f"timestamp_micros({c} div 1000)"
        return inner if spec_type == "timestamp" else f"try_cast({inner} AS {sql_type(spec_type)})"
    if spec_type == "timestamp" and kind in ("int", "float", "decimal"):
        return f"timestamp_micros(try_cast(round({c} * 1000000) AS BIGINT))"
    return f"try_cast({c} AS {sql_type(spec_type)})"


def _event_micros(stream, schema: pa.Schema, src) -> str:
    """Spark SQL for the stream's event time in epoch microseconds (null when unusable): the one rule,
    :func:`mjoin.model.eventtime.event_time_sql`, of the column's type in the files (an ``expr`` typed by Spark)."""
    et = stream.event_time
    return eventtime.event_time_sql(et, None if et.expr is not None else _kind(schema.field(et.column).type), src)


def normalize_group(spark, query, eq: EngineQuery, stream_name: str, schema: pa.Schema, paths: list,
                    late_before: int | None = None, rejects: bool = True, future_allowance_us: int | None = None):
    """Frame rows of one group of same-schema files with ``_reason`` (null: valid) and, for rejected rows,
    ``_file`` and ``_raw``: one SQL projection over one read (built as text and handed to Spark in one call:
    per-column ``F.expr`` objects cost a py4j round trip each, ~0.3 s of a run's driver time). ``rejects``
    False: no row of these files can be rejected (their footers, :meth:`Inspected.can_reject`), so the rows
    carry none of the three reject columns. ``future_allowance_us``: rows at or after their file's arrival epoch
    plus this are ``future`` (the arrival from the file's path, :data:`ARRIVAL_SQL`)."""
    stream = query.stream(stream_name)
    src = read_files(spark, read_schema(schema, list(stream.columns)), paths)
    ts_sql = _event_micros(stream, schema, src)
    cols = ["CAST(1 AS TINYINT) AS _kind", f"CAST({eq.index(stream_name)} AS INT) AS _s", f"{ts_sql} AS _ts"]
    null_key, bad_type = [], []
    for c in eq.stream_classes[stream_name]:
        col = eq.key_columns[(stream_name, c)]
        expr = (_as_long_key(col, _kind(schema.field(col).type)) if not eq.is_band(c) else
                f"try_cast({_q(col)} * {10 ** eq.band_scale[c]} AS BIGINT)")  # a band value in integer units
        cols.append(f"{expr} AS {_q(key_name(c))}")
        null_key.append(f"{_q(col)} IS NULL")
        bad_type.append(f"({_q(col)} IS NOT NULL AND {expr} IS NULL)")
    for col, spec_type in eq.payload[stream_name]:
        expr = _as_type(col, _kind(schema.field(col).type), spec_type)
        cols.append(f"{expr} AS {_q(payload_name(stream_name, col))}")
        bad_type.append(f"({_q(col)} IS NOT NULL AND {expr} IS NULL)")
    if not rejects:
        return src.selectExpr(*cols)
    reason = (f"CASE WHEN {' OR '.join(null_key)} THEN 'null_key' WHEN {' OR '.join(bad_type)} THEN 'bad_type' "
              f"WHEN ({ts_sql}) IS NULL THEN 'bad_time' ")
    if future_allowance_us is not None:
        bound = f"({ARRIVAL_SQL.format(path='_metadata.file_path')} * 1000000 + {int(future_allowance_us)})"
        reason += f"WHEN ({ts_sql}) >= {bound} THEN 'future' "
    if late_before is not None:
        reason += f"WHEN ({ts_sql}) < {int(late_before)} THEN 'late' "
    reason += "END"
    raw = "to_json(named_struct(" + ", ".join(f"{_str(c)}, CAST({_q(c)} AS STRING)" for c in stream.columns) + "))"
    bad = f"({reason}) IS NOT NULL"
    return src.selectExpr(*cols, f"{reason} AS _reason", f"CASE WHEN {bad} THEN _metadata.file_path END AS _file",
                          f"CASE WHEN {bad} THEN {raw} END AS _raw")


def normalize_streams(spark, query, eq: EngineQuery, inspected: Inspected, late_before: int | None = None,
                      scan: bool | None = None):
    """Frame rows of every accepted file, with ``_reason`` (null: valid) and, for rejected rows,
    ``_file`` and ``_raw`` (the row as JSON) for the quarantine; None when there is no file.

    When no row of any file can be rejected by the footers (:meth:`Inspected.can_reject`), the frame has no
    ``_reason``/``_file``/``_raw`` at all (so they never cross the input shuffle: ``BatchRunner.route_frame``);
    a group of such files among others gets them as NULLs (the union) without computing them.

    ``scan``: read the files in Spark's tasks with the driver's reader (:func:`scan_streams`: same rows, same
    columns); None (the default): where :func:`local_supported` holds and ``MJOIN_SPARK_SCAN`` is not ``0``.
    Else (and for string or expression event times) Spark's file source and one SQL projection per group."""
    if scan is None:
        scan = spark_scan_enabled() and local_supported(query, {name for name, _ in inspected.groups})
    if scan:
        return scan_streams(spark, query, eq, inspected, late_before)
    frame = None
    for name, schema, paths in _groups(inspected):
        norm = normalize_group(spark, query, eq, name, schema, paths, late_before,
                               rejects=inspected.can_reject(name, paths, late_before),
                               future_allowance_us=inspected.future_allowance_us)
        frame = norm if frame is None else frame.unionByName(norm, allowMissingColumns=True)
    return frame


# ---- the driver's reader in Spark's tasks ------------------------------------------------------------

#: the input tasks of :func:`scan_streams` per slot of Spark's default parallelism
SCAN_TASKS_PER_CORE = 2
#: and at most about this many rows (footers) per task: a task holds its chunk in memory twice (read, normalised)
SCAN_TASK_ROWS = 500_000


def spark_scan_enabled() -> bool:
    """Whether the Spark path reads its files with :func:`scan_streams` where it can (``MJOIN_SPARK_SCAN=0``:
    never, Spark's file source as before)."""
    return os.environ.get("MJOIN_SPARK_SCAN", "1").strip() != "0"


def scan_chunks(sizes: list, tasks: int) -> list:
    """Contiguous chunks of the files of every group, about ``tasks`` of them in all, of about equal weight:
    ``sizes``: per group the files' weights (footer rows); a group gets ``round(its weight / target)`` chunks
    (at least one) cut where its running weight crosses equal shares. Returns ``[(group, first, end)]``."""
    total = sum(sum(w) for w in sizes)
    target = max(total / max(1, tasks), 1.0)
    out = []
    for gi, weights in enumerate(sizes):
        if not weights:
            continue
        n = max(1, min(len(weights), int(round(sum(weights) / target))))
        share = sum(weights) / n
        cum = np.cumsum(np.asarray(weights, dtype=np.float64))
        # the j-th cut after the first file whose running weight reaches j shares (never an empty chunk)
        cuts = sorted({min(len(weights) - 1, int(np.searchsorted(cum, j * share))) + 1 for j in range(1, n)})
        bounds = [0] + [c for c in cuts if 0 < c < len(weights)] + [len(weights)]
        out += [(gi, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    return out


def scan_ddl(eq: EngineQuery, streams, rejects: bool) -> list:
    """The columns :func:`normalize_streams` gives (the union of :func:`normalize_group`'s projections) for the
    streams ``streams``: ``_kind``, ``_s``, ``_ts``, their class keys, their payload by name, and (``rejects``)
    ``_reason``, ``_file``, ``_raw``."""
    classes = [c for c in eq.classes if any(c in eq.stream_classes[s] for s in streams)]
    cols = [("_kind", "tinyint"), ("_s", "int"), ("_ts", "bigint")] + [(key_name(c), "bigint") for c in classes]
    for s in eq.streams:
        if s in streams:
            cols += [(payload_name(s, col), sql_type(t)) for col, t in eq.payload[s]]
    return cols + ([("_reason", "string"), ("_file", "string"), ("_raw", "string")] if rejects else [])


def _scan_task(query, eq: EngineQuery, groups: list, chunks: list, schema: pa.Schema, late_before, reports,
               token: str):
    """The function ``mapInArrow`` runs over the chunk ids: each chunk's files read
    (:func:`read_group`) and normalised (:func:`normalize_arrow`), as ``schema``; a file that does not read is
    reported to the driver (``reports``, an accumulator of (``token``, stream, path, detail)) and yields no row."""

    def run(batches):
        for rb in batches:
            for i in rb.column(0).to_pylist():
                gi, a, b = chunks[i]
                name, fschema, paths, rejects, bounds = groups[gi]
                paths, bounds = paths[a:b], bounds[a:b]
                t, owner, failed = read_group(paths, _read_as(query.stream(name), fschema))
                if failed:
                    reports.add([(token, name, p, detail) for p, detail in failed])
                n = t.num_rows
                if not n:
                    continue
                cols = normalize_arrow(query, eq, name, fschema, paths, t, owner, late_before, rejects, bounds)
                yield from pa.table([cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type)
                                     for f in schema], schema=schema).to_batches()

    return run


class _ListParam:
    """An accumulator of lists (pyspark's ``AccumulatorParam`` protocol): what the tasks reported, concatenated."""

    def zero(self, value):
        return []

    def addInPlace(self, a, b):
        a.extend(b)
        return a


def _reports(sc):
    """The Spark context's one accumulator of unreadable files (one per context, not one per read: pyspark
    keeps every accumulator it made for the context's life; the entries are rare, each input takes its own by
    token)."""
    acc = getattr(sc, "_mjoin_unreadable", None)
    if acc is None:
        acc = sc._mjoin_unreadable = sc.accumulator([], _ListParam())
    return acc


def scan_streams(spark, query, eq: EngineQuery, inspected: Inspected, late_before: int | None = None,
                 tasks: int | None = None):
    """:func:`normalize_streams` read by Spark's tasks with the driver's reader: a small frame of chunk ids
    (each chunk a contiguous run of one group's files, of about equal rows by the footers: :func:`scan_chunks`;
    ``tasks`` of them, by default :data:`SCAN_TASKS_PER_CORE` per slot of the default parallelism, more if a
    task would read more than :data:`SCAN_TASK_ROWS` rows), and
    ``mapInArrow`` reading each chunk's files (:func:`read_group`) and normalising it with the same code as the driver
    path (:func:`read_group`, :func:`normalize_arrow`). No file index, no per-file task work in Spark, one
    projection to analyse. The rows and columns are :func:`normalize_group`'s union (:func:`scan_ddl`); the
    reject columns only where a file can reject a row (:meth:`Inspected.can_reject`), as there.

    A file whose data does not read in a task is left out and reported through an accumulator
    (``inspected.reports``): after the Spark job that ran the input, :meth:`Inspected.collect_unreadable`
    quarantines it as ``unreadable``, as the driver path does. None when there is no file."""
    groups = [(name, fschema, list(paths), inspected.can_reject(name, paths, late_before),
               inspected.future_bounds(name, paths)) for name, fschema, paths in _groups(inspected)]
    if not groups:
        return None
    weights = [[max(1, getattr(inspected.accepted.get((name, p)), "rows", None) or 1) for p in paths]
               for name, _, paths, _, _ in groups]
    if tasks is None:
        tasks = max(SCAN_TASKS_PER_CORE * max(1, int(spark.sparkContext.defaultParallelism)),
                    -(-sum(map(sum, weights)) // SCAN_TASK_ROWS))
    chunks = scan_chunks(weights, tasks)
    ddl = scan_ddl(eq, {g[0] for g in groups}, any(g[3] for g in groups))
    if inspected.reports is None:
        inspected.reports, inspected.token = _reports(spark.sparkContext), uuid.uuid4().hex
    fn = _scan_task(query, eq, groups, chunks, arrow_schema(ddl), late_before, inspected.reports, inspected.token)
    return spark.range(0, len(chunks), 1, len(chunks)).mapInArrow(fn, spark_schema(ddl))


#: quarantined rows up to this count are collected and written by the driver (one small Spark
#: job per batch instead of one write job per stream); more are written by Spark.
DRIVER_WRITE_LIMIT = 100_000


def write_quarantine(frame, counts: dict, rejects: list, out_lake, query_name: str, eq: EngineQuery,
                     batch_id: int | None = None) -> None:
    """Rejected rows (reason, file, the row as JSON) under ``quarantine/<query>/<stream>/rows/batch=<B>/``
    and rejected files in ``.../files-batch=<B>.json``. ``counts``: stream -> reason -> rows; with
    ``batch_id`` None the frame carries a ``_batch`` column (interval runs)."""
    streams = [s for s, reasons in counts.items() if any(n for r, n in reasons.items() if r in ROW_REASONS)]
    total = sum(n for s in streams for r, n in counts[s].items() if r in ROW_REASONS)
    if streams:
        bad = frame.where(F.col("_reason").isNotNull() & F.col("_s").isin([eq.index(s) for s in streams]))
        batch_col = F.col("_batch") if batch_id is None else F.lit(batch_id)
        bad = bad.select(F.col("_s"), batch_col.cast("int").alias("batch"), F.col("_reason").alias("reason"),
                         F.col("_file").alias("file"), F.col("_raw").alias("row"))
        if total <= DRIVER_WRITE_LIMIT:
            _write_quarantine_rows(bad.toArrow(), out_lake, query_name, eq)
        else:
            for s in streams:
                base = fsutil.join(out_lake.quarantine(query_name, s), "rows")
                part = bad.where(F.col("_s") == eq.index(s)).drop("_s")
                if batch_id is None:
                    part.write.mode("overwrite").partitionBy("batch").parquet(base)
                else:
                    part.drop("batch").write.mode("overwrite").parquet(fsutil.join(base, f"batch={batch_id}"))
    write_file_rejects(out_lake.quarantine(query_name), [r.to_json() for r in rejects],
                       batch_id if batch_id is not None else 1)


def write_file_rejects(quarantine_root: str, rejects: list, batch_id: int) -> None:
    """The rejected files (``rejects``: :meth:`FileReject.to_json` of each) in
    ``<quarantine_root>/<stream>/files-batch=<B>.json``, one file per stream (replaced)."""
    by_stream: dict = {}
    for r in rejects:
        by_stream.setdefault(r["stream"], []).append(r)
    for stream, items in by_stream.items():
        fsutil.atomic_write_text(fsutil.join(quarantine_root, stream, f"files-batch={batch_id}.json"),
                                 json.dumps(items, indent=1))


def _write_quarantine_rows(table: pa.Table, out_lake, query_name: str, eq: EngineQuery) -> None:

    s_col = np.asarray(table.column("_s").to_numpy(zero_copy_only=False))
    b_col = np.asarray(table.column("batch").to_numpy(zero_copy_only=False))
    rest = table.drop_columns(["_s", "batch"])
    for s, b in sorted({(int(x), int(y)) for x, y in zip(s_col, b_col)}):
        part = rest.filter(pa.array((s_col == s) & (b_col == b)))
        write_parquet(fsutil.join(out_lake.quarantine(query_name, eq.streams[s]), "rows", f"batch={b}",
                                  "part-00000.parquet"), part)


def add_counts(total: dict, *counts: dict) -> dict:
    """Add ``counts`` (each stream -> reason -> rows) into ``total``; returns ``total``."""
    for c in counts:
        for stream, reasons in c.items():
            for reason, n in reasons.items():
                if n:
                    per = total.setdefault(stream, {})
                    per[reason] = per.get(reason, 0) + n
    return total


# ---- the same rules with pyarrow, for batches small enough to run on the driver -------------------


def local_supported(query, streams) -> bool:
    """Whether :func:`normalize_local` reads ``streams`` exactly as :func:`normalize_group` would: event
    times in a column of their own (timestamp, date, epoch seconds), not a string pattern or a Spark
    SQL expression (those are Spark's to parse)."""
    for name in streams:
        et = query.stream(name).event_time
        if et.expr is not None or et.format is not None or query.stream(name).columns.get(et.column) == "string":
            return False
    return True


def _micros(arr: pa.ChunkedArray, kind: str) -> pa.Array:
    """Event time in epoch microseconds, as :func:`_event_micros` computes it (null when unusable):
    :func:`mjoin.model.eventtime.micros_arrow`."""
    return eventtime.micros_arrow(arr, kind)


def _spark_string(v) -> str:
    """A value as Spark's CAST(... AS STRING) writes it in the quarantine's row JSON."""
    if isinstance(v, datetime):
        text = v.replace(tzinfo=None).isoformat(sep=" ")
        return text.rstrip("0").rstrip(".") if "." in text else text
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def raw_json(table: pa.Table) -> list:
    """Each row as the quarantine keeps it, ``json.dumps({col: _spark_string(v) for non-NULL v},
    separators=(",", ":"))``: :func:`raw_json_array` as Python strings."""
    return raw_json_array(table).to_pylist()


def raw_json_array(table: pa.Table) -> pa.Array:
    """:func:`raw_json` as an Arrow string array, built column by column: integers and decimals of scale <= 6
    (where ``str(Decimal)`` never uses an exponent) as Arrow's string cast, which writes them as Python does;
    other columns formatted once per distinct value; the braces added by Arrow too. (Per row in Python it was
    ~15 ms of a micro-batch.)"""

    parts = []  # per column: ',"name":"value"', or "" where NULL
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        key = "," + json.dumps(name) + ":"
        t = col.type
        if pa.types.is_integer(t) or (pa.types.is_decimal(t) and 0 <= t.scale <= 6):
            frag = pc.binary_join_element_wise(pa.scalar(key + '"'), pc.cast(col, pa.string()), pa.scalar('"'), "")
        elif pa.types.is_timestamp(t) and t.unit in ("ms", "us") and t.tz in (None, "UTC", "+00:00"):
            # "YYYY-mm-dd HH:MM:SS[.ffffff]" without trailing zeros of the fraction (as _spark_string)
            text = pc.replace_substring_regex(pc.strftime(col, "%Y-%m-%d %H:%M:%S"), r"\.?0+$", "")
            frag = pc.binary_join_element_wise(pa.scalar(key + '"'), text, pa.scalar('"'), "")
        else:
            enc = pc.dictionary_encode(col)
            frags = pa.array([key + json.dumps(_spark_string(v)) for v in enc.dictionary.to_pylist()], pa.string())
            frag = frags.take(enc.indices)
        parts.append(pc.fill_null(frag, ""))
    if not parts:
        return pa.array(["{}"] * table.num_rows, pa.string())
    # (no NULLs left: pyarrow's join with null_handling="skip" drops rows whose inputs are all NULL)
    joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "")
    return pc.binary_join_element_wise(pa.scalar("{"), pc.utf8_slice_codeunits(joined, 1), pa.scalar("}"), "")


#: threads that read a group's files (a file's decoding runs in Arrow without the GIL, opening it and its footer
#: in Python): on 2 cores 4 threads read sf 1's 720 small files in 0.30 s and 120 larger ones in 0.07 s, against
#: 0.43 s and 0.14 s for one pyarrow.dataset scan of the group (one process, load ~3.4; bench/scale/README.md, the eighth
#: input round; the engine side by side: bench/scale/results/input-ab-h34-default-sf1.json)
READ_THREADS = 4


def _read_file(path: str, schema: pa.Schema) -> pa.Table:
    """One file's columns ``schema.names``, as ``schema`` (the group's declared columns; a file may order its
    columns otherwise, have others, or declare a column NOT NULL that another file of the group does not)."""
    fs, p = fsutil.resolve(path)
    with fs.open_input_file(p) as fh:
        t = pq.ParquetFile(fh).read(columns=schema.names, use_threads=False)
    return t.select(schema.names).cast(schema)


def read_group(paths: list, schema: pa.Schema) -> tuple[pa.Table, np.ndarray, list]:
    """``(rows, file index of each row, [(path, error)] of the files that could not be read)``: the files of one
    group (one accepted stream's files of one schema) read as ``schema``, each on its own on a pool of
    :data:`READ_THREADS` threads, in the order given; a file whose data does not read (its footer passed the
    contract) or that is gone since is left out (and quarantined by the caller), never the whole read."""
    if not paths:
        return schema.empty_table(), np.zeros(0, np.int32), []

    def one(path):
        try:
            return _read_file(path, schema), None
        except (OSError, pa.ArrowException) as exc:
            return None, f"not a readable Parquet file ({type(exc).__name__}: {exc})"

    read = list(shared_pool("read", READ_THREADS).map(one, paths)) if len(paths) > 1 else [one(paths[0])]
    tables, owners, failed = [], [], []
    for i, (path, (t, error)) in enumerate(zip(paths, read)):
        if error is not None:
            failed.append((path, error))
        elif t.num_rows:
            tables.append(t)
            owners.append(np.full(t.num_rows, i, np.int32))
    table = pa.concat_tables(tables).combine_chunks() if tables else schema.empty_table()
    return table, (np.concatenate(owners) if owners else np.zeros(0, np.int32)), failed


def _cast_payload(src: pa.ChunkedArray, target: pa.DataType, owner: np.ndarray) -> pa.Array:
    """A payload column cast to its slot's type; where the cast of the whole column fails, file by file (``owner``:
    the file of each row), a file whose values do not all convert getting NULLs (the per-file rule)."""
    safe = not pa.types.is_timestamp(target)
    try:
        return pc.cast(src, target, safe=safe)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    src = src.combine_chunks() if isinstance(src, pa.ChunkedArray) else src
    out, start = [], 0
    bounds = np.flatnonzero(np.diff(owner)) + 1 if len(owner) else np.zeros(0, np.int64)
    for end in list(bounds) + [len(owner)]:
        part = src.slice(start, end - start)
        try:
            out.append(pc.cast(part, target, safe=safe))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            out.append(pa.nulls(end - start, target))
        start = end
    return pa.concat_arrays(out) if out else pa.nulls(0, target)


#: ``_reason`` by code: 0 = valid (NULL), then the row reasons
_REASON_BY_CODE = pa.array([None, "null_key", "bad_type", "bad_time", "late", "future"], pa.string())


def normalize_arrow(query, eq: EngineQuery, name: str, fschema: pa.Schema, paths: list, t: pa.Table,
                    owner: np.ndarray, late_before: int | None = None, rejects: bool = True,
                    future_from: list | None = None) -> dict:
    """The rules of :func:`normalize_group` in Arrow, over the rows ``t`` of one group of same-schema files of
    stream ``name`` (``fschema``: their schema; ``owner``: each row's index into ``paths``, as
    :func:`read_group` gives them): the columns ``_kind``, ``_s``, ``_ts``, the stream's class keys, its payload
    by name (``<stream>__<col>``, cast to the frame's type) and ``_reason``, ``_file``, ``_raw`` (``rejects``
    False: no row of these files can be rejected, by their footers, so the three are NULL, as the SQL path's
    union gives them). ``future_from``: per file of ``paths``, the event time (micros) from which its rows are
    ``future`` (None: none is). The one copy of the rules in Arrow: :func:`normalize_local` (the driver) and
    :func:`scan_streams` (Spark's tasks) both call it."""

    frame = arrow_frame_schema(eq)
    stream = query.stream(name)
    n = t.num_rows
    cols = {"_kind": pa.array(np.ones(n, np.int8)), "_s": pa.array(np.full(n, eq.index(name), np.int32))}
    ts = _micros(t.column(stream.event_time.column), _kind(fschema.field(stream.event_time.column).type))
    cols["_ts"] = ts
    null_key = np.zeros(n, bool)
    for c in eq.stream_classes[name]:
        col = eq.key_columns[(name, c)]
        src = t.column(col)
        if eq.is_band(c) and eq.band_scale[c]:  # a band value in integer units
            src = pc.multiply(src, pa.scalar(10 ** eq.band_scale[c], pa.int64()))
        k = pc.cast(src, pa.int64())
        cols[key_name(c)] = k
        null_key |= np.asarray(k.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    bad_type = np.zeros(n, bool)
    for col, _spec in eq.payload[name]:
        target = payload_name(name, col)
        src = t.column(col)
        v = _cast_payload(src, frame.field(target).type, owner)
        cols[target] = v
        bad_type |= np.asarray(pc.and_(src.is_valid(), v.is_null()).to_numpy(zero_copy_only=False), dtype=bool)
    if not rejects:
        for c in ("_reason", "_file", "_raw"):
            cols[c] = pa.nulls(n, pa.string())
        return cols
    ts_null = np.asarray(ts.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    code = np.zeros(n, np.int8)
    t_us = ts.fill_null(0).to_numpy()
    if late_before is not None:
        code[~ts_null & (t_us < int(late_before))] = 4
    if future_from is not None and any(b is not None for b in future_from):
        never = np.iinfo(np.int64).max
        bound = np.asarray([never if b is None else int(b) for b in future_from], dtype=np.int64)[owner]
        code[~ts_null & (t_us >= bound)] = 5
    for mask, c in ((ts_null, 3), (bad_type, 2), (null_key, 1)):
        code[mask] = c  # the last assignment wins: null_key, bad_type, bad_time, future, late (Spark's CASE)
    good = code == 0
    cols["_reason"] = _REASON_BY_CODE.take(pa.array(code))
    if good.all():
        cols["_file"] = pa.nulls(n, pa.string())
        cols["_raw"] = pa.nulls(n, pa.string())
    else:
        urls = pa.array([p if fsutil.is_url(p) else "file://" + os.path.abspath(p) for p in paths], pa.string())
        cols["_file"] = urls.take(pa.array(owner, mask=good))
        bad = np.flatnonzero(~good)
        raws = raw_json_array(t.take(pa.array(bad)))
        cols["_raw"] = raws.take(pa.array(np.cumsum(~good, dtype=np.int64) - 1, mask=good))
    return cols


def _read_as(stream, fschema: pa.Schema) -> pa.Schema:
    """The group's declared columns, nullable (the group is by type alone: a file may allow NULLs another does
    not)."""
    return pa.schema([pa.field(c, fschema.field(c).type) for c in stream.columns])


def _groups(inspected: Inspected) -> list:
    """``[(stream, schema, paths)]`` of the accepted files, in the order both paths read them."""
    return [(name, fschema, paths) for (name, _sig), (fschema, paths)
            in sorted(inspected.groups.items(), key=lambda kv: (kv[0][0], kv[1][1][0]))]


def normalize_local(query, eq: EngineQuery, inspected: Inspected, late_before: int | None = None) -> pa.Table | None:
    """:func:`normalize_streams` on the driver with pyarrow (no Spark job): the rows of every accepted file
    in the engine's input layout (:func:`mjoin.engine.frame.input_ddl`: payload in its stream's slots), with
    ``_reason``, ``_file``, ``_raw``. Only for streams :func:`local_supported` accepts.

    Each group of same-schema files is read (:func:`read_group`: file by file on a thread pool) and normalised as
    one table (:func:`normalize_arrow`: the per-file rules, the event time's conversion by the group's type,
    ``_file`` from each row's file); a file whose data does not read is quarantined whole (``unreadable``:
    :meth:`Inspected.unreadable`) and the others are read."""
    schema = arrow_input_schema(eq)
    slot_of = {name: slot for pairs in payload_slots(eq)[1].values() for name, slot in pairs}
    parts = []
    for name, fschema, paths in _groups(inspected):
        t, owner, failed = read_group(paths, _read_as(query.stream(name), fschema))
        for path, detail in failed:
            inspected.unreadable(name, path, detail)
        n = t.num_rows
        if n == 0:
            continue
        cols = normalize_arrow(query, eq, name, fschema, paths, t, owner, late_before,
                               future_from=inspected.future_bounds(name, paths))
        cols = {slot_of.get(k, k): v for k, v in cols.items()}
        parts.append(pa.table([cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type)
                               for f in schema], schema=schema))
    return pa.concat_tables(parts) if parts else None


# ---- punctuations: promises as routed rows -----------------------------------------------------------


def punctuation_rows(query, eq: EngineQuery, landed: list, buckets: int, schema: pa.Schema,
                     batch_of=None, future_allowance: float | None = None) -> tuple[pa.Table | None, dict, list]:
    """The landed punctuation files (``landed``: ``[(path, source, arrival epoch)]``) as routed frame rows
    (``_kind`` 4: ``_s`` the promising stream, the class key column = the lowest key, ``_hi`` the highest,
    ``_ts`` when promised = the arrival's start in micros; one row per bucket an interval covers), the
    event-time promises (stream -> micros: no later tuple before it), and the files that could not be
    read (``FileReject``, reason ``bad_punctuation``), or whose event-time promise lies at or after its
    folder's epoch plus ``future_allowance`` (seconds: the contract's future bound, so that a promise cannot move
    a watermark further than an accepted row could). ``batch_of(path, arrival) -> batch or None`` adds a
    ``_batch`` column (interval runs; None drops the file)."""

    by_source: dict = {}
    for s in query.streams:
        by_source.setdefault(s.source, []).append(s.name)
    cols = {n: [] for n in ("_s", "_c", "_b", "_ts", "_key", "_hi", "_batch")}
    event_time: dict = {}
    rejects = []
    for path, source, arrival in landed:
        b = batch_of(path, arrival) if batch_of is not None else None
        if batch_of is not None and b is None:
            continue
        for name in by_source.get(source, []):
            try:
                p = pmod.read(path)
            except (pmod.PunctuationError, OSError) as exc:
                rejects.append(FileReject(name, path, "bad_punctuation", str(exc), None))
                continue
            bound = contract.future_from_us(int(arrival), future_allowance) if arrival is not None else None
            if p.event_time_before is not None and bound is not None and \
                    int(round(p.event_time_before * 1_000_000)) > bound:
                rejects.append(FileReject(name, path, "bad_punctuation", "promises an event time beyond its arrival "
                                          "folder's epoch plus the future allowance (future)", None))
                continue
            if p.event_time_before is not None:
                t = int(round(p.event_time_before * 1_000_000))
                event_time[name] = max(t, event_time.get(name, t))
            classes = [c for c in eq.stream_classes[name] if eq.key_columns[(name, c)] == p.column]
            if not classes or not (p.keys or p.ranges):
                continue
            ci = eq.class_index(classes[0])
            intervals = [(k, k) for k in p.keys] + list(p.ranges)
            for lo, hi in intervals:
                span = range(buckets) if hi - lo + 1 >= buckets else sorted({k % buckets for k in range(lo, hi + 1)})
                for bk in span:
                    cols["_s"].append(eq.index(name))
                    cols["_c"].append(ci)
                    cols["_b"].append(bk)
                    cols["_ts"].append(int(arrival) * 1_000_000)
                    cols["_key"].append(lo)
                    cols["_hi"].append(hi)
                    cols["_batch"].append(b)
    n = len(cols["_s"])
    if not n:
        return None, event_time, rejects
    arrays = {"_kind": pa.array(np.full(n, 4, np.int8)), "_s": pa.array(cols["_s"], pa.int32()),
              "_c": pa.array(cols["_c"], pa.int32()), "_b": pa.array(cols["_b"], pa.int32()),
              "_ts": pa.array(cols["_ts"], pa.int64()), "_hi": pa.array(cols["_hi"], pa.int64())}
    c_arr = np.asarray(cols["_c"])
    for ci, c in enumerate(eq.classes):
        arrays[key_name(c)] = pa.array(np.where(c_arr == ci, np.asarray(cols["_key"], dtype=np.int64), 0),
                                       pa.int64(), mask=c_arr != ci)
    fields = list(schema)
    table = pa.table([arrays[f.name] if f.name in arrays else pa.nulls(n, f.type) for f in fields], schema=schema)
    if batch_of is not None:
        table = table.append_column("_batch", pa.array(cols["_batch"], pa.int32()))
    return table, event_time, rejects
