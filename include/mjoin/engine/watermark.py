"""Event time of the streaming join: a watermark per stream, combined by the minimum (pure, no Spark).

Each stream's watermark is its largest accepted event time minus the query's ``lateness``; the
job's watermark is the minimum over the streams that are not idle, and it never goes back.
A row is ``late`` (quarantined) iff its event time is below the job's watermark when its batch
starts; after a batch, a state tuple of stream r is dropped once ``ts_r <= wm - W_r`` with ``wm``
the watermark the batch started with: every later accepted row has ``ts >= wm``, so such a
tuple can join none of them (docs/algorithms.md, "Notation": a result needs ``max(ts) - ts_r < W_r``).

**Only accepted rows move it.** ``batch_max`` is the largest event time of the rows the operator
accepted, and a row at or after its arrival folder's epoch plus the future allowance is never accepted
(``future``: the landing contract's rule, :func:`mjoin.lake.contract.future_from_us`); a punctuation
promising beyond that bound is rejected before it reaches ``promised``. So a producer whose clock runs ten
years ahead cannot drag a stream's watermark there and make every later row ``late``.

This is the policy of Spark's ``spark.sql.streaming.multipleWatermarkPolicy = min`` and of
Flink's multi-input operators: one stream that runs ahead (a micro-batch holding later files of
one stream, a boundary inside an arrival cycle) makes nothing late. The maximum over streams,
the engine's earlier rule, made every other stream's older rows late in that case.

**Idle streams.** A stream that stops holds the minimum back: nothing is late and nothing is
purged, so the state would grow with the stall. So the job's watermark never trails the leading
stream by more than ``idle_us`` (plus the lateness): a stream whose progress (largest accepted
event time; for a stream without any row yet, the first event time the job accepted) lags the
leader's by more than ``idle_us`` is *idle*, and counts in the minimum as if it were at
``lead - idle_us``. Measured in event time, not wall time (unlike Flink's ``withIdleness``), so a
catch-up over a backlog and the live job decide alike. While a stream idles, the state holds
about ``idle_us`` plus the windows of event time; when it resumes, its rows at or above the
watermark (within ``idle_us`` of the leader) join as usual, older ones are late (quarantined and
counted). ``idle_us`` defaults to the query's largest window.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Watermarks:
    max_ts: dict = field(default_factory=dict)  # stream -> largest accepted event time (micros)
    first_ts: int | None = None  # the first batch's smallest per-stream maximum (progress of silent streams)
    watermark: int | None = None  # the job's watermark (micros); None: no row is late yet
    idle: tuple = ()  # streams lagging the leader by more than the idle timeout
    #: stream -> event time (micros) it promised no later tuple below (a punctuation, mjoin.model.punctuation)
    promised: dict = field(default_factory=dict)

    @classmethod
    def from_manifest(cls, manifest: dict | None, streams, lateness_us: int) -> "Watermarks":
        """What a committed state manifest says (manifests written before per-stream watermarks held
        one ``max_ts`` for all streams: read as the watermark, nothing known per stream)."""
        if not manifest:
            return cls()
        et = manifest.get("event_time")
        if et:
            return cls(max_ts={s: int(v) for s, v in et.get("max_ts", {}).items()}, first_ts=et.get("first_ts"),
                       watermark=et.get("watermark"), idle=tuple(et.get("idle", ())),
                       promised={s: int(v) for s, v in et.get("promised", {}).items()})
        legacy = manifest.get("max_ts")
        if legacy is None:
            return cls()
        return cls(max_ts={s: int(legacy) for s in streams}, first_ts=int(legacy),
                   watermark=int(legacy) - lateness_us)

    def advance(self, batch_max: dict, streams, lateness_us: int, idle_us: float,
                promised: dict | None = None) -> "Watermarks":
        """The watermarks after a batch whose accepted rows reached ``batch_max`` (stream -> micros) and
        whose punctuations promised ``promised`` (stream -> micros: no later tuple of it before that)."""
        max_ts = dict(self.max_ts)
        for s, v in batch_max.items():
            if v is not None:
                max_ts[s] = max(int(v), max_ts.get(s, int(v)))
        prom = dict(self.promised)
        for s, v in (promised or {}).items():
            prom[s] = max(int(v), prom.get(s, int(v)))
        # a promise counts as the stream's progress: its watermark may be the promised bound itself
        known = {s: max(max_ts.get(s, -(1 << 62)), prom[s] + lateness_us if s in prom else -(1 << 62))
                 for s in streams if s in max_ts or s in prom}
        first = self.first_ts
        if first is None and known:
            first = min(known.values())
        if first is None:
            return Watermarks(max_ts=max_ts, promised=prom)
        progress = {s: known.get(s, first) for s in streams}
        lead = max(progress.values())
        floor = lead - idle_us  # how far behind the leader the watermark may stay
        idle = tuple(s for s in streams if progress[s] < floor)
        wm = self.watermark
        if all(s in known or s in idle for s in streams):
            cand = max(min(progress.values()), floor) - lateness_us
            wm = cand if wm is None else max(wm, cand)
        return Watermarks(max_ts=max_ts, first_ts=first, watermark=int(wm) if wm is not None else None, idle=idle,
                          promised=prom)

    def per_stream(self, lateness_us: int) -> dict:
        """Each stream's own watermark (None: no row yet)."""
        return {s: v - lateness_us for s, v in self.max_ts.items()}

    def to_json(self) -> dict:
        doc = asdict(self)
        doc["idle"] = list(self.idle)
        if not doc["promised"]:
            del doc["promised"]
        return doc
