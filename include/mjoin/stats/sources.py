"""Read the landed streams of a query for one statistics interval (Spark).

One narrow DataFrame for all streams of the query, read once:

    sid  int     index of the stream in ``query.stream_names``
    t    bigint  event time, epoch microseconds (NULL: unusable event time, counted)
    g    bigint  key group of the row (``partition.sql_group_expr`` of its partitioning key;
                 0 without a partitioning; NULL when that key is NULL)
    k0.. bigint  the row's key in attribute class c0, c1, ... (NULL: no such key or NULL key; a row with a
                 NULL in any of its stream's keys has a NULL key in every class: the engine quarantines it
                 whole, reason ``null_key``, so it is in no statistic but the NULL-key counts)

Only rows that can matter are kept: ``T0 - W_s < t <= T1`` (the window state at
the first cycle's start needs the lead-in ``W_s``), plus NULL event times so they
can be counted. Arrival partitions are pruned on the assumption that a tuple's
event time is not later than its arrival (``--scan-all-arrivals`` turns that off).

Bad input is never silently dropped: a file that lacks a needed column or holds
a key of a non-integral type is skipped and reported with the reason; rows with
an unusable event time and NULL keys are counted and reported in the job summary.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.model import eventtime
from mjoin.model.keygroups import group_of, sql_group_expr
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)

US = 1_000_000


@dataclass(frozen=True)
class Grid:
    """The cycles ``[T0 + j tau, T0 + (j+1) tau)``, ``j = 0..n-1``, in epoch microseconds."""

    t0_us: int
    t1_us: int
    tau_us: int

    @property
    def n(self) -> int:
        return (self.t1_us - self.t0_us) // self.tau_us

    def start_epoch(self, j: int) -> int:
        return (self.t0_us + j * self.tau_us) // US

    @property
    def tau(self) -> float:
        return self.tau_us / US


@dataclass
class StreamReport:
    stream: str
    source: str
    files: int = 0
    rejected_files: list = field(default_factory=list)  # [{"file": path, "reason": text}]
    arrivals_scanned: int = 0
    arrivals_total: int = 0
    rows_in_files: int = 0  # rows of the files read (their Parquet footers): a bound on the rows the job reads
    #: per key column: (min, max) over the files read, from the footers' column statistics (None: a file has none)
    key_range: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"source": self.source, "files": self.files, "rejected_files": self.rejected_files,
                "arrivals_scanned": self.arrivals_scanned, "arrivals_total": self.arrivals_total,
                "rows_in_files": self.rows_in_files}

    def add_key_range(self, column: str, lo_hi) -> None:
        """Widen ``column``'s range by one file's ``(min, max)``; a file without statistics makes it unknown."""
        if column in self.key_range and self.key_range[column] is None:
            return
        if lo_hi is None:
            self.key_range[column] = None
            return
        old = self.key_range.get(column)
        self.key_range[column] = lo_hi if old is None else (min(old[0], lo_hi[0]), max(old[1], lo_hi[1]))


def fdiv(a: str, b: int) -> str:
    """Floor division of a bigint SQL expression by a positive integer, exact (no doubles)."""
    return f"((({a}) - pmod(({a}), {int(b)})) div {int(b)})"


def cdiv(a: str, b: int) -> str:
    """Ceiling division of a bigint SQL expression by a positive integer."""
    return f"(-{fdiv(f'-({a})', b)})"


def case_sid(values, default="NULL") -> str:
    """``CASE sid WHEN 0 THEN v0 ... END``: a per-stream constant in SQL."""
    return "CASE sid " + " ".join(f"WHEN {i} THEN {v}" for i, v in enumerate(values)) + f" ELSE {default} END"


# ---- file checks ---------------------------------------------------------------

_INTEGRAL = ("long", "int", "short")


def _family(arrow_type: pa.DataType) -> str:
    if pa.types.is_integer(arrow_type):
        return "integral"
    if pa.types.is_floating(arrow_type) or pa.types.is_decimal(arrow_type):
        return "fractional"
    if pa.types.is_timestamp(arrow_type):
        return "timestamp"
    if pa.types.is_date(arrow_type):
        return "date"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    return str(arrow_type)


def _spec_family(spec_type: str) -> str:
    if spec_type in _INTEGRAL:
        return "integral"
    if spec_type in ("double", "float") or spec_type.startswith("decimal"):
        return "fractional"
    return spec_type


def needed_columns(stream, query=None) -> list[str]:
    cols = list(stream.keys)
    for b in (query.band_classes.values() if query is not None else ()):  # band columns key the band classes
        if stream.name in (b.left, b.right) and b.column_of(stream.name) not in cols:
            cols.append(b.column_of(stream.name))
    if stream.event_time.column and stream.event_time.column not in cols:
        cols.append(stream.event_time.column)
    return cols


def file_problem(schema: pa.Schema, stream) -> str | None:
    """Why a landed file cannot be read for ``stream`` (None: it can)."""
    names = set(schema.names)
    for c in needed_columns(stream):
        if c not in names:
            return f"column {c!r} is missing (the file has {', '.join(schema.names)})"
        fam = _family(schema.field(c).type)
        if c in stream.keys and fam != "integral":
            return f"key column {c!r} has type {schema.field(c).type}; join keys must be integral"
        if c == stream.event_time.column:
            want = _spec_family(stream.columns[c])
            if fam != want:
                return (f"event-time column {c!r} has type {schema.field(c).type}, the spec declares "
                        f"{stream.columns[c]}")
    return None


def event_time_sql(stream, src, kind: str | None = None) -> str:
    """Event time of a row as epoch microseconds (NULL when unusable): the engine's rule
    (:func:`mjoin.model.eventtime.event_time_sql`) for the event-time column's ``kind`` in the files (default: its
    type as the DataFrame ``src`` reads it; an ``expr`` is typed by Spark on ``src``)."""
    et = stream.event_time
    if et.expr is None and kind is None:
        kind = eventtime.spark_kind(src.schema[et.column].dataType.simpleString())
        if kind == "int" and stream.columns.get(et.column) == "timestamp":
            kind = "ts_ns"  # a declared timestamp that Spark reads as long: nanoseconds (nanosAsLong)
    return eventtime.event_time_sql(et, kind, src)


# ---- reading ---------------------------------------------------------------------

def select_files(lake, stream, lo_epoch: float, hi_epoch: float | None, prune: bool, report: StreamReport) -> list[str]:
    """Landed files of ``stream`` whose arrival partition can hold rows with ``lo < ts``.

    Partition ``arrival=a`` holds arrivals in ``[a, next a)``; with ``ts <= arrival`` its
    rows have ``ts < next a``, so partitions with ``next a <= lo`` are skipped. Partitions
    that start after ``hi`` (the interval end plus the query's lateness) are skipped too:
    the engine drops rows that late."""
    arrivals = lake.arrivals(stream.source)
    report.arrivals_total = len(arrivals)
    keep = []
    for i, a in enumerate(arrivals):
        nxt = arrivals[i + 1] if i + 1 < len(arrivals) else None
        if prune and nxt is not None and nxt <= lo_epoch:
            continue
        if prune and hi_epoch is not None and a > hi_epoch:
            continue
        keep.append(a)
    report.arrivals_scanned = len(keep)
    files = []
    for a in keep:
        d = lake.arrival_dir(stream.source, a)
        files += [fsutil.join(d, n) for n in fsutil.listdir(d) if n.endswith(".parquet") and not n.startswith((".", "_"))]
    return files


def _spark_type(t: pa.DataType) -> str:
    """The Spark type to request for a Parquet column of arrow type ``t`` (integers widen to bigint)."""
    if pa.types.is_integer(t):
        return "bigint"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_floating(t):
        return "double"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):  # nanoseconds as long (nanosAsLong), as the engine reads them
        return "bigint" if t.unit == "ns" else "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_date(t):
        return "date"
    return "string"


def _footer_of(path, columns=()) -> tuple[pa.Schema, int, dict]:
    """A landed file's Arrow schema, row count and, per integral column of ``columns``, the ``(min, max)`` of
    its values from the row groups' statistics (``()``: only NULLs; ``None``: a row group has no statistics):
    its Parquet footer only."""
    fs, p = fsutil.resolve(path)
    with fs.open_input_file(p) as f:
        pf = pq.ParquetFile(f)
        meta, schema = pf.metadata, pf.schema_arrow
        ranges = {}
        for c in columns:
            if c not in schema.names or not pa.types.is_integer(schema.field(c).type):
                continue
            j = schema.get_field_index(c)
            lo = hi = None
            for rg in range(meta.num_row_groups):
                col = meta.row_group(rg).column(j)
                st = col.statistics
                if st is not None and st.has_null_count and st.null_count >= meta.row_group(rg).num_rows:
                    continue  # only NULLs (or no rows): no key to bound
                if st is None or not st.has_min_max:
                    lo = None
                    break
                lo = int(st.min) if lo is None else min(lo, int(st.min))
                hi = int(st.max) if hi is None else max(hi, int(st.max))
            else:
                ranges[c] = () if lo is None else (lo, hi)
                continue
            ranges[c] = None
        return schema, meta.num_rows, ranges


def _spark_path(path: str) -> str:
    return path if fsutil.is_url(path) else "file://" + fsutil.resolve(path)[1]


def checked_files(query, lake, grid: Grid, *, prune_arrivals: bool = True) -> tuple[dict, dict]:
    """``({stream: StreamReport}, {stream: {(Spark type signature, event-time kind): [paths]}})``: the landed
    files of every stream
    that the interval needs, each checked from its Parquet footer (unreadable or unusable files are skipped and
    reported with the reason)."""
    reports, usable = {}, {}
    for s in query.streams:
        rep = reports[s.name] = StreamReport(stream=s.name, source=s.source)
        lo = (grid.t0_us - s.window * US) / US
        files = select_files(lake, s, lo, grid.t1_us / US + query.lateness, prune_arrivals, rep)
        by_schema = usable[s.name] = {}
        for f in files:
            try:
                schema, num_rows, ranges = _footer_of(f, s.keys)
            except (OSError, pa.ArrowInvalid) as exc:
                rep.rejected_files.append({"file": f, "reason": f"unreadable Parquet: {exc}"})
                continue
            why = file_problem(schema, s)
            if why:
                rep.rejected_files.append({"file": f, "reason": why})
                continue
            sig = tuple(_spark_type(schema.field(c).type) for c in needed_columns(s, query))
            et_col = s.event_time.column
            kind = eventtime.arrow_kind(schema.field(et_col).type) if et_col else None  # None: an expr
            by_schema.setdefault((sig, kind), []).append(f)
            rep.rows_in_files += num_rows
            for c, lo_hi in ranges.items():
                if lo_hi != ():
                    rep.add_key_range(c, lo_hi)
        rep.files = sum(len(v) for v in by_schema.values())
        for r in rep.rejected_files:
            log.warning("stream %s: skipped %s: %s", s.name, r["file"], r["reason"])
    return reports, usable


def load_streams(spark, query, lake, grid: Grid, rule: dict | None, *, prune_arrivals: bool = True, files=None):
    """The narrow DataFrame of all streams (see module doc) and a report per stream (``files``: what
    :func:`checked_files` returned, if the caller has it already)."""
    classes = query.all_classes
    part_class = rule["attr_class"] if rule else None
    frames = []
    reports, usable = files or checked_files(query, lake, grid, prune_arrivals=prune_arrivals)
    for sid, s in enumerate(query.streams):
        by_schema = usable[s.name]
        lo_us = grid.t0_us - int(round(s.window * US))
        # one projection and one filter per file schema, as SQL strings: in a classic session every DataFrame
        # call is a round trip to the JVM and an analysis, and this plan is rebuilt every run
        keys = [(f"CAST(`{kc}` AS BIGINT)" if c not in query.band_classes else
                 f"CAST(`{kc}` * {10 ** query.band_scale(c)} AS BIGINT)") if kc else "CAST(NULL AS BIGINT)"
                for c, kc in ((c, query.key_column(s.name, c)) for c in classes)]
        own = [i for i, c in enumerate(classes) if query.key_column(s.name, c)]
        if len(own) > 1:  # a NULL in any key: no key at all (the engine quarantines the row, null_key)
            any_null = " OR ".join(f"({keys[i]}) IS NULL" for i in own)
            keys = [f"CASE WHEN {any_null} THEN CAST(NULL AS BIGINT) ELSE {k} END" if i in own else k
                    for i, k in enumerate(keys)]
        if part_class is None:
            g = "CAST(0 AS BIGINT)"
        else:
            # NULL key -> no group (sql_group_expr's range rule alone would give NULL keys group 0)
            kcol = f"({keys[classes.index(part_class)]})"
            g = f"CASE WHEN {kcol} IS NULL THEN NULL ELSE CAST({sql_group_expr(kcol, rule)} AS BIGINT) END"
        keep = f"t IS NULL OR (t > {lo_us} AND t <= {grid.t1_us})"
        for (sig, kind), paths in by_schema.items():
            if kind == "ts_ns":  # read as long nanoseconds, as the engine does (its ENGINE_CONF sets this too)
                spark.conf.set("spark.sql.legacy.parquet.nanosAsLong", "true")
            reader = spark.read
            if s.event_time.expr is None:
                # only the needed columns, with explicit types: other columns (even ones Spark cannot
                # read, like nanosecond timestamps) are never looked at, and int32 keys widen to bigint
                reader = reader.schema(", ".join(f"`{c}` {t}" for c, t in zip(needed_columns(s, query), sig)))
            src = reader.parquet(*[_spark_path(p) for p in paths])
            columns = [f"CAST({sid} AS INT) AS sid", f"{event_time_sql(s, src, kind)} AS t", f"{g} AS g",
                       *[f"{k} AS k{ci}" for ci, k in enumerate(keys)]]
            frames.append(src.selectExpr(*columns).where(keep))
    if frames:
        base = frames[0]
        for f in frames[1:]:
            base = base.union(f)  # the same columns in the same order
    else:
        schema = "sid int, t bigint, g bigint, " + ", ".join(f"k{i} bigint" for i in range(len(classes)))
        base = spark.createDataFrame([], schema)
    return base, reports


# ---- the same rows read on the driver (small intervals) ------------------------------------------

def driver_read_problem(spark, query) -> str | None:
    """Why :func:`read_routed` cannot produce exactly the rows Spark's projection would (None: it can). It
    covers the event-time columns that are a timestamp, a date or epoch seconds (integral or fractional) and
    integral keys; an event-time ``expr`` or ``format`` (Spark SQL), band classes (scaled keys) and a session
    time zone other than UTC (Spark reads zone-less timestamps and dates in it) stay with Spark."""
    if getattr(query, "bands", ()) or query.band_classes:
        return "band classes"
    for s in query.streams:
        if s.event_time.expr is not None or s.event_time.format is not None:
            return f"stream {s.name}: event time from a Spark SQL expression or pattern"
        if _spec_family(s.columns.get(s.event_time.column, "")) not in ("timestamp", "date", "integral", "fractional"):
            return f"stream {s.name}: event time of type {s.columns.get(s.event_time.column)}"
    try:
        tz = spark.conf.get("spark.sql.session.timeZone")
    except Exception:  # noqa: BLE001 - a session that cannot tell: leave it to Spark
        return "the session time zone is unknown"
    if tz not in ("UTC", "Etc/UTC", "Z", "+00:00", "GMT"):
        return f"session time zone {tz} (not UTC)"
    return None


def _micros(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Event time as epoch microseconds and its validity, as :func:`event_time_sql` computes it in a UTC
    session: :func:`mjoin.model.eventtime.micros_arrow` of the column's kind."""
    try:
        us = eventtime.micros_arrow(col, eventtime.arrow_kind(col.type))
    except ValueError as exc:  # a string: Spark's to parse
        raise DriverReadUnsupported(f"an event-time column of type {col.type}: {exc}") from None
    return us.fill_null(0).to_numpy(), ~np.asarray(us.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def _groups(key: np.ndarray, key_ok: np.ndarray, rule: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """The key group of each row (:func:`mjoin.model.keygroups.group_of`, as ``partition.sql_group_expr``); NULL
    where the key is NULL (no rule: every row in group 0)."""
    if not rule:
        return np.zeros(len(key), dtype=np.int64), np.ones(len(key), dtype=bool)
    return np.where(key_ok, group_of(key, rule), 0), key_ok


class DriverReadUnsupported(ValueError):
    """A landed file whose columns :func:`read_routed` does not convert exactly as Spark does (the caller reads
    the interval with Spark instead)."""


def _int64(col: pa.ChunkedArray, what: str) -> np.ndarray:
    if not (pa.types.is_signed_integer(col.type) or pa.types.is_unsigned_integer(col.type) and col.type.bit_width < 64):
        raise DriverReadUnsupported(f"{what} has type {col.type}")
    return pc.cast(col, pa.int64()).fill_null(0).to_numpy()


def read_routed(query, grid: Grid, rule: dict | None, usable: dict, stream_classes: list[list[int]]) -> pa.Table:
    """The rows ``exact.route(load_streams(...), ...)`` collects (``ci, sid, t, g, key``: every row once per
    attribute class of its stream, lead-in and NULL event times included), read with pyarrow on the driver from
    the files :func:`checked_files` kept: no Spark job for an interval small enough for the driver's kernel.
    Only where :func:`driver_read_problem` is None (tests compare both readers)."""
    classes = query.all_classes
    part_class = rule["attr_class"] if rule else None
    parts = []
    for sid, s in enumerate(query.streams):
        cols = needed_columns(s, query)
        key_cols = [query.key_column(s.name, c) for c in classes]
        lo_us = grid.t0_us - int(round(s.window * US))
        same_types: dict = {}  # the stream's files by the Arrow types of their needed columns: converted at once
        for paths in usable[s.name].values():
            for path in paths:
                fs, p = fsutil.resolve(path)
                with fs.open_input_file(p) as f:  # ParquetFile.read: ~2.5x faster than read_table on small files
                    table = pq.ParquetFile(f).read(columns=cols, use_threads=False)
                table = pa.table({c: table.column(c) for c in cols})  # no file or field metadata
                same_types.setdefault(tuple(str(fld.type) for fld in table.schema), []).append(table)
        for tables in same_types.values():
            table = pa.concat_tables(tables)
            t, t_ok = _micros(table.column(s.event_time.column))
            keep = ~t_ok | ((t > lo_us) & (t <= grid.t1_us))
            if not keep.any():
                continue
            keys = []
            for kc in key_cols:
                if kc is None:
                    keys.append((np.zeros(int(keep.sum()), np.int64), np.zeros(int(keep.sum()), bool)))
                    continue
                col = table.column(kc)
                ok = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
                keys.append((_int64(col, f"stream {s.name}: key column {kc}")[keep], ok[keep]))
            own = [i for i, kc in enumerate(key_cols) if kc is not None]
            if len(own) > 1:  # a NULL in any key: no key at all, as load_streams (the engine's null_key)
                all_ok = np.logical_and.reduce([keys[i][1] for i in own])
                keys = [(k, ok & all_ok) if i in own else (k, ok) for i, (k, ok) in enumerate(keys)]
            if part_class is None:
                g, g_ok = _groups(keys[0][0], keys[0][1], None)
            else:
                g, g_ok = _groups(*keys[classes.index(part_class)], rule)
            tk, tk_ok = t[keep], t_ok[keep]
            for ci in stream_classes[sid]:
                k, k_ok = keys[ci]
                parts.append(pa.table({
                    "ci": pa.array(np.full(len(tk), ci, np.int32)),
                    "sid": pa.array(np.full(len(tk), sid, np.int32)),
                    "t": pa.array(tk, mask=~tk_ok),
                    "g": pa.array(g, mask=~g_ok),
                    "key": pa.array(k, mask=~k_ok),
                }))
    if not parts:
        return pa.table({"ci": pa.array([], pa.int32()), "sid": pa.array([], pa.int32()),
                         "t": pa.array([], pa.int64()), "g": pa.array([], pa.int64()),
                         "key": pa.array([], pa.int64())})
    return pa.concat_tables(parts)
