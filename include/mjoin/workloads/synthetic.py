"""The synthetic drifting workload: n streams whose rates, key popularity and match rates change on a schedule.

Each stream ``s_i`` is generated independently (its own child of the seed's
``numpy.random.SeedSequence``) in ticks of :data:`TICK` seconds. In tick ``k`` its
parameters are the schedule's values at the tick's midpoint; the tick holds
``Poisson(rate * tick)`` tuples at uniform times within it; each tuple's key is
``offset + (rank + shift) mod domain`` with ``rank ~ Zipf(zipf)`` over
``0..domain-1`` (exact finite-domain inverse-CDF sampling, exponent quantized to
0.01), NULL with probability ``null_rate``; or, for striped streams (``stripes > 1``), by the
weight of the key's residue mod ``stripes`` (schedule.py). Columns: ``key`` (int64), ``ts``
(timestamp, UTC), ``id`` (int64, 0.. per stream in arrival order), ``payload``
(float64, uniform in [0, 1)).

Streams whose schedule ``keys`` list ``key2`` (schedule.py) also carry ``key2`` (int64, after
``key``), drawn the same way from their ``key2_*`` parameters with a random stream of its own
(:func:`key2_seed`): the other columns are exactly those of the same stream without ``key2``.

The workload also holds ``query.yaml`` (all streams joined on ``key``: one
attribute class, the complete join graph; with ``key2``, the streams listing ``key`` joined on
``key`` and those listing ``key2`` on ``key2``: two classes, each complete, linked by the streams
that carry both, as cu links sr with wr and cr in the TPC-DS two-class query) and
``schedule.parquet`` (the schedule evaluated per arrival cycle and stream: the ground truth for
statistics and forecasts; with ``key2`` also its ``key2_*`` parameters, NaN for streams without it).
"""
from __future__ import annotations

import logging
import math
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from mjoin import __version__
from mjoin.model.query import load_query, parse_query
from mjoin.model.timeutil import format_duration, iso
from mjoin.workloads import params
from mjoin.workloads.errors import WorkloadError
from mjoin.workloads.manifest import MANIFEST_VERSION, Manifest, load_manifest, time_range, write_manifest
from mjoin.workloads.schedule import KEY, KEY2, KEY2_PARAMS, PARAMS, ZIPF_STEP, Schedule, load_schedule, zipf_cdf
from mjoin.workloads.streamfiles import TS, spec_mismatches, ts_array, write_stream
from mjoin.workloads.workdir import staged_output

log = logging.getLogger(__name__)

#: Generation tick (seconds): parameters are constant within a tick.
TICK = 1.0
DEFAULT_DURATION = "30m"
DEFAULT_WINDOW = "1m"
QUERY_FILE = "query.yaml"
SCHEDULE_FILE = "schedule.parquet"
_NAME = re.compile(r"[^A-Za-z0-9_]+")
#: Spawn-key word of the second key's random stream ("key2" in ASCII): a child no stream's own generator uses.
KEY2_STREAM = 0x6B657932


def key2_seed(seed_seq: np.random.SeedSequence) -> np.random.SeedSequence:
    """The second key's own seed, derived from the stream's without consuming it (the stream's other columns, drawn
    from ``seed_seq`` as before, stay bit-identical whether or not it carries ``key2``)."""
    return np.random.SeedSequence(seed_seq.entropy, spawn_key=(*seed_seq.spawn_key, KEY2_STREAM),
                                  pool_size=seed_seq.pool_size)


def zipf_keys(schedule: Schedule, stream: str, mid, tick, u_key, prefix: str = ""):
    """Keys ``offset + (rank + shift) mod domain``, ``rank`` Zipf by inverse CDF of ``u_key``, from the parameters
    ``<prefix>zipf`` etc. of each tuple's tick; also the per-tick offset, domain and shift (striped keys reuse them)."""
    zipf = np.round(schedule.value(stream, f"{prefix}zipf", mid) / ZIPF_STEP) * ZIPF_STEP
    domain = schedule.value(stream, f"{prefix}domain", mid).astype(np.int64)
    offset = schedule.value(stream, f"{prefix}offset", mid).astype(np.int64)
    shift = schedule.value(stream, f"{prefix}shift", mid).astype(np.int64)
    rank = np.zeros(len(tick), dtype=np.int64)
    # one exact CDF per distinct (exponent, domain); hand-written because numpy's zipf is unbounded and needs a > 1
    pairs = np.stack([zipf, domain.astype(float)], axis=1)
    uniq, group_of_tick = np.unique(pairs, axis=0, return_inverse=True)
    group = group_of_tick.reshape(-1)[tick]
    for g, (a, d) in enumerate(uniq):
        sel = group == g
        if sel.any():
            rank[sel] = np.minimum(np.searchsorted(zipf_cdf(a, int(d)), u_key[sel], side="right"), int(d) - 1)
    return offset[tick] + np.mod(rank + shift[tick], domain[tick]), offset, domain, shift


def generate_stream(schedule: Schedule, stream: str, start_us: int, seed_seq: np.random.SeedSequence) -> pa.Table:
    """One stream's rows in arrival order: key, (key2,) ts, id, payload."""
    rng = np.random.default_rng(seed_seq)
    n_ticks = max(1, math.ceil(schedule.duration / TICK - 1e-9))
    t0 = np.arange(n_ticks) * TICK
    length = np.minimum(TICK, schedule.duration - t0)
    mid = t0 + length / 2
    counts = rng.poisson(schedule.rate(stream, mid) * length)
    tick = np.repeat(np.arange(n_ticks), counts)
    total = int(counts.sum())
    u_time, u_key, u_null, payload = rng.random(total), rng.random(total), rng.random(total), rng.random(total)
    rel_us = np.floor((t0[tick] + u_time * length[tick]) * 1e6).astype(np.int64)
    null_rate = schedule.value(stream, "null_rate", mid)
    key, offset, domain, shift = zipf_keys(schedule, stream, mid, tick, u_key)
    stripes = schedule.value(stream, "stripes", mid).astype(np.int64)
    if (stripes > 1).any():  # striped ticks: a stripe (residue mod M) by its weight, a key uniform within it
        key = np.where(stripes[tick] > 1, _striped_keys(rng, schedule, stream, mid, tick, u_key, offset, domain,
                                                         shift, stripes), key)
    is_null = u_null < null_rate[tick]
    order = np.argsort(rel_us, kind="stable")
    columns = {"key": pa.array(key[order], type=pa.int64(), mask=is_null[order])}
    if KEY2 in schedule.stream_keys(stream):
        columns[KEY2] = _key2_column(schedule, stream, mid, tick, key2_seed(seed_seq), order)
    return pa.table({
        **columns,
        TS: ts_array(start_us + rel_us[order]),
        "id": pa.array(np.arange(total, dtype=np.int64), type=pa.int64()),
        "payload": pa.array(payload[order], type=pa.float64()),
    })


def _key2_column(schedule: Schedule, stream: str, mid, tick, seed_seq, order) -> pa.Array:
    """The second key of every tuple (in arrival ``order``) from its own random stream: a Zipf key of the
    ``key2_*`` parameters, NULL with probability ``key2_null_rate``."""
    rng = np.random.default_rng(seed_seq)
    u_key, u_null = rng.random(len(tick)), rng.random(len(tick))
    key2 = zipf_keys(schedule, stream, mid, tick, u_key, prefix=f"{KEY2}_")[0]
    is_null = u_null < schedule.value(stream, f"{KEY2}_null_rate", mid)[tick]
    return pa.array(key2[order], type=pa.int64(), mask=is_null[order])


def _striped_keys(rng, schedule: Schedule, stream: str, mid, tick, u_key, offset, domain, shift, stripes):
    """Keys of every tuple as if its tick were striped (schedule.py): the stripe drawn by ``u_key`` from the
    weights (``contrast`` for the ``hot`` stripes from ``shift``, 1 for the others), the key uniform within it."""
    hot = schedule.value(stream, "hot", mid).astype(np.int64)
    contrast = schedule.value(stream, "contrast", mid)
    out = np.zeros(len(tick), dtype=np.int64)
    u = rng.random(len(tick))
    params = np.stack([stripes, hot, np.mod(shift, np.maximum(stripes, 1)), contrast], axis=1)
    uniq, which = np.unique(params, axis=0, return_inverse=True)
    which = which.reshape(-1)[tick]
    for i, (m, h, sh, k) in enumerate(uniq):
        sel = which == i
        if not sel.any() or m <= 1:
            continue
        m, h, sh = int(m), int(h), int(sh)
        w = np.ones(m)
        w[np.mod(sh + np.arange(min(h, m)), m)] = k
        cdf = np.cumsum(w) / w.sum()
        stripe = np.minimum(np.searchsorted(cdf, u_key[sel], side="right"), m - 1)
        per = np.maximum(domain[tick][sel] // m, 1)
        out[sel] = offset[tick][sel] + stripe + m * np.minimum((u[sel] * per).astype(np.int64), per - 1)
    return out


def query_document(name: str, sources: dict, window: float, keys: dict | None = None) -> dict:
    """The spec joining every stream on ``key`` (a chain of predicates: one class, the complete graph), or, with
    ``keys`` (stream -> key columns) naming ``key2`` somewhere, each key's streams on it (two classes)."""
    names = list(sources)
    if keys and any(KEY2 in k for k in keys.values()):
        return _two_class_document(name, sources, window, keys)
    return {
        "spec_version": 1,
        "name": name,
        "description": f"synthetic workload: {len(names)} streams joined on key",
        "lateness": "0s",
        "streams": [{"name": s, "source": src, "event_time": "ts", "window": format_duration(window),
                     "columns": {"ts": "timestamp", "key": "long", "id": "long", "payload": "double"}, "keys": ["key"]}
                    for s, src in sources.items()],
        "predicates": [f"{a}.key = {b}.key" for a, b in zip(names, names[1:])],
        "output": [f"{names[0]}.key AS key"] + [f"{s}.id AS {s}_id" for s in names],
    }


def _two_class_document(name: str, sources: dict, window: float, keys: dict) -> dict:
    """The two-class spec: per key column a chain of predicates over the streams that list it (each class the
    complete graph of its streams); every stream reads ``key`` and, if it carries it, ``key2``."""
    names = list(sources)
    members = {k: [s for s in names if k in keys.get(s, (KEY,))] for k in (KEY, KEY2)}
    carries2 = {s for s in names if KEY2 in keys.get(s, (KEY,))}
    columns = {s: {"ts": "timestamp", "key": "long", **({KEY2: "long"} if s in carries2 else {}), "id": "long",
                   "payload": "double"} for s in names}
    return {
        "spec_version": 1,
        "name": name,
        "description": (f"synthetic workload: {len(names)} streams, {', '.join(members[KEY])} joined on key and "
                        f"{', '.join(members[KEY2])} on key2 (two attribute classes)"),
        "lateness": "0s",
        "streams": [{"name": s, "source": src, "event_time": "ts", "window": format_duration(window),
                     "columns": columns[s], "keys": list(keys.get(s, (KEY,)))} for s, src in sources.items()],
        "predicates": [f"{a}.{k} = {b}.{k}" for k in (KEY, KEY2) for a, b in zip(members[k], members[k][1:])],
        "output": ([f"{members[k][0]}.{k} AS {k}" for k in (KEY, KEY2) if members[k]]
                   + [f"{s}.id AS {s}_id" for s in names]),
    }


def schedule_table(schedule: Schedule, start_us: int, cycle_s: int, end_us: int) -> pa.Table:
    """The schedule per arrival cycle and stream: parameter values at the cycle's middle, expected tuples."""
    first = (start_us // 1_000_000) // cycle_s * cycle_s
    cycles = np.arange(first, math.ceil(end_us / 1e6 / cycle_s) * cycle_s, cycle_s, dtype=np.int64)
    rows: dict = {"cycle_start": [], "stream": []}
    key2_params = list(KEY2_PARAMS) if schedule.two_class else []  # one class: the columns as before
    for p in list(PARAMS) + key2_params + ["effective_rate", "expected_tuples"]:
        rows[p] = []
    # expected tuples: the rate integrated over the overlap of the cycle with [start, end), 0.1 s resolution
    fine = np.arange(0, schedule.duration, 0.1) + 0.05
    fine_abs = start_us / 1e6 + fine
    fine_w = np.minimum(0.1, schedule.duration - (fine - 0.05))
    fine_cycle = ((fine_abs // cycle_s) * cycle_s).astype(np.int64)
    for s in schedule.stream_names:
        rel_mid = np.clip(cycles + cycle_s / 2 - start_us / 1e6, 0, schedule.duration)
        expected = np.bincount(np.searchsorted(cycles, fine_cycle), weights=schedule.rate(s, fine) * fine_w, minlength=len(cycles))
        rows["cycle_start"] += cycles.tolist()
        rows["stream"] += [s] * len(cycles)
        for p in PARAMS:
            rows[p] += schedule.value(s, p, rel_mid).tolist()
        for p in key2_params:
            rows[p] += (schedule.value(s, p, rel_mid).tolist() if KEY2 in schedule.stream_keys(s)
                        else [math.nan] * len(cycles))
        rows["effective_rate"] += schedule.rate(s, rel_mid).tolist()
        rows["expected_tuples"] += expected[:len(cycles)].tolist()
    return pa.table(rows)


def generate_synthetic(out, *, streams: int = 4, duration=DEFAULT_DURATION, rate=None, domain=None,
                       schedule="stationary", window=DEFAULT_WINDOW, cycle=params.DEFAULT_CYCLE,
                       start=params.DEFAULT_START, seed=0, name: str | None = None, prefix: str = "",
                       overwrite: bool = False) -> Manifest:
    """Generate a synthetic drifting workload into ``out``; return its manifest.

    ``schedule``: a preset name, a YAML/JSON path, or a schedule dict (schedule.py).
    ``rate``/``domain``: base rate (tuples/s per stream) and key domain, overriding the
    schedule's defaults. ``window``: the window of every stream in the written spec.
    ``prefix``: prepended to the source folder names (streams stay ``s0..``).
    """
    if isinstance(streams, bool) or not isinstance(streams, (int, np.integer)) or not 2 <= int(streams) <= 26:
        raise WorkloadError(f"{streams!r}: a synthetic join needs 2 to 26 streams", "--streams")
    streams = int(streams)
    duration_s = params.duration_seconds(duration)
    window_s = params.duration_seconds(window, "--window")
    cycle_s = params.cycle_seconds(cycle)
    start_us = params.start_micros(start)
    seed = params.seed_value(seed)
    if rate is not None:
        params.positive(rate, "--rate", params.MAX_RATE)
    if domain is not None:
        try:
            ok = not isinstance(domain, bool) and float(domain) == int(float(domain)) and int(float(domain)) >= 1
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise WorkloadError(f"{domain!r} is not a positive whole number", "--domain")
    if not re.fullmatch(r"[A-Za-z0-9_.\-]*", prefix or ""):
        raise WorkloadError(f"{prefix!r} may only hold letters, digits, '_', '.', '-'", "--prefix")
    sched = load_schedule(schedule, streams=streams, duration=duration_s, rate=rate,
                          domain=None if domain is None else int(float(domain)))
    label = sched.name if isinstance(schedule, str) else "custom"
    qname = name or f"synthetic_{_NAME.sub('_', label)}_{streams}"
    sources = {s: f"{prefix}{s}" for s in sched.stream_names}
    try:
        query = parse_query(query_document(qname, sources, window_s, dict(sched.keys)), source="--name")
    except ValueError as exc:
        raise WorkloadError(str(exc), "--name") from None
    end_us = start_us + math.ceil(duration_s * 1e6)
    children = np.random.SeedSequence(seed).spawn(streams)
    with staged_output(out, overwrite) as stage:
        out_sources = {}
        for s, child in zip(sched.stream_names, children):
            tbl = generate_stream(sched, s, start_us, child)
            problems = spec_mismatches(tbl.schema, query.stream(s))
            if problems:
                raise WorkloadError(f"stream {s} does not fit its spec: {'; '.join(problems)}")
            written = write_stream(stage, sources[s], tbl, cycle_s)
            out_sources[sources[s]] = {
                "stream": s, "rows": written["rows"], "source_rows": written["rows"],
                "null_keys": {k: int(tbl.column(k).null_count) for k in (KEY, KEY2) if k in tbl.column_names},
                "rejected": {"rows": 0, "reasons": {}, "file": None},
                "arrivals": written["arrivals"], "files": written["files"],
                "columns": {f.name: str(f.type) for f in tbl.schema},
                "event_time": "generated arrival time (Poisson arrivals at the scheduled rate)",
            }
        with open(os.path.join(stage, QUERY_FILE), "w") as f:
            f.write(f"# generated by `python -m mjoin generate synthetic` (schedule {sched.name}, seed {seed})\n")
            yaml.safe_dump(query.to_spec(), f, sort_keys=False)
        load_query(os.path.join(stage, QUERY_FILE))  # the written spec must load
        pq.write_table(schedule_table(sched, start_us, cycle_s, end_us), os.path.join(stage, SCHEDULE_FILE), compression="zstd")
        doc = {
            "manifest_version": MANIFEST_VERSION,
            "kind": "synthetic",
            "generator": {"mjoin": __version__, "numpy": np.__version__, "pyarrow": pa.__version__},
            "parameters": {"streams": streams, "duration": duration_s, "rate": sched.base_rate,
                           "domain": sched.base_domain,
                           "schedule": sched.name, "window": format_duration(window_s), "seed": seed,
                           "start": iso(start_us / 1e6), "cycle": format_duration(cycle_s), "prefix": prefix,
                           "query": qname, "tick": TICK},
            **time_range(start_us, end_us),
            "cycle_seconds": cycle_s,
            "sources": out_sources,
            "queries": [QUERY_FILE],
            "schedule": sched.to_dict(),
            "notes": [f"{SCHEDULE_FILE}: the schedule evaluated per cycle and stream (ground truth)",
                      "rates are Poisson: a cycle's count varies around expected_tuples by about its square root"],
        }
        write_manifest(stage, doc)
    log.debug("synthetic workload %s (%d streams) -> %s", sched.name, streams, out)
    return load_manifest(out)
