"""The statistics the streaming join job emits, and reading them back for the DAG's statistics step.

In continuous mode the join job computes the one statistics schema itself (docs/statistics.md, "Where the
statistics come from"): its stage-1 tasks count whole cycles from the window state they hold
(:mod:`mjoin.stats.instate`), and the driver sums, assembles and writes them to the statistics history exactly
as the standalone job does (:func:`mjoin.stats.job.assemble_run`, :func:`mjoin.stats.job.write_run`).
:class:`JobStatistics` is what :mod:`mjoin.engine.stream` calls around each micro-batch (the engine knows
nothing of the schema):

1. :meth:`JobStatistics.emission`: the cycles whose end is below the watermark the batch starts with are
   final (a later row at or before their end is ``late``); those not emitted yet are counted by this batch's
   tasks, from the state as committed before it, under the running plan's key groups;
2. :meth:`JobStatistics.purge_bound`: the state keeps each pending cycle's window lead-in: it is purged with
   ``min(watermark, start of the first pending cycle)`` instead of the watermark, i.e. at most one cycle
   ``tau`` of event time more per stream (``tau x lambda`` tuples);
3. :meth:`JobStatistics.after_tasks` (before the batch's commit): the tasks' counts plus the NULL-key rows the
   tasks quarantined in those cycles, written to the history; recorded in the batch's state manifest
   (``jobstats``: the next cycle to emit, the range-cell span, the per-cycle quarantine counts of the cycles
   still open, cycles not written yet).

Exactly once: a re-run batch (a crash before its commit, a kill -9 and restart) starts from the same manifest
and state, counts the same cycles and replaces their folders (each written atomically: never half a cycle);
a cycle is emitted by the one committed batch that passes it, so nothing is lost or doubled. A cycle whose
folders cannot be written (the history's file system fails) is kept, assembled, beside the state
(``<state>/jobstats/pending-b<batch>/``) and retried at every later batch until written; a cycle the history
refuses (another cycle grid there) is dropped and reported, as is a batch whose tasks could not count (the
join never fails for its statistics). Every batch's metrics record says what it emitted (``job_stats``).

:func:`use_job_statistics` is the DAG's statistics step in continuous mode: the period's cycles as the job
emitted them, validated, waiting while the running job catches up; else why not (the step then runs the
standalone job).
"""
from __future__ import annotations

import json
import logging
import re
import time
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mjoin.model.statistics import StatisticsError
from mjoin.model.timeutil import iso, to_epoch
from mjoin.runtime import fsutil
from mjoin.stats import history, kernel
from mjoin.stats.history import HistoryError, history_root
from mjoin.stats.instate import SPAN, Emission, merge_spans, range_rule, read_doc
from mjoin.stats.job import StatsConfig, StatsRun, assemble_run, write_run
from mjoin.stats.sources import US, Grid

log = logging.getLogger(__name__)

PENDING = re.compile(r"^pending-b(\d+)$")
#: errors kept in the manifest's ``jobstats`` section (the newest)
KEEP_ERRORS = 5


def unsupported(query) -> str | None:
    """Why the job cannot count a query's statistics itself (None: it can). Band predicates: a band class's
    state is sliced by time, not by key, and a residual band filters matches by payload values; the
    standalone job computes those edges (:mod:`mjoin.stats.bands`)."""
    if query.band_classes or getattr(query, "bands", ()):
        return "the query has band predicates (their statistics come from the statistics job)"
    return None


def final_end(watermark_us: int, tau_us: int) -> int:
    """One past the last cycle (absolute index) whose end is below ``watermark_us``: ``(j + 1) tau < wm``."""
    return -(-int(watermark_us) // tau_us) - 1


class JobStatistics:
    """The streaming join job's own statistics of ``query``, in cycles of ``cycle_seconds`` (aligned to
    multiples of it from the epoch, as the loop's intervals are), written to the history under ``out``
    (default ``<lake>/stats``)."""

    def __init__(self, query, lake, cycle_seconds, *, out=None, histogram_buckets: int = 1024,
                 key_buckets: int = StatsConfig.key_buckets, key_ranges: int = StatsConfig.key_ranges):
        tau = float(cycle_seconds)
        if not tau > 0 or tau != int(tau):
            raise StatisticsError(f"the job's statistics cycle must be a whole number of seconds, got {cycle_seconds!r}")
        self.query = query
        self.tau_s = int(tau)
        self.tau_us = self.tau_s * US
        self.root = str(out) if out else history_root(lake)
        self.store = fsutil.join(lake.state(query.name), "jobstats")
        self.problem = unsupported(query)
        self.histogram_buckets, self.key_buckets, self.key_ranges = int(histogram_buckets), int(key_buckets), int(key_ranges)
        classes = query.all_classes
        self.classes = tuple(classes)
        self.stream_classes = [[classes.index(c) for c in query.all_classes_of(s)] for s in query.stream_names]
        self.members = tuple(tuple(sid for sid, cs in enumerate(self.stream_classes) if ci in cs)
                             for ci in range(len(classes)))

    def describe(self) -> dict:
        return {"cycle_seconds": self.tau_s, "history": self.root, "off": self.problem}

    # ---- before the batch ------------------------------------------------------------------------------------
    def _section(self, manifest: dict | None) -> dict | None:
        js = (manifest or {}).get("jobstats")
        return js if js and js.get("cycle_seconds") == self.tau_s else None

    def emission(self, prev: dict | None, late_before: int | None, plan) -> Emission | None:
        """What the batch's tasks count (None: the job counts nothing for this query, :func:`unsupported`)."""
        if self.problem:
            return None
        js = self._section(prev)
        hi = None if late_before is None else final_end(late_before, self.tau_us)
        if js is not None:
            lo = js.get("next")
        elif prev is not None and late_before is not None:
            # the state was purged without the lead-in (a job that ran without its statistics, or with another
            # cycle): the first cycle whose lead-in it surely holds starts at the watermark or after
            lo = -(-int(late_before) // self.tau_us)
        else:
            lo = None  # nothing purged yet: from the oldest row the state holds
        return Emission(tau_us=self.tau_us, lo=lo, hi=hi, streams=tuple(self.query.stream_names),
                        windows_us=tuple(int(round(s.window * US)) for s in self.query.streams),
                        first_class=tuple(cs[0] for cs in self.stream_classes), classes=self.classes,
                        class_members=self.members, rule=getattr(plan, "partitioning", None) or None,
                        buckets=self.histogram_buckets, key_buckets=self.key_buckets, key_ranges=self.key_ranges,
                        span=int((js or {}).get("span") or 1))

    def purge_bound(self, late_before: int | None, emission: Emission | None) -> int | None:
        """The bound the batch purges the state with: the watermark, lowered to the start of the first cycle
        still to emit after this batch, so that its window lead-in stays (at most ``tau`` more event time)."""
        if emission is None or late_before is None:
            return late_before
        return min(int(late_before), final_end(late_before, self.tau_us) * self.tau_us)

    # ---- after the tasks, before the commit -------------------------------------------------------------------
    def after_tasks(self, batch_id: int, emission: Emission | None, docs: list, prev: dict | None,
                    plan=None) -> tuple[dict, dict]:
        """Write the cycles the batch made final (and any kept from earlier batches); ``({"jobstats": section
        of the manifest}, {"job_stats": the batch's report})``."""
        if emission is None:
            return {}, {"job_stats": {"off": self.problem}}
        t0, c0 = time.perf_counter(), time.thread_time()
        js = self._section(prev) or {}
        counted = [d for d in docs if "jobstats" in d]
        report = {"cycles": [], "written": [], "pending": [], "errors": [],
                  "task_cpu_seconds": round(sum(float(d.get("cpu_seconds") or 0.0) for d in counted), 6),
                  # the stage-1 tasks' whole CPU without the statistics (the operator, state and result writes)
                  "join_task_cpu_seconds": round(sum(float(d.get("join_cpu_seconds") or 0.0) for d in counted), 6)}
        quarantined = _merge_quarantined(js.get("quarantined") or {}, [d.get("by_cycle") or {} for d in docs],
                                         emission.lo)
        pending = []
        for item in js.get("pending") or []:  # what earlier batches could not write, oldest first
            self._retry(item, pending, report)
        nxt, span = emission.lo, int(js.get("span") or 1)
        if emission.counts_cycles:
            errors = sorted({d["error"] for d in docs if d.get("error")})
            table, task_span, task_lo = merge_spans([read_doc(d) for d in docs if "jobstats" in d], emission)
            lo = emission.lo
            if lo is None:  # the first emission: from the oldest row any task holds (or quarantined)
                firsts = [task_lo] if task_lo is not None else []
                firsts += [int(j) for j in quarantined]
                lo = min(firsts) if firsts else None
            if errors:
                report["errors"].append(f"batch {batch_id}: the tasks could not count cycles "
                                        f"[{iso(0 if lo is None else lo * self.tau_s)}, {iso(emission.hi * self.tau_s)}): "
                                        f"{'; '.join(errors)[:500]}; those cycles are not emitted (the statistics job "
                                        "computes them)")
                nxt = emission.hi
            elif lo is not None and emission.hi > lo:
                span = max(span, task_span)
                run, grid = self.assemble(table, lo, emission.hi, span, quarantined, emission.rule,
                                          {"batch_id": batch_id, "plan_version": getattr(plan, "version", None),
                                           "plan_source": getattr(plan, "source", None)})
                report["cycles"] = [grid.start_epoch(j) for j in range(grid.n)]
                self._write(batch_id, run, grid, pending, report)
                nxt = emission.hi
            if nxt is not None:
                quarantined = {j: v for j, v in quarantined.items() if int(j) >= nxt}
        errors = (list(js.get("errors") or []) + report["errors"])[-KEEP_ERRORS:]
        for e in report["errors"]:
            log.error("job statistics: %s", e)
        section = {"cycle_seconds": self.tau_s, "next": nxt, "span": span, "quarantined": quarantined,
                   "pending": pending, "errors": errors}
        self._clean(batch_id, prev, pending)
        report["pending"] = sorted({c for item in pending for c in item["cycles"]})
        report["next"] = None if nxt is None else nxt * self.tau_s
        report["driver_seconds"] = round(time.perf_counter() - t0, 6)
        report["driver_cpu_seconds"] = round(time.thread_time() - c0, 6)
        return {"jobstats": section}, {"job_stats": report}

    def assemble(self, table: pa.Table, lo: int, hi: int, span: int, quarantined: dict, rule, job: dict
                 ) -> tuple[StatsRun, Grid]:
        """The cycles ``lo .. hi - 1`` from the tasks' summed counts (cycles relative to ``lo``), with the
        NULL-key rows quarantined in them, as the standalone job assembles its own."""
        grid = Grid(lo * self.tau_us, hi * self.tau_us, self.tau_us)
        n = grid.n
        cells = {}
        if len(self.classes) == 1:
            cls = self.classes[0]
            if self.key_buckets:
                cells["buckets"] = {"method": "hash", "attr_class": cls, "groups": self.key_buckets}
            if self.key_ranges and span > 1:
                cells["ranges"] = range_rule(cls, span, self.key_ranges)
        table = _relative(table, lo)
        if "ranges" not in cells and self.key_ranges and len(self.classes) == 1:  # no positive key: no ranges
            drop = kernel.CELL_KIND * (1 + (1 if self.key_buckets else 0))
            table = table.filter(pc.invert(pc.and_(pc.greater_equal(table.column("kind"), drop),
                                                   pc.less(table.column("kind"), drop + kernel.CELL_KIND))))
        extra = []  # the NULL-key rows quarantined in each cycle: rows, no key (not tuples: docs/statistics.md)
        for j, per in quarantined.items():
            jr = int(j) - lo
            if not 0 <= jr < n:
                continue
            for stream, reasons in per.items():
                k = int(reasons.get("null_key") or 0)
                if k and stream in self.query.stream_names:
                    sid = self.query.stream_names.index(stream)
                    extra.append((sid, self.stream_classes[sid][0], jr, k))
        if extra:
            g = pa.nulls(len(extra), pa.int64()) if rule else pa.array(np.zeros(len(extra), np.int64))
            add = pa.table({"kind": pa.array(np.full(len(extra), kernel.ROWS, np.int8)),
                            "sid": pa.array([e[0] for e in extra], pa.int32()), "r": pa.array(np.zeros(len(extra), np.int32)),
                            "ci": pa.array([e[1] for e in extra], pa.int32()), "g": g,
                            "j": pa.array([e[2] for e in extra], pa.int64()), "x": pa.array(np.zeros(len(extra), np.int64)),
                            "v0": pa.array([e[3] for e in extra], pa.int64()), "v1": pa.array(np.zeros(len(extra), np.int64)),
                            "v2": pa.array(np.zeros(len(extra), np.int64))}, schema=kernel.OUT_SCHEMA)
            table = pa.concat_tables([table, add])
        params = kernel.Params(grid.t0_us, grid.t1_us, grid.tau_us, tuple(int(round(s.window * US)) for s in self.query.streams),
                               tuple(cs[0] for cs in self.stream_classes), self.members, self.histogram_buckets,
                               tuple(("mod", int(r["groups"])) if k == "buckets" else ("range", tuple(r["bounds"]))
                                     for k, r in cells.items()))
        frames = kernel.reduce_partials(table, params, len(self.classes))
        config = StatsConfig(partitioning=rule, histogram_buckets=self.histogram_buckets,
                             key_buckets=self.key_buckets, key_ranges=self.key_ranges)
        run = assemble_run(self.query, grid, config, frames, cells)
        computed = iso(datetime.now(timezone.utc))
        for epoch, meta in run.cycle_meta.items():
            j = epoch // self.tau_s
            meta.update(source="job", job={**job, "computed_at": computed},
                        quarantined={s: {r: int(v) for r, v in reasons.items()}
                                     for s, reasons in (quarantined.get(str(j)) or {}).items()})
            meta["run"] = {"start": iso(grid.t0_us / US), "end": iso(grid.t1_us / US), "computed_at": computed}
        return run, grid

    # ---- writing, and keeping what could not be written ------------------------------------------------------
    def _write(self, batch_id: int, run: StatsRun, grid: Grid, pending: list, report: dict) -> None:
        epochs = [grid.start_epoch(j) for j in range(grid.n)]
        if pending:  # keep the order: a cycle is not written before an older one still pending
            pending.append(self._keep(batch_id, run, grid))
            return
        try:
            write_run(self.root, self.query, grid, run)
            report["written"] += epochs
        except HistoryError as exc:  # another cycle grid in the history: writing again will not help
            report["errors"].append(f"cycles [{iso(epochs[0])}, {iso(epochs[-1] + self.tau_s)}) not written: {exc}")
        except (OSError, ValueError, pa.ArrowException) as exc:
            report["errors"].append(f"cycles [{iso(epochs[0])}, {iso(epochs[-1] + self.tau_s)}) could not be "
                                    f"written ({type(exc).__name__}: {exc}); kept and retried at the next batch")
            pending.append(self._keep(batch_id, run, grid))

    def _keep(self, batch_id: int, run: StatsRun, grid: Grid) -> dict:
        """Write ``run`` beside the state (``pending-b<batch>/``); the manifest's entry for it."""
        name = f"pending-b{batch_id}"
        folder = fsutil.join(self.store, name)
        fsutil.remove(folder)
        fsutil.makedirs(folder)
        pq.write_table(history._table(run.rows, history.HISTORY_SCHEMA), fsutil.join(folder, "rows.parquet"))
        pq.write_table(history._table(run.histogram, history.HISTOGRAM_SCHEMA), fsutil.join(folder, "histogram.parquet"))
        for kind, (_, rows) in run.cells.items():
            pq.write_table(history._table(rows, history.HISTORY_SCHEMA), fsutil.join(folder, f"cells-{kind}.parquet"))
        doc = {"grid": [grid.t0_us, grid.t1_us, grid.tau_us], "meta": {str(e): m for e, m in run.cycle_meta.items()},
               "cells": {kind: rule for kind, (rule, _) in run.cells.items()}}
        fsutil.atomic_write_text(fsutil.join(folder, "run.json"), json.dumps(doc, default=str))
        return {"dir": name, "cycles": [grid.start_epoch(j) for j in range(grid.n)]}

    def _retry(self, item: dict, pending: list, report: dict) -> None:
        if pending:
            pending.append(item)
            return
        folder = fsutil.join(self.store, item["dir"])
        try:
            doc = json.loads(fsutil.read_text(fsutil.join(folder, "run.json")))
            grid = Grid(*doc["grid"])
            rows = pq.read_table(fsutil.join(folder, "rows.parquet")).to_pandas()
            run = StatsRun(rows=rows, histogram=pq.read_table(fsutil.join(folder, "histogram.parquet")).to_pandas(),
                           cycle_meta={int(e): m for e, m in doc["meta"].items()})
            run.cells = {kind: (rule, pq.read_table(fsutil.join(folder, f"cells-{kind}.parquet")).to_pandas())
                         for kind, rule in doc["cells"].items()}
        except (OSError, ValueError, KeyError, pa.ArrowException) as exc:
            report["errors"].append(f"kept cycles {item['cycles'][:1]}.. unreadable ({exc}); dropped")
            return
        try:
            write_run(self.root, self.query, grid, run)
            report["written"] += list(item["cycles"])
        except HistoryError as exc:
            report["errors"].append(f"kept cycles {iso(item['cycles'][0])}..: {exc}; dropped")
        except (OSError, ValueError, pa.ArrowException) as exc:
            report["errors"].append(f"kept cycles {iso(item['cycles'][0])}.. still cannot be written "
                                    f"({type(exc).__name__}: {exc}); retried at the next batch")
            pending.append(item)

    def _clean(self, batch_id: int, prev: dict | None, pending: list) -> None:
        """Remove kept cycles no manifest still needs (a re-run of this batch reads the previous manifest)."""
        keep = {item["dir"] for item in pending} | {item["dir"] for item in (self._section(prev) or {}).get("pending") or []}
        if not fsutil.exists(self.store):
            return
        for name in fsutil.listdir(self.store):
            m = PENDING.match(name)
            if m and name not in keep and int(m.group(1)) < batch_id:
                fsutil.remove(fsutil.join(self.store, name))


def _relative(table: pa.Table, lo: int) -> pa.Table:
    """The merged counts without the ``SPAN`` row, cycles relative to ``lo``."""
    kind = table.column("kind").to_numpy()
    table = table.filter(pa.array(kind != SPAN))
    j = table.column("j").to_numpy() - int(lo)
    return table.set_column(table.schema.get_field_index("j"), "j", pa.array(j, pa.int64()))


def _merge_quarantined(acc: dict, more: list, lo: int | None) -> dict:
    """``{cycle: {stream: {reason: rows}}}`` plus the tasks' ``{stream: {reason: {cycle: rows}}}``; cycles before
    ``lo`` (already emitted: such rows were late as well) are left out."""
    out = {j: {s: dict(r) for s, r in per.items()} for j, per in acc.items()}
    for doc in more:
        for stream, reasons in doc.items():
            for reason, cycles in reasons.items():
                for j, n in cycles.items():
                    if lo is not None and int(j) < lo:
                        continue
                    per = out.setdefault(str(j), {}).setdefault(stream, {})
                    per[reason] = per.get(reason, 0) + int(n)
    return out


# ---- the DAG's statistics step -------------------------------------------------------------------------

def check_cycles(query, root, start, end, cycle_seconds) -> dict:
    """What the history holds of the cycles of ``[start, end)``: ``cycles`` (how many there are), ``missing``
    (ISO starts), ``from_job`` (how many the join job emitted), ``problems`` (cycles that do not validate:
    another spec, cycle length, incomplete or out-of-range statistics)."""
    t0, t1, tau = int(to_epoch(start)), int(to_epoch(end)), int(cycle_seconds)
    want = list(range(t0, t1, tau))
    try:
        hist = history.read_history(root, query.name, start=t0, end=t1, meta=True)
    except HistoryError:
        hist = history.empty_history()
        hist.attrs["cycles"] = {}
    metas = hist.attrs.get("cycles") or {}
    missing, problems, from_job = [], [], 0
    starts = pd.to_datetime(hist["cycle_start"], utc=True) if len(hist) else None
    for e in want:
        meta = metas.get(iso(e))
        if not meta or starts is None or not (starts == pd.Timestamp(e, unit="s", tz="UTC")).any():
            missing.append(iso(e))
            continue
        from_job += meta.get("source") == "job"
        if meta.get("query_fingerprint") not in (None, query.fingerprint):
            problems.append(f"{iso(e)}: computed for another version of the query spec")
        elif float(meta.get("cycle_seconds") or tau) != tau:
            problems.append(f"{iso(e)}: a {meta.get('cycle_seconds')} s cycle, not {tau} s")
        else:
            bad = history.snapshot(hist, e).problems(query)
            if bad:
                problems.append(f"{iso(e)}: {'; '.join(bad[:3])}")
    return {"cycles": len(want), "missing": missing, "from_job": from_job, "problems": problems}


def use_job_statistics(query, lake, start, end, cycle_seconds, *, running, out=None, wait: float = 120.0,
                       poll: float = 1.0, clock=time.monotonic, sleep=time.sleep, job_cycle: float | None = None) -> dict:
    """The statistics step of a continuous-mode run: the cycles of ``[start, end)`` the join job emitted, read
    and validated. While some are missing and the job runs (``running()``), wait for it to catch up, at most
    ``wait`` seconds. Returns ``{"source": "job", ...}`` when every cycle is there and valid, else ``{"source":
    None, "fallback": why}`` (the caller then runs the standalone statistics job). ``job_cycle``: the statistics
    cycle the running job computes, as its status records it (0: none; None: not known); another cycle than
    ``cycle_seconds`` falls back at once, with no waiting."""
    root = str(out) if out else history_root(lake)
    why_not = unsupported(query)
    if why_not is None and job_cycle is not None and float(job_cycle) != float(cycle_seconds) and running():
        why_not = ("it was started without --stats-cycle (mjoin_join_job's stats_cycle 0)" if not job_cycle else
                   f"it computes {float(job_cycle):g}-s cycles, the run wants {float(cycle_seconds):g}-s ones")
    if why_not:  # the job emits nothing usable for this run: no waiting
        return {"source": None, "fallback": f"the join job does not compute them: {why_not}", "waited_seconds": 0.0,
                "history": root}
    t_start = clock()
    deadline = t_start + float(wait)
    while True:
        got = check_cycles(query, root, start, end, cycle_seconds)
        out_doc = {**got, "waited_seconds": round(clock() - t_start, 3), "history": root}
        if got["problems"]:
            return {**out_doc, "source": None,
                    "fallback": f"{len(got['problems'])} emitted cycle(s) do not validate: {got['problems'][0]}"}
        if not got["missing"]:
            return {**out_doc, "source": "job"}
        is_running = bool(running())
        if not is_running or clock() >= deadline:
            have = got["cycles"] - len(got["missing"])
            why = ("the join job is not running" if not is_running else
                   f"the join job is lagging ({wait:g} s waited)")
            return {**out_doc, "source": None,
                    "fallback": f"{why}: it emitted {have} of the {got['cycles']} cycles (first missing "
                                f"{got['missing'][0]})"}
        sleep(poll)
