"""Query specs: the one YAML format, its validation, the join graph and attribute classes.

A spec names the streams of a multi-way sliding-window equi-join (docs/algorithms.md,
"Notation"): per stream its source folder in the lake, event time, window,
typed columns and join keys; the equi-join predicates; the output columns.

The join graph has one vertex per stream. Attribute classes are the
transitive closure of the predicates over ``(stream, column)``; within a class
every pair of streams is joinable, so the graph holds an edge for every such
pair, not only for the predicates written (the seed query written as a chain
``cu = sr = wr = cr`` is the complete graph K4, which is why all 24 initial
orders of the paper are valid for every stream).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from itertools import combinations
from pathlib import Path
from typing import Iterable, Sequence

import yaml

from mjoin.model.timeutil import format_duration, parse_duration

SPEC_VERSION = 1
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
INTEGRAL_TYPES = ("long", "int", "short")
TYPES = INTEGRAL_TYPES + ("string", "double", "float", "boolean", "date", "timestamp")
DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
QUERIES_DIR = Path(__file__).resolve().parents[2] / "queries"


class QuerySpecError(ValueError):
    """A spec that cannot be used; ``field`` names where: a top-level key (``predicates[1]``,
    ``output[0]``, ``lateness``) or ``streams[<index>] (<name>).<key>`` (``streams[<index>].<key>``
    before the stream's name is known), e.g. ``streams[2] (wr).window``."""

    def __init__(self, field: str, message: str, source: str | None = None):
        self.field = field
        self.message = message
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {message}")


@dataclass(frozen=True)
class EventTime:
    """How a stream's event time is obtained: a column (timestamp, epoch seconds or a
    string parsed with ``format``) or a Spark SQL ``expr`` deriving it."""

    column: str | None = None
    format: str | None = None
    expr: str | None = None

    def to_spec(self):
        if self.expr is not None:
            return {"expr": self.expr}
        if self.format is not None:
            return {"column": self.column, "format": self.format}
        return self.column


@dataclass(frozen=True)
class Stream:
    name: str
    source: str
    event_time: EventTime
    window: float
    columns: dict
    keys: tuple

    def type_of(self, column: str) -> str:
        return self.columns[column]


@dataclass(frozen=True)
class Predicate:
    left: str
    left_column: str
    right: str
    right_column: str

    def __str__(self) -> str:
        return f"{self.left}.{self.left_column} = {self.right}.{self.right_column}"


@dataclass(frozen=True)
class Band:
    """A residual band predicate ``|left.left_column - right.right_column| <= width`` between two streams
    that an equi-predicate already joins (PSP's band join, applied after the key lookup)."""

    left: str
    left_column: str
    right: str
    right_column: str
    width: float

    def __str__(self) -> str:
        w = int(self.width) if float(self.width).is_integer() else self.width
        return f"abs({self.left}.{self.left_column} - {self.right}.{self.right_column}) <= {w}"

    def column_of(self, stream: str) -> str:
        return self.left_column if stream == self.left else self.right_column


_NUMERIC_TYPES = ("long", "int", "short", "double", "float")


@dataclass(frozen=True)
class Edge:
    """An undirected join-graph edge between two streams, within one attribute class."""

    a: str
    b: str
    a_column: str
    b_column: str
    attr_class: str
    explicit: bool  # written as a predicate (False: implied by transitivity)

    def column_of(self, stream: str) -> str:
        if stream == self.a:
            return self.a_column
        if stream == self.b:
            return self.b_column
        raise KeyError(stream)

    def other(self, stream: str) -> str:
        return self.b if stream == self.a else self.a


@dataclass(frozen=True)
class OutputColumn:
    stream: str
    column: str
    name: str


@dataclass(frozen=True)
class Query:
    name: str
    streams: tuple
    predicates: tuple
    output: tuple
    lateness: float = 0.0
    description: str = ""
    source_path: str | None = field(default=None, compare=False)
    bands: tuple = ()  # Band: residual predicates between joined streams

    # ---- streams ---------------------------------------------------------
    @property
    def stream_names(self) -> list[str]:
        return [s.name for s in self.streams]

    def stream(self, name: str) -> Stream:
        for s in self.streams:
            if s.name == name:
                return s
        raise KeyError(f"query {self.name!r} has no stream {name!r} (streams: {', '.join(self.stream_names)})")

    @property
    def max_window(self) -> float:
        return max(s.window for s in self.streams)

    # ---- attribute classes -----------------------------------------------
    @cached_property
    def attribute_classes(self) -> dict[str, tuple[tuple[str, str], ...]]:
        """Class id (``c0``, ``c1``, ... in order of first appearance) -> its (stream, column) members."""
        parent: dict = {}

        def find(x):
            while parent.setdefault(x, x) != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        order = []
        for p in self.predicates:
            for node in ((p.left, p.left_column), (p.right, p.right_column)):
                if node not in parent:
                    order.append(node)
                    parent[node] = node
            parent[find((p.left, p.left_column))] = find((p.right, p.right_column))
        classes: dict = {}
        for node in order:
            classes.setdefault(find(node), []).append(node)
        return {f"c{i}": tuple(members) for i, members in enumerate(classes.values())}

    def class_of(self, stream: str, column: str) -> str:
        for cid, members in self.attribute_classes.items():
            if (stream, column) in members:
                return cid
        raise KeyError(f"{stream}.{column} is not a join key")

    def key_column(self, stream: str, attr_class: str) -> str | None:
        """The column of ``stream`` in ``attr_class`` (None if the stream is not in it); for a band class,
        the stream's band column."""
        if attr_class in self.band_classes:
            b = self.band_classes[attr_class]
            return b.column_of(stream) if stream in (b.left, b.right) else None
        for s, c in self.attribute_classes[attr_class]:
            if s == stream:
                return c
        return None

    def classes_of(self, stream: str) -> list[str]:
        return [cid for cid, members in self.attribute_classes.items() if any(s == stream for s, _ in members)]

    @property
    def single_class(self) -> bool:
        return len(self.attribute_classes) == 1 and not self.band_classes

    # ---- bands (PSP) -------------------------------------------------------
    @cached_property
    def band_classes(self) -> dict:
        """``b0``, ``b1``, ... -> a band predicate between two streams no key joins: such a pair is joined by
        the band alone, on time-sliced state (PSP, docs/engine.md)."""
        joined = {frozenset((e.a, e.b)) for e in self._equi_edges}
        alone = [b for b in self.bands if frozenset((b.left, b.right)) not in joined]
        return {f"b{i}": b for i, b in enumerate(alone)}

    @property
    def all_classes(self) -> list[str]:
        """The attribute classes, then the band classes (what the engine and the statistics key state by)."""
        return list(self.attribute_classes) + list(self.band_classes)

    def all_classes_of(self, stream: str) -> list[str]:
        return self.classes_of(stream) + [c for c, b in self.band_classes.items() if stream in (b.left, b.right)]

    def band_scale(self, attr_class: str) -> int:
        """Decimal scale of a band class's columns (its values are kept as integers times 10^scale)."""
        b = self.band_classes[attr_class]
        return _decimal_scale(self.stream(b.left).type_of(b.left_column))

    @property
    def residual_bands(self) -> tuple:
        """Bands between streams a key already joins: filters applied after the key lookup."""
        alone = set(self.band_classes.values())
        return tuple(b for b in self.bands if b not in alone)

    # ---- join graph --------------------------------------------------------
    @cached_property
    def _equi_edges(self) -> tuple[Edge, ...]:
        explicit = {frozenset(((p.left, p.left_column), (p.right, p.right_column))) for p in self.predicates}
        rank = {n: i for i, n in enumerate(self.stream_names)}
        out = []
        for cid, members in self.attribute_classes.items():
            for (s1, c1), (s2, c2) in combinations(members, 2):
                if rank[s1] > rank[s2]:
                    (s1, c1), (s2, c2) = (s2, c2), (s1, c1)
                out.append(Edge(s1, s2, c1, c2, cid, frozenset(((s1, c1), (s2, c2))) in explicit))
        return tuple(out)

    @cached_property
    def edges(self) -> tuple[Edge, ...]:
        """The join graph: every pair joined by a key (within an attribute class), and every pair joined by a
        band alone (its band class ``b<i>``)."""
        rank = {n: i for i, n in enumerate(self.stream_names)}
        out = list(self._equi_edges)
        for cid, b in self.band_classes.items():
            (s1, c1), (s2, c2) = sorted([(b.left, b.left_column), (b.right, b.right_column)], key=lambda x: rank[x[0]])
            out.append(Edge(s1, s2, c1, c2, cid, True))
        out.sort(key=lambda e: (rank[e.a], rank[e.b]))
        return tuple(out)

    def edge(self, left: str, right: str) -> Edge:
        """The edge joining two streams (KeyError if they are not adjacent)."""
        for e in self.edges:
            if {e.a, e.b} == {left, right}:
                return e
        raise KeyError(f"no join predicate connects {left} and {right}")

    def has_edge(self, left: str, right: str) -> bool:
        return any({e.a, e.b} == {left, right} for e in self.edges)

    def neighbors(self, stream: str) -> list[str]:
        return [n for n in self.stream_names if n != stream and self.has_edge(stream, n)]

    @property
    def directed_edges(self) -> list[tuple[str, str]]:
        """Every ordered pair ``(l, r)`` that is an edge: the keys of ``gamma`` and ``mu``."""
        out = []
        for e in self.edges:
            out += [(e.a, e.b), (e.b, e.a)]
        rank = {n: i for i, n in enumerate(self.stream_names)}
        return sorted(out, key=lambda lr: (rank[lr[0]], rank[lr[1]]))

    def expansion_error(self, start: str, pairs: Sequence[Sequence[str]]) -> str | None:
        """Why ``pairs`` is not a connected expansion of the graph from ``start`` (None if it is)."""
        if start not in self.stream_names:
            return f"unknown stream {start!r}"
        joined = [start]
        for k, pair in enumerate(pairs):
            if len(pair) != 2:
                return f"step {k + 1} is {list(pair)!r}, not a pair [l, r]"
            left, right = pair
            for s in (left, right):
                if s not in self.stream_names:
                    return f"step {k + 1} [{left}, {right}]: unknown stream {s!r}"
            if left not in joined:
                return f"step {k + 1} [{left}, {right}]: {left} is not yet in the partial result {joined}"
            if right in joined:
                return f"step {k + 1} [{left}, {right}]: {right} is already in the partial result {joined}"
            if not self.has_edge(left, right):
                return f"step {k + 1} [{left}, {right}]: no join predicate connects {left} and {right}"
            joined.append(right)
        missing = [s for s in self.stream_names if s not in joined]
        if missing:
            return f"the order never reaches {', '.join(missing)}"
        return None

    # ---- identity ------------------------------------------------------------
    def to_spec(self) -> dict:
        """The canonical spec (what :func:`parse_query` reads back to an equal query)."""
        return {
            "spec_version": SPEC_VERSION,
            "name": self.name,
            "description": self.description,
            "lateness": format_duration(self.lateness),
            "streams": [
                {
                    "name": s.name,
                    "source": s.source,
                    "event_time": s.event_time.to_spec(),
                    "window": format_duration(s.window),
                    "columns": dict(s.columns),
                    "keys": list(s.keys),
                }
                for s in self.streams
            ],
            "predicates": [str(p) for p in self.predicates] + [str(b) for b in self.bands],
            "output": [f"{o.stream}.{o.column}" + ("" if o.name == o.column else f" AS {o.name}") for o in self.output],
        }

    @cached_property
    def fingerprint(self) -> str:
        """sha256 of the canonical spec: plans and statistics record which spec they were made for."""
        canonical = json.dumps(self.to_spec(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def describe(self) -> str:
        lines = [f"query {self.name}: {len(self.streams)} streams, lateness {format_duration(self.lateness)}"]
        for s in self.streams:
            lines.append(f"  {s.name:<6} source={s.source} window={format_duration(s.window)} keys={','.join(s.keys)}")
        for cid, members in self.attribute_classes.items():
            lines.append(f"  class {cid}: " + " = ".join(f"{s}.{c}" for s, c in members))
        lines.append("  edges: " + ", ".join(f"{e.a}-{e.b}" + ("" if e.explicit else "*") for e in self.edges)
                     + "   (* implied by transitivity)")
        for b in self.residual_bands:
            lines.append(f"  band: {b}   (residual, after the key lookup)")
        for cid, b in self.band_classes.items():
            lines.append(f"  band {cid}: {b}   (joins {b.left} and {b.right} alone: time-sliced state, PSP)")
        lines.append("  output: " + ", ".join(o.name for o in self.output))
        return "\n".join(lines)


# ---- loading and validation ----------------------------------------------------

def _require(doc: dict, key: str, where: str, source):
    if not isinstance(doc, dict) or key not in doc or doc[key] in (None, ""):
        raise QuerySpecError(f"{where}{key}" if where else key, "is required", source)
    return doc[key]


def _check_type(t, where: str, source) -> str:
    t = str(t).strip().lower()
    if t in TYPES or DECIMAL.match(t):
        return t
    raise QuerySpecError(where, f"unknown type {t!r} (use one of {', '.join(TYPES)}, decimal(p,s))", source)


def _parse_stream(i: int, doc, source) -> Stream:
    where = f"streams[{i}]."
    if not isinstance(doc, dict):
        raise QuerySpecError(f"streams[{i}]", "must be a mapping with name, source, event_time, window, columns, keys", source)
    unknown = set(doc) - {"name", "source", "event_time", "window", "columns", "keys", "description"}
    if unknown:
        raise QuerySpecError(f"streams[{i}]", f"unknown field(s) {', '.join(sorted(unknown))}", source)
    name = str(_require(doc, "name", where, source))
    if not NAME.match(name):
        raise QuerySpecError(f"{where}name", f"{name!r} is not an identifier (letters, digits, _)", source)
    where = f"streams[{i}] ({name})."
    src = str(doc.get("source") or name)
    if not re.match(r"^[A-Za-z0-9_.\-]+$", src):
        raise QuerySpecError(f"{where}source", f"{src!r} is not a folder name", source)
    try:
        window = parse_duration(_require(doc, "window", where, source))
    except ValueError as exc:
        raise QuerySpecError(f"{where}window", str(exc), source) from None
    if window <= 0:
        raise QuerySpecError(f"{where}window", "must be positive", source)
    cols = _require(doc, "columns", where, source)
    if not isinstance(cols, dict) or not cols:
        raise QuerySpecError(f"{where}columns", "must map column names to types, e.g. {sr_addr_sk: long}", source)
    columns = {}
    for c, t in cols.items():
        if not NAME.match(str(c)):
            raise QuerySpecError(f"{where}columns.{c}", "is not an identifier", source)
        columns[str(c)] = _check_type(t, f"{where}columns.{c}", source)
    keys = doc.get("keys", [])
    if isinstance(keys, str):
        keys = [keys]
    if not isinstance(keys, list):
        raise QuerySpecError(f"{where}keys", "must list the stream's join-key columns", source)
    for k in keys:
        if k not in columns:
            raise QuerySpecError(f"{where}keys", f"{k!r} is not one of the declared columns", source)
        if columns[k] not in INTEGRAL_TYPES:
            raise QuerySpecError(f"{where}keys", f"{k!r} has type {columns[k]}; join keys must be integral "
                                 f"({', '.join(INTEGRAL_TYPES)}): the engine indexes keys as int64", source)
    et = _require(doc, "event_time", where, source)
    if isinstance(et, str):
        et = {"column": et}
    if not isinstance(et, dict) or not (("column" in et) ^ ("expr" in et)):
        raise QuerySpecError(f"{where}event_time", "must be a column name, {column: c, format: f} or {expr: <Spark SQL>}", source)
    if "column" in et:
        col = et["column"]
        if col not in columns:
            raise QuerySpecError(f"{where}event_time", f"column {col!r} is not one of the declared columns", source)
        ctype = columns[col]
        fmt = et.get("format")
        if ctype == "string" and not fmt:
            raise QuerySpecError(f"{where}event_time", f"string column {col!r} needs a format, e.g. yyyy-MM-dd HH:mm:ss", source)
        if ctype not in ("timestamp", "long", "int", "double", "string", "date"):
            raise QuerySpecError(f"{where}event_time", f"column {col!r} of type {ctype} cannot hold a time", source)
        event_time = EventTime(column=col, format=fmt)
    else:
        event_time = EventTime(expr=str(et["expr"]))
    return Stream(name=name, source=src, event_time=event_time, window=window, columns=columns, keys=tuple(keys))


_PRED = re.compile(r"^\s*([A-Za-z_]\w*)\.([A-Za-z_]\w*)\s*=\s*([A-Za-z_]\w*)\.([A-Za-z_]\w*)\s*$")
_OUT = re.compile(r"^\s*([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\s+(?:AS|as)\s+([A-Za-z_]\w*))?\s*$")


_BAND_ABS = re.compile(r"^\s*abs\(\s*(\w+)\.(\w+)\s*-\s*(\w+)\.(\w+)\s*\)\s*<=\s*([0-9]+(?:\.[0-9]+)?)\s*$", re.I)
_BAND_BETWEEN = re.compile(r"^\s*(\w+)\.(\w+)\s+BETWEEN\s+(\w+)\.(\w+)\s*-\s*([0-9]+(?:\.[0-9]+)?)\s+AND\s+"
                           r"(\w+)\.(\w+)\s*\+\s*([0-9]+(?:\.[0-9]+)?)\s*$", re.I)


def _decimal_scale(spec_type: str) -> int:
    """The scale of a decimal(p,s) spec type (0 for integers)."""
    m = re.match(r"^decimal\(\s*\d+\s*,\s*(\d+)\s*\)$", spec_type)
    return int(m.group(1)) if m else 0


def _parse_band(i: int, text: str, by_name: dict, source) -> Band | None:
    """A band predicate (None if ``text`` is not one), validated: known streams and numeric columns."""
    m = _BAND_ABS.match(text)
    if m:
        l, lc, r, rc, w = m.groups()
    else:
        m = _BAND_BETWEEN.match(text)
        if not m:
            return None
        l, lc, r, rc, w1, r2, rc2, w2 = m.groups()
        if (r2, rc2) != (r, rc) or float(w1) != float(w2):
            raise QuerySpecError(f"predicates[{i}]", f"{text!r}: a band is 'a.x BETWEEN b.y - c AND b.y + c' with the "
                                 "same column and width on both sides", source)
        w = w1
    for s, c in ((l, lc), (r, rc)):
        if s not in by_name:
            raise QuerySpecError(f"predicates[{i}]", f"unknown stream {s!r} in {text!r}", source)
        t = by_name[s].columns.get(c)
        if t is None:
            raise QuerySpecError(f"predicates[{i}]", f"{s}.{c} is not a declared column of stream {s}", source)
        if t not in _NUMERIC_TYPES and not t.startswith("decimal("):
            raise QuerySpecError(f"predicates[{i}]", f"{s}.{c} is {t}: a band compares numbers "
                                 "(long, int, short, double, float, decimal)", source)
    if l == r:
        raise QuerySpecError(f"predicates[{i}]", f"{text!r} compares stream {l} with itself", source)
    return Band(l, lc, r, rc, float(w))


def parse_query(doc: dict, source: str | None = None) -> Query:
    """Validate a spec document (already parsed from YAML) and build the :class:`Query`."""
    if not isinstance(doc, dict):
        raise QuerySpecError("(top level)", "a query spec is a mapping with name, streams, predicates, output", source)
    unknown = set(doc) - {"spec_version", "name", "description", "streams", "predicates", "output", "lateness"}
    if unknown:
        raise QuerySpecError("(top level)", f"unknown field(s) {', '.join(sorted(unknown))}", source)
    if doc.get("spec_version", SPEC_VERSION) != SPEC_VERSION:
        raise QuerySpecError("spec_version", f"{doc.get('spec_version')!r} is not supported (this mjoin reads {SPEC_VERSION})", source)
    name = str(_require(doc, "name", "", source))
    if not NAME.match(name):
        raise QuerySpecError("name", f"{name!r} is not an identifier (letters, digits, _)", source)
    try:
        lateness = parse_duration(doc.get("lateness", 0))
    except ValueError as exc:
        raise QuerySpecError("lateness", str(exc), source) from None

    raw_streams = _require(doc, "streams", "", source)
    if not isinstance(raw_streams, list) or len(raw_streams) < 2:
        raise QuerySpecError("streams", "a multi-way join needs a list of at least 2 streams", source)
    streams = [_parse_stream(i, s, source) for i, s in enumerate(raw_streams)]
    by_name = {}
    for i, s in enumerate(streams):
        if s.name in by_name:
            raise QuerySpecError(f"streams[{i}].name", f"duplicate stream name {s.name!r}", source)
        by_name[s.name] = s

    raw_preds = _require(doc, "predicates", "", source)
    if not isinstance(raw_preds, list) or not raw_preds:
        raise QuerySpecError("predicates", "must list equi-join predicates like 'a.x = b.y'", source)
    preds = []
    pairs = {}
    bands = []
    for i, text in enumerate(raw_preds):
        band = _parse_band(i, str(text), by_name, source)
        if band is not None:
            bands.append(band)
            continue
        m = _PRED.match(str(text))
        if not m:
            raise QuerySpecError(f"predicates[{i}]", f"{text!r} is not an equi-join 'stream.column = stream.column' nor "
                                 "a band 'abs(a.x - b.y) <= c' / 'a.x BETWEEN b.y - c AND b.y + c'", source)
        l, lc, r, rc = m.groups()
        for s, c in ((l, lc), (r, rc)):
            if s not in by_name:
                raise QuerySpecError(f"predicates[{i}]", f"unknown stream {s!r} in {text!r}", source)
            if c not in by_name[s].keys:
                raise QuerySpecError(f"predicates[{i}]", f"{s}.{c} is not in the keys of stream {s} ({', '.join(by_name[s].keys)})", source)
        if l == r:
            raise QuerySpecError(f"predicates[{i}]", f"{text!r} joins stream {l} with itself", source)
        pair = frozenset((l, r))
        if pair in pairs:
            raise QuerySpecError(f"predicates[{i}]", f"{l} and {r} are already joined by predicates[{pairs[pair]}]; "
                                 "composite keys between one pair of streams are not supported", source)
        pairs[pair] = i
        preds.append(Predicate(l, lc, r, rc))

    raw_out = _require(doc, "output", "", source)
    if not isinstance(raw_out, list) or not raw_out:
        raise QuerySpecError("output", "must list the projected columns as 'stream.column [AS name]'", source)
    output = []
    for i, text in enumerate(raw_out):
        m = _OUT.match(str(text))
        if not m:
            raise QuerySpecError(f"output[{i}]", f"{text!r} is not 'stream.column' or 'stream.column AS name'", source)
        s, c, alias = m.groups()
        if s not in by_name:
            raise QuerySpecError(f"output[{i}]", f"unknown stream {s!r}", source)
        if c not in by_name[s].columns:
            raise QuerySpecError(f"output[{i}]", f"{s}.{c} is not a declared column of stream {s}", source)
        output.append(OutputColumn(s, c, alias or c))
    seen = {}
    for i, o in enumerate(output):
        if o.name in seen:
            raise QuerySpecError(f"output[{i}]", f"output name {o.name!r} is used twice; rename one with AS", source)
        seen[o.name] = i

    if not preds and not bands:
        raise QuerySpecError("predicates", "needs at least one join predicate", source)
    query = Query(name=name, streams=tuple(streams), predicates=tuple(preds), output=tuple(output),
                  lateness=lateness, description=str(doc.get("description") or ""), source_path=source,
                  bands=tuple(bands))
    alone = set(query.band_classes.values())
    pairs_seen: dict = {}
    for i, text in enumerate(raw_preds):
        b = _parse_band(i, str(text), by_name, source)
        if b is None or b not in alone:
            continue
        pair = frozenset((b.left, b.right))
        if pair in pairs_seen:
            raise QuerySpecError(f"predicates[{i}]", f"{b.left} and {b.right} are already joined by the band "
                                 f"predicates[{pairs_seen[pair]}]; one band per pair joined by bands alone", source)
        pairs_seen[pair] = i
        for s_, c_ in ((b.left, b.left_column), (b.right, b.right_column)):
            t = by_name[s_].columns[c_]
            if t not in INTEGRAL_TYPES and not t.startswith("decimal("):
                raise QuerySpecError(f"predicates[{i}]", f"{s_}.{c_} is {t}: a band that joins two streams alone "
                                     "(time-sliced state) compares integral or decimal columns (the state is sorted "
                                     "by them as int64)", source)
        scales = {_decimal_scale(by_name[s_].columns[c_]) for s_, c_ in ((b.left, b.left_column),
                                                                        (b.right, b.right_column))}
        if len(scales) > 1:
            raise QuerySpecError(f"predicates[{i}]", f"{text!r}: both columns of a band that joins two streams alone "
                                 "need the same scale (two integers, or decimals with the same scale)", source)
        scale = scales.pop()
        if abs(b.width * 10 ** scale - round(b.width * 10 ** scale)) > 1e-9:
            raise QuerySpecError(f"predicates[{i}]", f"{text!r}: the width {b.width:g} has more decimals than the "
                                 f"columns ({scale})", source)

    # graph-level checks
    for cid, members in query.attribute_classes.items():
        seen_streams = {}
        for s, c in members:
            if s in seen_streams and seen_streams[s] != c:
                raise QuerySpecError("predicates", f"attribute class {cid} holds two columns of stream {s} "
                                     f"({seen_streams[s]}, {c}); a stream may join on one column per class", source)
            seen_streams[s] = c
    for i, s in enumerate(streams):
        for k in s.keys:
            try:
                query.class_of(s.name, k)
            except KeyError:
                raise QuerySpecError(f"streams[{i}] ({s.name}).keys", f"key {k!r} is not used by any predicate",
                                     source) from None
    for i, s in enumerate(streams):
        if not s.keys and not any(s.name in (b.left, b.right) for b in query.band_classes.values()):
            raise QuerySpecError(f"streams[{i}] ({s.name}).keys", "must list the stream's join-key columns (a stream "
                                 "without keys is joined by a band predicate alone)", source)
    reached, frontier = {streams[0].name}, [streams[0].name]
    while frontier:
        n = frontier.pop()
        for m in query.neighbors(n):
            if m not in reached:
                reached.add(m)
                frontier.append(m)
    if len(reached) != len(streams):
        lost = [s.name for s in streams if s.name not in reached]
        raise QuerySpecError("predicates", f"the join graph is not connected: {', '.join(lost)} cannot be reached "
                             "(cross products are not supported)", source)
    return query


def resolve_query_path(ref: str | os.PathLike) -> Path:
    """A spec path, or a bare query name looked up in ``$MJOIN_QUERIES`` then ``include/queries/``."""
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    dirs = [Path(d) for d in os.environ.get("MJOIN_QUERIES", "").split(os.pathsep) if d] + [QUERIES_DIR]
    for d in dirs:
        for suffix in (".yaml", ".yml"):
            if (d / f"{ref}{suffix}").exists():
                return d / f"{ref}{suffix}"
    raise QuerySpecError("(file)", f"no query spec {ref!r} (looked in {', '.join(str(d) for d in dirs)})")


def load_query(ref: str | os.PathLike | Query) -> Query:
    """Load and validate a spec from a YAML path or a query name; a Query is returned as is."""
    if isinstance(ref, Query):
        return ref
    path = resolve_query_path(ref)
    try:
        text = path.read_text()
    except OSError as exc:
        raise QuerySpecError("(file)", f"cannot read {path}: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise QuerySpecError("(yaml)", f"not valid YAML: {exc}", str(path)) from None
    return parse_query(doc, source=str(path))


def list_queries() -> list[str]:
    return sorted(p.stem for p in QUERIES_DIR.glob("*.yaml"))


def stream_order_from(query: Query, names: Iterable[str]) -> list[str]:
    """Validate a permutation of the query's streams (e.g. ``--initial-order cu,sr,wr,cr``)."""
    names = [n.strip() for n in names if n.strip()]
    if sorted(names) != sorted(query.stream_names):
        raise ValueError(f"{','.join(names)} is not a permutation of the streams {','.join(query.stream_names)}")
    return names
