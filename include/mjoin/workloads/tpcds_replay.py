"""TPC-DS tables replayed as streams: the paper's random interleaving, or event time.

Paper replay (runtime-optimization paper, Sec. 5: "supplied in a random order"):
the rows of customer, store_returns, web_returns and catalog_returns are
concatenated and shuffled together with one seeded permutation; the i-th tuple
of that interleaving arrives at ``start + i / rate`` and carries it as ``ts``.
Every source is therefore spread uniformly over the horizon (stationary), and
every row of every table is in its stream.

Event-time replay: a return's ``ts`` is ``d_date + t_time`` of its
``*_returned_date_sk`` and ``*_return(ed)_time_sk``, with the TPC-DS calendar
(about 5.7 years) compressed onto the simulated clock by ``speedup``; rows are
sorted by it (the tables are not stored in time order). Returns whose date or
time is NULL (or not in date_dim/time_dim) have no event time: they are written
to ``<workload>/rejected/<source>/part-00000.parquet`` with a ``reject_reason``
and counted in the manifest, not streamed. Customer has no event time: by default
its rows arrive uniformly over the horizon in a seeded random order (like the
paper replay restricted to customer); ``customer_arrival="start"`` puts them all at
``start`` instead (use with a customer window covering the whole horizon).

Rows with NULL join keys stay in their stream (they join with nothing) and are
counted per key column in the manifest.
"""
from __future__ import annotations

import logging
import math
import os

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mjoin import __version__
from mjoin.model.query import load_query
from mjoin.model.timeutil import format_duration, iso
from mjoin.workloads import params, tpcds_cache
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.manifest import MANIFEST_VERSION, Manifest, load_manifest, time_range, write_manifest
from mjoin.workloads.streamfiles import TS, cast_columns, null_counts, spec_mismatches, ts_array, write_stream
from mjoin.workloads.workdir import staged_output

log = logging.getLogger(__name__)

REPLAYS = ("paper", "event-time")
CUSTOMER_ARRIVALS = ("uniform", "start")
#: The shipped specs a TPC-DS workload is meant for (their key columns are counted for NULLs).
TPCDS_QUERIES = ("tpcds_returns_by_address", "tpcds_returns_by_customer_and_address")
#: Default replay length when neither rate, duration nor speedup is given: 1 h = 360 cycles of 10 s.
DEFAULT_DURATION = 3600.0
#: Event-time columns of each returns table (customer has none).
EVENT_TIME_COLUMNS = {
    "store_returns": ("sr_returned_date_sk", "sr_return_time_sk"),
    "web_returns": ("wr_returned_date_sk", "wr_returned_time_sk"),
    "catalog_returns": ("cr_returned_date_sk", "cr_returned_time_sk"),
}
_SPEC_ARROW = {"long": pa.int64(), "int": pa.int32(), "short": pa.int16()}


def _spec_columns(queries) -> tuple[dict, dict]:
    """Per source: integral columns to cast (name -> arrow type), and the join-key columns."""
    casts, keys = {}, {}
    for q in queries:
        for s in q.streams:
            for col, typ in s.columns.items():
                if typ in _SPEC_ARROW:
                    casts.setdefault(s.source, {})[col] = _SPEC_ARROW[typ]
            for k in s.keys:
                if k not in keys.setdefault(s.source, []):
                    keys[s.source].append(k)
    return casts, keys


def _check_against_specs(source: str, table: pa.Table, queries) -> None:
    problems = [p for q in queries for s in q.streams if s.source == source for p in spec_mismatches(table.schema, s)]
    if problems:  # a generator bug or an incompatible spec; never write such a workload
        raise WorkloadError(f"stream {source} does not fit the query specs: {'; '.join(problems)}")


def _paper_arrivals(tables: dict, rate: float, start_us: int, seed: int) -> dict:
    """Per source: (row indices in arrival order, ts in microseconds) of one seeded interleaving."""
    sizes = [tables[t].num_rows for t in tpcds_cache.STREAM_TABLES]
    total = sum(sizes)
    perm = np.random.default_rng(seed).permutation(total)  # perm[i] = global row arriving i-th
    position = np.empty(total, dtype=np.int64)
    position[perm] = np.arange(total, dtype=np.int64)
    out, offset = {}, 0
    for table, n in zip(tpcds_cache.STREAM_TABLES, sizes):
        pos = position[offset:offset + n]
        offset += n
        order = np.argsort(pos, kind="stable")
        ts = start_us + np.floor(pos[order] * (1e6 / rate)).astype(np.int64)
        out[table] = (order, ts)
    return out


def _event_time_tables(cache: str) -> dict:
    """Per returns table: (accepted rows sorted by event time with ``_event_s``, rejected rows with ``reject_reason``)."""
    con = tpcds_cache.connect()
    dates, times = os.path.join(cache, "date_dim.parquet"), os.path.join(cache, "time_dim.parquet")
    out = {}
    for table, (date_col, time_col) in EVENT_TIME_COLUMNS.items():
        order = ", ".join(f"r.{c}" for c in tpcds_cache.PRIMARY_KEYS[table])
        sql = f"""
            SELECT r.*,
                   CASE WHEN r.{date_col} IS NULL THEN '{date_col} is NULL'
                        WHEN d.d_date IS NULL THEN '{date_col} not in date_dim'
                        WHEN r.{time_col} IS NULL THEN '{time_col} is NULL'
                        WHEN t.t_time IS NULL THEN '{time_col} not in time_dim' END AS reject_reason,
                   date_diff('day', DATE '1970-01-01', d.d_date)::BIGINT * 86400 + t.t_time AS _event_s
            FROM read_parquet('{os.path.join(cache, table + '.parquet')}') r
            LEFT JOIN read_parquet('{dates}') d ON d.d_date_sk = r.{date_col}
            LEFT JOIN read_parquet('{times}') t ON t.t_time_sk = r.{time_col}
            ORDER BY _event_s NULLS LAST, {order}"""
        tbl = con.execute(sql).to_arrow_table()
        reason = tbl.column("reject_reason")
        n_ok = reason.null_count  # accepted rows (no reason) sort first: NULL event times sort last
        accepted = tbl.slice(0, n_ok).drop_columns(["reject_reason"])
        rejected = tbl.slice(n_ok).drop_columns(["_event_s"])
        out[table] = (accepted, rejected)
    con.close()
    return out


def generate_tpcds(out, *, sf=0.1, replay: str = "paper", rate=None, duration=None, speedup=None,
                   cycle=params.DEFAULT_CYCLE, start=params.DEFAULT_START, seed=0,
                   customer_arrival: str = "uniform", cache_dir=None, overwrite: bool = False,
                   queries=TPCDS_QUERIES) -> Manifest:
    """Generate a TPC-DS stream workload into ``out`` (a folder); return its manifest.

    ``rate`` is the total arrival rate (tuples/s over all four streams); give at most
    one of ``rate``, ``duration`` (replay length) and, for event time, ``speedup``
    (calendar seconds per simulated second). Default: the replay lasts 1 h.
    """
    sf = tpcds_cache.check_sf(sf)
    if replay not in REPLAYS:
        raise WorkloadError(f"{replay!r} is not a replay (use {' or '.join(REPLAYS)})", "--replay")
    if customer_arrival not in CUSTOMER_ARRIVALS:
        raise WorkloadError(f"{customer_arrival!r}: use {' or '.join(CUSTOMER_ARRIVALS)}", "--customer-arrival")
    given = [n for n, v in (("--rate", rate), ("--duration", duration), ("--speedup", speedup)) if v is not None]
    if len(given) > 1:
        raise WorkloadError(f"give at most one of {', '.join(given)}", given[1])
    if speedup is not None and replay != "event-time":
        raise WorkloadError("only applies to --replay event-time", "--speedup")
    if customer_arrival != "uniform" and replay != "event-time":
        raise WorkloadError("only applies to --replay event-time (the paper replay interleaves customer)", "--customer-arrival")
    rate = None if rate is None else params.positive(rate, "--rate", params.MAX_RATE)
    duration = None if duration is None else params.duration_seconds(duration)
    speedup = None if speedup is None else params.positive(speedup, "--speedup")
    cycle_s = params.cycle_seconds(cycle)
    start_us = params.start_micros(start)
    seed = params.seed_value(seed)
    specs = [load_query(q) for q in queries]
    casts, keys = _spec_columns(specs)

    cache = str(tpcds_cache.ensure_tables(sf, cache_dir))
    source_rows = {t: pq.read_metadata(os.path.join(cache, f"{t}.parquet")).num_rows for t in tpcds_cache.STREAM_TABLES}
    with staged_output(out, overwrite) as stage:
        if replay == "paper":
            streams, rejected, extra = _paper(cache, source_rows, rate, duration, start_us, seed)
        else:
            streams, rejected, extra = _event_time(cache, source_rows, rate, duration, speedup, start_us, seed, customer_arrival)
        rate_used, end_us = extra.pop("rate"), extra.pop("end_us")
        sources = {}
        for table in tpcds_cache.STREAM_TABLES:
            tbl = cast_columns(streams[table], casts.get(table, {}))
            _check_against_specs(table, tbl, specs)
            written = write_stream(stage, table, tbl, cycle_s)
            rej = rejected.get(table)
            rej_info = {"rows": 0, "reasons": {}, "file": None}
            if rej is not None and rej.num_rows:
                rel = os.path.join("rejected", table, "part-00000.parquet")
                os.makedirs(os.path.join(stage, os.path.dirname(rel)), exist_ok=True)
                pq.write_table(rej, os.path.join(stage, rel), compression="zstd")
                reasons = {}
                for r in rej.column("reject_reason").to_pylist():
                    reasons[r] = reasons.get(r, 0) + 1
                rej_info = {"rows": rej.num_rows, "reasons": dict(sorted(reasons.items())), "file": rel}
            if written["rows"] + rej_info["rows"] != source_rows[table]:  # never silently lose a row
                raise RuntimeError(f"{table}: {written['rows']} streamed + {rej_info['rows']} rejected "
                                   f"!= {source_rows[table]} source rows")
            sources[table] = {
                "rows": written["rows"], "source_rows": source_rows[table],
                "null_keys": null_counts(tbl, keys.get(table, [])), "rejected": rej_info,
                "arrivals": written["arrivals"], "files": written["files"],
                "columns": {f.name: str(f.type) for f in tbl.schema},
                "event_time": extra["event_time"][table],
            }

        doc = {
            "manifest_version": MANIFEST_VERSION,
            "kind": "tpcds",
            "generator": {"mjoin": __version__, "duckdb": duckdb.__version__, "numpy": np.__version__, "pyarrow": pa.__version__},
            "parameters": {"sf": sf, "replay": replay, "seed": seed, "rate": rate_used, "rate_rule": extra.pop("rate_rule"),
                           "duration": (end_us - start_us) / 1e6, "start": iso(start_us / 1e6),
                           "cycle": format_duration(cycle_s),
                           **({"customer_arrival": customer_arrival} if replay == "event-time" else {})},
            **time_range(start_us, end_us),
            "cycle_seconds": cycle_s,
            "sources": sources,
            "queries": list(queries),
            "replay": extra["replay"],
            "notes": extra["notes"],
        }
        write_manifest(stage, doc)
    log.debug("tpcds workload sf=%s replay=%s -> %s", tpcds_cache.sf_label(sf), replay, out)
    return load_manifest(out)


def _rate_rule(rate, duration, n: int, what: str) -> tuple[float, str]:
    if rate is not None:
        return rate, "given (--rate)"
    if duration is not None:
        return n / duration, f"{n} tuples / --duration {format_duration(duration)}"
    return n / DEFAULT_DURATION, f"default: {n} tuples / {format_duration(DEFAULT_DURATION)} ({what})"


def _paper(cache, source_rows, rate, duration, start_us, seed):
    total = sum(source_rows.values())
    rate, rule = _rate_rule(rate, duration, total, "the replay lasts 1h = 360 cycles of 10s")
    tables = {t: pq.read_table(os.path.join(cache, f"{t}.parquet")) for t in tpcds_cache.STREAM_TABLES}
    arrivals = _paper_arrivals(tables, rate, start_us, seed)
    streams = {}
    for t, (order, ts) in arrivals.items():
        streams[t] = tables[t].take(pa.array(order)).append_column(TS, ts_array(ts))
    end_us = start_us + math.ceil(total * 1e6 / rate)
    extra = {
        "rate": rate, "rate_rule": rule, "end_us": end_us,
        "event_time": {t: "arrival time of the paper's interleaving: start + i / rate" for t in tpcds_cache.STREAM_TABLES},
        "replay": {"kind": "paper", "interleaved": list(tpcds_cache.STREAM_TABLES), "total_rows": total,
                   "method": "one seeded permutation (numpy default_rng(seed).permutation) of the concatenated "
                             "tables, each stored in primary-key order; i-th tuple at start + i / rate"},
        "notes": ["ts is the arrival time on the simulated clock; all four sources are stationary by construction"],
    }
    return streams, {}, extra


def _event_time(cache, source_rows, rate, duration, speedup, start_us, seed, customer_arrival):
    returns = _event_time_tables(cache)
    ok = {t: acc for t, (acc, _) in returns.items()}
    events = np.concatenate([acc.column("_event_s").to_numpy() for acc in ok.values()])
    if not len(events):
        raise WorkloadError("no return has an event time at this scale factor", "--sf")
    origin = int(events.min() // 86400 * 86400)  # midnight of the first return day
    span = int(events.max()) - origin + 1  # event times are whole seconds: the last one maps below end
    streamed = source_rows["customer"] + sum(a.num_rows for a in ok.values())
    if speedup is not None:
        rule = "given (--speedup)"
    else:
        if rate is not None:
            duration, rule = streamed / rate, f"--rate {rate:g} tuples/s on average"
        elif duration is not None:
            rule = f"--duration {format_duration(duration)}"
        else:
            duration, rule = DEFAULT_DURATION, f"default: the calendar spans {format_duration(DEFAULT_DURATION)} (360 cycles of 10s)"
        speedup = span / duration
    dur_us = math.ceil(span * 1e6 / speedup)
    end_us = start_us + dur_us
    streams = {}
    for t, acc in ok.items():
        ev = acc.column("_event_s").to_numpy()
        ts = start_us + np.floor((ev - origin) * (1e6 / speedup)).astype(np.int64)
        streams[t] = acc.drop_columns(["_event_s"]).append_column(TS, ts_array(ts))
    customer = pq.read_table(os.path.join(cache, "customer.parquet"))
    nc = customer.num_rows
    if customer_arrival == "uniform":
        order = np.random.default_rng(seed).permutation(nc)
        ts = start_us + np.floor(np.arange(nc) * (dur_us / nc)).astype(np.int64)
        customer = customer.take(pa.array(order))
    else:
        ts = np.full(nc, start_us, dtype=np.int64)
    streams["customer"] = customer.append_column(TS, ts_array(ts))
    streams = {t: streams[t] for t in tpcds_cache.STREAM_TABLES}
    rejected = {t: rej for t, (_, rej) in returns.items()}
    et = {t: f"{d} (d_date) + {tm} (t_time), calendar compressed by speedup" for t, (d, tm) in EVENT_TIME_COLUMNS.items()}
    et["customer"] = ("no event time: uniform over [start, end) in a seeded random order" if customer_arrival == "uniform"
                      else "no event time: every row at start")
    extra = {
        "rate": streamed * 1e6 / dur_us, "rate_rule": f"mean total rate; {rule}", "end_us": end_us, "event_time": et,
        "replay": {"kind": "event-time", "calendar_origin": iso(origin), "calendar_end": iso(origin + span),
                   "speedup": speedup,
                   "simulated_ts": "start + (event_time - calendar_origin) / speedup",
                   "customer_arrival": customer_arrival},
        "notes": ["returns without a date or time are not streamed: see sources.*.rejected",
                  "returns follow the TPC-DS sales calendar: their rates ramp up and down over the horizon"],
    }
    return streams, rejected, extra
