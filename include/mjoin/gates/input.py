"""Gate 1: the raw input of one interval, per stream (the files landed under ``<lake>/streams/<source>/``).

Cheap by default: per file, pyarrow reads the Parquet footer (schema, row count,
row-group statistics). NULL-key and event-time counts come from the footer's
statistics when they settle the question (no NULLs; min and max event time inside
the bounds) and otherwise from reading just the key and event-time columns.
Duplicate files: files of equal size are hashed (sha256 of the bytes), so only
candidates are read in full. The per-file numbers become three small pandas
frames (``files``, ``streams``, ``flow``) that GX validates in ~0.05 s.

``config.input_engine="spark"`` (or ``spark=`` given) scans the key and event-time
columns with Spark instead (:mod:`mjoin.gates.input_spark`), for raw input too big for
the driver; footers and hashes are still read with pyarrow.
"""
from __future__ import annotations

import hashlib
import math
import os
from collections import defaultdict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import fsutil
from ..timeutil import cycles as cycle_starts
from ..timeutil import iso, parse_duration, parse_time
from .base import GateRun
from .config import GateConfig, GateConfigError
from .result import GateResult
from .suites import input_files_suite, input_flow_suite, input_streams_suite

_INT_BITS = {"short": 16, "int": 32, "long": 64}


# ---- schema --------------------------------------------------------------------------------

def type_problem(spec_type: str, arrow_type: pa.DataType) -> str | None:
    """Why a Parquet column of ``arrow_type`` cannot hold the spec's ``spec_type`` (None if it can).

    Integers may be narrower than declared (Spark widens them), never wider; strings may be
    large strings; timestamps any unit and zone; decimals need the declared scale."""
    t = spec_type
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


# ---- event time --------------------------------------------------------------------------------

def event_time_column(stream) -> str | None:
    """The column holding the event time, or None when it is derived (``expr``) or parsed (``format``)."""
    et = stream.event_time
    if et.expr is not None or et.format is not None:
        return None
    return et.column


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


def usable_columns(stream, schema: pa.Schema) -> tuple[list[str], str | None]:
    """``(keys, ts)`` that can be counted in a file: all join keys (or none) and the event-time column,
    each present with a type the spec allows."""
    keys = [k for k in stream.keys if k in schema.names and type_problem(stream.columns[k], schema.field(k).type) is None]
    keys = keys if len(keys) == len(stream.keys) else []
    ts = event_time_column(stream)
    if ts is not None and (ts not in schema.names or type_problem(stream.columns[ts], schema.field(ts).type)):
        ts = None
    return keys, ts


def summarize_file(path: str, stream, lo: float, hi: float, *, scan: bool = True) -> dict:
    """Footer, schema and (with ``scan``) NULL-key and event-time counts of one landed file."""
    out = {"rows": math.nan, "read_error": None, "schema_problem": None, "missing_keys": None,
           "null_key_rows": math.nan, "late": math.nan, "future": math.nan, "ts_min": math.nan, "ts_max": math.nan,
           "null_ts": math.nan, "shortcut": False, "scan_columns": ()}
    fs, p = fsutil.resolve(path)
    try:
        with fs.open_input_file(p) as fh:
            pf = pq.ParquetFile(fh)
            schema = pf.schema_arrow
            md = pf.metadata
            out["rows"] = md.num_rows
            out["schema_problem"], out["missing_keys"] = schema_problems(stream, schema)
            keys, ts = usable_columns(stream, schema)
            out["scan_columns"] = tuple((c, str(schema.field(c).type)) for c in keys + ([ts] if ts else []))
            if not scan:
                return out
            null_key_rows, ts_part = _stats_shortcut(md, schema, keys, ts, lo, hi)
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
            secs = to_epoch_seconds(table.column(ts))
            ok = np.isfinite(secs)
            ts_part = (int((secs[ok] < lo).sum()), int((secs[ok] >= hi).sum()),
                       float(secs[ok].min()) if ok.any() else math.nan,
                       float(secs[ok].max()) if ok.any() else math.nan, int((~ok).sum()))
        else:
            out["shortcut"] = True
        out["late"], out["future"], out["ts_min"], out["ts_max"], out["null_ts"] = ts_part
    return out


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


def _size(path: str) -> int | None:
    fs, p = fsutil.resolve(path)
    info = fs.get_file_info(p)
    return info.size if info.size is not None and info.size >= 0 else None


def find_duplicates(files: list[tuple[str, str]]) -> dict:
    """``{path: earlier_path}`` for files with the same bytes as an earlier one in ``files``
    (``[(path, label)]`` in landing order). Only files of equal size are hashed."""
    by_size = defaultdict(list)
    for path, label in files:
        try:
            by_size[_size(path)].append((path, label))
        except OSError:
            continue
    dup = {}
    for size, group in by_size.items():
        if size is None or len(group) < 2:
            continue
        first = {}
        for path, label in group:
            try:
                digest = content_hash(path)
            except OSError:
                continue
            if digest in first:
                dup[path] = first[digest]
            else:
                first[digest] = label
    return dup


# ---- the interval --------------------------------------------------------------------------------

def landed(lake, source: str, t_from: float, t_to: float) -> list[tuple[int, str]]:
    """``[(arrival_epoch, path)]`` of the Parquet files landed for ``source`` in ``[t_from, t_to)``."""
    out = []
    for a in lake.arrivals(source):
        if t_from <= a < t_to:
            d = lake.arrival_dir(source, a)
            out += [(a, fsutil.join(d, n)) for n in fsutil.listdir(d) if n.endswith(".parquet")]
    return out


def _rel(lake, path: str) -> str:
    root = str(lake.root).rstrip("/")
    if fsutil.is_url(root):
        return path[len(root) + 1:] if path.startswith(root + "/") else path
    return os.path.relpath(fsutil.resolve(path)[1], fsutil.resolve(root)[1])


def summarize_input(query, lake, start, end, *, cycle: float | str | None = None, config: GateConfig | None = None,
                    spark=None) -> dict:
    """The three frames the input suites check: ``files``, ``streams``, ``flow`` (plus ``bounds``)."""
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

    file_rows, stream_rows, flow_rows = [], [], []
    for s in query.streams:
        files = landed(lake, s.source, t0, t1)
        earlier = landed(lake, s.source, t0 - lookback, t0) if lookback > 0 else []
        dups = find_duplicates([(p, _rel(lake, p)) for _, p in earlier + files])
        summaries = {p: summarize_file(p, s, lo, hi, scan=not use_spark) for _, p in files}
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
                ts = event_time_column(s)
                for p, counts in scan_with_spark(spark, s, paths, lo, hi, keys=keys,
                                                 ts=ts if ts in names else None).items():
                    summaries[p].update(counts)
        per_cycle = defaultdict(int)
        for a, p in files:
            x = summaries[p]
            file_rows.append({"where": _rel(lake, p), "stream": s.name, "arrival": iso(a), "rows": x["rows"],
                              "read_error": x["read_error"], "schema_problem": x["schema_problem"],
                              "missing_keys": x["missing_keys"], "duplicate_of": dups.get(p),
                              "null_key_rows": x["null_key_rows"], "late": x["late"], "future": x["future"],
                              "ts_min": x["ts_min"], "ts_max": x["ts_max"], "null_ts": x["null_ts"],
                              "footer_only": x["shortcut"]})
            if x["read_error"] is None:
                per_cycle[int((a - t0) // cycle) if cycle else 0] += int(x["rows"])
        mine = [r for r in file_rows if r["stream"] == s.name]
        keyed = [r for r in mine if not _nan(r["null_key_rows"])]
        timed = [r for r in mine if not _nan(r["late"])]
        key_rows = sum(int(r["rows"]) for r in keyed)
        ts_rows = sum(int(r["rows"]) - int(r["null_ts"]) for r in timed)
        nk = sum(int(r["null_key_rows"]) for r in keyed)
        late = sum(int(r["late"]) for r in timed)
        fut = sum(int(r["future"]) for r in timed)
        stream_rows.append({
            "where": s.name, "source": s.source, "files": len(mine),
            "rows": sum(int(r["rows"]) for r in mine if not _nan(r["rows"])),
            "key_checked_rows": key_rows, "null_key_rows": nk, "null_key_fraction": nk / key_rows if key_rows else math.nan,
            "ts_checked_rows": ts_rows, "late": late, "late_fraction": late / ts_rows if ts_rows else math.nan,
            "future": fut, "future_fraction": fut / ts_rows if ts_rows else math.nan,
            "null_ts": sum(int(r["null_ts"]) for r in timed),
            "ts_min": iso(min(r["ts_min"] for r in timed)) if any(not _nan(r["ts_min"]) for r in timed) else None,
            "ts_max": iso(max(r["ts_max"] for r in timed)) if any(not _nan(r["ts_max"]) for r in timed) else None,
            "event_time_checked": event_time_column(s) is not None,
        })
        min_rows = 0 if s.name in cfg.quiet_streams else cfg.min_rows_per_cycle
        for i, c in enumerate(starts):
            flow_rows.append({"where": f"{s.name}@{iso(c)}", "stream": s.name, "cycle": iso(c), "rows": per_cycle.get(i, 0),
                              "min_rows": min_rows})
    files_df = pd.DataFrame(file_rows, columns=["where", "stream", "arrival", "rows", "read_error", "schema_problem",
                                                "missing_keys", "duplicate_of", "null_key_rows", "late", "future",
                                                "ts_min", "ts_max", "null_ts", "footer_only"])
    streams_df = pd.DataFrame(stream_rows)
    for c in ("ts_min", "ts_max"):
        streams_df[c] = streams_df[c].astype(object)
    return {"files": files_df, "streams": streams_df, "flow": pd.DataFrame(flow_rows),
            "bounds": {"event_time_from": iso(lo), "event_time_to": iso(hi), "engine": "spark" if use_spark else "pyarrow"}}


def _nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def check_input(query, lake, start, end, *, cycle: float | str | None = None, config: GateConfig | None = None,
                spark=None) -> GateResult:
    """Check the raw input landed for every stream of ``query`` with arrival in ``[start, end)``."""
    cfg = config or GateConfig()
    run = GateRun("input", query, cfg)
    cycle = None if cycle is None else parse_duration(cycle)
    frames = summarize_input(query, lake, start, end, cycle=cycle, config=cfg, spark=spark)
    run.check(input_files_suite(query, cfg), frames["files"])
    run.check(input_streams_suite(query, cfg, cfg.late_tolerance_for(query)), frames["streams"])
    run.check(input_flow_suite(query, cfg), frames["flow"])
    for s in query.streams:
        if event_time_column(s) is None:
            run.note(f"{s.name}: event time is derived ({s.event_time.to_spec()}); late/future tuples not counted")
    nts = frames["streams"]["null_ts"].sum() if len(frames["streams"]) else 0
    if nts:
        run.note(f"{int(nts)} row(s) with a NULL event time (not counted as late or future)")
    run.details.update({"start": iso(parse_time(start)), "end": iso(parse_time(end)), "cycle_seconds": cycle,
                        **frames["bounds"], "streams": frames["streams"].to_dict("records"),
                        "files": int(len(frames["files"])),
                        "files_footer_only": int(frames["files"]["footer_only"].sum()) if len(frames["files"]) else 0})
    return run.result()
