"""The loop's fixed costs step by step, two versions of the code side by side (the goal: the loop's overhead under 5% of the join).

    flock /tmp/mjoin-bench.lock nice -n 5 .venv/bin/python bench/evaluation/overhead.py \
        --workload /tmp/w/tpcds-sf0.1-7m --base main [--cycles 12 --period 120 --periods 2 --reps 3 --tag quick]

Each version (``--base``: a git ref, checked out in a temporary worktree; and this checkout) runs in its own
process, the versions alternating ``--reps`` times. A process builds the statistics history of the L cycles
before the measured interval (not timed), then times what one re-optimization costs:

- per 10-s cycle, ``mjoin.evaluation.cycle_loop.CycleLoop.step`` as ``replay`` calls it (statistics job of the cycle,
  history read, statistics gate, Holt, forecast gate, dppick, plan gate), ``--cycles`` cycles;
- per DAG period, ``run_evaluation.period_overhead`` (one statistics job over the period, the same steps once);
- what the fixed costs are made of: Spark jobs and py4j round trips per statistics job, the job's own phases
  (its summary's ``wall_seconds``), and one cycle's gates under cProfile split into GX's parts (building
  suites, registering suite and validation definition, the validation itself, the freshness check and
  results store, rendering the result as JSON) and our pandas frames; cProfile slows everything down, so
  those are shares, the timings come from the unprofiled steps.

The join's own time for the same interval comes from ``run_evaluation.py --sections overhead`` (the engine is
not run here). Results: ``results/overhead[_<tag>].json`` (machine, load before/after, versions, commits).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
STEPS = ("statistics", "history", "stats_gate", "forecast", "forecast_gate", "optimize", "plan_gate")

#: cProfile entries (file suffix, function) whose cumulative time is one part of the gates' cost
GX_PARTS = {
    "suite_building": [("mjoin/gates/gxengine.py", "expect"), ("mjoin/gates/gxengine.py", "make_suite")],
    "registering": [("core/factory/suite_factory.py", "add_or_update"),
                    ("core/factory/validation_definition_factory.py", "add_or_update")],
    "validation": [("validator/v1_validator.py", "validate_expectation_suite")],
    "freshness_and_store": [("core/validation_definition.py", "is_fresh"),
                            ("data_context/store/validation_results_store.py", "store_validation_results"),
                            ("data_context/store/store.py", "remove_key"), ("data_context/store/store.py", "list_keys")],
    "result_json": [("core/expectation_validation_result.py", "to_json_dict")],
    "failures": [("mjoin/gates/gxengine.py", "failures_from")],
    "frames": [("mjoin/gates/frames.py", "tidy_frame"), ("mjoin/gates/frames.py", "coverage_frame"),
               ("mjoin/gates/frames.py", "mark_expected_groups"), ("mjoin/gates/forecast.py", "plausibility_frame")],
    "gates": [("mjoin/gates/stats.py", "check_statistics"), ("mjoin/gates/forecast.py", "check_forecast"),
              ("mjoin/gates/plan.py", "check_plan")],
    "forecast_fits": [("mjoin/forecast/holt.py", "forecast_series")],
    "forecast": [("mjoin/forecast/holt.py", "forecast")],
}


def spread(values: list) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def profile_parts(prof: cProfile.Profile) -> dict:
    """Seconds (under cProfile) of each part of ``GX_PARTS``: the largest cumulative time of its entries
    (nested calls of one function are counted once: a suite-level result's to_json_dict holds its results')."""
    stats = pstats.Stats(prof).stats
    out = {}
    for part, entries in GX_PARTS.items():
        total = 0.0
        for suffix, fn in entries:
            cums = [ct for (f, _, name), (_, _, _, ct, _) in stats.items() if name == fn and f.endswith(suffix)]
            total += max(cums, default=0.0)
        out[part] = total
    return out


# ---- one version, in its own process -----------------------------------------------------------------

def child(args) -> dict:
    """Time the loop's steps with the code under ``args.include`` (see the module doc)."""
    sys.path.insert(0, args.include)
    sys.path.insert(0, str(Path(args.include).parent / "bench" / "evaluation"))
    import logging

    logging.basicConfig(level=logging.WARNING)
    for name in ("py4j", "great_expectations", "mjoin"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import py4j.clientserver as cs

    import run_evaluation as rev
    from mjoin.evaluation.cycle_loop import CycleLoop, LoopSettings
    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark
    from mjoin.stats.history import read_history
    from mjoin.stats.job import run_statistics

    calls = [0]
    send = cs.ClientServerConnection.send_command

    def counting(self, command):
        calls[0] += 1
        return send(self, command)

    cs.ClientServerConnection.send_command = counting
    spark = get_spark("mjoin-bench-overhead", Resources(spark_master="local[2]", shuffle_partitions=4))
    sc = spark.sparkContext
    query = load_query(rev.SEED)
    workload = Path(args.workload)
    lake = Lake(str(workload))
    tau, length = args.cycle, args.length
    start, end = rev.span_of(workload, tau)
    first = start + rev.warm_offset(query, tau) * tau  # the measured interval, as the evaluation's
    work = Path(args.work)
    root = str(work / "history")
    shutil.rmtree(root, ignore_errors=True)
    run_statistics(spark, query, lake, max(start, first - length * tau), first, tau, out=root)  # not timed
    loop = CycleLoop(query, LoopSettings(strategies=("dppick",), length=length, cycle=float(tau),
                                         cost_model=rev.cost_model()), [tuple(query.stream_names)])
    # once per process: importing GX, then its ephemeral context (what a fresh Airflow task would pay per gate run)
    t = time.perf_counter()
    import great_expectations  # noqa: F401
    gx_import = time.perf_counter() - t
    from mjoin.gates import gxengine

    t = time.perf_counter()
    gxengine.runner()
    gx_context = time.perf_counter() - t
    # one untimed step first: imports (GX ~2.5 s) and first-use costs are paid once per process, not per cycle
    t = time.perf_counter()
    loop.step(read_history(root, query.name, start=first - length * tau, end=first), first - tau, 0.0)
    first_step = time.perf_counter() - t
    cycles = []
    for k in range(args.cycles):
        c = first + k * tau
        sc.setJobGroup(f"stats-{k}", "statistics")
        calls[0] = 0
        t = time.perf_counter()
        run = run_statistics(spark, query, lake, c, c + tau, tau, out=root)
        stats_seconds = time.perf_counter() - t
        py4j_calls = calls[0]
        jobs = len(sc.statusTracker().getJobIdsForGroup(f"stats-{k}"))
        t = time.perf_counter()
        hist = read_history(root, query.name, start=c + tau - length * tau, end=c + tau)
        history_seconds = time.perf_counter() - t
        rec = loop.step(hist, c, stats_seconds)
        st = rec["strategies"]["dppick"]
        cycles.append({
            "cycle_start": c,
            "seconds": {"statistics": stats_seconds, "history": history_seconds,
                        "stats_gate": rec["seconds"].get("stats_gate"), "forecast": rec["seconds"].get("forecast"),
                        "forecast_gate": rec["seconds"].get("forecast_gate"),
                        "optimize": st.get("optimize_seconds"), "plan_gate": st.get("plan_gate_seconds")},
            "outcomes": [rec.get("stats_gate"), rec.get("forecast_gate"), st.get("gate_outcomes")],
            "statistics_job": {"spark_jobs": jobs, "py4j_calls": py4j_calls,
                               "phases": run.summary["wall_seconds"], "kernel": run.summary.get("kernel")},
        })
    # the last cycle's step once more under cProfile (not timed: cProfile slows it down ~2x)
    prof = cProfile.Profile()
    prof.enable()
    loop.step(hist, c, 0.0)
    prof.disable()
    profiled = {"cycle": args.cycles - 1, "seconds_under_profile": profile_parts(prof)}
    sc.setJobGroup("period", "period")
    calls[0] = 0
    po = rev.period_overhead(spark, query, str(workload), start, first, end, tau, length, args.period, args.periods,
                             work)
    po["spark_jobs"] = len(sc.statusTracker().getJobIdsForGroup("period"))
    po["py4j_calls"] = calls[0]
    spark.stop()
    return {"cycles": cycles, "profiled": profiled, "per_period": po,
            "once_per_process": {"gx_import": gx_import, "gx_context": gx_context, "first_step": first_step}}


# ---- the parent: versions side by side -------------------------------------------------------------------

def checkout(ref: str, where: Path) -> tuple[Path, str]:
    """A detached worktree of ``ref`` at ``where``: its include/ and its commit."""
    subprocess.run(["git", "-C", str(PROJECT), "worktree", "add", "--detach", str(where), ref], check=True,
                   capture_output=True)
    commit = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    return where / "include", commit


def run_child(args, label: str, include: Path, rep: int, work: Path) -> dict:
    out = work / f"{label}-{rep}.json"
    env = dict(os.environ, PYTHONPATH=str(include))  # Spark's Python workers import the same version
    cmd = [sys.executable, __file__, "--child", "--include", str(include), "--workload", args.workload,
           "--work", str(work / f"{label}-{rep}"), "--json", str(out), "--cycles", str(args.cycles),
           "--period", str(args.period), "--periods", str(args.periods), "--cycle", str(args.cycle),
           "--length", str(args.length)]
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{label} rep {rep} failed:\n{r.stderr[-4000:]}")
    doc = json.loads(out.read_text())
    doc["process_seconds"] = time.perf_counter() - t
    return doc


def summarize(runs: list) -> dict:
    """Per step: the median over every timed cycle of every repetition, and the spread of the repetitions'
    medians; the same per period; the statistics job's Spark jobs and py4j calls; the profiled parts."""
    per_cycle = {s: [c["seconds"][s] for r in runs for c in r["cycles"]] for s in STEPS}
    rep_medians = {s: [statistics.median(c["seconds"][s] or 0.0 for c in r["cycles"]) for r in runs] for s in STEPS}
    totals = [sum(c["seconds"][s] or 0.0 for s in STEPS) for r in runs for c in r["cycles"]]
    periods = [p for r in runs for p in r["per_period"]["periods"]]
    return {
        "cycle_step_seconds": {s: spread(v) for s, v in per_cycle.items()},
        "cycle_step_rep_medians": {s: spread(v) for s, v in rep_medians.items()},
        "cycle_total_seconds": spread(totals),
        "period_seconds": runs[0]["per_period"]["period_seconds"],
        "period_step_seconds": {s: spread([p["seconds"][s] for p in periods]) for s in STEPS},
        "period_total_seconds": spread([p["total"] for p in periods]),
        "statistics_job": {
            "spark_jobs": spread([c["statistics_job"]["spark_jobs"] for r in runs for c in r["cycles"]]),
            "py4j_calls": spread([c["statistics_job"]["py4j_calls"] for r in runs for c in r["cycles"]]),
            "phases": {ph: spread([c["statistics_job"]["phases"].get(ph) for r in runs for c in r["cycles"]])
                       for ph in sorted({ph for r in runs for c in r["cycles"] for ph in c["statistics_job"]["phases"]})},
            "per_period_spark_jobs": [r["per_period"]["spark_jobs"] for r in runs],
            "per_period_py4j_calls": [r["per_period"]["py4j_calls"] for r in runs],
            "read": sorted({(c["statistics_job"]["kernel"] or {}).get("read", "spark") for r in runs
                            for c in r["cycles"]}),
        },
        "gates_under_profile": {part: spread([r["profiled"]["seconds_under_profile"][part] for r in runs])
                                for part in GX_PARTS},
        "outcomes": sorted({json.dumps(c["outcomes"]) for r in runs for c in r["cycles"]}),
        "once_per_process": {k: spread([r["once_per_process"][k] for r in runs])
                             for k in ("gx_import", "gx_context", "first_step")},
        "process_seconds": spread([r["process_seconds"] for r in runs]),
    }


def markdown(result: dict) -> str:
    """The side-by-side tables of one result file (per cycle and per period, medians with the repetitions'
    spread; the statistics job's Spark jobs and py4j calls; the gates' parts under cProfile)."""
    v = result["versions_compared"]
    b, h = v["base"], v["head"]
    c = result["commits"]
    lines = [f"| step | before ({c['base']}), s | after ({c['head']}), s |", "|---|---|---|"]

    def cell(s):
        return f"{s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]" if s["median"] is not None else "-"

    for step in STEPS:
        lines.append(f"| {step} | {cell(b['cycle_step_rep_medians'][step])} | {cell(h['cycle_step_rep_medians'][step])} |")
    lines.append(f"| **per 10-s cycle** | **{b['cycle_total_seconds']['median']:.3f}** | "
                 f"**{h['cycle_total_seconds']['median']:.3f}** |")
    for step in STEPS:
        lines.append(f"| per {b['period_seconds']}-s period: {step} | {b['period_step_seconds'][step]['median']:.3f} | "
                     f"{h['period_step_seconds'][step]['median']:.3f} |")
    lines.append(f"| **per {b['period_seconds']}-s period** | **{cell(b['period_total_seconds'])}** | "
                 f"**{cell(h['period_total_seconds'])}** |")
    sj_b, sj_h = b["statistics_job"], h["statistics_job"]
    lines.append(f"| statistics job per cycle: Spark jobs / py4j calls | {sj_b['spark_jobs']['median']:g} / "
                 f"{sj_b['py4j_calls']['median']:g} | {sj_h['spark_jobs']['median']:g} / {sj_h['py4j_calls']['median']:g} |")
    for k in ("gx_import", "gx_context", "first_step"):
        lines.append(f"| once per process: {k} | {b['once_per_process'][k]['median']:.3f} | "
                     f"{h['once_per_process'][k]['median']:.3f} |")
    for part in ("suite_building", "registering", "validation", "freshness_and_store", "result_json", "frames",
                 "gates", "forecast_fits", "forecast"):
        lines.append(f"| under cProfile, one cycle: {part} | {b['gates_under_profile'][part]['median']:.3f} | "
                     f"{h['gates_under_profile'][part]['median']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True, help="a TPC-DS lake (run_evaluation.py's tpcds-sf<sf>[-<duration>])")
    p.add_argument("--base", default="main", help="git ref of the previous code")
    p.add_argument("--cycles", type=int, default=12, help="10-s cycles timed per process")
    p.add_argument("--period", type=int, default=300, help="the DAG's period, seconds")
    p.add_argument("--periods", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="processes per version, alternating")
    p.add_argument("--cycle", type=int, default=10)
    p.add_argument("--length", type=int, default=60)
    p.add_argument("--tag", default="")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--markdown", metavar="JSON", help="print a result file's tables and exit")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--include", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--json", help=argparse.SUPPRESS)
    if argv is None and "--markdown" in sys.argv:
        argv = sys.argv[1:] + ["--workload", "-"]
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    if args.child:
        Path(args.json).write_text(json.dumps(child(args), default=str))
        return 0
    sys.path.insert(0, str(PROJECT / "include"))
    sys.path.insert(0, str(HERE))
    import run_evaluation as rev

    tmp = Path(tempfile.mkdtemp(prefix="mjoin-overhead-"))
    try:
        base_include, base_commit = checkout(args.base, tmp / "base")
        versions = [("base", base_include), ("head", PROJECT / "include")]
        result = {"benchmark": "evaluation/overhead", **rev.provenance(), "parameters": vars(args),
                  "commits": {"base": base_commit, "head": rev.provenance()["git_commit"]},
                  "load_average_before": list(os.getloadavg())}
        runs = {label: [] for label, _ in versions}
        for rep in range(args.reps):
            for label, include in (versions if rep % 2 == 0 else versions[::-1]):
                print(f"rep {rep + 1}/{args.reps}: {label} (load {os.getloadavg()[0]:.1f})", flush=True)
                runs[label].append(run_child(args, label, include, rep, tmp))
        result["load_average_after"] = list(os.getloadavg())
        result["versions_compared"] = {label: summarize(rs) for label, rs in runs.items()}
        result["runs"] = runs
    finally:
        subprocess.run(["git", "-C", str(PROJECT), "worktree", "remove", "--force", str(tmp / "base")],
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    out = Path(args.out) / ("overhead" + (f"_{args.tag}" if args.tag else "") + ".json")
    out.write_text(json.dumps(result, indent=1, default=str))
    for label, s in result["versions_compared"].items():
        steps = ", ".join(f"{k} {v['median']:.3f}" for k, v in s["cycle_step_seconds"].items())
        print(f"{label}: per cycle {s['cycle_total_seconds']['median']:.3f} s ({steps}); per {s['period_seconds']} s "
              f"period {s['period_total_seconds']['median']:.3f} s")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
