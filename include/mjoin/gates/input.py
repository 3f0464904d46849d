"""Gate 1: the raw input of one interval, per stream (the files landed under ``<lake>/streams/<source>/``).

Cheap by default: per file, pyarrow reads the Parquet footer (schema, row count,
row-group statistics). NULL-key and event-time counts come from the footer's
statistics when they settle the question (no NULLs; min and max event time inside
the bounds) and otherwise from reading just the key and event-time columns.
Event times given as a string column with a Spark ``format`` are parsed with DuckDB's
``try_strptime`` (the pattern translated by :func:`strptime_pattern`); a Spark SQL ``expr``
is evaluated only by the Spark engine (with pyarrow the late/future rules are skipped for
that stream, and the result says so).

Duplicate files, against the files of the interval and of the lookback before it: the
same bytes (files of equal size are hashed, sha256, so only candidates are read in
full), the same file name when names are unique (not the lake's positional
``part-<n>.parquet``), or the same rows by their footer fingerprint (row count, schema,
and every column's min, max and NULL count).

The per-file numbers become small pandas frames that GX validates in ~0.05 s:
Late and future: a row is late when its event time is before the interval's start minus the late
tolerance; it is *future* by the landing contract's rule, the join engine's (:mod:`mjoin.lake.contract`):
at or after its arrival folder's epoch plus the future allowance (``future_allowance``, default two of
the lake's arrival cycles); a file whose rows are mostly future fails ``input.event_time_not_future``
(the engine quarantines it whole).

``files`` (one row per file), ``cycles`` (one row per stream and arrival cycle, and one
``<stream>@interval`` row per stream: the NULL-key, late and future counts and the row count are
checked per cycle, so one bad cycle is not diluted by good ones, and over the interval, so a
sustained shift too small for one cycle is seen) and ``streams`` (per-interval totals and the
stream's history, for the report). A cycle without an arrival folder is a cycle with no rows.

The limits are statistical (:mod:`mjoin.gates.bounds`): each stream's own history (its files
landed in ``fraction_history`` before the interval, footers only when they settle it) gives its
usual NULL-key, late and future shares and its rows per cycle; a cycle fails when its bad rows
exceed the binomial upper bound of its checked rows at the stream's tolerated share (the history's
upper bound x ``fraction_slack``, capped by ``*_fraction_max``; the cap itself without history), or
its rows fall below ``min_rows_per_cycle`` (for a sparse stream: below its Poisson lower bound).

``config.input_engine="spark"`` (or ``spark=`` given) scans the key and event-time
columns with Spark instead (:mod:`mjoin.gates.input_spark`), for raw input too big for
the driver; footers and hashes are still read with pyarrow.
"""
from __future__ import annotations

import math
import os
from collections import defaultdict

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.gates.base import GateRun
from mjoin.gates.bounds import count_limit, row_alpha, rows_floor, tolerated_share
from mjoin.gates.config import DEFAULT_POSITIONAL, GateConfig, GateConfigError
from mjoin.gates.result import GateResult
from mjoin.gates.suites import input_cycles_suite, input_files_suite
from mjoin.lake.contract import (US, FileFacts, Seen, arrival_cycle, file_size, footer_fingerprint, future_allowance,
                                 future_from_us, future_problem, inspect as inspect_file, to_epoch_seconds, type_problem,
                                 young_allowance)
from mjoin.model.timeutil import cycles as cycle_starts, iso, parse_duration, parse_time
from mjoin.runtime import fsutil

# ---- schema --------------------------------------------------------------------------------

# ---- event time --------------------------------------------------------------------------------

def event_time_column(stream) -> str | None:
    """The column holding the event time as a timestamp, date or epoch seconds; None when it is derived
    (``expr``) or parsed from a string (``format``)."""
    et = stream.event_time
    if et.expr is not None or et.format is not None:
        return None
    return et.column


#: Spark datetime pattern letters (runs of one letter) -> DuckDB strptime specifiers
_SPARK_LETTERS = {
    "y": {1: "%Y", 2: "%y", 3: "%Y", 4: "%Y"}, "M": {1: "%m", 2: "%m", 3: "%b", 4: "%B"},
    "L": {1: "%m", 2: "%m", 3: "%b", 4: "%B"}, "d": {1: "%d", 2: "%d"}, "D": {1: "%j", 2: "%j", 3: "%j"},
    "H": {1: "%H", 2: "%H"}, "h": {1: "%I", 2: "%I"}, "m": {1: "%M", 2: "%M"}, "s": {1: "%S", 2: "%S"},
    "S": {3: "%g", 6: "%f", 9: "%n"}, "a": {1: "%p"}, "E": {1: "%a", 2: "%a", 3: "%a", 4: "%A"},
    "X": {1: "%z", 2: "%z", 3: "%z"}, "x": {1: "%z", 2: "%z", 3: "%z"}, "Z": {1: "%z", 2: "%z", 3: "%z"},
}


def strptime_pattern(spark_pattern: str) -> str | None:
    """The DuckDB ``strptime`` format of a Spark datetime pattern (``yyyy-MM-dd HH:mm:ss`` ->
    ``%Y-%m-%d %H:%M:%S``), or None if it uses letters without an equivalent (eras, quarters,
    zone names, optional sections, fractions other than 3, 6 or 9 digits)."""
    out, i, p = [], 0, spark_pattern
    while i < len(p):
        c = p[i]
        if c == "'":  # quoted literal text; '' is a quote, inside or outside a quoted section
            if p.startswith("''", i):
                out.append("'")
                i += 2
                continue
            j, text = i + 1, []
            while True:
                if j >= len(p):
                    return None
                if p.startswith("''", j):
                    text.append("'")
                    j += 2
                elif p[j] == "'":
                    break
                else:
                    text.append(p[j])
                    j += 1
            out.append("".join(text).replace("%", "%%"))
            i = j + 1
            continue
        if c.isalpha():
            j = i
            while j < len(p) and p[j] == c:
                j += 1
            spec = _SPARK_LETTERS.get(c, {}).get(j - i)
            if spec is None:
                return None
            out.append(spec)
            i = j
            continue
        if c in "[]{}#":
            return None
        out.append("%%" if c == "%" else c)
        i += 1
    return "".join(out)


def parse_event_times(arr, spark_pattern: str) -> np.ndarray:
    """Epoch seconds (NaN for NULL or unparseable, as Spark's ``try_to_timestamp``) of strings in a Spark
    datetime pattern, parsed with DuckDB; a pattern without a zone is read as UTC (the Spark session's)."""
    fmt = strptime_pattern(spark_pattern)
    if fmt is None:
        raise ValueError(f"the pattern {spark_pattern!r} has no strptime equivalent")
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("event_times", pa.table({"s": pc.cast(arr, pa.string())}))
        fmt_sql = fmt.replace("'", "''")
        col = con.execute(f"SELECT epoch_us(try_strptime(s, '{fmt_sql}')) AS us FROM event_times").arrow()
    finally:
        con.close()
    us = col.column("us") if hasattr(col, "column") else col.read_all().column("us")
    return to_epoch_seconds(us) / 1e6


# ---- one file ----------------------------------------------------------------------------------

def _stats_shortcut(md, schema: pa.Schema, keys: list[str], ts: str | None, lo: float, hi: float):
    """Counts settled by the footer's row-group statistics alone, else None for that part (``lo``: late before
    it, ``hi``: future at or after it; seconds).

    Returns ``(null_key_rows or None, (late, future, ts_min, ts_max, null_ts) or None)``."""
    names = [md.schema.column(i).path for i in range(md.num_columns)]
    null_key_rows = None
    if keys and all(k in names for k in keys):
        counts = []
        for rg in range(md.num_row_groups):
            for k in keys:
                st = md.row_group(rg).column(names.index(k)).statistics
                if st is None or not st.has_null_count:
                    counts = None
                    break
                counts.append(st.null_count)
            if counts is None:
                break
        if counts is not None:
            if len(keys) == 1:
                null_key_rows = int(sum(counts))
            elif sum(counts) == 0:
                null_key_rows = 0
    ts_part = None
    if ts is not None and ts in names and md.num_row_groups > 0:
        mins, maxs, nulls = [], [], 0
        try:
            for rg in range(md.num_row_groups):
                st = md.row_group(rg).column(names.index(ts)).statistics
                if st is None or not st.has_min_max or not st.has_null_count:
                    raise LookupError("no statistics")
                mins.append(st.min)
                maxs.append(st.max)
                nulls += st.null_count
            bounds = to_epoch_seconds(pa.array([min(mins), max(maxs)], type=schema.field(ts).type))
        except (LookupError, pa.ArrowException, TypeError, ValueError):
            bounds = None
        if bounds is not None and np.all(np.isfinite(bounds)) and bounds[0] >= lo and bounds[1] < hi:
            ts_part = (0, 0, float(bounds[0]), float(bounds[1]), int(nulls))
    elif ts is not None and ts in names and md.num_row_groups == 0:
        ts_part = (0, 0, math.nan, math.nan, 0)
    return null_key_rows, ts_part


def usable_columns(stream, schema: pa.Schema, *, spark: bool = False) -> tuple[list[str], str | None]:
    """``(keys, ts)`` that can be counted in a file: all join keys (or none) and the event-time column
    (a timestamp, date or epoch-seconds column, or a string column with a ``format`` that pyarrow can
    parse or ``spark`` is used), each present with a type the spec allows. ``ts`` is None for an
    ``expr`` event time."""
    keys = [k for k in stream.keys if k in schema.names and type_problem(stream.columns[k], schema.field(k).type) is None]
    keys = keys if len(keys) == len(stream.keys) else []
    et = stream.event_time
    ts = None if et.expr is not None else et.column
    if et.format is not None and strptime_pattern(et.format) is None and not spark:
        ts = None
    if ts is not None and (ts not in schema.names or type_problem(stream.columns[ts], schema.field(ts).type)):
        ts = None
    return keys, ts


def unchecked_event_time(stream, spark: bool) -> str | None:
    """Why late and future tuples of ``stream`` cannot be counted by this engine (None: they can)."""
    et = stream.event_time
    if spark:
        return None
    if et.expr is not None:
        return (f"event time is the Spark SQL expression {et.expr!r}: only the Spark engine evaluates it "
                "(input_engine=spark)")
    if et.format is not None and strptime_pattern(et.format) is None:
        return (f"the event-time pattern {et.format!r} has no strptime equivalent: only the Spark engine parses it "
                "(input_engine=spark)")
    return None


def summarize_file(path: str, stream, lo: float, hi: float | None, *, scan: bool = True) -> dict:
    """The contract's file-level rules (:func:`mjoin.lake.contract.inspect`: readable, key columns, schema, event
    time, mostly future, footer fingerprint) and, with ``scan``, NULL-key and event-time counts of one landed
    file: late before ``lo``, future at or after ``hi`` (seconds: the file's future bound,
    :func:`mjoin.lake.contract.future_from_us`; None: no row is future)."""
    out = {"rows": math.nan, "read_error": None, "schema_problem": None, "missing_keys": None,
           "no_event_time": None, "future_file": None, "null_key_rows": math.nan, "late": math.nan,
           "future": math.nan, "ts_min": math.nan, "ts_max": math.nan, "null_ts": math.nan, "shortcut": False,
           "scan_columns": (), "fingerprint": None}
    facts = inspect_file(path, stream)
    out.update(read_error=facts.read_error, schema_problem=facts.schema_problem, missing_keys=facts.missing_keys,
               no_event_time=facts.no_event_time, fingerprint=facts.fingerprint)
    if facts.read_error:
        return out
    if facts.problem() is None and hi is not None:  # the engine's whole-file rule, after the others
        out["future_file"] = future_problem(facts, stream, int(round(hi * US)))
    hi = math.inf if hi is None else hi
    out["rows"] = facts.rows
    fmt = stream.event_time.format
    schema = facts.schema
    keys, ts = usable_columns(stream, schema)
    if stream.event_time.expr is not None:  # the expression may read any column: Spark reads them all
        out["scan_columns"] = tuple((f.name, str(f.type)) for f in schema)
    else:
        skeys, sts = usable_columns(stream, schema, spark=True)
        out["scan_columns"] = tuple((c, str(schema.field(c).type)) for c in skeys + ([sts] if sts else []))
    if not scan:
        return out
    fs, p = fsutil.resolve(path)
    try:
        with fs.open_input_file(p) as fh:
            pf = pq.ParquetFile(fh)
            md = pf.metadata
            # footer min/max settle the event times of a time column, not of strings in a pattern
            null_key_rows, ts_part = _stats_shortcut(md, schema, keys, ts if fmt is None else None, lo, hi)
            need = ([k for k in keys] if keys and null_key_rows is None else []) + ([ts] if ts and ts_part is None else [])
            table = pf.read(columns=need) if need else None
    except (OSError, pa.ArrowException) as exc:
        out["read_error"] = f"{type(exc).__name__}: {exc}"
        return out
    if keys:
        if null_key_rows is None:
            mask = None
            for k in keys:
                m = table.column(k).is_null().to_numpy(zero_copy_only=False)
                mask = m if mask is None else (mask | m)
            null_key_rows = int(mask.sum()) if mask is not None else 0
        out["null_key_rows"] = null_key_rows
    if ts:
        if ts_part is None:
            secs = parse_event_times(table.column(ts), fmt) if fmt else to_epoch_seconds(table.column(ts))
            ok = np.isfinite(secs)
            future = (np.round(secs[ok] * US) >= round(hi * US)) if math.isfinite(hi) else np.zeros(int(ok.sum()), bool)
            ts_part = (int((secs[ok] < lo).sum()), int(future.sum()),
                       float(secs[ok].min()) if ok.any() else math.nan,
                       float(secs[ok].max()) if ok.any() else math.nan, int((~ok).sum()))
        else:
            out["shortcut"] = True
        out["late"], out["future"], out["ts_min"], out["ts_max"], out["null_ts"] = ts_part
    return out


def file_fingerprint(path: str) -> tuple[int | None, str | None]:
    """``(rows, footer fingerprint)`` of a file (``(None, None)`` if its footer cannot be read)."""
    fs, p = fsutil.resolve(path)
    try:
        with fs.open_input_file(p) as fh:
            pf = pq.ParquetFile(fh)
            return pf.metadata.num_rows, footer_fingerprint(pf.metadata, pf.schema_arrow)
    except (OSError, pa.ArrowException):
        return None, None


def find_duplicates(files: list[dict], positional_names: str = DEFAULT_POSITIONAL) -> dict:
    """``{path: (earlier label, kind)}`` for files that repeat an earlier one of ``files`` (dicts with
    ``path``, ``label``, ``rows``, ``fingerprint``, in landing order), by the contract's rule
    (:class:`mjoin.lake.contract.Seen`: same bytes, same non-positional name, same footer fingerprint)."""
    seen = Seen(positional=positional_names)
    dup = {}
    for f in files:
        try:
            size = file_size(f["path"])
        except OSError:
            size = None
        facts = FileFacts(path=f["path"], stream="", size=size, rows=None if _nan(f.get("rows")) else f.get("rows"),
                          fingerprint=f.get("fingerprint"))
        earlier = seen.duplicate_of(facts)
        if earlier:
            dup[f["path"]] = earlier
        else:
            seen.add(facts, label=f["label"])
    return dup


# ---- the interval --------------------------------------------------------------------------------

def landed(lake, source: str, t_from: float, t_to: float) -> list[tuple[int, str]]:
    """``[(arrival_epoch, path)]`` of the Parquet files landed for ``source`` in ``[t_from, t_to)``."""
    out = []
    for a in lake.arrivals(source):
        if t_from <= a < t_to:
            d = lake.arrival_dir(source, a)
            out += [(a, fsutil.join(d, n)) for n in sorted(fsutil.listdir(d)) if n.endswith(".parquet")]
    return out


def _rel(lake, path: str) -> str:
    root = str(lake.root).rstrip("/")
    if fsutil.is_url(root):
        return path[len(root) + 1:] if path.startswith(root + "/") else path
    return os.path.relpath(fsutil.resolve(path)[1], fsutil.resolve(root)[1])


def _nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _totals(rows: list[dict]) -> dict:
    """Rows, NULL-key rows, late and future rows and their fractions over some files of one stream."""
    keyed = [r for r in rows if not _nan(r["null_key_rows"])]
    timed = [r for r in rows if not _nan(r["late"])]
    key_rows = sum(int(r["rows"]) for r in keyed)
    ts_rows = sum(int(r["rows"]) - int(r["null_ts"]) for r in timed)
    nk = sum(int(r["null_key_rows"]) for r in keyed)
    late = sum(int(r["late"]) for r in timed)
    fut = sum(int(r["future"]) for r in timed)
    mins = [r["ts_min"] for r in timed if not _nan(r["ts_min"])]
    maxs = [r["ts_max"] for r in timed if not _nan(r["ts_max"])]
    return {
        "files": len(rows), "rows": sum(int(r["rows"]) for r in rows if not _nan(r["rows"])),
        "key_checked_rows": key_rows, "null_key_rows": nk, "null_key_fraction": nk / key_rows if key_rows else math.nan,
        "ts_checked_rows": ts_rows, "late": late, "late_fraction": late / ts_rows if ts_rows else math.nan,
        "future": fut, "future_fraction": fut / ts_rows if ts_rows else math.nan,
        "null_ts": sum(int(r["null_ts"]) for r in timed),
        "ts_min": iso(min(mins)) if mins else None, "ts_max": iso(max(maxs)) if maxs else None,
    }


FILE_COLUMNS = ["where", "stream", "arrival", "cycle", "rows", "read_error", "schema_problem", "missing_keys",
                "no_event_time", "future_file", "duplicate_of", "duplicate_kind", "null_key_rows", "late", "future", "ts_min", "ts_max", "null_ts",
                "footer_only"]

#: the fraction rules: (name, bad-row column, checked-row column, cap field of GateConfig)
FRACTIONS = (("null_key", "null_key_rows", "key_checked_rows", "null_key_fraction_max"),
             ("late", "late", "ts_checked_rows", "late_fraction_max"),
             ("future", "future", "ts_checked_rows", "future_fraction_max"))


def first_arrival(query, lake) -> int | None:
    """The first arrival cycle landed for any stream of ``query`` (None: nothing landed yet)."""
    firsts = [a[0] for a in (lake.arrivals(s) for s in {st.source for st in query.streams}) if a]
    return min(firsts) if firsts else None


def stream_history(query, stream, lake, t0: float, unit: float, cfg: GateConfig, began: int | None,
                   summaries: dict, allowance: float | None = None) -> dict:
    """A stream's own history before ``t0``: its landed files of ``[t0 - fraction_history, t0)`` (not
    before the query's first landed cycle ``began``), summarized from their footers like the interval's
    (late relative to each file's own arrival cycle, future by the contract's rule: ``allowance``), their
    totals, and the span in cycles of ``unit`` seconds. ``summaries`` (path -> summary) is filled for reuse by
    the duplicate check."""
    h0 = t0 - cfg.fraction_history
    if began is not None:
        h0 = max(h0, float(began))
    span = max(0.0, t0 - h0) / unit if unit > 0 else 0.0
    if cfg.fraction_history <= 0 or span < 1:
        return {"cycles": 0.0, **_totals([])}
    late_tol = cfg.late_tolerance_for(query)
    rows = []
    for a, p in landed(lake, stream.source, h0, t0):
        x = summaries.get(p)
        if x is None:
            x = summaries[p] = summarize_file(p, stream, a - late_tol, _future_s(a, allowance))
        if x["read_error"] is None and not _nan(x["rows"]):
            rows.append(x)
    return {"from": iso(h0), "cycles": span, **_totals(rows)}


def _future_s(arrival: int, allowance: float | None) -> float | None:
    bound = future_from_us(int(arrival), allowance)
    return None if bound is None else bound / US


def lake_future_allowance(query, lake, cfg: GateConfig) -> tuple[float | None, float | None]:
    """``(future allowance in seconds or None, the lake's arrival cycle or None)``: ``cfg.future_allowance``,
    else two of the lake's arrival cycles inferred from every arrival folder of the query's sources, as the join
    engine infers them (:func:`mjoin.lake.contract.arrival_cycle`), else the query's shortest window."""
    cycle = arrival_cycle([lake.arrivals(src) for src in dict.fromkeys(s.source for s in query.streams)])
    return future_allowance(cfg.future_allowance, cycle, young_allowance(query)), cycle


def judge_rows(rows: list[dict], history: dict, cfg: GateConfig, quiet: set) -> None:
    """Add to every summary row (a stream's cycle or its interval) the limits the cycles suite checks:
    ``<kind>_limit`` (the most bad rows its checked rows may hold at the stream's tolerated share
    ``<kind>_share``, from ``<kind>_basis``: history, cap or config) and ``min_rows`` (rows it must hold).
    Bonferroni over all rows: each is judged at (1 - fraction_confidence) / len(rows)."""
    alpha = row_alpha(cfg.fraction_confidence, len(rows))
    for r in rows:
        h = history[r["stream"]]
        for kind, bad, checked, cap in FRACTIONS:
            share, basis = tolerated_share(h[bad], h[checked], getattr(cfg, cap), cfg.fraction_confidence,
                                           cfg.fraction_slack)
            r[f"{kind}_share"], r[f"{kind}_basis"] = share, basis
            r[f"{kind}_limit"] = count_limit(r[checked], share, alpha)
        cycles = r.pop("_cycles")
        if r["stream"] in quiet:
            r["min_rows"] = 0
            continue
        wanted = cfg.min_rows_per_cycle * cycles
        if h["cycles"] >= 1 and h["rows"] > 0:  # a sparse stream may skip cycles, not go quiet (a stream with no
            # rows in its whole history is not sparse: it is dead, or quiet by config, never judged by a rate of 0)
            rate = h["rows"] / h["cycles"]
            wanted = min(wanted, rows_floor(rate * cycles / cfg.fraction_slack, alpha))
        r["min_rows"] = int(wanted)


def summarize_input(query, lake, start, end, *, cycle: float | str | None = None, config: GateConfig | None = None,
                    spark=None) -> dict:
    """The frames the input suites check: ``files`` (one row per file) and ``cycles`` (one row per stream and
    arrival cycle, plus one ``<stream>@interval`` row per stream when there are several cycles: counts,
    fractions, the limits of :func:`judge_rows`), plus ``streams`` (the interval's totals per stream and
    its history, for the report) and ``bounds``."""
    cfg = config or GateConfig()
    unknown = [s for s in cfg.quiet_streams if s not in query.stream_names]
    if unknown:
        raise GateConfigError(f"quiet_streams names unknown stream(s) {', '.join(unknown)} "
                              f"(streams: {', '.join(query.stream_names)})")
    t0, t1 = parse_time(start).timestamp(), parse_time(end).timestamp()
    cycle = None if cycle is None else parse_duration(cycle)
    if cycle is not None and cycle <= 0:
        raise GateConfigError("the cycle length must be positive")
    if t1 <= t0:
        raise GateConfigError(f"empty interval [{iso(t0)}, {iso(t1)})")
    lo = t0 - cfg.late_tolerance_for(query)
    allowance, lake_cycle = lake_future_allowance(query, lake, cfg)
    lookback = cfg.duplicate_lookback_for(query)
    starts = [c.timestamp() for c in cycle_starts(t0, t1, cycle)] if cycle else [t0]
    use_spark = spark is not None or cfg.input_engine == "spark"
    began = first_arrival(query, lake)

    file_rows, stream_rows, cycle_rows, history = [], [], [], {}
    for s in query.streams:
        files = landed(lake, s.source, t0, t1)
        before: dict = {}  # footers of earlier files, read once for the history and the duplicate check
        history[s.name] = stream_history(query, s, lake, t0, cycle or (t1 - t0), cfg, began, before, allowance)
        earlier = landed(lake, s.source, t0 - lookback, t0) if lookback > 0 else []
        summaries = {p: summarize_file(p, s, lo, _future_s(a, allowance), scan=not use_spark) for a, p in files}
        candidates = []
        for _, p in earlier:
            rows, fp = (before[p]["rows"], before[p]["fingerprint"]) if p in before else file_fingerprint(p)
            candidates.append({"path": p, "label": _rel(lake, p), "rows": rows, "fingerprint": fp})
        candidates += [{"path": p, "label": _rel(lake, p), "rows": summaries[p]["rows"],
                        "fingerprint": summaries[p]["fingerprint"]} for _, p in files]
        dups = find_duplicates(candidates, cfg.positional_file_names)
        if use_spark:
            # imported here, not at the top: the input gate imports no Spark unless it is asked to scan with it
            from mjoin.gates.input_spark import scan_with_spark

            # one Spark scan per set of usable columns (and their types): a multi-file read needs one schema
            batches = defaultdict(list)
            for p, x in summaries.items():
                if x["read_error"] is None and x.get("scan_columns"):
                    batches[x["scan_columns"]].append(p)
            for columns, paths in batches.items():
                names = {c for c, _ in columns}
                keys = [k for k in s.keys if k in names]
                keys = keys if len(keys) == len(s.keys) else []
                ts_column = s.event_time.column
                timed = s.event_time.expr is not None or ts_column in names
                for p, counts in scan_with_spark(spark, s, paths, lo, allowance, keys=keys, timed=timed,
                                                 columns=None if s.event_time.expr is not None else sorted(names)).items():
                    summaries[p].update(counts)
        mine = []
        for a, p in files:
            x = summaries[p]
            i = int((a - t0) // cycle) if cycle else 0
            dup_of, dup_kind = dups.get(p, (None, None))
            row = {"where": _rel(lake, p), "stream": s.name, "arrival": iso(a), "cycle": iso(starts[min(i, len(starts) - 1)]),
                   "cycle_index": i, "rows": x["rows"], "read_error": x["read_error"],
                   "schema_problem": x["schema_problem"], "missing_keys": x["missing_keys"],
                   "no_event_time": x["no_event_time"], "future_file": x["future_file"], "duplicate_of": dup_of,
                   "duplicate_kind": dup_kind, "null_key_rows": x["null_key_rows"], "late": x["late"],
                   "future": x["future"], "ts_min": x["ts_min"], "ts_max": x["ts_max"], "null_ts": x["null_ts"],
                   "footer_only": x["shortcut"]}
            mine.append(row)
            file_rows.append(row)
        unchecked = unchecked_event_time(s, use_spark)
        h = history[s.name]
        stream_rows.append({"where": s.name, "source": s.source, **_totals(mine),
                            "event_time": s.event_time.to_spec(), "event_time_checked": unchecked is None,
                            "event_time_unchecked": unchecked,
                            "history": {k: h.get(k) for k in ("from", "cycles", "rows", "null_key_rows",
                                                              "key_checked_rows", "late", "future", "ts_checked_rows")}})
        for i, c in enumerate(starts):  # a cycle without a folder is a cycle with no rows
            cycle_rows.append({"where": f"{s.name}@{iso(c)}", "stream": s.name, "cycle": iso(c),
                               **_totals([r for r in mine if r["cycle_index"] == i]), "_cycles": 1})
        if len(starts) > 1:  # the interval as a whole: a sustained shift too small to show in one cycle
            cycle_rows.append({"where": f"{s.name}@interval", "stream": s.name, "cycle": None, **_totals(mine),
                               "_cycles": len(starts)})
    judge_rows(cycle_rows, history, cfg, set(cfg.quiet_streams))
    files_df = pd.DataFrame(file_rows, columns=FILE_COLUMNS)
    streams_df = pd.DataFrame(stream_rows)
    cycles_df = pd.DataFrame(cycle_rows)
    for df in (streams_df, cycles_df):
        for c in ("ts_min", "ts_max"):
            df[c] = df[c].astype(object)
    return {"files": files_df, "cycles": cycles_df, "streams": streams_df,
            "bounds": {"event_time_from": iso(lo), "future_allowance_seconds": allowance, "arrival_cycle_seconds": lake_cycle,
                       "engine": "spark" if use_spark else "pyarrow",
                       "first_arrival": iso(began) if began is not None else None}}


def check_input(query, lake, start, end, *, cycle: float | str | None = None, config: GateConfig | None = None,
                spark=None) -> GateResult:
    """Check the raw input landed for every stream of ``query`` with arrival in ``[start, end)``: files, and
    per stream and arrival cycle (``cycle``; the whole interval is one cycle without it) the NULL-key,
    late and future fractions and the row count."""
    cfg = config or GateConfig()
    run = GateRun("input", query, cfg)
    cycle = None if cycle is None else parse_duration(cycle)
    frames = summarize_input(query, lake, start, end, cycle=cycle, config=cfg, spark=spark)
    run.check(input_files_suite(query, cfg), frames["files"])
    run.check(input_cycles_suite(query, cfg, cfg.late_tolerance_for(query)), frames["cycles"])
    for st in frames["streams"].to_dict("records"):
        if st["event_time_unchecked"]:
            run.note(f"{st['where']}: {st['event_time_unchecked']}; its late and future tuples are not counted")
            run.skip(["input.late_fraction_below_max", "input.future_fraction_below_max"],
                     f"{st['where']}: {st['event_time_unchecked']}")
    nts = frames["streams"]["null_ts"].sum() if len(frames["streams"]) else 0
    if nts:
        run.note(f"{int(nts)} row(s) with a NULL or unparseable event time (not counted as late or future)")
    run.details.update({"start": iso(parse_time(start)), "end": iso(parse_time(end)), "cycle_seconds": cycle,
                        **frames["bounds"], "streams": frames["streams"].to_dict("records"),
                        "cycles": frames["cycles"].to_dict("records"),
                        "files": int(len(frames["files"])),
                        "files_footer_only": int(frames["files"]["footer_only"].sum()) if len(frames["files"]) else 0,
                        "duplicates": frames["files"].loc[frames["files"]["duplicate_of"].notna(),
                                                          ["where", "duplicate_of", "duplicate_kind"]].to_dict("records")})
    return run.result()
