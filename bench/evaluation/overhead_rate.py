"""The loop's overhead (the goal: under 5% of the join) against the arrival rate: the loop's overhead per re-optimization as a fraction of the join's own
time for the same interval, on the seed query replayed at several total rates, in one process.

    flock /tmp/mjoin-bench.lock nice -n 5 .venv/bin/python bench/evaluation/overhead_rate.py \\
        --rates paper 500 1000 --sf 1 --limit 1200 --work /tmp/mjoin-overhead-rate
    .venv/bin/python bench/evaluation/overhead_rate.py --plot-only results/overhead_rate_sf1.json

A point is ``RATE`` (total tuples/s over the four streams; ``paper``: the generator's default, the 1-h replay) or
``RATE@SF`` (another scale factor: the paper replay of sf 1 holds ~604 k tuples, so above ~1000 tuples/s it lasts
less than the 5-min window plus one 300-s DAG period). Per point, run_evaluation's own steps: the paper section's
engine runs (the covering fixed orders, ``--reps`` rounds) and loop (every strategy, ``--orders`` initial orders;
its per-cycle timing is ``loop_overhead``), then ``overhead_section`` (the loop at the DAG's period against dppick's
composed engine time for the same batches). Writes ``results/overhead_rate[_<tag>].json`` (provenance as
run_evaluation writes it, load before/after per point) and ``.png`` (the ratio against the rate, log-log, with the
5% goal).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_evaluation as ev  # noqa: E402  (puts include/ on the path)

log = logging.getLogger("bench.evaluation.overhead_rate")
GOAL = 0.05
STEPS = ("statistics", "history", "stats_gate", "forecast", "forecast_gate", "optimize", "plan_gate")


def parse_point(text: str, sf: float) -> tuple[float | None, float]:
    """``paper`` | ``RATE`` | ``RATE@SF`` -> (rate or None for the default replay, scale factor)."""
    rate, _, at = text.partition("@")
    return (None if rate == "paper" else float(rate)), (float(at) if at else sf)


def crossing(points: list, goal: float = GOAL) -> dict:
    """Where the ratio (loop / join) falls below ``goal`` against the rate: ``points`` are (rate, ratio) pairs.
    Measured: the first pair of neighbouring rates with the ratio at or above the goal, then below it, interpolated
    linearly in log(rate) and log(ratio). Otherwise the power law fitted to all points (least squares in log-log),
    solved for the goal: an extrapolation, said so. ``rate`` is None when neither exists."""
    pts = sorted((float(r), float(x)) for r, x in points if r and x and r > 0 and x > 0)
    if not pts:
        return {"rate": None, "how": "no points"}
    if pts[0][1] < goal:
        return {"rate": None, "how": f"below the goal already at the lowest rate ({pts[0][0]:g}/s)"}
    for (r0, x0), (r1, x1) in zip(pts, pts[1:]):
        if x0 >= goal > x1:
            f = (math.log(goal) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return {"rate": math.exp(math.log(r0) + f * (math.log(r1) - math.log(r0))), "how": "interpolated",
                    "between": [r0, r1]}
    out = {"rate": None, "how": "not crossed at the measured rates"}
    if len({r for r, _ in pts}) >= 2:
        xs, ys = [math.log(r) for r, _ in pts], [math.log(x) for _, x in pts]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)
        out["slope"] = slope  # ratio ~ rate ** slope
        if slope < 0:
            out.update(rate=math.exp(mx + (math.log(goal) - my) / slope), how="extrapolated (power law, log-log fit)")
    return out


def crossings(points: list, goal: float = GOAL) -> dict:
    """``crossing`` per DAG period and per 10-s cycle, over all points and per scale factor (the key domain grows
    with the scale factor, so a point at another sf is another workload, not only another rate)."""
    groups = {"all": points, **{f"sf{sf:g}": [p for p in points if p["sf"] == sf]
                                for sf in sorted({p["sf"] for p in points})}}
    return {name: {"per_period": crossing([(p["rate"], p["period"]["ratio_median"]) for p in pts if "period" in p], goal),
                   "per_period_median_round": crossing([(p["rate"], p["period"].get("ratio_median_round"))
                                                        for p in pts if "period" in p], goal),
                   "per_cycle": crossing([(p["rate"], p["cycle"]["ratio"]) for p in pts if "cycle" in p], goal)}
            for name, pts in groups.items()}


def _median(values):
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(over: dict, cycle: int) -> dict:
    """One rate's numbers: the loop per 10-s cycle and per DAG period by step, the join for the same intervals, the
    ratios."""
    pc, pp = over["per_cycle"], over["per_period"]
    cycles = pc["cycles"]
    periods = pp["periods"]
    per_period_steps = {k: _median(p["seconds"][k] for p in periods) for k in STEPS}
    out = {
        "measured_cycles": cycles,
        "cycle": {"loop_seconds_median": pc["loop_seconds_per_cycle"]["median"],
                  "loop_seconds_mean": pc["loop_seconds_total"] / cycles if cycles else None,
                  "steps_median": pc["median_step_seconds"],
                  "join_seconds_mean": pc["join_engine_seconds"] / cycles if cycles else None,
                  "join_cpu_seconds_mean": pc["join_task_cpu_seconds"] / cycles if cycles else None,
                  "ratio": pc["fraction_of_join_engine_time"]},
        "period": {"seconds": pp["period_seconds"], "count": len(periods),
                   "loop_seconds_median": _median(p["total"] for p in periods), "steps_median": per_period_steps,
                   "join_seconds_median": _median(p["join_engine_seconds"] for p in periods),
                   "join_cpu_seconds_median": _median(p["join_task_cpu_seconds"] for p in periods),
                   "ratio_median": _median(p["fraction_of_join_engine_time"] for p in periods),
                   "ratios": [p["fraction_of_join_engine_time"] for p in periods]},
    }
    # run_evaluation's per-period join (``_per_batch_wall``) was the composed time of the engine's middle round in run
    # order until c565eaa (results/overhead_rate_sf1.json was made so), the per-cycle one the median over the rounds.
    # The loop per period against the latter, scaled to the period's batches, says how much one slow round moved the
    # per-period ratio of such a run; in runs since c565eaa both are medians over the rounds.
    join = out["cycle"]["join_seconds_mean"]
    if join:
        per = join * pp["period_seconds"] / cycle
        out["period"]["join_seconds_median_round"] = per
        out["period"]["ratio_median_round"] = out["period"]["loop_seconds_median"] / per
    return out


def run(args) -> dict:
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark
    from mjoin.workloads.manifest import load_manifest

    work = Path(args.work or tempfile.mkdtemp(prefix="mjoin-bench-overhead-rate-"))
    work.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": "overhead_rate", **ev.provenance(),
              "parameters": {k: v for k, v in vars(args).items() if k != "plot_only"}, "points": []}
    out_path = Path(args.out) / f"{stem_name(args)}.json"
    t_all = time.perf_counter()

    def save():
        result["seconds_total"] = time.perf_counter() - t_all
        result["load_average_after"] = list(os.getloadavg())
        result["crossing"] = crossings(result["points"])
        out_path.write_text(json.dumps(ev.strip(result), indent=1, default=str))

    spark = get_spark("mjoin-bench-overhead-rate", Resources(spark_master="local[2]", shuffle_partitions=4))
    try:
        for text in args.rates:
            rate, sf = parse_point(text, args.sf)
            point = {"point": text, "sf": sf, "rate_asked": rate}
            result["points"].append(point)
            with ev.Section(f"overhead at {text} tuples/s, sf {sf:g}", point):
                wl = ev.tpcds_workload(work, sf, None, rate)
                m = load_manifest(wl)
                point.update(rate=m.parameters["rate"], replay_seconds=int(m.end_epoch) - int(m.start_epoch), lake=str(wl))
                pargs = argparse.Namespace(**{**vars(args), "tpcds_rate": rate, "sf": [sf]})
                label = f"seed-sf{sf:g}-{text}"
                doc = ev.paper_workload(spark, pargs, label, wl, ev.SEED, work, all_orders=False)
                over = ev.overhead_section(spark, pargs, doc, work)
                point.update(interval=doc["interval"], engine=doc["engine"], overhead=over, **summarize(over, args.cycle))
                point["gate_outcomes"] = doc["loop"]["gate_outcomes"]
            log.info("%s: loop/join per cycle %.0f%%, per period %.0f%%", text, 100 * (point["cycle"]["ratio"] or 0),
                     100 * (point["period"]["ratio_median"] or 0))
            save()
    finally:
        spark.stop()
        save()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return ev.strip(result)


def stem_name(args) -> str:
    return "overhead_rate" + (f"_{args.tag}" if args.tag else "")


def markdown(result: dict) -> str:
    """The README's table: per rate, the loop per 10-s cycle and per DAG period by step, the join, the ratios."""
    rows = ["| rate (tuples/s), sf | measured cycles, result rows | loop per 10-s cycle: statistics / gates / Holt / total | "
            "join per 10-s batch | loop / join per cycle | loop per period: statistics / gates / Holt / total | "
            "join per period | loop / join per period (median [periods]) | the same against the median round |",
            "|---" * 9 + "|"]
    for p in result["points"]:
        if "cycle" not in p:
            continue
        c, q = p["cycle"], p["period"]

        def parts(steps, total):
            gates = sum(steps[k] or 0 for k in ("stats_gate", "forecast_gate", "plan_gate"))
            return f"{steps['statistics']:.2f} / {gates:.2f} / {steps['forecast']:.2f} / **{total:.2f} s**"

        ratios = ", ".join(f"{100 * x:.0f}%" for x in q["ratios"] if x is not None)
        rows.append(f"| {p['rate']:.0f}, sf {p['sf']:g} | {p['measured_cycles']}, {p['engine']['result_rows'][0]:,} | {parts(c['steps_median'], c['loop_seconds_median'])} | "
                    f"{1000 * c['join_seconds_mean']:.0f} ms | {100 * c['ratio']:.0f}% | "
                    f"{q['seconds']} s: {parts(q['steps_median'], q['loop_seconds_median'])} | "
                    f"{q['join_seconds_median']:.2f} s | **{100 * q['ratio_median']:.0f}%** [{ratios}] | "
                    f"{q['join_seconds_median_round']:.2f} s: {100 * q['ratio_median_round']:.0f}% |")
    rows.append("")
    for group, cr in crossings([p for p in result["points"] if "cycle" in p]).items():
        for k in ("per_period", "per_period_median_round", "per_cycle"):
            x = cr[k]
            rate = f"{x['rate']:.0f} tuples/s" if x.get("rate") else "none"
            rows.append(f"- 5% crossing, {group}, {k.replace('_', ' ')}: {rate} ({x.get('how')}"
                        + (f" between {x['between'][0]:g} and {x['between'][1]:g}/s" if "between" in x else "")
                        + (f", slope {x['slope']:.2f}" if "slope" in x else "") + ")")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", nargs="+", default=["paper", "500", "1000"],
                   help="points: paper | RATE | RATE@SF (total tuples/s; @SF: another scale factor)")
    p.add_argument("--sf", type=float, default=1.0, help="scale factor of the points without @SF")
    p.add_argument("--limit", type=float, default=1200, help="at most this many seconds of each replay")
    p.add_argument("--cycle", type=int, default=10)
    p.add_argument("--length", type=int, default=60)
    p.add_argument("--orders", type=int, default=6, help="first N of the 24 initial orders in the loop")
    p.add_argument("--reps", type=int, default=3, help="engine rounds of the covering fixed orders")
    p.add_argument("--validate", action="store_true", help="also the real switching run (off by default)")
    p.add_argument("--period", type=int, default=300)
    p.add_argument("--periods", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--work", help="working folder (default: a temporary one); generated workloads there are reused")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--tag", default="sf1")
    p.add_argument("--plot-only", metavar="JSON", help="recompute the summaries and crossing of a results file from its measurements, redraw its plot")
    p.add_argument("--markdown", metavar="JSON", help="print the README table of a results file")
    args = p.parse_args(argv)
    from plots import plot_overhead_rate

    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    if args.plot_only:  # summaries and crossing are derived from the measurements: recomputed, then the plot
        path = Path(args.plot_only)
        result = json.loads(path.read_text())
        for p in result["points"]:
            if "overhead" in p:
                p.update(summarize(p["overhead"], result["parameters"]["cycle"]))
        result["crossing"] = crossings([p for p in result["points"] if "cycle" in p])
        path.write_text(json.dumps(result, indent=1, default=str))
        plot_overhead_rate(result, path.with_suffix(".png"))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("py4j", "mjoin.engine.interval", "mjoin.engine.batch", "mjoin.stats", "great_expectations",
                 "mjoin.forecast.holt"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("mjoin.gates").setLevel(logging.ERROR)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = run(args)
    plot_overhead_rate(result, Path(args.out) / f"{stem_name(args)}.png")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
