"""python -m mjoin stats: the statistics job (Spark) for one interval of cycles."""
from __future__ import annotations

import json

from mjoin.commands import UserError
from mjoin.engine.control import JobControl
from mjoin.lake.layout import Lake
from mjoin.lake.registry import PlanRegistry
from mjoin.model.plan import load_plan
from mjoin.model.query import load_query
from mjoin.model.timeutil import iso, parse_duration, parse_time
from mjoin.runtime import fsutil
from mjoin.runtime.spark import SparkConnectUnavailable, get_spark
from mjoin.stats.emitted import use_job_statistics
from mjoin.stats.job import METHODS, MODES, StatsConfig, run_statistics
from mjoin.stats.sketch import SketchConfig

NAME = "stats"
HELP = "compute per-cycle stream/edge statistics of an interval into the history (Spark)"
DESCRIPTION = """Compute, for every statistics cycle [T, T+tau) in [--from, --to), lambda, kappa and
window_tuples per stream, q, m, s (gamma, mu) per directed edge, per key group, and the
per-key rate histogram; replace those cycles in the Parquet history
<out>/<query>/cycle=<epoch>/ (default <lake>/stats). Re-running an interval replaces
its cycles. Example:

  python -m mjoin stats --query tpcds_returns_by_address --lake .lake \\
      --from 2026-01-01T00:00:00Z --to 2026-01-01T00:10:00Z --cycle 10

With --prefer-job (the loop's statistics step in continuous mode) the cycles the streaming join job
emitted itself are used when the history holds all of them and they validate (no stream is read);
otherwise they are computed here, and --report FILE says which and why.

Exit 2 for bad arguments (interval not a whole number of cycles, unknown query, ...)."""


def add_arguments(p):
    p.add_argument("--query", required=True, help="query spec path or name")
    p.add_argument("--lake", help="lake root (default $MJOIN_LAKE or <project>/.lake)")
    p.add_argument("--namespace", default="", help="lake namespace for the output (e.g. eval/<run>)")
    p.add_argument("--from", dest="start", required=True, metavar="T0", help="interval start (ISO-8601 or epoch s)")
    p.add_argument("--to", dest="end", required=True, metavar="T1", help="interval end, exclusive")
    p.add_argument("--cycle", required=True, metavar="SECONDS", help="statistics cycle tau (e.g. 10, 10s, 1m)")
    p.add_argument("--out", metavar="DIR", help="history root (default <lake>/stats); cycles go to DIR/<query>/")
    p.add_argument("--mode", choices=MODES, default="exact", help="exact (default) or sketch (bounded memory)")
    p.add_argument("--method", choices=METHODS, default="pass",
                   help="exact mode: pass (default: one Spark job, a numpy pass per key partition) or sql "
                        "(one Spark SQL aggregation per statistic; slower, the reference)")
    p.add_argument("--driver-rows", type=int, default=StatsConfig.driver_rows, metavar="N",
                   help="exact pass: when the interval's files hold at most N rows (per attribute class), collect "
                        "them and run the kernel on the driver, skipping the shuffle (default %(default)s; "
                        "0: always on the executors)")
    p.add_argument("--plan", default="active", metavar="PLAN",
                   help="take the key groups from this plan: a plan file, 'active' (the registry's ACTIVE "
                        "plan if there is one; default) or 'none' (one group)")
    p.add_argument("--partitioning", metavar="JSON", help="a partitioning rule as JSON (overrides --plan), e.g. "
                   '\'{"method": "hash", "attr_class": "c0", "groups": 4}\'')
    p.add_argument("--histogram-buckets", type=int, default=1024, metavar="B",
                   help="per-key rate histogram buckets pmod(key, B) (default 1024; 0: exact keys)")
    p.add_argument("--key-buckets", type=int, default=StatsConfig.key_buckets, metavar="B",
                   help="per-key-bucket statistics pmod(key, B) in the same pass, what the optimizer prices key-group "
                        "rules with (exact pass mode, one attribute class; default %(default)s; 0: none)")
    p.add_argument("--key-ranges", type=int, default=StatsConfig.key_ranges, metavar="R",
                   help="per-key-range statistics over R equal ranges of [0, 2^k) (default %(default)s; 0: none)")
    p.add_argument("--sketch-depth", type=int, default=5, help="sketch mode: hash tables (default 5)")
    p.add_argument("--sketch-width", type=int, default=1024, help="sketch mode: buckets per table (default 1024)")
    p.add_argument("--sketch-dense-keys", type=int, default=64, help="sketch mode: heavy keys per stream held exactly")
    p.add_argument("--sketch-sample-keys", type=int, default=4096,
                   help="sketch mode: keys per window in the coordinated sample that estimates m")
    p.add_argument("--sketch-slices", type=int, default=0, help="sketch mode: time slices per cycle (0: auto)")
    p.add_argument("--scan-all-arrivals", action="store_true",
                   help="read every arrival partition (default: skip those that can only hold older event times)")
    p.add_argument("--prefer-job", action="store_true",
                   help="continuous mode: use the cycles the streaming join job emitted into the history (waiting "
                        "while it catches up, --job-wait) and read no stream; compute them here only when the job "
                        "emitted none or not all (stopped, lagging) or they do not validate")
    p.add_argument("--job-wait", type=float, metavar="SECONDS",
                   help="--prefer-job: wait at most this long for a running join job to emit the interval's last "
                        "cycles (default: one cycle, the query's lateness and three of the job's trigger intervals, "
                        "plus 15 s: the job emits a cycle at its first batch after its watermark passed the cycle)")
    p.add_argument("--report", metavar="FILE", help="write where the statistics came from (job or this job, and why) "
                                                  "to FILE as JSON (the DAG's run folder)")
    p.add_argument("--json", action="store_true", help="print the job summary as JSON")


def _partitioning(args, query, lake):
    if args.partitioning:
        try:
            rule = json.loads(args.partitioning)
        except json.JSONDecodeError as exc:
            raise UserError(f"--partitioning is not JSON: {exc}") from None
        return rule or None, "--partitioning"
    ref = (args.plan or "none").strip()
    if ref == "none":
        return None, "none"
    if ref == "active":
        plan = PlanRegistry(lake, query.name).active(query)
        return (plan.partitioning if plan else None), ("active plan v%s" % plan.version if plan else "no active plan")
    plan = load_plan(ref, query)
    return plan.partitioning, ref


def _write_report(path, report: dict) -> None:
    if path:
        fsutil.atomic_write_text(path, json.dumps(report, indent=2, default=str))


def run(args) -> int:
    query = load_query(args.query)
    lake = Lake(args.lake, args.namespace) if args.lake else Lake.default().with_namespace(args.namespace)
    try:
        cycle = parse_duration(args.cycle)
        start, end = parse_time(args.start), parse_time(args.end)
        sketch = SketchConfig(depth=args.sketch_depth, width=args.sketch_width, dense_keys=args.sketch_dense_keys,
                              sample_keys=args.sketch_sample_keys, slices_per_cycle=args.sketch_slices,
                              top_k_tracked=max(1024, 4 * args.sketch_dense_keys))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    report = {"source": "standalone", "start": iso(start), "end": iso(end), "cycle_seconds": cycle}
    if args.prefer_job:
        control = JobControl(lake, query.name)
        wait, job = args.job_wait, control.status()
        if wait is None:
            trigger = float(job.get("interval") or 10.0)
            wait = cycle + query.lateness + 3 * trigger + 15.0
        used = use_job_statistics(query, lake, start, end, cycle, out=args.out, wait=wait,
                                  running=lambda: control.status()["running"], job_cycle=job.get("stats_cycle"))
        report.update(used)
        if used["source"] == "job":
            _write_report(args.report, report)
            print(f"stats {query.name}: the {used['cycles']} cycles of [{iso(start)}, {iso(end)}) as the join job "
                  f"emitted them ({used['from_job']} by the job; validated, waited {used['waited_seconds']:.1f} s); "
                  "no stream read")
            return 0
        report["source"] = "standalone"
        print(f"stats {query.name}: the join job's statistics cannot be used: {used['fallback']}; computing them")
    rule, rule_from = _partitioning(args, query, lake)
    config = StatsConfig(mode=args.mode, partitioning=rule, histogram_buckets=args.histogram_buckets,
                         prune_arrivals=not args.scan_all_arrivals, sketch=sketch if args.mode == "sketch" else None,
                         method=args.method, driver_rows=args.driver_rows, key_buckets=args.key_buckets,
                         key_ranges=args.key_ranges)
    try:
        spark = get_spark("mjoin-stats", allow_remote=True)  # MJOIN_SPARK_REMOTE: a warm Connect session
    except SparkConnectUnavailable as exc:
        raise UserError(str(exc)) from None
    run_ = run_statistics(spark, query, lake, start, end, cycle, out=args.out, config=config)
    s = run_.summary
    report["wall_seconds"] = s["wall_seconds"].get("total")
    _write_report(args.report, report)
    if args.json:
        print(json.dumps(s, indent=1, default=str))
        return 0
    w = s["wall_seconds"]
    print(f"stats {query.name}: {s['cycles']} cycles of {s['cycle_seconds']:g}s [{s['start']}, {s['end']}), "
          f"{s['groups']} group(s) ({rule_from}), {s['mode']} mode, {w['total']:.1f}s "
          f"(compute {w['compute']:.1f}s, write {w['write']:.1f}s)")
    for name, st in s["streams"].items():
        nulls = ", ".join(f"{c} {n}" for c, n in st["null_keys"].items() if n)
        print(f"  {name:<6} {st['tuples']} tuples, {st['files']} files"
              + (f", NULL keys: {nulls}" if nulls else "")
              + (f", {st['bad_event_time']} unusable event times" if st["bad_event_time"] else "")
              + (f", {len(st['rejected_files'])} files SKIPPED" if st["rejected_files"] else ""))
        for r in st["rejected_files"]:
            print(f"    skipped {r['file']}: {r['reason']}")
    cells = s.get("cells") or {}
    if cells.get("sets"):
        print("  per-cell statistics: " + ", ".join(
            f"{k} ({r['groups'] if r['method'] == 'hash' else len(r['bounds']) + 1} cells)" for k, r in cells["sets"].items()))
    if cells.get("note"):
        print(f"  per-cell statistics: {cells['note']}")
    print(f"  history {s['out']}")
    print(f"  summary {s['summary_file']}")
    return 0
