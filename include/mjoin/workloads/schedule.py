"""Drift schedules for the synthetic workload: per-stream parameters over time (steps, ramps, bursts).

A schedule (YAML/JSON file, dict, or a named preset) sets, for each stream
``s0..s{n-1}``, the parameters of its generator and how they change::

    defaults: {rate: 20, zipf: 1.0, domain: 1000, offset: 0, shift: 0, null_rate: 0}
    streams:                       # per-stream overrides
      s1: {rate: 2x, shift: 50}
    events:
      - {type: step,  at: 50%, stream: s0, param: rate, value: 0.5x}
      - {type: ramp,  from: 10m, to: 20m, stream: s3, param: offset, value: 1d}
      - {type: burst, from: 40%, to: 45%, streams: [s1, s2], factor: 5}

Parameters (per stream): ``rate`` (tuples/s), ``zipf`` (exponent ``a`` of the key
popularity, 0 = uniform), ``domain`` (number of distinct keys), ``offset`` (the
smallest key), ``shift`` (rotates which keys are popular), ``null_rate`` (share of
NULL keys). A tuple's key is ``offset + (rank + shift) mod domain`` with ``rank``
drawn from Zipf(a) over ``0..domain-1`` (rank 0 the most popular).

Striped keys (``stripes`` ``M > 1``, ``hot`` ``H``, ``contrast`` ``k``): popularity depends on
the key's residue mod ``M`` (its *stripe*) instead of a Zipf rank. The ``H`` stripes
``shift, shift + 1, ..., shift + H - 1`` (mod ``M``) are hot: each of their keys is ``k``
times as popular as a key of another stripe; within a stripe the keys ``offset + stripe +
M u`` (``u`` in ``0..domain/M - 1``) are equally popular (``zipf`` is not used). Two streams
whose hot stripes differ favour different probe orders in different residue classes, spread
over the whole key range: key buckets ``key mod B`` (``M`` dividing ``B``) rank the streams
differently by rate, which PMJoin's rate-based partitioning finds and hash or range
partitioning cannot (the ``stripes`` preset). Streams match
where their ``[offset, offset + domain)`` ranges overlap, most where their popular
keys (``offset + shift`` onwards) coincide: moving ``offset`` moves a stream out of
the others' domain (its match rates drop), moving ``shift`` moves its hot keys.

Values: numbers; ``rate`` also as ``<k>x`` (k times the base rate, ``--rate``),
``domain``/``offset``/``shift`` also as ``<k>d`` (k times the base domain,
``--domain``). Times: seconds, durations (``90s``, ``10m``) or ``<p>%`` of the
workload's duration. ``step`` sets a value from ``at`` on; ``ramp`` moves it
linearly from its value at ``from`` to ``value`` at ``to``; ``burst`` multiplies
the rate by ``factor`` on ``[from, to)`` (bursts multiply; steps and ramps of one
stream's parameter may not overlap). ``stream`` is a name, a list, or ``all``.

Two attribute classes (optional): ``keys`` names the join-key columns of each stream, ``key``
(the default: every stream joins on ``key``, one class) and/or ``key2``, a second key column
with its own parameters ``key2_zipf``, ``key2_domain``, ``key2_offset``, ``key2_shift``,
``key2_null_rate`` (same meaning and suffixes as the first key's; each defaults to the
document's ``defaults`` value of the first key's parameter, e.g. ``key2_domain`` to the base
domain) and its own steps and ramps (``param: key2_domain``)::

    keys: {s0: [key, key2], s2: [key2], s3: [key2]}      # s1 (not listed): [key]
    streams:
      s2: {key2_domain: 2d}
    events:
      - {type: step, at: 50%, stream: s2, param: key2_domain, value: 1d}

The generated query joins the streams that list ``key`` on ``key`` and those that list ``key2``
on ``key2`` (synthetic.py): two classes when both have members. Each used key needs two
streams and exactly one stream carries both (none: the join graph falls apart; two: they would be
joined on a composite key, which the query format does not have). ``key2_*``
parameters are only allowed on streams that carry ``key2``. Every stream still carries the
``key`` column (drawn as before); ``key2`` is drawn from its own random stream, so a schedule
without ``keys`` generates exactly what it did before the second key existed.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from mjoin.model.timeutil import format_duration, parse_duration
from mjoin.workloads.errors import ScheduleError
from mjoin.workloads.presets import PRESETS, preset_document

#: Parameter -> (default, minimum, maximum, integral)
PARAMS = {
    "rate": (20.0, 0.0, 1e6, False),
    "zipf": (1.0, 0.0, 10.0, False),
    "domain": (1000, 1, 1_000_000, True),
    "offset": (0, -(2 ** 62), 2 ** 62, True),
    "shift": (0, -(2 ** 62), 2 ** 62, True),
    "null_rate": (0.0, 0.0, 1.0, False),
    "stripes": (1, 1, 65536, True),
    "hot": (1, 1, 65536, True),
    "contrast": (1.0, 1.0, 1e12, False),
}
#: The second key column (two attribute classes) and its parameters: the first key's, prefixed.
KEY, KEY2 = "key", "key2"
KEY2_PARAMS = {f"{KEY2}_{p}": PARAMS[p] for p in ("zipf", "domain", "offset", "shift", "null_rate")}
ALL_PARAMS = {**PARAMS, **KEY2_PARAMS}
EVENT_TYPES = ("step", "ramp", "burst")
#: Zipf exponents are quantized to this step so sampling can share one CDF per (exponent, domain).
ZIPF_STEP = 0.01
_REL = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([xd])\s*$")
_PCT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True)
class Event:
    type: str
    streams: tuple
    start: float
    end: float
    param: str = "rate"
    value: float | None = None
    factor: float | None = None

    def to_dict(self) -> dict:
        d = {"type": self.type, "streams": list(self.streams)}
        if self.type == "step":
            d.update(at=self.start, param=self.param, value=self.value)
        elif self.type == "ramp":
            d.update(**{"from": self.start, "to": self.end, "param": self.param, "value": self.value})
        else:
            d.update(**{"from": self.start, "to": self.end, "factor": self.factor})
        return d


@dataclass(frozen=True)
class Schedule:
    """A resolved schedule: absolute values and times (seconds from the workload's start)."""

    name: str
    stream_names: tuple
    duration: float
    base: dict  # stream -> {param: value}
    events: tuple
    description: str = ""
    base_rate: float = PARAMS["rate"][0]
    base_domain: int = PARAMS["domain"][0]
    keys: tuple = ()  # ((stream, (key columns)), ...) for every stream; () = every stream joins on key alone

    def stream_keys(self, stream: str) -> tuple:
        """The join-key columns of ``stream``: ``("key",)`` unless the schedule's ``keys`` says otherwise."""
        return dict(self.keys).get(stream, (KEY,))

    @property
    def two_class(self) -> bool:
        """Whether some stream joins on ``key2`` (the query then has a second attribute class)."""
        return any(KEY2 in k for _, k in self.keys)

    def value(self, stream: str, param: str, t) -> np.ndarray:
        """The parameter of ``stream`` at times ``t`` (seconds from start), steps and ramps applied."""
        t = np.asarray(t, dtype=float)
        current = float(self.base[stream][param])
        out = np.full(t.shape, current)
        for e in sorted((e for e in self.events if e.type != "burst" and e.param == param and stream in e.streams),
                        key=lambda e: e.start):
            if e.type == "step":
                out = np.where(t >= e.start, e.value, out)
            else:
                frac = np.clip((t - e.start) / (e.end - e.start), 0.0, 1.0)
                out = np.where(t >= e.start, current + (e.value - current) * frac, out)
            current = float(e.value)
        if ALL_PARAMS[param][3]:
            out = np.round(out)
        return out

    def rate(self, stream: str, t) -> np.ndarray:
        """Tuples/s of ``stream`` at ``t``: the ``rate`` parameter times every burst active at ``t``."""
        t = np.asarray(t, dtype=float)
        out = self.value(stream, "rate", t)
        for e in self.events:
            if e.type == "burst" and stream in e.streams:
                out = out * np.where((t >= e.start) & (t < e.end), e.factor, 1.0)
        return out

    def to_dict(self) -> dict:
        """The resolved schedule (absolute values, times in seconds), as stored in the manifest (``keys`` only
        for two classes, so one-class manifests are as before)."""
        doc = {"name": self.name, "description": self.description, "duration": self.duration,
               "base_rate": self.base_rate, "base_domain": self.base_domain,
               "streams": {s: dict(self.base[s]) for s in self.stream_names},
               "events": [e.to_dict() for e in self.events]}
        if self.two_class:
            doc["keys"] = {s: list(self.stream_keys(s)) for s in self.stream_names}
        return doc


# ---- parsing -------------------------------------------------------------------------

def _number(value, field: str) -> float:
    if isinstance(value, bool):
        raise ScheduleError(f"{value!r} is not a number", field)
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ScheduleError(f"{value!r} is not a number", field) from None
    if not math.isfinite(x):
        raise ScheduleError(f"{value!r} is not finite", field)
    return x


def _param_value(param: str, value, field: str, base_rate: float, base_domain: int) -> float:
    _, lo, hi, integral = ALL_PARAMS[param]
    m = _REL.match(str(value)) if isinstance(value, str) else None
    if m:
        k, unit = float(m.group(1)), m.group(2)
        if unit == "x" and param != "rate":
            raise ScheduleError(f"{value!r}: the 'x' suffix (times the base rate) only applies to rate", field)
        if unit == "d" and param.removeprefix(f"{KEY2}_") not in ("domain", "offset", "shift"):
            raise ScheduleError(f"{value!r}: the 'd' suffix (times the base domain) only applies to domain, offset, "
                                "shift (and their key2_ forms)", field)
        x = k * (base_rate if unit == "x" else base_domain)
    else:
        x = _number(value, field)
    if integral:
        x = float(round(x))
    if not lo <= x <= hi:
        raise ScheduleError(f"{value!r} is outside [{lo:g}, {hi:g}]", field)
    return x


def _time(value, field: str, duration: float) -> float:
    m = _PCT.match(value) if isinstance(value, str) else None
    if m:
        t = float(m.group(1)) / 100.0 * duration
    else:
        try:
            t = parse_duration(value)
        except ValueError as exc:
            raise ScheduleError(f"{exc} (or use a percentage of the duration, e.g. 50%)", field) from None
    if t > duration + 1e-9:
        raise ScheduleError(f"{value!r} is after the end of the workload ({format_duration(duration)})", field)
    return t


def _params(doc, field: str, base_rate, base_domain) -> dict:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ScheduleError("must map parameter names to values", field)
    out = {}
    for k, v in doc.items():
        if k not in ALL_PARAMS:
            raise ScheduleError(f"unknown parameter {k!r} (use {', '.join(ALL_PARAMS)})", f"{field}.{k}")
        out[k] = _param_value(k, v, f"{field}.{k}", base_rate, base_domain)
    return out


def _streams_of(e: dict, field: str, names: tuple) -> tuple:
    if "stream" in e and "streams" in e:
        raise ScheduleError("give stream or streams, not both", field)
    raw = e.get("stream", e.get("streams"))
    if raw is None:
        raise ScheduleError("is required (a stream name, a list, or all)", f"{field}.stream")
    if raw in ("all", "*"):
        return names
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise ScheduleError(f"{raw!r} is not a stream name, a list of names, or all", f"{field}.stream")
    for s in items:
        if s not in names:
            raise ScheduleError(f"unknown stream {s!r} (streams: {', '.join(names)})", f"{field}.stream")
    return tuple(dict.fromkeys(items))


def _event(e, i: int, names: tuple, duration: float, base_rate, base_domain) -> Event:
    field = f"events[{i}]"
    if not isinstance(e, dict):
        raise ScheduleError("must be a mapping with type, stream and times", field)
    kind = e.get("type")
    if kind not in EVENT_TYPES:
        raise ScheduleError(f"type {kind!r} is not one of {', '.join(EVENT_TYPES)}", f"{field}.type")
    allowed = {"step": {"type", "stream", "streams", "at", "param", "value"},
               "ramp": {"type", "stream", "streams", "from", "to", "param", "value"},
               "burst": {"type", "stream", "streams", "from", "to", "factor"}}[kind]
    unknown = set(e) - allowed
    if unknown:
        raise ScheduleError(f"unknown field(s) {', '.join(sorted(map(str, unknown)))} for a {kind}", field)
    streams = _streams_of(e, field, names)
    for key in ({"at", "param", "value"} if kind == "step" else {"from", "to", "param", "value"} if kind == "ramp"
                else {"from", "to", "factor"}):
        if key not in e or e[key] is None:
            raise ScheduleError("is required", f"{field}.{key}")
    if kind == "step":
        start = end = _time(e["at"], f"{field}.at", duration)
    else:
        start, end = _time(e["from"], f"{field}.from", duration), _time(e["to"], f"{field}.to", duration)
        if end <= start:
            raise ScheduleError(f"'to' ({e['to']}) must be after 'from' ({e['from']})", f"{field}.to")
    if kind == "burst":
        factor = _number(e["factor"], f"{field}.factor")
        if factor < 0:
            raise ScheduleError(f"{e['factor']!r} must be >= 0", f"{field}.factor")
        return Event("burst", streams, start, end, factor=factor)
    param = e["param"]
    if param not in ALL_PARAMS:
        raise ScheduleError(f"unknown parameter {param!r} (use {', '.join(ALL_PARAMS)})", f"{field}.param")
    value = _param_value(param, e["value"], f"{field}.value", base_rate, base_domain)
    return Event(kind, streams, start, end, param=param, value=value)


def _check_streams(streams) -> None:
    if isinstance(streams, bool) or not isinstance(streams, int) or not 2 <= streams <= 26:
        raise ScheduleError(f"{streams!r}: a synthetic join needs 2 to 26 streams", "--streams")


def parse_schedule(doc, *, streams: int, duration, rate=None, domain=None, name: str | None = None) -> Schedule:
    """Validate a schedule document for ``streams`` streams over ``duration``; resolve relative values.

    ``rate``/``domain`` (the CLI's ``--rate``/``--domain``) override the document's
    ``defaults`` and are the base of ``<k>x`` and ``<k>d`` values.
    """
    if not isinstance(doc, dict):
        raise ScheduleError("must be a mapping with defaults, streams and events", "schedule")
    unknown = set(doc) - {"name", "description", "defaults", "streams", "events", "keys"}
    if unknown:
        raise ScheduleError(f"unknown field(s) {', '.join(sorted(map(str, unknown)))}", "schedule")
    _check_streams(streams)
    duration = parse_duration(duration) if not isinstance(duration, (int, float)) else float(duration)
    names = tuple(f"s{i}" for i in range(streams))
    raw_defaults = doc.get("defaults") or {}
    if not isinstance(raw_defaults, dict):
        raise ScheduleError("must map parameter names to values", "defaults")
    base_rate = _param_value("rate", rate if rate is not None else raw_defaults.get("rate", PARAMS["rate"][0]),
                             "--rate" if rate is not None else "defaults.rate", PARAMS["rate"][0], 1)
    base_domain = int(_param_value("domain", domain if domain is not None else raw_defaults.get("domain", PARAMS["domain"][0]),
                                   "--domain" if domain is not None else "defaults.domain", base_rate, PARAMS["domain"][0]))
    defaults = {p: spec[0] for p, spec in PARAMS.items()}
    given = _params(raw_defaults, "defaults", base_rate, base_domain)
    defaults.update({p: v for p, v in given.items() if p in PARAMS})
    defaults["rate"], defaults["domain"] = base_rate, float(base_domain)
    keys = _keys(doc.get("keys"), names)
    carries2 = {s for s, cols in keys if KEY2 in cols}  # the streams with a second key column
    defaults2 = {p: given.get(p, defaults[p.removeprefix(f"{KEY2}_")]) for p in KEY2_PARAMS}
    per_stream = doc.get("streams") or {}
    if not isinstance(per_stream, dict):
        raise ScheduleError("must map stream names to parameter overrides", "streams")
    base = {}
    for s in per_stream:
        if s not in names:
            raise ScheduleError(f"unknown stream {s!r} (streams: {', '.join(names)})", f"streams.{s}")
    for s in names:
        own = _params(per_stream.get(s), f"streams.{s}", base_rate, base_domain)
        if s not in carries2 and set(own) & set(KEY2_PARAMS):
            raise ScheduleError(f"{s} has no {KEY2} (list it in keys to give it one)",
                                f"streams.{s}.{sorted(set(own) & set(KEY2_PARAMS))[0]}")
        base[s] = {**defaults, **(defaults2 if s in carries2 else {}), **own}
    raw_events = doc.get("events") or []
    if not isinstance(raw_events, list):
        raise ScheduleError("must be a list of step, ramp and burst events", "events")
    events = tuple(_event(e, i, names, duration, base_rate, base_domain) for i, e in enumerate(raw_events))
    for i, e in enumerate(events):
        bare = [s for s in e.streams if e.param in KEY2_PARAMS and s not in carries2]
        if bare:
            raise ScheduleError(f"{bare[0]} has no {KEY2} (list it in keys to give it one)", f"events[{i}].param")
    # steps and ramps of one (stream, parameter) must not overlap: "the value before the ramp" must be defined
    spans: dict = {}
    for i, e in enumerate(events):
        if e.type == "burst":
            continue
        for s in e.streams:
            for j, (a, b) in spans.get((s, e.param), []):
                if (e.start < b and a < e.end) or e.start == a:
                    raise ScheduleError(f"overlaps events[{j}] on {s}.{e.param}", f"events[{i}]")
            spans.setdefault((s, e.param), []).append((i, (e.start, e.end)))
    return Schedule(name=str(name or doc.get("name") or "custom"), stream_names=names, duration=duration, base=base,
                    events=events, description=str(doc.get("description") or ""), base_rate=base_rate,
                    base_domain=base_domain, keys=keys)


def _keys(doc, names: tuple) -> tuple:
    """The ``keys`` field resolved for every stream (``()`` when absent: one class on ``key``); each used key
    column joins at least two streams and, with two classes, some stream carries both (a connected join)."""
    if doc is None:
        return ()
    if not isinstance(doc, dict):
        raise ScheduleError(f"must map stream names to lists of key columns ({KEY}, {KEY2})", "keys")
    out = {}
    for s, cols in doc.items():
        if s not in names:
            raise ScheduleError(f"unknown stream {s!r} (streams: {', '.join(names)})", f"keys.{s}")
        items = [cols] if isinstance(cols, str) else cols
        if (not isinstance(items, list) or not items or len(set(items)) != len(items)
                or not set(items) <= {KEY, KEY2}):
            raise ScheduleError(f"{cols!r} is not a list of distinct key columns ({KEY}, {KEY2})", f"keys.{s}")
        out[s] = tuple(k for k in (KEY, KEY2) if k in items)
    resolved = tuple((s, out.get(s, (KEY,))) for s in names)
    for k in (KEY, KEY2):
        members = [s for s, cols in resolved if k in cols]
        if len(members) == 1:
            raise ScheduleError(f"only {members[0]} joins on {k}: a key column needs two streams", "keys")
    both = [s for s, cols in resolved if len(cols) == 2]
    if len(both) > 1:
        raise ScheduleError(f"{both[0]} and {both[1]} both carry {KEY} and {KEY2}: a pair joined on two keys is a "
                            "composite key, which queries do not have", "keys")
    if all(len(cols) == 1 for _, cols in resolved) and len({cols for _, cols in resolved}) > 1:
        raise ScheduleError(f"no stream carries both {KEY} and {KEY2}: the two classes would not be joined", "keys")
    return resolved if any(KEY2 in cols for _, cols in resolved) else ()


def load_schedule(ref, *, streams: int, duration, rate=None, domain=None) -> Schedule:
    """A schedule from a preset name (:data:`PRESETS`), a YAML/JSON file, or a dict."""
    _check_streams(streams)
    if isinstance(ref, dict):
        return parse_schedule(ref, streams=streams, duration=duration, rate=rate, domain=domain)
    text = str(ref)
    if text in PRESETS:
        return parse_schedule(preset_document(text, streams), streams=streams, duration=duration, rate=rate,
                              domain=domain, name=text)
    path = Path(text).expanduser()
    if not path.exists():
        raise ScheduleError(f"{text!r} is neither a preset ({', '.join(PRESETS)}) nor a file", "--schedule")
    try:
        raw = path.read_text()
        doc = json.loads(raw) if path.suffix == ".json" else yaml.safe_load(raw)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ScheduleError(f"cannot read {path}: {exc}", "--schedule") from None
    name = doc.get("name") if isinstance(doc, dict) and doc.get("name") else path.stem
    return parse_schedule(doc, streams=streams, duration=duration, rate=rate, domain=domain, name=name)


def zipf_cdf(a: float, domain: int) -> np.ndarray:
    """CDF of Zipf(a) over ranks 0..domain-1: P(rank = k) proportional to (k + 1)^-a."""
    weights = np.arange(1, int(domain) + 1, dtype=float) ** (-float(a))
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]
