"""What the engine needs to know about a query and a plan, flattened for the per-bucket operator.

Pure (no Spark): :class:`EngineQuery` numbers the streams (canonical order = spec
order, the delta decomposition's order) and the attribute classes, names the
columns every row carries, and :class:`CompiledPlan` cuts each probe order into
same-class *segments* (docs/algorithms.md, "Cost model": a step into another attribute class
needs the partial results materialised and re-bucketed by the new class key).

Row layout shared by deltas, state files and partial results (the "frame"):

- ``_ts``: event time, int64 epoch microseconds;
- ``_k_<class>``: the stream's key in that attribute class (int64; null where the
  stream, or a partial result, has no member in the class);
- ``<stream>__<column>``: the payload, i.e. only the columns the query outputs
  (never whole rows: carrying whole TPC-DS rows cost ~10x, see docs/engine.md).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from mjoin.model.plan import PlanError

MICROS = 1_000_000


def payload_name(stream: str, column: str) -> str:
    return f"{stream}__{column}"


def _scale(spec_type: str) -> int:
    m = re.match(r"^decimal\(\s*\d+\s*,\s*(\d+)\s*\)$", spec_type)
    return int(m.group(1)) if m else 0


def key_name(attr_class: str) -> str:
    return f"_k_{attr_class}"


@dataclass(frozen=True)
class EngineQuery:
    """A query spec seen from the engine: indices, windows in micros, payload columns."""

    name: str
    streams: tuple  # canonical order
    classes: tuple  # attribute class ids, c0, c1, ...
    stream_classes: dict  # stream -> tuple of class ids
    key_columns: dict  # (stream, class) -> column
    window_us: dict  # stream -> int
    lateness_us: int
    payload: dict  # stream -> tuple of (column, spec type)
    output: tuple  # (output name, payload column name)
    fingerprint: str
    #: residual band predicates: (left, left payload column, right, right payload column, width)
    bands: tuple = ()
    #: band classes (a pair joined by a band alone, PSP): class -> half-width of the band in the key's int64
    #: units (decimals are scaled to integers); their keys are the band columns, their buckets time slices
    band_width: dict = field(default_factory=dict)
    band_scale: dict = field(default_factory=dict)  # class -> decimal scale of its columns (0: integers)

    @classmethod
    def from_query(cls, query) -> "EngineQuery":
        band_classes = dict(getattr(query, "band_classes", {}))
        classes = tuple(query.attribute_classes) + tuple(band_classes)
        stream_classes = {s: tuple(query.classes_of(s)) + tuple(c for c, b in band_classes.items() if s in (b.left, b.right))
                          for s in query.stream_names}
        key_columns = {(s, c): query.key_column(s, c) for s in query.stream_names for c in stream_classes[s]
                       if c not in band_classes}
        key_columns.update({(s, c): b.column_of(s) for c, b in band_classes.items() for s in (b.left, b.right)})
        band_scale = {c: _scale(query.stream(b.left).type_of(b.left_column)) for c, b in band_classes.items()}
        band_width = {c: int(round(b.width * 10 ** band_scale[c])) for c, b in band_classes.items()}
        payload = {}
        bands = tuple(getattr(query, "residual_bands", ()))
        for s in query.streams:
            cols = []
            wanted = [o.column for o in query.output if o.stream == s.name] + \
                [b.column_of(s.name) for b in bands if s.name in (b.left, b.right)]
            for c in wanted:  # the output's columns and the bands' (carried with the state)
                if c not in [x for x, _ in cols]:
                    cols.append((c, s.type_of(c)))
            payload[s.name] = tuple(cols)
        return cls(
            name=query.name, streams=tuple(query.stream_names), classes=classes, stream_classes=stream_classes,
            key_columns=key_columns,
            window_us={s.name: int(round(s.window * MICROS)) for s in query.streams},
            lateness_us=int(round(query.lateness * MICROS)), payload=payload,
            output=tuple((o.name, payload_name(o.stream, o.column)) for o in query.output),
            fingerprint=query.fingerprint,
            bands=tuple((b.left, payload_name(b.left, b.left_column), b.right, payload_name(b.right, b.right_column),
                         b.width) for b in bands),
            band_width=band_width, band_scale=band_scale,
        )

    def is_band(self, attr_class: str) -> bool:
        return attr_class in self.band_width

    def index(self, stream: str) -> int:
        return self.streams.index(stream)

    def class_index(self, attr_class: str) -> int:
        return self.classes.index(attr_class)

    def members(self, attr_class: str) -> list[str]:
        """Streams with a key in ``attr_class``, canonical order."""
        return [s for s in self.streams if attr_class in self.stream_classes[s]]

    def payload_columns(self, stream: str) -> list[str]:
        return [payload_name(stream, c) for c, _ in self.payload[stream]]

    @property
    def all_payload_columns(self) -> list[str]:
        return [p for s in self.streams for p in self.payload_columns(s)]

    def state_columns(self, stream: str) -> list[str]:
        """Columns of a state file of ``stream`` (any class copy): time, its class keys, its payload."""
        return ["_ts"] + [key_name(c) for c in self.stream_classes[stream]] + self.payload_columns(stream)



@dataclass(frozen=True)
class Segment:
    """Consecutive probe steps ``[start, end)`` of one order that share attribute class ``attr_class``."""

    attr_class: str
    start: int
    end: int


@dataclass(frozen=True)
class ChainPlan:
    stream: str
    group: int
    steps: tuple  # ((l, r, attr_class), ...)
    segments: tuple  # (Segment, ...)

    def segment_at(self, step: int) -> Segment:
        for seg in self.segments:
            if seg.start == step:
                return seg
        raise KeyError(f"no segment of {self.stream}'s order starts at step {step}")


@dataclass(frozen=True)
class CompiledPlan:
    """A validated plan cut into per-(group, stream) chains of same-class segments."""

    version: int | None
    strategy: str
    source: str  # registry | cli | default
    chains: dict  # (group, stream) -> ChainPlan
    partitioning: dict | None = None
    prefilter: bool = False
    groups: tuple = (0,)
    punctuation: str = "eager"  # eager | lazy | off (plan.options.punctuation)
    punctuation_threshold: int = 1000

    @classmethod
    def from_plan(cls, query, plan, source: str = "cli", prefilter: bool | None = None) -> "CompiledPlan":
        plan.validate(query)
        use_prefilter = plan.prefilter if prefilter is None else bool(prefilter)
        if use_prefilter and not query.single_class:
            raise PlanError(f"the SMJ prefilter needs a single attribute class; {query.name} has "
                            f"{len(query.attribute_classes)}")
        chains = {}
        for g in plan.group_ids:
            for s in query.stream_names:
                steps = tuple((l, r, query.edge(l, r).attr_class) for l, r in plan.order(s, g))
                segs, start = [], 0
                for k in range(1, len(steps) + 1):
                    if k == len(steps) or steps[k][2] != steps[start][2]:
                        segs.append(Segment(steps[start][2], start, k))
                        start = k
                chains[(g, s)] = ChainPlan(s, g, steps, tuple(segs))
        return cls(version=plan.version, strategy=plan.strategy, source=source, chains=chains,
                   partitioning=plan.partitioning, prefilter=use_prefilter, groups=tuple(plan.group_ids),
                   punctuation=plan.options.get("punctuation", "eager"),
                   punctuation_threshold=int(plan.options.get("punctuation_threshold", 1000)))

    def chain(self, stream: str, group: int = 0) -> ChainPlan:
        return self.chains[(group, stream)]

    def describe(self) -> str:
        v = f"v{self.version}" if self.version is not None else "(unversioned)"
        return f"plan {v} {self.strategy} from {self.source}" + (" +prefilter" if self.prefilter else "")
