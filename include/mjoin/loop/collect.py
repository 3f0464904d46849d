"""Steps 0-1 of a run: prepare (the interval and the Spark jobs' arguments), land (cycle mode with a
generated workload), the input gate once the interval's cycles are complete, and the statistics gate over
what the statistics job wrote (the join and statistics jobs themselves are spark-submit tasks of the DAG)."""
from __future__ import annotations

import json
import logging
import math
import time
from datetime import datetime, timedelta, timezone

from mjoin.engine.control import JobControl
from mjoin.engine.quarantine import job_report
from mjoin.gates.input import check_input as input_gate, first_arrival
from mjoin.gates.stats import check_statistics as statistics_gate
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.loop.config import (STATISTICS_REPORT, LoopConfig, NoChange, StepFailed, covered_until, finish_gate,
                               interval_for, run_dir, stats_root, write_doc)
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.model.timeutil import iso, parse_time
from mjoin.runtime import fsutil
from mjoin.stats.history import list_cycles, read_history
from mjoin.workloads.lander import land as land_workload

log = logging.getLogger(__name__)


def lands_itself(cfg: LoopConfig) -> bool:
    """Cycle mode with a ``workload`` in the live namespace: the run lands its own interval (demo, tests)."""
    return cfg.mode == "cycle" and bool(cfg.workload) and not cfg.namespace


def prepare(cfg: LoopConfig, logical_date) -> dict:
    """Resolve the mode (:func:`resolve_mode`), the interval (whole cycles, see :func:`interval_for`; from
    ``interval_end`` if given, else the logical date) and run folder; the Spark job arguments.

    No cycle is skipped silently: when the newest earlier run of the namespace ended before this interval starts
    (a run overran its period, so Airflow made no run for the periods in between; Airflow was stopped), the
    interval starts where that run ended, at most ``catch_up`` seconds before its end; landed cycles before
    that are a ``gap``, reported in the outcome and on the mjoin page (:func:`coverage`).

    On a lake fed from outside (not :func:`lands_itself`) the interval starts no earlier than the first
    cycle landed for the query (a cycle before the feed began is not a cycle of missing data; an interval
    wholly before it fails), and the statistics job also covers the landed cycles before the interval that
    the statistics history lacks (up to ``L`` cycles), so a fresh deployment's first run already has the
    history its forecast needs."""
    query = cfg.load_query()
    cfg.mode, mode_reason = resolve_mode(cfg, query)
    start, end = interval_for(cfg.judged_at(logical_date), cfg.period, cfg.cycle)
    start, covered = coverage(cfg, query, start, end)
    clipped, stats_from, skip = None, start, None
    if not lands_itself(cfg):
        began = first_cycle(cfg, query)
        if began is None:
            raise StepFailed(f"nothing has landed for {query.name} ({', '.join(sorted({s.source for s in query.streams}))}) "
                             f"under {Lake(cfg.lake).streams()}: start a feed (python -m mjoin live, or land a workload)")
        if began >= end:  # not missing data: the lake's history starts later (e.g. a run made before the feed began)
            skip = (f"the interval [{iso(start)}, {iso(end)}) ends before the first landed cycle {iso(began)} of "
                    f"{query.name}: nothing to judge or re-optimize")
        else:
            if began > start:
                clipped, start = iso(start), began
            stats_from = _stats_from(cfg, query, start, end, began)
    folder = run_dir(cfg, query.name, end)
    fsutil.makedirs(folder)
    ctx = {"query": query.name, "start": iso(start), "end": iso(end), "run_dir": folder, "namespace": cfg.namespace,
           "lake": cfg.lake, "mode": cfg.mode, "mode_reason": mode_reason, "logical_date": iso(logical_date),
           "clipped_from": clipped, "coverage": covered, "stats_from": iso(stats_from), "skip": skip,
           "prepared_at": iso(datetime.now(timezone.utc)), "config": cfg.to_json()}
    ctx["join_args"] = join_args(cfg, query, start, end, folder)
    ctx["stats_args"] = stats_args(cfg, query, stats_from, end, folder)
    ctx["join_stats_args"] = ctx["join_args"] + ["--stats"] + ctx["stats_args"]  # cycle mode: one spark-submit
    write_doc(fsutil.join(folder, "context.json"), ctx)
    log.info("re-optimization of %s for [%s, %s) (logical date %s%s), %s mode (%s), in %s", query.name, ctx["start"],
             ctx["end"], ctx["logical_date"], f"; starts at the first landed cycle, not {clipped}" if clipped else "",
             cfg.mode, mode_reason, folder)
    if covered.get("gap"):
        log.warning("%s", covered["gap"]["message"])
    return ctx


def resolve_mode(cfg: LoopConfig, query) -> tuple[str, str]:
    """``(mode, why)``: ``auto`` is ``continuous`` while the streaming join job of the query runs in the run's
    namespace (started by mjoin_join_job or ``python -m mjoin run --stream``; a cycle run's own join, trigger
    ``availableNow``, is not one), else ``cycle``. An explicit ``cycle`` while that job runs fails here: its
    join would be refused (the job holds the query)."""
    st = JobControl(cfg.lake_, query.name).status()
    streaming = bool(st.get("running")) and st.get("trigger") != "availableNow"
    job = (f"the streaming join job of {query.name} runs (pid {st.get('pid')} since {st.get('started_at')}, "
           f"trigger {st.get('trigger')})") if streaming else f"no streaming join job of {query.name} runs"
    if cfg.mode == "auto":
        return ("continuous" if streaming else "cycle"), f"mode auto: {job}"
    if cfg.mode == "cycle" and streaming and not cfg.namespace:
        raise StepFailed(f"mode cycle, but {job}: a cycle run's join would be refused; use mode auto (the default) or "
                         f"continuous, or stop the job first (mjoin_join_job action=stop)")
    return cfg.mode, f"mode {cfg.mode} (a param)"


def coverage(cfg: LoopConfig, query, start: datetime, end: datetime) -> tuple[datetime, dict]:
    """``(start, coverage)``: where the run's interval starts so that it also covers the cycles no earlier run of the
    namespace covered, and what it did: ``caught_up_from`` (the interval's own start, when it starts earlier),
    ``previous_end`` (the newest earlier run's interval end) and ``gap`` (cycles with landed data before
    ``end - catch_up`` that no run covers: its bounds, cycle count and a message), or None."""
    prev = covered_until(cfg, query.name, end)
    out = {"previous_end": iso(prev) if prev else None, "caught_up_from": None, "gap": None}
    if prev is None or prev >= start:
        return start, out
    lo = min(start, max(prev, end - timedelta(seconds=cfg.catch_up)))
    if lo < start:
        out["caught_up_from"] = iso(start)
        log.info("the previous run of %s ended at %s: this run also covers [%s, %s)", query.name, iso(prev), iso(lo),
                 iso(start))
    if prev < lo:
        lake = Lake(cfg.lake)
        landed = sorted({a for src in {s.source for s in query.streams} for a in lake.arrivals(src)
                         if prev.timestamp() <= a < lo.timestamp()})
        if landed:
            cycles = len({math.floor(a / cfg.cycle) for a in landed})
            out["gap"] = {"from": iso(prev), "to": iso(lo), "cycles": cycles,
                          "message": f"gap: {cycles} landed cycle(s) in [{iso(prev)}, {iso(lo)}) were covered by no run "
                                     f"(more than {cfg.catch_up:.0f} s before this interval's end: not caught up)"}
    return lo, out


def first_cycle(cfg: LoopConfig, query) -> datetime | None:
    """The first statistics cycle holding landed data of the query (its first arrival, up to the cycle grid)."""
    a = first_arrival(query, Lake(cfg.lake))
    return None if a is None else parse_time(math.ceil(a / cfg.cycle - 1e-9) * cfg.cycle)


def _stats_from(cfg: LoopConfig, query, start: datetime, end: datetime, began: datetime) -> datetime:
    """Where the statistics job starts: ``start``, or earlier when the history lacks the cycles before it
    that the forecast gate needs (``min_history``), back to L cycles before ``end`` and the first landed one."""
    need = cfg.gate_config().min_history
    lo = max(began, end - timedelta(seconds=cfg.length * cfg.cycle))
    if lo >= start:
        return start
    have = len(list_cycles(stats_root(cfg), query.name, lo, start))
    if have + (end - start).total_seconds() / cfg.cycle >= need:
        return start
    log.info("the statistics history holds %d cycles before %s (the forecast gate needs %d): the statistics job "
             "covers the landed cycles from %s", have, iso(start), need, iso(lo))
    return lo


def _first_plan(cfg: LoopConfig, query, folder: str) -> str | None:
    """The plan the join uses: the registry's active plan, else the fixed order of
    ``initial_order`` (written to the run folder), else None (the engine's spec order). A damaged ACTIVE is
    logged and counts as none here (the join job keeps its last good plan; ``plans repair`` fixes it)."""
    reg = PlanRegistry(cfg.lake_, query.name)
    version, damaged = reg.active_version_or_none()
    if damaged:
        log.warning("%s", damaged)
    if version is not None:
        return fsutil.join(reg.root, f"v{version:06d}.json")
    if cfg.initial_order:
        path = fsutil.join(folder, "initial_plan.json")
        make_plan(query, orders_from_permutation(query, cfg.initial_order), "fixed",
                  source={"initial_order": list(cfg.initial_order)}).save(path)
        return path
    return None


def join_args(cfg: LoopConfig, query, start, end, folder: str) -> list[str]:
    """Arguments of ``jobs/join.py`` for this run.

    Live cycle mode: the streaming job over what has landed (trigger availableNow); it
    reads the live registry's active plan at every batch boundary. Evaluation namespaces
    (backfills): the interval evaluation of ``[start, end)`` with that namespace's active
    plan, outputs in the namespace (the streaming checkpoint belongs to the live job)."""
    base = ["--query", cfg.query, "--lake", cfg.lake]
    plan = _first_plan(cfg, query, folder)
    if cfg.namespace:
        out = fsutil.join(cfg.lake, cfg.namespace, "joins", parse_time(end).strftime("%Y%m%dT%H%M%SZ"))
        return base + ["--from", iso(start), "--to", iso(end), "--cycle", str(cfg.cycle), "--out", out] + \
            (["--plan", plan] if plan else [])
    return base + ["--stream", "--trigger", "availableNow"] + (["--plan", plan] if plan and cfg.initial_order else [])


def stats_args(cfg: LoopConfig, query, start, end, folder: str | None = None) -> list[str]:
    """Arguments of ``jobs/stats.py`` for this run. Continuous mode (``job_statistics``): the step uses the cycles
    the running join job emitted and reads no stream, falling back to the statistics job when the job emitted
    none or not all (stopped, lagging); ``statistics.json`` in the run folder says which (:func:`statistics_source`)."""
    args = ["--query", cfg.query, "--lake", cfg.lake, "--from", iso(start), "--to", iso(end), "--cycle", str(cfg.cycle),
            "--mode", cfg.stats_mode]
    if cfg.mode == "continuous" and cfg.job_statistics and not cfg.namespace and cfg.stats_mode == "exact":
        args += ["--prefer-job"]
    if folder:
        args += ["--report", fsutil.join(folder, STATISTICS_REPORT)]
    return args + (["--namespace", cfg.namespace] if cfg.namespace else [])


def land(cfg: LoopConfig, ctx: dict) -> dict:
    if cfg.mode != "cycle" or not cfg.workload or cfg.namespace:
        reason = ("continuous mode: data lands by itself" if cfg.mode != "cycle" else
                  "evaluation namespace: history is already in the lake" if cfg.namespace else
                  "no workload parameter: data lands by itself")
        raise NoChange(reason)

    res = land_workload(cfg.workload, Lake(cfg.lake), until=ctx["end"], since=ctx["start"])
    out = res.to_dict()
    write_doc(fsutil.join(ctx["run_dir"], "land.json"), out)
    return out


def check_input(cfg: LoopConfig, ctx: dict, *, clock=time.time, sleep=time.sleep) -> dict:
    """Gate 1 on complete cycles: first wait until the interval's last cycle is complete (:func:`await_cycles`)."""
    if ctx.get("skip"):
        raise NoChange(ctx["skip"])
    query = cfg.load_query()
    waited = None if lands_itself(cfg) else await_cycles(cfg, query, ctx["end"], clock=clock, sleep=sleep)
    brief = finish_gate(input_gate(query, Lake(cfg.lake), ctx["start"], ctx["end"], cycle=cfg.cycle,
                              config=cfg.gate_config()), ctx, "input")
    out = {**brief, "completeness": waited}
    if ctx.get("mode") == "continuous":
        out["job_quarantine"] = job_quarantine_since_last_run(cfg, query.name, ctx["run_dir"])
    return out


def job_quarantine_since_last_run(cfg: LoopConfig, query_name: str, run_dir: str) -> dict:
    """Continuous mode: what the running join job quarantined (files by contract rule, rows by reason)
    since the previous run reported, from its batch metrics; written to ``job_quarantine.json`` of the
    run folder and logged (the job enforces the landing contract itself; the gate judged the files)."""
    lake = Lake(cfg.lake, cfg.namespace)
    marker = fsutil.join(lake.reports(query_name), "quarantine_reported.json")
    after = json.loads(fsutil.read_text(marker))["last_batch"] if fsutil.exists(marker) else None
    report = job_report(lake, query_name, after)
    write_doc(fsutil.join(run_dir, "job_quarantine.json"), report)
    write_doc(marker, {"last_batch": report["last_batch"]})
    if report["rows"] or report["files"]:
        log.warning("the join job quarantined %d rows and %d files in batches %s: %s", report["rows"],
                    len(report["files"]), report["batches"], report["by_stream"])
    return {k: report[k] for k in ("batches", "rows", "by_stream")} | {"files": len(report["files"])}


def cycle_landed(lake: Lake, source: str, end: float, cycle: float) -> bool:
    """Whether ``source`` has landed every arrival cycle ending by ``end``: its newest folder's cycle reaches
    ``end`` (each source lands its cycles in order, each folder atomically, so a folder at or after the last
    cycle means the cycles before are final, possibly empty). The landing cycle is the smallest spacing of
    the source's folders (at most the statistics ``cycle``)."""
    arrivals = lake.arrivals(source)
    if not arrivals:
        return False
    step = min([cycle] + [b - a for a, b in zip(arrivals, arrivals[1:]) if b > a])
    return arrivals[-1] + step >= end - 1e-6


def await_cycles(cfg: LoopConfig, query, end, *, clock=time.time, sleep=time.sleep, poll: float = 1.0) -> dict:
    """Wait until the last cycle before ``end`` is complete: every source of the query has landed it or a later
    cycle, or ``landing_allowance`` seconds have passed since ``end`` (a sparse source may have no folder for it:
    no rows). The landing contract has no per-cycle completion marker, so the allowance is what makes a quiet
    cycle final. An interval ending more than a period in the future fails at once (nothing to wait for)."""
    lake = Lake(cfg.lake)
    t_end = parse_time(end).timestamp()
    last = t_end - cfg.cycle
    sources = sorted({s.source for s in query.streams})
    deadline = t_end + cfg.landing_allowance
    if deadline - clock() > cfg.period + cfg.landing_allowance:
        raise StepFailed(f"the interval ends at {iso(t_end)}, {t_end - clock():.0f} s in the future: a run judges only "
                         "complete cycles (trigger it with a logical date at or before now)")
    t0 = clock()
    while True:
        missing = [src for src in sources if not cycle_landed(lake, src, t_end, cfg.cycle)]
        if not missing:
            how = "landed"
            break
        if clock() >= deadline:
            how = "allowance"
            log.info("cycle %s: no folder from %s %.0f s after its end (landing_allowance): taken as no rows",
                     iso(last), ", ".join(missing), cfg.landing_allowance)
            break
        sleep(min(poll, max(0.05, deadline - clock())))
    out = {"last_cycle": iso(last), "complete_by": how, "waited_seconds": round(clock() - t0, 3),
           "not_landed": missing if how == "allowance" else []}
    if out["waited_seconds"] > 0.5:
        log.info("waited %.1f s for cycle %s to complete (%s)", out["waited_seconds"], iso(last), how)
    return out


def read_stats_history(cfg: LoopConfig, query, start=None, end=None):
    return read_history(stats_root(cfg), query.name, start=start, end=end)


def check_statistics(cfg: LoopConfig, ctx: dict) -> dict:
    query = cfg.load_query()
    # the last L cycles, and the whole interval when it is longer (a run that caught up on missed cycles)
    start = min(parse_time(ctx["end"]) - timedelta(seconds=cfg.length * cfg.cycle), parse_time(ctx["start"]))
    history = read_stats_history(cfg, query, start=start, end=ctx["end"])
    result = statistics_gate(query, history, ctx["start"], ctx["end"], cfg.cycle, config=cfg.gate_config())
    return finish_gate(result, ctx, "stats")
