"""The landing contract's file-level rules: one module, used by the input gate and by the join engine.

A landed file is joined only if it passes every rule below; otherwise the engine quarantines it
whole (interval and streaming mode alike) and the gate fails with the same rule's name, so the two
can never disagree (the engine once joined a duplicate file and cast a string-key file
that the gate rejected). The checks read only the Parquet footer (schema, row count, row-group
statistics), plus the bytes of a file whose size equals an earlier file's (content duplicates).

| rule (gate expectation)       | quarantine reason | the file is rejected when ...                              |
|-------------------------------|-------------------|------------------------------------------------------------|
| ``input.files_readable``      | ``unreadable``    | it is not a readable Parquet file (truncated, not Parquet)   |
| ``input.key_columns_present`` | ``missing_key``   | a join-key column of its stream is missing                  |
| ``input.schema_matches_spec`` | ``schema_mismatch`` | a declared column is missing or has a type the spec does not allow (:func:`type_problem`) |
| ``input.event_time_parseable``| ``no_event_time`` | it has rows and every one has a NULL event time (footer statistics) |
| ``input.event_time_not_future`` | ``future``      | more than half of its rows with an event time are *future* (below)       |
| ``input.no_duplicate_files``  | ``duplicate_file`` | it repeats an earlier file of its stream: the same bytes, the same (non-positional) file name, or the same rows by the footer fingerprint |

Rows of an accepted file can still be quarantined one by one (NULL key, unparseable event time,
future, late): :mod:`mjoin.engine.normalize`.

**Event-time sanity.** A row is *future* when its event time is at or after its arrival folder's epoch
plus the *future allowance* (:func:`future_from_us`): a producer whose clock runs years ahead, or a file
landed in the wrong folder. It is quarantined as ``future`` and never moves a watermark (only accepted rows
do), so one bad producer cannot make every later row ``late``. The allowance is
:data:`FUTURE_CYCLES` arrival cycles unless configured (:func:`future_allowance`); the arrival cycle is the
lake's, inferred from its arrival folders when not given (:func:`arrival_cycle`). A file more than
:data:`FUTURE_FILE_SHARE` of whose timed rows are future is quarantined whole (:func:`future_rows`). Whether any row of a file *can* be is a footer fact too
(:func:`row_rejects`, conservative: "can" whenever the footer does not tell): where no file of a run
can reject a row, the engine's Spark input path carries no reject columns.

Duplicates are judged against :class:`Seen`, the files accepted before (the engine keeps it with
its state, so it survives restarts; the gate fills it from the interval and its lookback).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.model.eventtime import arrow_kind, micros_arrow
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil
from mjoin.runtime.pools import shared_pool

#: rule -> quarantine reason (what the engine's metrics count, per stream and batch)
RULES = {
    "input.files_readable": "unreadable",
    "input.key_columns_present": "missing_key",
    "input.schema_matches_spec": "schema_mismatch",
    "input.event_time_parseable": "no_event_time",
    "input.event_time_not_future": "future",
    "input.no_duplicate_files": "duplicate_file",
}
FILE_REASONS = tuple(RULES.values())
#: file names the lake reuses in every arrival folder: never duplicates by name alone
DEFAULT_POSITIONAL = r"part-\d+\.parquet"
#: the default future allowance, in arrival cycles (docs/workloads.md, "Event-time sanity")
FUTURE_CYCLES = 2
#: a file whose future rows are more than this share of its rows with an event time is quarantined whole
FUTURE_FILE_SHARE = 0.5
US = 1_000_000
SAME_BYTES, SAME_NAME, SAME_ROWS = "same bytes", "same file name", "same rows (footer: row count, schema, column min/max/NULLs)"
_INT_BITS = {"short": 16, "int": 32, "long": 64}


# ---- schema --------------------------------------------------------------------------------

def type_problem(spec_type: str, arrow_type: pa.DataType) -> str | None:
    """Why a Parquet column of ``arrow_type`` cannot hold the spec's ``spec_type`` (None if it can).

    Integers may be narrower than declared (Spark widens them), never wider; strings may be
    large strings; timestamps any unit and zone; decimals need the declared scale."""
    t = spec_type
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    ok = False
    if t in _INT_BITS:
        if pa.types.is_integer(arrow_type):
            bits = arrow_type.bit_width + (1 if pa.types.is_unsigned_integer(arrow_type) else 0)
            ok = bits <= _INT_BITS[t]
    elif t == "string":
        ok = pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or (
            hasattr(pa.types, "is_string_view") and pa.types.is_string_view(arrow_type))
    elif t == "double":
        ok = pa.types.is_floating(arrow_type)
    elif t == "float":
        ok = pa.types.is_floating(arrow_type) and arrow_type.bit_width <= 32
    elif t == "boolean":
        ok = pa.types.is_boolean(arrow_type)
    elif t == "date":
        ok = pa.types.is_date(arrow_type)
    elif t == "timestamp":
        ok = pa.types.is_timestamp(arrow_type)
    elif t.startswith("decimal("):
        p, s = (int(x) for x in t[len("decimal("):-1].split(","))
        ok = pa.types.is_decimal(arrow_type) and arrow_type.scale == s and arrow_type.precision <= p
    return None if ok else f"{arrow_type}, spec says {t}"


def schema_problems(stream, schema: pa.Schema) -> tuple[str | None, str | None]:
    """``(schema_problem, missing_keys)`` of a file's Arrow schema against the stream's declared columns."""
    names = set(schema.names)
    missing_keys = [k for k in stream.keys if k not in names]
    problems = []
    for c, t in stream.columns.items():
        if c not in names:
            if c not in stream.keys:
                problems.append(f"missing column {c}")
            continue
        why = type_problem(t, schema.field(c).type)
        if why:
            problems.append(f"{c} is {why}")
    return ("; ".join(problems) or None), (", ".join(missing_keys) or None)


# ---- footers -------------------------------------------------------------------------------

def _chunk_stats(md) -> dict:
    """Column path -> ``[NULLs, min, max, complete, fingerprintable]`` over all row groups, in one pass over
    the footer's column chunks (Python attribute access per chunk is most of a footer check):
    ``complete``: every chunk has statistics with a NULL count; ``fingerprintable``: also every chunk
    without min/max holds only NULLs."""
    cols: dict = {}
    for rg in range(md.num_row_groups):
        g = md.row_group(rg)
        rows = g.num_rows
        for i in range(g.num_columns):
            c = g.column(i)
            entry = cols.get(c.path_in_schema)
            if entry is None:
                entry = cols[c.path_in_schema] = [0, None, None, True, True]
            st = c.statistics
            if st is None or not st.has_null_count:
                entry[3] = entry[4] = False
                continue
            nulls = st.null_count
            entry[0] += nulls
            if st.has_min_max:
                lo, hi = st.min, st.max
                entry[1] = lo if entry[1] is None else min(entry[1], lo)
                entry[2] = hi if entry[2] is None else max(entry[2], hi)
            elif nulls < rows:
                entry[4] = False
    return cols


def footer_fingerprint(md, schema: pa.Schema, stats: dict | None = None) -> str | None:
    """A fingerprint of a file's rows from its footer alone: row count, column names and types, and every
    column's NULL count, min and max over all row groups (the same rows written by another writer, with
    another compression or row-group size, give the same fingerprint). None when a column chunk has no
    statistics, or the file has no rows. ``stats``: :func:`_chunk_stats` of ``md``, if already read."""
    if md.num_rows == 0:
        return None
    stats = _chunk_stats(md) if stats is None else stats
    if not all(e[3] and e[4] for e in stats.values()):
        return None
    doc = [md.num_rows, [(f.name, str(f.type)) for f in schema],
           sorted((k, repr(e[0]), repr(e[1]), repr(e[2])) for k, e in stats.items())]
    return hashlib.sha256(repr(doc).encode()).hexdigest()


def to_epoch_seconds(arr) -> np.ndarray:
    """Epoch seconds (float, NaN for NULL) of a timestamp, date or numeric (epoch seconds) Arrow array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_timestamp(t):
        micros = pc.cast(pc.cast(arr, pa.timestamp("us", tz=t.tz)), pa.int64())
        out = micros.to_numpy(zero_copy_only=False).astype("float64") / 1e6
    elif pa.types.is_date(t):
        days = pc.cast(pc.cast(arr, pa.date32()), pa.int32())
        out = days.to_numpy(zero_copy_only=False).astype("float64") * 86400.0
    elif pa.types.is_integer(t) or pa.types.is_floating(t):
        out = pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False).astype("float64")
    else:
        raise TypeError(f"event time of type {t} is not a timestamp, date or epoch seconds")
    if arr.null_count:
        out = np.where(arr.is_null().to_numpy(zero_copy_only=False), np.nan, out)
    return out


def _event_time_stats(md, schema: pa.Schema, column: str | None,
                      stats: dict | None = None) -> tuple[int | None, float | None]:
    """``(NULL count, max in epoch seconds)`` of a plain event-time column from the footer statistics
    (None where the footer does not tell). ``stats``: :func:`_chunk_stats` of ``md``, if already read."""
    if column is None or column not in schema.names:
        return None, None
    stats = _chunk_stats(md) if stats is None else stats
    entry = stats.get(column)
    if entry is None:  # no row group (or not a leaf column)
        return (0, None) if column in [md.schema.column(i).path for i in range(md.num_columns)] else (None, None)
    if not entry[3]:
        return None, None
    nulls, hi = entry[0], entry[2]
    ts_max = None
    if hi is not None:
        try:
            v = to_epoch_seconds(pa.array([hi], type=schema.field(column).type))[0]
            ts_max = float(v) if math.isfinite(v) else None
        except (TypeError, ValueError, pa.ArrowException):
            ts_max = None
    return nulls, ts_max


@dataclass
class FileFacts:
    """What the footer says about one landed file, and the rules it breaks (duplicates aside)."""

    path: str
    stream: str
    size: int | None = None
    rows: int | None = None
    fingerprint: str | None = None
    read_error: str | None = None
    schema_problem: str | None = None
    missing_keys: str | None = None
    no_event_time: str | None = None
    ts_max: float | None = None  # epoch seconds, from the footer (None: not known)
    #: why a row of the file can be quarantined by the engine's row rules (NULL key, a cast that fails, no usable
    #: event time), None: no row can, by the footer (:func:`row_rejects`); lateness is :meth:`rows_can_be_rejected`'s
    row_rejects: str | None = "not inspected"
    #: the footer's minimum of a plain event-time column: (value, Arrow type, kind), for :attr:`ts_min_us`
    ts_min: tuple | None = field(default=None, repr=False)
    #: the footer's minimum and maximum of a plain event-time column every row of which is usable (no NULL, converts
    #: to micros): (min, max, Arrow type, kind), for :func:`ts_bounds_us`; None: not known
    ts_bounds: tuple | None = field(default=None, repr=False)
    schema: pa.Schema | None = field(default=None, repr=False)

    @property
    def ts_min_us(self) -> int | None:
        """The earliest event time in epoch micros by the footer (None: not known); converted when asked (a
        pyarrow conversion is ~0.1 ms, a fifth of a footer check: only a streaming batch's lateness needs it)."""
        return None if self.ts_min is None else _event_micros(*self.ts_min)

    def problem(self) -> tuple[str, str] | None:
        """``(rule, detail)`` of the first rule the file breaks, in the table's order (None: it passes)."""
        if self.read_error:
            return "input.files_readable", self.read_error
        if self.missing_keys:
            return "input.key_columns_present", f"missing key column(s) {self.missing_keys}"
        if self.schema_problem:
            return "input.schema_matches_spec", self.schema_problem
        if self.no_event_time:
            return "input.event_time_parseable", self.no_event_time
        return None

    def rows_can_be_rejected(self, late_before: int | None = None, future_from: int | None = None) -> str | None:
        """Why a row of this (accepted) file can be quarantined, None if none can: :attr:`row_rejects`, or, with a
        future bound (``future_from``, epoch micros: rows at or after it are ``future``), a latest event time not
        1 ms before it (or not known), or, with a watermark (``late_before``, epoch micros: rows before it are
        ``late``), an earliest event time not after it (by 1 us: a footer's nanosecond minimum is truncated)."""
        if self.rows == 0:
            return None
        if self.row_rejects:
            return self.row_rejects
        if future_from is not None and (self.ts_max is None or self.ts_max * US + 1_000 >= future_from):
            return "rows may be at or after the future bound (future)"
        if late_before is None:
            return None
        earliest = self.ts_min_us  # a conversion per access: once
        if earliest is None:
            return "rows may be before the watermark (late)"
        if earliest <= late_before:
            return f"earliest event time {earliest} us is before the watermark {late_before} us (late)"
        return None


# ---- can a row be rejected? -------------------------------------------------------------------

_NEVER_FAILS = {  # spec type -> Arrow types whose every value the engine's cast converts (mjoin.engine.normalize)
    "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
    "double": pa.types.is_floating,
    "float": lambda t: pa.types.is_floating(t) and t.bit_width <= 32,
    "boolean": pa.types.is_boolean,
    "date": pa.types.is_date,
    "timestamp": pa.types.is_timestamp,
}


def cast_can_fail(spec_type: str, arrow_type: pa.DataType, band: bool = False) -> bool:
    """Whether the engine's cast of a column of ``arrow_type`` to ``spec_type`` (a key to bigint, a payload column
    to its type) can give NULL for a value that is not NULL (``bad_type``): never for integers into an integral
    type at least as wide, for the same type, or for a decimal into one of the same scale and no smaller precision;
    a ``band`` column (scaled to integer units) only when it is an integer. Anything else: it can (conservative)."""
    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if spec_type in _INT_BITS:
        return not (pa.types.is_integer(t) and t.bit_width + pa.types.is_unsigned_integer(t) <= _INT_BITS[spec_type])
    if band:
        return True
    if spec_type.startswith("decimal("):
        p, s = (int(x) for x in spec_type[len("decimal("):-1].split(","))
        return not (pa.types.is_decimal(t) and t.scale == s and t.precision <= p)
    ok = _NEVER_FAILS.get(spec_type)
    return ok is None or not ok(t)


def _event_micros(value, arrow_type: pa.DataType, kind: str) -> int | None:
    """The engine's event time in epoch micros (:func:`mjoin.model.eventtime.micros_arrow`) of a footer's min or max
    (None where not convertible: a value whose time is unusable)."""
    try:
        t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
        return micros_arrow(pa.array([value], type=t), kind).to_pylist()[0]
    except (TypeError, ValueError, OverflowError, pa.ArrowException):
        return None


def ts_bounds_us(facts: list) -> list:
    """Per :class:`FileFacts`: (earliest, latest) event time of the file's rows in epoch micros by its footer
    (:attr:`FileFacts.ts_bounds`), converted as the engine converts each row's time (so they bound the rows'
    times exactly), or None (not known; or a row's time can be unusable: such a row is the engine's ``bad_time``
    whatever the interval). One conversion per event-time type for all the files (a conversion costs ~0.1 ms:
    two per file would be a third of a footer check)."""
    out: list = [None] * len(facts)
    by_type: dict = {}
    for i, f in enumerate(facts):
        if f is not None and f.ts_bounds is not None:
            lo, hi, t, kind = f.ts_bounds
            by_type.setdefault((t, kind), []).append((i, lo, hi))
    for (t, kind), items in by_type.items():
        value_type = t.value_type if pa.types.is_dictionary(t) else t
        try:
            us = micros_arrow(pa.array([v for _, lo, hi in items for v in (lo, hi)], type=value_type), kind).to_pylist()
        except (TypeError, ValueError, OverflowError, pa.ArrowException):  # one by one: a bad value spoils one file
            us = [_event_micros(v, t, kind) for _, lo, hi in items for v in (lo, hi)]
        for k, (i, _, _) in enumerate(items):
            lo_us, hi_us = us[2 * k], us[2 * k + 1]
            out[i] = None if lo_us is None or hi_us is None else (lo_us, hi_us)
    return out


_SECONDS_MAX = np.iinfo(np.int64).max // 1_000_000  # epoch seconds whose micros fit a bigint (try_multiply)


def _seconds_fit(lo, hi, arrow_type: pa.DataType, kind: str) -> bool:
    """Whether every epoch-seconds value between a footer's min and max converts to micros (no overflow)."""
    if kind == "int":
        return isinstance(lo, int) and isinstance(hi, int) and -_SECONDS_MAX <= lo and hi <= _SECONDS_MAX
    return _event_micros(lo, arrow_type, kind) is not None and _event_micros(hi, arrow_type, kind) is not None


def row_rejects(stream, schema: pa.Schema, md, stats: dict, band_columns=()) -> tuple[str | None, tuple | None, tuple | None]:
    """``(why a row can be rejected or None, (the event time's footer minimum, its Arrow type, kind) or None,
    (its footer minimum, maximum, Arrow type, kind) or None)`` of a file by its footer (the third only when every
    row's event time is usable: no NULLs, a kind that always converts, micros that do not overflow)
    (``stats``: :func:`_chunk_stats`): a key column (``stream.keys`` and the engine's ``band_columns``) with NULLs
    (``null_key``), a declared column whose cast can fail (:func:`cast_can_fail`, ``bad_type``), an event time that
    can be unusable (``bad_time``: NULLs, a string or expression, floats (a NaN is not in the statistics), epoch
    seconds whose micros overflow by the footer's min/max). Unknown (no statistics) counts as "can"."""
    if md.num_rows == 0:
        return None, None, None
    why: list = []
    names = set(schema.names)

    def nulls(col):
        entry = stats.get(col)
        return entry[0] if entry is not None and entry[3] else None

    for col in dict.fromkeys(list(stream.keys) + list(band_columns)):
        n = nulls(col) if col in names else None
        if n is None:
            why.append(f"{col}: no NULL count in the footer")
        elif n:
            why.append(f"{col}: {n} NULL key(s)")
    for col, spec_type in stream.columns.items():
        if col in names and cast_can_fail(spec_type, schema.field(col).type, band=col in band_columns):
            why.append(f"{col}: {schema.field(col).type} to {spec_type} can fail")
    et, ts_min, ts_bounds = stream.event_time, None, None
    if et.expr is not None or et.format is not None:
        why.append("event time from an expression or a pattern")
    elif et.column not in names:
        why.append(f"no event-time column {et.column}")
    else:
        t = schema.field(et.column).type
        kind, n, entry = arrow_kind(t), nulls(et.column), stats.get(et.column)
        if n is None or n:
            why.append(f"{et.column}: " + ("no NULL count in the footer" if n is None else f"{n} NULL event time(s)"))
        if kind not in ("ts", "ts_ns", "date", "int", "decimal"):
            why.append(f"{et.column}: event time of kind {kind} can be unusable")
        elif entry is not None and entry[3] and entry[4] and entry[1] is not None:
            ts_min = (entry[1], t, kind)
            if kind in ("int", "decimal") and not _seconds_fit(entry[1], entry[2], t, kind):
                why.append(f"{et.column}: event time overflows micros (footer min/max)")
            elif n == 0 and entry[2] is not None:
                ts_bounds = (entry[1], entry[2], t, kind)
        elif kind in ("int", "decimal"):
            why.append(f"{et.column}: no min/max in the footer")
    return ("; ".join(why) or None), ts_min, ts_bounds


def inspect(path: str, stream, size: int | None = None, band_columns=()) -> FileFacts:
    """Footer, schema and the file-level rules of one landed file of ``stream`` (a query spec stream), and whether
    a row of it can be rejected (:func:`row_rejects`; ``band_columns``: columns the engine keys a band class on)."""
    out = FileFacts(path=path, stream=stream.name, size=size)
    fs, p = fsutil.resolve(path)
    try:
        with fs.open_input_file(p) as fh:
            if out.size is None:
                out.size = fh.size()
            pf = pq.ParquetFile(fh)
            schema, md = pf.schema_arrow, pf.metadata
    except Exception as exc:  # not Parquet, truncated, unreadable: the file is rejected, never the job
        out.read_error = f"not a readable Parquet file ({type(exc).__name__}: {exc})"
        return out
    out.schema, out.rows = schema, md.num_rows
    stats = _chunk_stats(md)
    out.fingerprint = footer_fingerprint(md, schema, stats)
    out.schema_problem, out.missing_keys = schema_problems(stream, schema)
    et = stream.event_time
    plain = et.column if et.expr is None else None
    nulls, ts_max = _event_time_stats(md, schema, plain, stats)
    out.ts_max = ts_max if et.format is None else None
    if md.num_rows and nulls is not None and nulls == md.num_rows:
        out.no_event_time = f"all {md.num_rows} rows have a NULL event time ({plain})"
    if out.schema_problem is None and out.missing_keys is None:
        out.row_rejects, out.ts_min, out.ts_bounds = row_rejects(stream, schema, md, stats, band_columns)
    return out


def inspect_all(items, threads: int | None = None, cache: bool = True) -> list[FileFacts]:
    """:func:`inspect` of ``[(path, stream, size or None[, band columns]), ...]`` in the order given, each file's
    facts taken from the :class:`FootersCache` when its (path, size, modification time) and the stream's rules are
    those of an earlier inspection in this process (``cache`` False: never), else read (and remembered).
    ``threads`` by default: 8 when a file is remote (on HDFS or S3 a footer read waits tens of milliseconds),
    else none (a local footer is Python work under the GIL: 720 files took 346 ms in this thread, 369 ms on
    2 threads and 377 ms on 8, medians of 8)."""
    items = [it if len(it) > 3 else (*it, ()) for it in items]
    if threads is None:
        threads = 8 if any(fsutil.is_url(it[0]) for it in items) else 1
    use_cache = cache and FOOTERS.capacity > 0 and items
    out: list = [None] * len(items)
    todo = list(range(len(items)))
    if use_cache:
        stamps = file_stamps([it[0] for it in items])
        keys = [None if st is None else FOOTERS.key(it[0], st, it[1], it[3]) for it, st in zip(items, stamps)]
        todo = []
        for i, key in enumerate(keys):
            hit = FOOTERS.get(key)
            if hit is None:
                todo.append(i)
            else:
                out[i] = hit
    if len(todo) <= 2 or threads <= 1:
        read = [inspect(*items[i]) for i in todo]
    else:
        read = list(shared_pool("footers", threads).map(lambda i: inspect(*items[i]), todo))
    settled = time.time_ns() - SETTLED_NS
    for i, facts in zip(todo, read):
        out[i] = facts
        if (use_cache and keys[i] is not None and facts.read_error is None and facts.size == stamps[i][0]
                and stamps[i][1] <= settled):
            FOOTERS.put(keys[i], facts)
    return out


#: a file's facts are remembered only once its modification time is this much in the past (git's "racy clean"
#: rule): a file changed later gets a later modification time even where the filesystem's clock is coarse
#: (Linux stamps files with a clock of a few ms; object stores with whole seconds)
SETTLED_NS = 2_000_000_000


def file_stamps(paths: list) -> list:
    """``(size, modification time in ns, inode or None)`` of each file (None: not found or not known): ``os.stat``
    for local paths, one listing call per remote filesystem for the URLs."""
    out: list = [None] * len(paths)
    remote: dict = {}
    for i, path in enumerate(paths):
        if not fsutil.is_url(path):
            try:
                st = os.stat(path)
            except OSError:
                continue
            out[i] = (st.st_size, st.st_mtime_ns, st.st_ino)
        else:
            fs, p = fsutil.resolve(path)
            remote.setdefault(path.split("://", 1)[0] + "://" + path.split("://", 1)[1].split("/", 1)[0],
                              (fs, []))[1].append((i, p))
    for fs, entries in remote.values():
        try:
            infos = fs.get_file_info([p for _, p in entries])
        except (OSError, pa.ArrowException):
            continue
        for (i, _), info in zip(entries, infos):
            if info.size is not None and info.size >= 0 and info.mtime_ns is not None:
                out[i] = (info.size, info.mtime_ns, None)
    return out


class FootersCache:
    """Footer facts (:class:`FileFacts`) of files inspected before in this process, by (path, size, modification
    time in ns, inode, the stream's rules): a re-run over the same lake (the evaluation's repeated runs, an interval
    evaluated again, a streaming job's retried batch) reads no footer again. A landed file is never rewritten in
    place (it lands once, atomically, under its arrival folder), and a file replaced anyway gets a new inode (a
    rename) or a later modification time: facts are remembered only of files last modified :data:`SETTLED_NS`
    before the inspection, so that a change after it cannot keep the same time (a remote store's clock skewed
    by more than that against the driver's could defeat this). Unreadable files are not remembered.
    Least recently used entries go first beyond ``capacity`` (``MJOIN_FOOTERS_CACHE``, 0: off)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._facts: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @staticmethod
    def key(path: str, stamp: tuple, stream, band_columns=()) -> tuple:
        """What a file's facts depend on: the file (path, size, mtime) and the stream's rules (its name, event
        time, declared columns, keys) and the engine's band columns."""
        et = stream.event_time
        return (path, *stamp, stream.name, et.column, et.format, et.expr, tuple(stream.columns.items()),
                tuple(stream.keys), tuple(band_columns))

    def get(self, key) -> FileFacts | None:
        """A copy of the facts remembered under ``key`` (callers may change theirs), or None."""
        with self._lock:
            facts = self._facts.get(key)
            if facts is None:
                self.misses += 1
                return None
            self._facts.move_to_end(key)
            self.hits += 1
        return dataclasses.replace(facts)

    def put(self, key, facts: FileFacts) -> None:
        with self._lock:
            self._facts[key] = dataclasses.replace(facts)
            self._facts.move_to_end(key)
            while len(self._facts) > self.capacity:
                self._facts.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._facts.clear()
            self.hits = self.misses = 0


def _cache_capacity() -> int:
    try:
        return max(0, int(os.environ.get("MJOIN_FOOTERS_CACHE", "50000")))
    except ValueError:
        return 50000


#: the process's footer facts (:class:`FootersCache`)
FOOTERS = FootersCache(_cache_capacity())


def content_hash(path: str, chunk: int = 1 << 20) -> str:
    fs, p = fsutil.resolve(path)
    h = hashlib.sha256()
    with fs.open_input_stream(p) as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def file_size(path: str) -> int | None:
    fs, p = fsutil.resolve(path)
    info = fs.get_file_info(p)
    return info.size if info.size is not None and info.size >= 0 else None


# ---- event-time sanity: future rows ------------------------------------------------------------

_ARRIVAL_DIR = re.compile(r"(?:^|/)arrival=(\d+)/[^/]*$")


def arrival_of(path: str) -> int | None:
    """The arrival epoch (seconds) of a landed file, from its folder ``arrival=<epoch>`` (None: not in one)."""
    m = _ARRIVAL_DIR.search(str(path))
    return int(m.group(1)) if m else None


def arrival_cycle(epochs) -> int | None:
    """The lake's arrival cycle (seconds) from its arrival folders (``epochs``: per source, the arrival epochs
    landed): the most common gap between consecutive folders of one source, the smallest of equally common
    ones; None while no source has two folders. The mode, not the smallest gap: a folder landed off the cycle
    (a quarantine replay lands at ``arrival=<now>``) makes two odd gaps, a sparse source's skipped cycles
    make multiples of the cycle."""
    counts: dict = {}
    for eps in epochs:
        e = sorted(set(int(x) for x in eps))
        for a, b in zip(e, e[1:]):
            counts[b - a] = counts.get(b - a, 0) + 1
    if not counts:
        return None
    top = max(counts.values())
    return min(g for g, c in counts.items() if c == top)


def future_allowance(configured: float | None, cycle: float | None, young: float | None = None) -> float | None:
    """Seconds after an arrival folder's epoch from which an event time is future: ``configured`` (seconds;
    ``inf``: no check), else :data:`FUTURE_CYCLES` arrival cycles, else (a young lake: no source has two
    folders yet, the cycle is unknown) ``young`` (:func:`young_allowance`); None: no check."""
    if configured is not None:
        return None if math.isinf(configured) else float(configured)
    return young if not cycle else FUTURE_CYCLES * float(cycle)


def young_allowance(query) -> float:
    """The future allowance while the lake's arrival cycle is unknown: the query's shortest window. No legitimate
    row is that far ahead of its folder (an arrival cycle is shorter than a window), and a file ten years ahead
    in a young lake's first folder is still quarantined (docs/workloads.md, "Event-time sanity")."""
    return float(min(s.window for s in query.streams))


def future_from_us(path_or_arrival, allowance: float | None) -> int | None:
    """The event time (epoch micros) from which a row of a file (its path, or its arrival epoch) is future:
    its arrival folder's epoch plus ``allowance`` seconds; None: no check (no allowance, or not in a folder)."""
    arrival = path_or_arrival if isinstance(path_or_arrival, (int, np.integer)) else arrival_of(path_or_arrival)
    if allowance is None or arrival is None:
        return None
    return int(arrival) * US + int(round(allowance * US))


def future_rows(facts: FileFacts, stream, bound_us: int | None) -> tuple[int, int] | None:
    """``(future rows, rows with an event time)`` of an accepted file whose rows at or after ``bound_us`` are
    future (:func:`future_from_us`): by the footer where it settles it (the latest event time before the bound,
    or the earliest at or after it), else from the event-time column read alone (the engine's conversion,
    :func:`mjoin.model.eventtime.micros_arrow`). None where the driver cannot compute event times (a string
    pattern or an expression: Spark's to evaluate; such a file's future rows are quarantined row by row)."""
    if bound_us is None or not facts.rows:
        return 0, facts.rows or 0
    et = stream.event_time
    if et.expr is not None or et.format is not None:
        return None
    if facts.ts_max is not None and facts.ts_max * US + 1_000 < bound_us:
        return 0, facts.rows
    if facts.ts_bounds is not None:  # every row's time usable (no NULL): by the footer's minimum
        earliest = facts.ts_min_us
        if earliest is not None and earliest >= bound_us:
            return facts.rows, facts.rows
    try:
        fs, p = fsutil.resolve(facts.path)
        with fs.open_input_file(p) as fh:
            col = pq.ParquetFile(fh).read(columns=[et.column], use_threads=False).column(et.column)
        us = micros_arrow(col, arrow_kind(col.type))
    except (OSError, ValueError, TypeError, OverflowError, pa.ArrowException):
        return None  # the data does not read: the engine's reader quarantines the file (unreadable)
    v = np.asarray(us.fill_null(np.iinfo(np.int64).min).to_numpy(), dtype=np.int64)
    timed = len(us) - us.null_count
    return int((v >= bound_us).sum()), int(timed)


def future_problem(facts: FileFacts, stream, bound_us: int | None) -> str | None:
    """Why an otherwise accepted file is quarantined whole as ``future`` (rule ``input.event_time_not_future``):
    more than :data:`FUTURE_FILE_SHARE` of its rows with an event time are at or after ``bound_us``; None: it
    is not (its future rows, if any, are quarantined one by one)."""
    counted = future_rows(facts, stream, bound_us)
    if counted is None:
        return None
    future, timed = counted
    if not future or future <= FUTURE_FILE_SHARE * timed:
        return None
    return (f"{future} of {timed} rows have an event time at or after {iso(bound_us / US)} (its arrival folder's "
            f"epoch plus the future allowance)")


# ---- duplicates ----------------------------------------------------------------------------

@dataclass
class SeenFile:
    path: str
    label: str
    stream: str
    size: int | None
    rows: int | None
    fingerprint: str | None
    ts_max: float | None = None  # epoch seconds: forget the file once the job's watermark passes it
    sha256: str | None = None


class Seen:
    """Files accepted so far, per stream, to recognise a file that lands again (``input.no_duplicate_files``):
    the same bytes (only files of equal size are hashed), the same file name unless it matches
    ``positional`` (names the lake reuses every cycle), or the same rows by the footer fingerprint.
    Files without rows are never duplicates by name or fingerprint (they cannot double-count a join).

    Indexed per stream by size, by file name and by fingerprint (each list in the order the files were
    accepted), so a check looks only at the files that could match: the verdict (which earlier file, which
    kind) is the one a scan of every remembered file in order gives, in time independent of their number."""

    def __init__(self, files=(), positional: str = DEFAULT_POSITIONAL):
        self.positional = re.compile(positional)
        self.files = [f if isinstance(f, SeenFile) else SeenFile(**f) for f in files]

    @property
    def files(self) -> list[SeenFile]:
        return self._files

    @files.setter
    def files(self, files) -> None:
        self._files: list[SeenFile] = []
        self._by_size: dict = {}  # (stream, size) -> [SeenFile]
        self._by_name: dict = {}  # (stream, file name) -> [SeenFile with rows]
        self._by_fingerprint: dict = {}  # (stream, fingerprint) -> [SeenFile with rows]
        for f in files:
            self._remember(f)

    def _remember(self, f: SeenFile) -> None:
        self._files.append(f)
        if f.size is not None:
            self._by_size.setdefault((f.stream, f.size), []).append(f)
        if f.rows:
            self._by_name.setdefault((f.stream, _file_name(f.path)), []).append(f)
            if f.fingerprint:
                self._by_fingerprint.setdefault((f.stream, f.fingerprint), []).append(f)

    def duplicate_of(self, facts: FileFacts, label: str | None = None) -> tuple[str, str] | None:
        """``(label of the earlier file, kind)`` if ``facts`` repeats a remembered file of its stream."""
        if facts.size is not None:
            sized = [f for f in self._by_size.get((facts.stream, facts.size), ()) if f.path != facts.path]
            if sized:
                try:
                    digest = content_hash(facts.path)
                except OSError:
                    digest = None
                for f in sized:
                    if digest is None:
                        break
                    if f.sha256 is None:
                        try:
                            f.sha256 = content_hash(f.path)
                        except OSError:
                            continue  # the earlier file is gone: only its fingerprint can tell
                    if f.sha256 == digest:
                        return f.label, SAME_BYTES
        if not facts.rows:
            return None
        name = _file_name(facts.path)
        if not self.positional.fullmatch(name):
            for f in self._by_name.get((facts.stream, name), ()):
                if f.path != facts.path:
                    return f.label, SAME_NAME
        if facts.fingerprint:
            for f in self._by_fingerprint.get((facts.stream, facts.fingerprint), ()):
                if f.path != facts.path:
                    return f.label, SAME_ROWS
        return None

    def add(self, facts: FileFacts, label: str | None = None, ts_max: float | None = None) -> None:
        self._remember(SeenFile(path=facts.path, label=label or facts.path, stream=facts.stream, size=facts.size,
                                rows=facts.rows, fingerprint=facts.fingerprint,
                                ts_max=facts.ts_max if ts_max is None else ts_max))

    def forget(self, stream: str, path: str) -> bool:
        """Forget the file ``path`` of ``stream`` (accepted by its footer, but its data did not read: a repaired
        copy of it must not be a duplicate of rows that were never joined). Returns whether it was remembered."""
        keep = [f for f in self._files if not (f.stream == stream and f.path == path)]
        if len(keep) == len(self._files):
            return False
        self.files = keep
        return True

    def forget_before(self, watermark_seconds: float | None) -> int:
        """Forget files whose every row is below the job's watermark: a duplicate of them now would be
        quarantined as late row by row, so it can no longer double-count a result. Returns how many."""
        if watermark_seconds is None:
            return 0
        keep = [f for f in self._files if f.ts_max is None or f.ts_max >= watermark_seconds]
        gone = len(self._files) - len(keep)
        if gone:
            self.files = keep
        return gone

    def to_json(self) -> list:
        return [asdict(f) for f in self._files]


def _file_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]
