"""python -m mjoin run: the join engine, interval evaluation or streaming."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import pyarrow.parquet as pq

from mjoin.commands import UserError
from mjoin.engine.config import EngineConfig, EngineError
from mjoin.engine.control import JobControl, JobRunning
from mjoin.engine.failure import JobFailed, filesystem_failure
from mjoin.engine.runs import run_interval, run_stream
from mjoin.engine.stream import claim_info
from mjoin.engine.state import StateStore
from mjoin.lake.layout import Lake
from mjoin.lake.registry import RegistryError
from mjoin.model.query import load_query
from mjoin.model.statistics import StatisticsError
from mjoin.model.timeutil import parse_duration
from mjoin.optimizer.calibrate import COST_MODEL_FILE
from mjoin.optimizer.cost import CostModel, CostModelError
from mjoin.optimizer.psp import slices_for
from mjoin.runtime import fsutil
from mjoin.runtime.resources import Resources
from mjoin.runtime.spark import get_spark
from mjoin.stats.emitted import JobStatistics

log = logging.getLogger(__name__)
NAME = "run"
HELP = "run the multi-way stream join (interval evaluation, or --stream)"
DESCRIPTION = """Run the Spark multi-way window join of a query.

Interval evaluation (default): join the lake's data with event time in [--from, --to)
in cycles of --cycle seconds, the state built from the window before --from; write
results (Parquet, <out>/results/<query>/batch=<B>/), metrics (JSON lines,
<out>/metrics/<query>/metrics.jsonl) and rejected input (<out>/quarantine/<query>/)
under --out, and print a summary. A pure function of the lake's contents.

  python -m mjoin run --query tpcds_returns_by_address --plan plan.json --lake .lake \\
      --from 2026-01-01T00:05:00Z --to 2026-01-01T00:20:00Z --cycle 60 --out /tmp/eval

Streaming (--stream): one Structured Streaming query over <lake>/streams/, checkpoint,
state, results and metrics in the lake; the plan is the registry's active one
(re-read at every batch), else --plan, else the spec's stream order.

  python -m mjoin run --stream --query tpcds_returns_by_address --lake .lake

--engine spark-native runs Spark's own chained stream-stream joins instead (baseline).

Exit codes: 0 done; 2 bad input (spec, plan, arguments) or the streaming job of this
query already runs (refused before Spark starts); 1 anything else. A full disk or a
read-only folder ends the run with one line naming the cause and the path (the
traceback is in the log above it), and `job status` records the failure."""


def add_arguments(p):
    p.add_argument("--query", required=True, help="query spec (YAML path or name)")
    p.add_argument("--lake", required=True, help="lake root (landed streams under <lake>/streams/)")
    p.add_argument("--plan", help="plan JSON (default: the registry's active plan when streaming, else the "
                                  "spec's stream order)")
    p.add_argument("--engine", choices=("mjoin", "spark-native"), default="mjoin")
    g = p.add_argument_group("interval evaluation")
    g.add_argument("--from", dest="start", help="interval start (ISO-8601 or epoch seconds)")
    g.add_argument("--to", dest="end", help="interval end, exclusive")
    g.add_argument("--cycle", type=float, help="batch length in seconds of event time")
    g.add_argument("--out", help="output folder (cleared for this query first)")
    s = p.add_argument_group("streaming")
    s.add_argument("--stream", action="store_true", help="run the streaming job instead of an interval")
    s.add_argument("--trigger", choices=("availableNow", "processingTime"), default="availableNow")
    s.add_argument("--interval", type=float, help="processingTime trigger interval, seconds")
    s.add_argument("--timeout", type=float, help="stop a processingTime run after this many seconds")
    s.add_argument("--namespace", default="", help="lake namespace for outputs (e.g. eval/run1)")
    s.add_argument("--max-files-per-trigger", type=int,
                   help="at most this many landed files per micro-batch, in whole arrival folders (a folder with "
                        "more files is read whole in a batch of its own)")
    s.add_argument("--stats-cycle", type=float, default=0, metavar="SECONDS",
                   help="the job computes the statistics of every cycle of this many seconds itself, from its state, "
                        "into the statistics history (<lake>/stats; the loop's cycle; docs/statistics.md, \"Where "
                        "the statistics come from\"); 0 (default): off")
    s.add_argument("--idle-timeout", type=_idle_timeout, metavar="SECONDS|never",
                   help="a stream whose event time lags the leading stream's by more than this is idle: the "
                        "job's watermark does not wait for it (default: the query's largest window)")
    t = p.add_argument_group("event-time sanity (the landing contract)")
    t.add_argument("--future-allowance", type=_allowance, metavar="SECONDS|never",
                   help="a row whose event time is at or after its arrival folder's epoch plus this is 'future': "
                        "quarantined, it moves no watermark (default: two arrival cycles)")
    t.add_argument("--arrival-cycle", type=_positive_duration, metavar="SECONDS",
                   help="the lake's arrival cycle (default: the most common gap between two consecutive arrival "
                        "folders of a source)")
    e = p.add_argument_group("engine")
    e.add_argument("--buckets", type=int, default=16, help="key buckets per attribute class (default 16)")
    e.add_argument("--driver-rows", type=int, default=1_000_000, metavar="N",
                   help="run on the driver (no Spark job) a micro-batch whose state plus new rows hold at most N "
                        "tuples, and an interval whose accepted files hold at most N rows "
                        "(default 1000000; 0: always on the executors)")
    e.add_argument("--shuffle-partitions", type=int, help="partitions of the per-batch shuffle")
    e.add_argument("--psp-slices", default="auto", metavar="N|auto",
                   help="slices of the state of streams joined by a band alone (PSP; fixed for the life of a state). "
                        "auto (default): the existing state's, else the PSP latency model's choice (docs/algorithms.md Eq. 58-61) from the streams' landed "
                        "rates, the windows and the cores")
    e.add_argument("--prefilter", dest="prefilter", action="store_true", default=None,
                   help="force the SMJ synopsis prefilter on (default: the plan's option)")
    e.add_argument("--no-prefilter", dest="prefilter", action="store_false", help="force the prefilter off")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--inject-fault", dest="fault", help=argparse.SUPPRESS)


def _idle_timeout(text: str) -> float:
    if text.strip().lower() in ("never", "inf", "none"):
        return float("inf")

    try:
        v = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not v > 0:
        raise argparse.ArgumentTypeError("must be a positive duration (or never)")
    return v


def _allowance(text: str) -> float:
    if text.strip().lower() in ("never", "inf", "none"):
        return float("inf")
    return _positive_duration(text)


def _positive_duration(text: str) -> float:
    try:
        v = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError("must be a positive duration")
    return v


def _psp_slices(args) -> int:
    """``--psp-slices``: a number, or auto (the state's, else Eq. 61: mjoin.optimizer.psp.slices_for)."""
    value = str(getattr(args, "psp_slices", "auto") or "auto")
    if value != "auto":
        if not value.isdigit() or int(value) < 1:
            raise UserError(f"--psp-slices must be a whole number >= 1 or auto, not {value!r}")
        return int(value)

    try:
        query = load_query(args.query)
    except Exception:  # the run reports a bad spec itself
        return 4
    if not query.band_classes:
        return 4

    lake = Lake(args.lake, getattr(args, "namespace", "") or "")
    latest = StateStore(lake.state(query.name)).latest() if args.stream else None
    if latest and latest.get("psp_slices"):
        return int(latest["psp_slices"])
    lam = {}
    for s in query.streams:  # rows per second of what has landed
        files = lake.stream_files(s.source)
        arrivals = lake.arrivals(s.source)
        if files and len(arrivals) > 1:
            rows = sum(pq.read_metadata(f).num_rows for f in files[-50:])
            span = max(arrivals[-1] - arrivals[max(len(arrivals) - 50, 0)], 1)
            lam[s.name] = rows / span

    return slices_for(query, lam, cores=os.cpu_count() or 2, **_measured_costs(lake, query))


def _measured_costs(lake, query) -> dict:
    """T_j measured on this lake: the calibrated cost model's alpha_m (seconds per matched state tuple, fitted
    to the engine's own metrics by ``mjoin calibrate`` / the loop), when there is one; else the latency model's defaults (Eq. 58)."""

    path = fsutil.join(lake.plans(query.name), COST_MODEL_FILE)
    try:
        model = CostModel.from_json(json.loads(fsutil.read_text(path)))
    except (FileNotFoundError, ValueError, CostModelError):
        return {}
    return {"t_j": model.alpha_m} if model.calibrated and model.alpha_m > 0 else {}


def config_from(args):
    return EngineConfig(buckets=args.buckets, shuffle_partitions=args.shuffle_partitions, prefilter=args.prefilter,
                        max_files_per_trigger=args.max_files_per_trigger, fault=args.fault,
                        idle_timeout=getattr(args, "idle_timeout", None),
                        future_allowance=getattr(args, "future_allowance", None),
                        arrival_cycle=getattr(args, "arrival_cycle", None),
                        driver_rows=getattr(args, "driver_rows", 1_000_000),
                        psp_slices=_psp_slices(args))


def check_interval_args(args) -> None:
    """An interval run's required options, checked before anything starts (a UserError names them)."""
    if args.stream:
        return
    missing = [f"--{n}" for n, v in (("from", args.start), ("to", args.end), ("cycle", args.cycle),
                                     ("out", args.out)) if v in (None, "")]
    if missing:
        raise UserError(f"interval evaluation needs {', '.join(missing)} (or use --stream)")


def claim_job(args):
    """The streaming job's claim (``engine.control``), taken before Spark starts (a Spark start takes 10-60 s):
    a second start of the job of this query in this lake is refused at once (``UserError``, naming the running
    job and the lake). None for an interval run and for the spark-native baseline (no claim)."""
    if not args.stream or args.engine != "mjoin":
        return None
    lake = Lake(args.lake, args.namespace)
    try:
        return JobControl(lake, load_query(args.query).name).claim(
            claim_info(args.trigger, args.interval, getattr(args, "stats_cycle", 0) or 0))
    except JobRunning as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:  # the control folder cannot be written: a read-only or full lake
        found = filesystem_failure(exc)
        raise JobFailed(found.line() if found else f"the join job cannot start: {exc}", found) from exc


def execute(spark, args, claim=None):
    """Run what ``args`` ask for on ``spark``; returns the summary (also used by jobs/join.py). ``claim``: the
    streaming job's claim (:func:`claim_job`)."""
    query = load_query(args.query)
    try:
        config = config_from(args)
        if args.stream:
            lake = Lake(args.lake, args.namespace)
            cycle = getattr(args, "stats_cycle", 0) or 0
            stats = JobStatistics(query, lake, cycle) if cycle and args.engine == "mjoin" else None
            return run_stream(spark, query, lake, trigger=args.trigger, interval=args.interval, plan=args.plan,
                              config=config, engine=args.engine, timeout=args.timeout, stats=stats,
                              **({"claim": claim} if claim is not None else {}))
        check_interval_args(args)
        return run_interval(spark, query, args.plan, Lake(args.lake), args.start, args.end, args.cycle, args.out,
                            engine=args.engine, config=config)
    except (EngineError, RegistryError, StatisticsError) as exc:
        raise UserError(str(exc)) from None
    except ValueError as exc:  # unparsable --from/--to
        if "is not a time" in str(exc):
            raise UserError(str(exc)) from None
        raise


def failed(exc: JobFailed) -> int:
    """A run ended by its environment (:class:`~mjoin.engine.failure.JobFailed`): the traceback to the log, then
    the one line naming the cause and the path; exit code 1."""
    cause = exc.__cause__ or exc
    log.error("%s; the traceback:", exc, exc_info=(type(cause), cause, cause.__traceback__))
    logging.getLogger("py4j").setLevel(logging.WARNING)  # (its goodbye at exit would follow the one line)
    print(f"error: {exc}", file=sys.stderr, flush=True)
    return 1


def launch(args, app_name: str):
    """Claim the streaming job (before Spark starts), start Spark, run; returns the summary. A claim the run
    never took over (Spark did not start, a bad argument) is recorded ``failed`` and released."""
    check_interval_args(args)  # usage errors before Spark's ~10 s start
    load_query(args.query)
    claim = claim_job(args)
    try:
        spark = get_spark(app_name, Resources.from_env())
        return execute(spark, args, claim)
    except BaseException as exc:
        if claim is not None:
            claim.abandon(f"{type(exc).__name__}: {str(exc)[:2000]}")
        raise


def run(args) -> int:
    try:
        summary = launch(args, f"mjoin-run-{'stream' if args.stream else 'interval'}")
    except JobFailed as exc:
        return failed(exc)
    print(json.dumps(summary.to_json(), indent=2, default=str) if args.json else summary.describe())
    return 0
