"""The one statistics schema: what the stats job writes, the forecast reads and writes,
the gates check and the optimizer reads (docs/algorithms.md, "Statistics per cycle").

Per key group ``g`` (group 0 only, when the plan has no partitioning):

- per stream ``s``: ``lambda`` (tuples/s arriving in the cycle), ``kappa`` (distinct
  join-key values in the window state; for a stream in several attribute classes,
  the key of its first class), ``window_tuples`` (``|W_s|``, tuples in the window),
  and ``tuples`` (count in the cycle);
- per directed edge ``(l, r)``: ``gamma`` (match rate m/q, Eq. 9), ``mu`` (mean
  matches per successful lookup s/m, Eq. 10) and the raw counts ``q``, ``m``, ``s``.

Two physical forms of the same records:

- a JSON document (one snapshot: a measured cycle, or a forecast), validated by
  ``schemas/statistics.schema.json``;
- tidy rows (one row per group x stream or group x directed edge per cycle), the
  Parquet history ``<lake>/stats/<query>/cycle=<t>/`` that the forecast reads back.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from mjoin.model.schemas import validate_document
from mjoin.model.timeutil import iso, parse_time
from mjoin.runtime.fsutil import atomic_write_text, read_text

SCHEMA_VERSION = 1
STREAM_FIELDS = ("lambda", "kappa", "window_tuples")
EDGE_FIELDS = ("gamma", "mu")
COUNT_FIELDS = {"stream": ("tuples",), "edge": ("q", "m", "s")}
KINDS = ("measured", "forecast", "last_value", "mean", "synthetic")
#: columns of the tidy form, in order (the Parquet history's schema)
ROW_COLUMNS = ("query", "cycle_start", "cycle_seconds", "group", "entity", "stream", "right",
               "lambda", "kappa", "window_tuples", "tuples", "gamma", "mu", "q", "m", "s")


class StatisticsError(ValueError):
    """Statistics that cannot be used (missing stream or edge, out of range, wrong query)."""


@dataclass
class StreamStats:
    lam: float
    kappa: float
    window_tuples: float
    tuples: float | None = None

    def as_dict(self) -> dict:
        return {"lambda": self.lam, "kappa": self.kappa, "window_tuples": self.window_tuples, "tuples": self.tuples}


@dataclass
class EdgeStats:
    gamma: float
    mu: float
    q: float | None = None
    m: float | None = None
    s: float | None = None

    def as_dict(self) -> dict:
        return {"gamma": self.gamma, "mu": self.mu, "q": self.q, "m": self.m, "s": self.s}

    @classmethod
    def from_counts(cls, q: float, m: float, s: float) -> "EdgeStats":
        """Eq. 9-10: gamma = m / q, mu = s / m (gamma = 0 and mu = 1 where nothing was looked up or matched)."""
        gamma = m / q if q else 0.0
        mu = s / m if m else 1.0
        return cls(gamma=gamma, mu=mu, q=q, m=m, s=s)


@dataclass
class GroupStats:
    streams: dict = field(default_factory=dict)  # name -> StreamStats
    edges: dict = field(default_factory=dict)  # (left, right) -> EdgeStats


@dataclass
class Statistics:
    """One snapshot of the statistics of a query (measured for a cycle, or forecast)."""

    query: str
    groups: dict  # group id -> GroupStats
    kind: str = "measured"
    cycle_start: str | None = None
    cycle_seconds: float | None = None
    partitioning: dict | None = None
    meta: dict = field(default_factory=dict)

    # ---- accessors used by the optimizer (group 0 by default) ----------------
    def group(self, g: int = 0) -> GroupStats:
        try:
            return self.groups[g]
        except KeyError:
            raise StatisticsError(f"statistics of {self.query} have no key group {g} (groups: {sorted(self.groups)})") from None

    def lam(self, s: str, g: int = 0) -> float:
        return self._stream(s, g).lam

    def kappa(self, s: str, g: int = 0) -> float:
        return self._stream(s, g).kappa

    def window_tuples(self, s: str, g: int = 0) -> float:
        return self._stream(s, g).window_tuples

    def gamma(self, l: str, r: str, g: int = 0) -> float:
        return self._edge(l, r, g).gamma

    def mu(self, l: str, r: str, g: int = 0) -> float:
        return self._edge(l, r, g).mu

    def _stream(self, s, g):
        try:
            return self.group(g).streams[s]
        except KeyError:
            raise StatisticsError(f"statistics of {self.query} (group {g}) have no stream {s!r}") from None

    def _edge(self, l, r, g):
        try:
            return self.group(g).edges[(l, r)]
        except KeyError:
            raise StatisticsError(f"statistics of {self.query} (group {g}) have no edge {l}->{r}") from None

    # ---- checks --------------------------------------------------------------
    def problems(self, query) -> list[str]:
        """What makes these statistics unusable for ``query`` (empty list: usable).

        Completeness and ranges only; the data-quality gate (``mjoin.gates``) adds the
        history and plausibility rules and reports through great-expectations."""
        out = []
        if self.query != query.name:
            out.append(f"statistics are for query {self.query!r}, not {query.name!r}")
        for g, gs in sorted(self.groups.items()):
            for s in query.stream_names:
                st = gs.streams.get(s)
                if st is None:
                    out.append(f"group {g}: stream {s} missing")
                    continue
                for name, v in (("lambda", st.lam), ("kappa", st.kappa), ("window_tuples", st.window_tuples)):
                    if v is None or not math.isfinite(v) or v < 0:
                        out.append(f"group {g}: {s}.{name} = {v} (must be finite and >= 0)")
            for l, r in query.directed_edges:
                e = gs.edges.get((l, r))
                if e is None:
                    out.append(f"group {g}: edge {l}->{r} missing")
                    continue
                if e.gamma is None or not math.isfinite(e.gamma) or not 0 <= e.gamma <= 1:
                    out.append(f"group {g}: gamma[{l}][{r}] = {e.gamma} (must be in [0, 1])")
                if e.mu is None or not math.isfinite(e.mu) or e.mu < 0 or (e.gamma and e.gamma > 0 and e.mu < 1):
                    out.append(f"group {g}: mu[{l}][{r}] = {e.mu} (must be finite and >= 1 where gamma > 0)")
            extra = set(gs.streams) - set(query.stream_names)
            if extra:
                out.append(f"group {g}: unknown stream(s) {', '.join(sorted(extra))}")
        if not self.groups:
            out.append("no key group at all")
        return out

    def check(self, query) -> "Statistics":
        problems = self.problems(query)
        if problems:
            raise StatisticsError("; ".join(problems))
        return self

    # ---- JSON ------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "query": self.query,
            "kind": self.kind,
            "cycle_start": self.cycle_start,
            "cycle_seconds": self.cycle_seconds,
            "partitioning": self.partitioning,
            "groups": [
                {
                    "group": g,
                    "streams": [{"stream": s, **st.as_dict()} for s, st in gs.streams.items()],
                    "edges": [{"left": l, "right": r, **e.as_dict()} for (l, r), e in gs.edges.items()],
                }
                for g, gs in sorted(self.groups.items())
            ],
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, doc: dict) -> "Statistics":
        validate_document(doc, "statistics")
        groups = {}
        for gdoc in doc["groups"]:
            gs = GroupStats()
            for st in gdoc["streams"]:
                gs.streams[st["stream"]] = StreamStats(lam=_num(st["lambda"]), kappa=_num(st["kappa"]),
                                                       window_tuples=_num(st["window_tuples"]), tuples=_num(st.get("tuples")))
            for e in gdoc["edges"]:
                gs.edges[(e["left"], e["right"])] = EdgeStats(gamma=_num(e["gamma"]), mu=_num(e["mu"]), q=_num(e.get("q")),
                                                              m=_num(e.get("m")), s=_num(e.get("s")))
            groups[int(gdoc["group"])] = gs
        return cls(query=doc["query"], groups=groups, kind=doc.get("kind", "measured"), cycle_start=doc.get("cycle_start"),
                   cycle_seconds=doc.get("cycle_seconds"), partitioning=doc.get("partitioning"), meta=doc.get("meta") or {})

    def save(self, path) -> Path:
        atomic_write_text(path, json.dumps(self.to_json(), indent=2, default=json_default, allow_nan=True))
        return Path(path)

    @classmethod
    def load(cls, path) -> "Statistics":
        try:
            doc = json.loads(read_text(path))
        except json.JSONDecodeError as exc:
            raise StatisticsError(f"{path}: not JSON ({exc})") from None
        return cls.from_json(doc)

    # ---- tidy rows (Parquet history) -------------------------------------------
    def to_rows(self) -> list[dict]:
        rows = []
        base = {"query": self.query, "cycle_start": self.cycle_start, "cycle_seconds": self.cycle_seconds}
        for g, gs in sorted(self.groups.items()):
            for s, st in gs.streams.items():
                rows.append(_row(base, g, "stream", s, None, st.as_dict()))
            for (l, r), e in gs.edges.items():
                rows.append(_row(base, g, "edge", l, r, e.as_dict()))
        return rows

    @classmethod
    def from_rows(cls, rows: Iterable[dict], kind: str = "measured") -> "Statistics":
        """One snapshot from tidy rows of a single cycle (a pandas frame's ``to_dict('records')``)."""
        rows = list(rows)
        if not rows:
            raise StatisticsError("no statistics rows")
        queries = {r["query"] for r in rows}
        cycles_ = {_cycle_key(r.get("cycle_start")) for r in rows}
        if len(queries) != 1 or len(cycles_) != 1:
            raise StatisticsError(f"rows of one query and one cycle expected, got queries {sorted(queries)} "
                                  f"and {len(cycles_)} cycles")
        groups: dict = {}
        for r in rows:
            gs = groups.setdefault(int(r["group"]), GroupStats())
            if r["entity"] == "stream":
                gs.streams[r["stream"]] = StreamStats(lam=_num(r["lambda"]), kappa=_num(r["kappa"]),
                                                      window_tuples=_num(r["window_tuples"]), tuples=_num(r.get("tuples")))
            elif r["entity"] == "edge":
                gs.edges[(r["stream"], r["right"])] = EdgeStats(gamma=_num(r["gamma"]), mu=_num(r["mu"]), q=_num(r.get("q")),
                                                                m=_num(r.get("m")), s=_num(r.get("s")))
            else:
                raise StatisticsError(f"unknown entity {r['entity']!r} (stream or edge)")
        first = rows[0]
        start = first.get("cycle_start")
        return cls(query=first["query"], groups=groups, kind=kind, cycle_start=None if start is None else iso(start),
                   cycle_seconds=_num(first.get("cycle_seconds")))


def aggregate_rows(rows: Iterable[dict], kind: str = "measured") -> Statistics:
    """One snapshot for several cycles of tidy rows (e.g. a whole re-optimization interval).

    Per stream: mean ``lambda``, ``kappa``, ``window_tuples`` over the cycles, summed
    ``tuples``; per edge: summed ``q``, ``m``, ``s`` and then Eq. 9-10 (so ``gamma`` and
    ``mu`` are the interval's own match rate and mean matches, not a mean of ratios)."""
    rows = list(rows)
    if not rows:
        raise StatisticsError("no statistics rows to aggregate")
    streams, edges, cycles_ = {}, {}, set()
    for r in rows:
        cycles_.add(_cycle_key(r.get("cycle_start")))
        g = int(r["group"])
        if r["entity"] == "stream":
            acc = streams.setdefault((g, r["stream"]), {"lambda": [], "kappa": [], "window_tuples": [], "tuples": 0.0})
            for f in STREAM_FIELDS:
                if r.get(f) is not None and math.isfinite(float(r[f])):
                    acc[f].append(float(r[f]))
            acc["tuples"] += float(r.get("tuples") or 0)
        elif r["entity"] == "edge":
            acc = edges.setdefault((g, r["stream"], r["right"]), [0.0, 0.0, 0.0])
            for i, f in enumerate(("q", "m", "s")):
                acc[i] += float(r.get(f) or 0)
    groups: dict = {}
    for (g, s), acc in streams.items():
        mean = lambda xs: sum(xs) / len(xs) if xs else math.nan
        groups.setdefault(g, GroupStats()).streams[s] = StreamStats(
            lam=mean(acc["lambda"]), kappa=mean(acc["kappa"]), window_tuples=mean(acc["window_tuples"]), tuples=acc["tuples"])
    for (g, l, r), (q, m, s) in edges.items():
        groups.setdefault(g, GroupStats()).edges[(l, r)] = EdgeStats.from_counts(q, m, s)
    starts = sorted(c for c in cycles_ if c is not None and not isinstance(c, str))
    first = rows[0]
    return Statistics(query=first["query"], groups=groups, kind=kind,
                      cycle_start=iso(starts[0]) if starts else None,
                      cycle_seconds=_num(first.get("cycle_seconds")),
                      meta={"aggregated_cycles": len(cycles_)})


def _row(base, g, entity, stream, right, values) -> dict:
    row = {c: None for c in ROW_COLUMNS}
    row.update(base)
    row.update({"group": g, "entity": entity, "stream": stream, "right": right})
    row.update(values)
    return row


def _num(v):
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise StatisticsError(f"{v!r} is not a number") from None
    return f


def _cycle_key(v):
    if v is None:
        return None
    try:
        return parse_time(v).timestamp()
    except (TypeError, ValueError):
        return str(v)


def json_default(o):
    """``json.dumps``' ``default``: datetimes as ISO strings, numpy scalars as Python values."""
    if hasattr(o, "isoformat"):
        return iso(o)
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")
