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
``files`` (one row per file), ``cycles`` (one row per stream and arrival cycle: the
NULL-key, late and future fractions and the row count are checked per cycle, so one bad
cycle is not diluted by good ones; cycles with fewer than ``fraction_min_rows`` checked rows
are pooled into one row ``<stream>@small cycles``, so their fractions are judged together
instead of on a handful of rows) and ``streams`` (per-interval totals, for the report).

``config.input_engine="spark"`` (or ``spark=`` given) scans the key and event-time
columns with Spark instead (:mod:`mjoin.gates.input_spark`), for raw input too big for
the driver; footers and hashes are still read with pyarrow.
"""
from __future__ import annotations

import math
import os
import re
from collections import defaultdict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import fsutil
from ..contract import (SAME_BYTES, SAME_NAME, SAME_ROWS, FileFacts, Seen, file_size, footer_fingerprint,  # noqa: F401
                        schema_problems, to_epoch_seconds, type_problem)
from ..contract import inspect as inspect_file
from ..timeutil import cycles as cycle_starts
from ..timeutil import iso, parse_duration, parse_time
from .base import GateRun
from .config import DEFAULT_POSITIONAL, GateConfig, GateConfigError
from .result import GateResult
from .suites import input_cycles_suite, input_files_suite

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
    import duckdb

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
    """Counts settled by the footer's row-group statistics alone, else None for that part.

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


def summarize_file(path: str, stream, lo: float, hi: float, *, scan: bool = True) -> dict:
    """The contract's file-level rules (:func:`mjoin.contract.inspect`: readable, key columns, schema, event
    time, footer fingerprint) and, with ``scan``, NULL-key and event-time counts of one landed file."""
    out = {"rows": math.nan, "read_error": None, "schema_problem": None, "missing_keys": None,
           "no_event_time": None, "null_key_rows": math.nan, "late": math.nan, "future": math.nan,
           "ts_min": math.nan, "ts_max": math.nan, "null_ts": math.nan, "shortcut": False, "scan_columns": (),
           "fingerprint": None}
    facts = inspect_file(path, stream)
    out.update(read_error=facts.read_error, schema_problem=facts.schema_problem, missing_keys=facts.missing_keys,
               no_event_time=facts.no_event_time, fingerprint=facts.fingerprint)
    if facts.read_error:
        return out
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
            ts_part = (int((secs[ok] < lo).sum()), int((secs[ok] >= hi).sum()),
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
    (:class:`mjoin.contract.Seen`: same bytes, same non-positional name, same footer fingerprint)."""
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
                "no_event_time", "duplicate_of", "duplicate_kind", "null_key_rows", "late", "future", "ts_min", "ts_max", "null_ts",
                "footer_only"]


def summarize_input(query, lake, start, end, *, cycle: float | str | None = None, config: GateConfig | None = None,
                    spark=None) -> dict:
    """The frames the input suites check: ``files`` (one row per file) and ``cycles`` (one row per stream and
    arrival cycle: counts, fractions, ``min_rows``), plus ``streams`` (the interval's totals per stream, for
    the report) and ``bounds``."""
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
    lo, hi = t0 - cfg.late_tolerance_for(query), t1 + cfg.future_tolerance
    lookback = cfg.duplicate_lookback_for(query)
    starts = [c.timestamp() for c in cycle_starts(t0, t1, cycle)] if cycle else [t0]
    use_spark = spark is not None or cfg.input_engine == "spark"

    file_rows, stream_rows, cycle_rows = [], [], []
    for s in query.streams:
        files = landed(lake, s.source, t0, t1)
        earlier = landed(lake, s.source, t0 - lookback, t0) if lookback > 0 else []
        summaries = {p: summarize_file(p, s, lo, hi, scan=not use_spark) for _, p in files}
        candidates = []
        for _, p in earlier:
            rows, fp = file_fingerprint(p)
            candidates.append({"path": p, "label": _rel(lake, p), "rows": rows, "fingerprint": fp})
        candidates += [{"path": p, "label": _rel(lake, p), "rows": summaries[p]["rows"],
                        "fingerprint": summaries[p]["fingerprint"]} for _, p in files]
        dups = find_duplicates(candidates, cfg.positional_file_names)
        if use_spark:
            from .input_spark import scan_with_spark

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
                for p, counts in scan_with_spark(spark, s, paths, lo, hi, keys=keys, timed=timed,
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
                   "no_event_time": x["no_event_time"], "duplicate_of": dup_of,
                   "duplicate_kind": dup_kind, "null_key_rows": x["null_key_rows"], "late": x["late"],
                   "future": x["future"], "ts_min": x["ts_min"], "ts_max": x["ts_max"], "null_ts": x["null_ts"],
                   "footer_only": x["shortcut"]}
            mine.append(row)
            file_rows.append(row)
        unchecked = unchecked_event_time(s, use_spark)
        stream_rows.append({"where": s.name, "source": s.source, **_totals(mine),
                            "event_time": s.event_time.to_spec(), "event_time_checked": unchecked is None,
                            "event_time_unchecked": unchecked})
        min_rows = 0 if s.name in cfg.quiet_streams else cfg.min_rows_per_cycle
        small = []  # files of the cycles too small to judge their fractions alone
        for i, c in enumerate(starts):
            in_cycle = [r for r in mine if r["cycle_index"] == i]
            row = {"where": f"{s.name}@{iso(c)}", "stream": s.name, "cycle": iso(c), **_totals(in_cycle),
                   "min_rows": min_rows, "pooled": False}
            if len(starts) > 1 and row["key_checked_rows"] + row["ts_checked_rows"] > 0 and (
                    row["key_checked_rows"] < cfg.fraction_min_rows or row["ts_checked_rows"] < cfg.fraction_min_rows):
                # GX skips missing values: the fractions of this cycle are judged in the pooled row below
                row.update(null_key_fraction=math.nan, late_fraction=math.nan, future_fraction=math.nan, pooled=True)
                small += in_cycle
            cycle_rows.append(row)
        if small:
            cycle_rows.append({"where": f"{s.name}@small cycles", "stream": s.name, "cycle": None, **_totals(small),
                               "min_rows": 0, "pooled": False})
    files_df = pd.DataFrame(file_rows, columns=FILE_COLUMNS)
    streams_df = pd.DataFrame(stream_rows)
    cycles_df = pd.DataFrame(cycle_rows)
    for df in (streams_df, cycles_df):
        for c in ("ts_min", "ts_max"):
            df[c] = df[c].astype(object)
    return {"files": files_df, "cycles": cycles_df, "streams": streams_df,
            "bounds": {"event_time_from": iso(lo), "event_time_to": iso(hi), "engine": "spark" if use_spark else "pyarrow"}}


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
