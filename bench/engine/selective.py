"""Benchmark: a selective synthetic workload where the probe order decides the work, with the 24 fixed
orders and the optimizers' plans side by side, and whether the engine's WALL time follows the plan.

    python bench/engine/selective.py            # ~10-15 min on 2 cores
    python bench/engine/selective.py --quick    # smoke run (small domain, 1 round)

Why: on TPC-DS (run_bench.py) fan-outs are ~1 and ~90% of the new tuples die at their first lookup
whatever the order, so the order-dependent probing is ~20% of the work and the seed query's wall time
does not follow the plan. Here the project's synthetic generator (``mjoin.workloads.synthetic.generate_synthetic``,
one attribute class, the 4 streams joined on ``key``) is given a schedule with very different gamma and mu:

- ``s0``, ``s1`` (hot): uniform keys over a shared domain ``[0, D)``, rates such that a window holds
  ``mu_hot`` tuples per key: every lookup into them hits (gamma = 1) and fetches ~``mu_hot`` tuples;
- ``s2`` (mid): same domain, ``mu_mid`` tuples per key in a window: gamma ~ 1 - exp(-mu_mid);
- ``s3`` (rare): uniform keys over ``[0, D / rare_share)``, ``mu_rare`` tuples per key in a window: a
  lookup into it hits with gamma ~ ``mu_rare``, and only ``rare_share`` of its own keys are in the others'.

A hot tuple that probes the other hot stream first fetches ``mu_hot`` tuples and then, ~99% of the
time, dies at ``s3``; one that probes ``s3`` first dies at once. The results (the same in every order)
are few next to that: the order decides most of the work.

In ONE run (after an unmeasured warm-up, rounds in a fresh random order, medians): the 24 fixed orders
(``fixedOrder``: every stream probes the others in the permutation's order) and the plans of ``exact``,
``dppick``, ``selectivity_first`` and ``greedy`` (``mjoin.optimizer.strategies``), optimized on the statistics job's
statistics of the cycle before the interval (what a re-optimization at the interval's start sees), with
the cost model calibrated on this machine by run_bench.py (``results/orders_full.json``; the
uncalibrated default model as well). All pipelined interval runs (``run_interval_plans``). The prediction
is run_bench.py's: per-cycle statistics x the cost model calibrated on this run's own per-step CPU times.
Per plan: wall (``batch_seconds``), tasks' / chains' / probing CPU, lookups, matches, predicted seconds,
and a fingerprint of the result rows (all plans must return the same multiset of rows).
Writes ``results/selective[_quick].json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from itertools import permutations
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from run_bench import (MEASURES, PROJECT, git_commit, median_over_rounds, predicted_costs,  # noqa: E402
                       rank_correlations, spread, summarise, versions)

sys.path.insert(0, str(PROJECT / "include"))
log = logging.getLogger("bench.engine.selective")
STRATEGIES = ("exact", "dppick", "selectivity_first", "greedy")
PRIOR_MODEL = HERE / "results" / "orders_full.json"
KEYS = MEASURES + ("lookups", "matches")


def schedule(domain: int, window: float, mu_hot: float, mu_mid: float, rare_share: float, mu_rare: float) -> dict:
    """The generator's schedule (schedule.py format): rate = tuples per key in a window x keys / window."""
    rare_domain = int(round(domain / rare_share))
    return {
        "name": "selective",
        "description": (f"s0, s1 hot (mu {mu_hot:g} over {domain} keys), s2 mid (mu {mu_mid:g}), "
                        f"s3 rare ({rare_share:.0%} of its keys shared, gamma into it ~{mu_rare:g})"),
        "defaults": {"zipf": 0.0, "offset": 0, "shift": 0, "null_rate": 0.0},
        "streams": {
            "s0": {"rate": mu_hot * domain / window, "domain": domain},
            "s1": {"rate": mu_hot * domain / window, "domain": domain},
            "s2": {"rate": mu_mid * domain / window, "domain": domain},
            "s3": {"rate": mu_rare * rare_domain / window, "domain": rare_domain},
        },
        "events": [],
    }


def fingerprint(results_path: str) -> dict:
    """Order-independent fingerprint of the result rows (:func:`mjoin.engine.results.result_fingerprint`)."""
    from mjoin.engine.results import result_fingerprint

    return result_fingerprint(results_path)


def plan_key(plan) -> str:
    return json.dumps({g: {s: [list(p) for p in o] for s, o in sorted(v.items())} for g, v in plan.orders.items()},
                      sort_keys=True)


def first_step_fanout(records: list, stats) -> dict:
    """Per directed pair ``l->r``, gamma (hits/lookups) and mu (matches/hits) of the engine's FIRST probe
    step of ``l``'s chains, next to the statistics' gamma and mu (Eq. 9-10) of the same edge."""
    acc: dict = {}
    for rec in records:
        for c in rec["chains"]:
            if c["steps"]:
                st = c["steps"][0]
                a = acc.setdefault((c["stream"], st["right"]), [0, 0, 0])
                a[0] += st["lookups"]
                a[1] += st["hits"]
                a[2] += st["matches"]
    g = stats.group(0)
    out = {}
    for (left, right), (q, m, n) in sorted(acc.items()):
        e = g.edges.get((left, right))
        out[f"{left}->{right}"] = {"gamma": m / q if q else None, "mu": n / m if m else None, "lookups": q,
                                   "statistics_gamma": e.gamma if e else None, "statistics_mu": e.mu if e else None}
    return out


def clusters(rows: list) -> dict:
    """Plans predicted near the best (<= 2x) vs far from it (>= 10x): median wall and CPU of each."""
    best = min(r["predicted_seconds"] for r in rows)
    out = {}
    for name, sel in (("near_best", lambda r: r["predicted_seconds"] <= 2 * best),
                      ("far_from_best", lambda r: r["predicted_seconds"] >= 10 * best)):
        rs = [r for r in rows if sel(r)]
        if rs:
            out[name] = {"plans": [r["order"] for r in rs],
                         **{f"median_{k}": statistics.median(r[k] for r in rs) for k in KEYS + ("predicted_seconds",)},
                         "min_batch_seconds": min(r["batch_seconds"] for r in rs),
                         "max_batch_seconds": max(r["batch_seconds"] for r in rs)}
    return out


def rank_of(rows: list, name: str, key: str) -> int:
    """1 = lowest ``key`` among ``rows``."""
    mine = next(r[key] for r in rows if r["order"] == name)
    return 1 + sum(1 for r in rows if r["order"] != name and r[key] < mine)


def run(args) -> dict:
    from mjoin.optimizer.calibrate import CalibrationError, calibrate, engine_observations
    from mjoin.optimizer.cost import CostModel
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.metrics import read_metrics
    from mjoin.engine.interval import run_interval_plans
    from mjoin.engine.metrics import machine
    from mjoin.lake.layout import Lake
    from mjoin.optimizer.strategies import compare
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.model.query import load_query
    from mjoin.runtime.resources import Resources
    from mjoin.runtime.spark import get_spark
    from mjoin.stats.job import compute_statistics
    from mjoin.workloads.synthetic import generate_synthetic

    work = Path(args.work or tempfile.mkdtemp(prefix="mjoin-bench-selective-"))
    sched = schedule(args.domain, args.window, args.mu_hot, args.mu_mid, args.rare_share, args.mu_rare)
    t = time.perf_counter()
    manifest = generate_synthetic(work / "w", streams=4, duration=args.duration, schedule=sched,
                                  window=f"{args.window}s", cycle=f"{args.cycle}s", seed=args.seed,
                                  name="selective_4", overwrite=True)
    gen_seconds = time.perf_counter() - t
    rows_per_stream = {s: manifest.source(s)["rows"] for s in manifest.sources}
    query = load_query(str(work / "w" / "query.yaml"))
    lake = Lake(str(work / "w"))
    t0 = int(manifest.start_epoch)
    # one cycle of full windows for the optimizer's statistics, then the measured interval
    start = t0 + args.window + args.cycle
    end = start + ((int(manifest.end_epoch) - start) // args.cycle) * args.cycle
    spark = get_spark("mjoin-bench-selective", Resources(spark_master=args.master, shuffle_partitions=args.partitions))
    try:
        load_before = os.getloadavg()
        t = time.perf_counter()
        stats_run = compute_statistics(spark, query, lake, start - args.cycle, end, args.cycle)
        cycles = sorted(stats_run.cycle_meta)
        opt_stats = stats_run.snapshot(cycles[0])
        stats_by_cycle = [stats_run.snapshot(c) for c in cycles[1:]]
        stats_seconds = time.perf_counter() - t

        # the 24 fixed orders and the optimizers' plans (identical order sets run once)
        perms = list(permutations(query.stream_names))
        plans = {"".join(p): make_plan(query, orders_from_permutation(query, p), "fixedOrder") for p in perms}
        fixed_by_key = {plan_key(p): n for n, p in plans.items()}
        models = {"calibrated_prior": CostModel.from_json(json.loads(PRIOR_MODEL.read_text())["calibration"]
                                                          ["cpu_seconds"]["model"]) if PRIOR_MODEL.exists() else None,
                  "default": CostModel()}
        chosen, run_key = {}, {}
        for mname, model in models.items():
            if model is None:
                continue
            got, skipped = compare(query, opt_stats, list(STRATEGIES), cost_model=model)
            for sname, plan in got.items():
                k = plan_key(plan)
                label = sname if mname == "calibrated_prior" else f"{sname}[{mname}]"
                run_key.setdefault(k, label)
                chosen[label] = {"strategy": sname, "cost_model": mname, "runs_as": run_key[k],
                                 "same_orders_as_fixed": fixed_by_key.get(k), "estimated_cost": plan.estimated_cost,
                                 "orders": {s: [r for _, r in o] for s, o in plan.orders[0].items()}}
                if run_key[k] == label:
                    plans[label] = plan
            for sname, why in skipped.items():
                chosen[f"{sname}[{mname}]"] = {"skipped": why}
        opt_names = [n for n in plans if n not in {"".join(p) for p in perms}]
        log.info("plans: 24 fixed + %s", opt_names)

        config = EngineConfig(buckets=args.buckets)
        first = next(iter(plans))
        t = time.perf_counter()
        run_interval_plans(spark, query, {first: plans[first]}, lake, start, end, args.cycle, str(work / "warmup"),
                           config=config, pipelined=True)
        warmup_seconds = time.perf_counter() - t
        rounds, calib_records, fingerprints = {}, [], {}
        rng = random.Random(args.seed)
        loads = []
        for rnd in range(args.rounds):
            names = list(plans)
            rng.shuffle(names)
            loads.append(os.getloadavg()[0])
            log.info("round %d: %d plans, load average %.2f", rnd + 1, len(names), loads[-1])
            summaries = run_interval_plans(spark, query, {n: plans[n] for n in names}, lake, start, end, args.cycle,
                                           str(work / "out"), config=config, pipelined=True)
            for n, s in summaries.items():
                recs = read_metrics(s.metrics_path)
                rounds.setdefault(n, []).append(summarise(n, s, recs))
                calib_records += recs
                if rnd == args.rounds - 1:
                    fingerprints[n] = fingerprint(s.results_path)
        loads.append(os.getloadavg()[0])
    finally:
        spark.stop()
        if not args.keep and not args.work:
            shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()

    rows = [median_over_rounds(rounds[n]) for n in plans]
    for r in rows:
        r["kind"] = "fixed" if r["order"] in fixed_by_key.values() else "optimizer"
        r["same_orders_as_fixed"] = None if r["kind"] == "fixed" else fixed_by_key.get(plan_key(plans[r["order"]]))
        r["result_fingerprint"] = fingerprints[r["order"]]
    calibration, model = {}, None
    try:
        model, rep = calibrate(engine_observations(calib_records), "auto", time_field="cpu_seconds",
                               source="bench selective")
        calibration = {"model": model.to_json(), "r2": rep["r2"], "coefficients": rep["coefficients"],
                       "overhead_seconds_per_call": rep["overhead_seconds_per_call"], "notes": rep["notes"]}
    except CalibrationError as exc:
        calibration = {"error": str(exc)}
    predicted = predicted_costs(query, stats_by_cycle, plans, model or CostModel(), args.cycle)
    predicted_default = predicted_costs(query, stats_by_cycle, plans, CostModel(), args.cycle)
    for r in rows:
        r["predicted_seconds"] = predicted[r["order"]]
        r["predicted_default_model"] = predicted_default[r["order"]]
        r["probe_share_of_task_cpu"] = r["probe_cpu_seconds"] / r["task_cpu_seconds"] if r["task_cpu_seconds"] else None
    rows.sort(key=lambda r: r["predicted_seconds"])
    fixed = [r for r in rows if r["kind"] == "fixed"]
    # what exact would choose with this run's own calibration (no run of its own: mapped to a measured plan)
    in_run = None
    if model is not None:
        got, _ = compare(query, opt_stats, ["exact"], cost_model=model)
        k = plan_key(got["exact"])
        in_run = {"runs_as": run_key.get(k) or fixed_by_key.get(k),
                  "orders": {s: [x for _, x in o] for s, o in got["exact"].orders[0].items()}}
    exact_name = chosen.get("exact", {}).get("runs_as")
    ranks = None
    if exact_name:
        ranks = {}
        for key in KEYS + ("predicted_seconds",):
            ranks[key] = {"among_all_plans": rank_of(rows, exact_name, key), "of": len(rows),
                          "among_fixed_plus_exact": rank_of(fixed + [r for r in rows if r["order"] == exact_name],
                                                            exact_name, key)}
    fps = {json.dumps(r["result_fingerprint"], sort_keys=True) for r in rows}
    g = opt_stats.group(0)
    return {
        "benchmark": "engine-selective", "mode": "quick" if args.quick else "full",
        "date": datetime.now(timezone.utc).isoformat(), "machine": machine(),
        "load_average_before": list(load_before), "load_average_after": list(load_after),
        "load_average_1min_per_round": loads,
        "versions": versions(), "git_commit": git_commit(), "command": " ".join([sys.executable] + sys.argv),
        "parameters": {"domain": args.domain, "window_s": args.window, "mu_hot": args.mu_hot, "mu_mid": args.mu_mid,
                       "rare_share": args.rare_share, "mu_rare": args.mu_rare, "duration": args.duration,
                       "cycle_s": args.cycle, "interval": [start, end], "batches": (end - start) // args.cycle,
                       "buckets": args.buckets, "master": args.master, "shuffle_partitions": args.partitions,
                       "rounds": args.rounds, "seed": args.seed, "execution": "pipelined",
                       "optimizer_statistics_cycle": [start - args.cycle, start]},
        "workload": {"generator": "mjoin.workloads.synthetic.generate_synthetic", "schedule": sched,
                     "rows_per_stream": rows_per_stream, "generate_seconds": gen_seconds,
                     "statistics_for_optimizer": {
                         "streams": {s: v.as_dict() for s, v in g.streams.items()},
                         "edges": {f"{a}->{b}": {"gamma": e.gamma, "mu": e.mu} for (a, b), e in g.edges.items()}}},
        "statistics_seconds": stats_seconds, "warmup_seconds": warmup_seconds,
        "results_agree": len(fps) == 1, "result_fingerprints": sorted(fps),
        "optimizer_plans": chosen, "exact_with_this_runs_calibration": in_run,
        "exact_rank": ranks,
        "plans": rows,
        "clusters": clusters(rows),
        "engine_first_step_fanout": first_step_fanout(calib_records, opt_stats),
        "spread_fixed": spread(fixed, KEYS + ("predicted_seconds",)),
        "spread_all": spread(rows, KEYS + ("predicted_seconds",)),
        "rank_correlation_predicted_vs_measured": {
            "fixed_24": rank_correlations(fixed, predicted, KEYS),
            "all_plans": rank_correlations(rows, predicted, KEYS),
            "fixed_24_default_model": rank_correlations(fixed, predicted_default, KEYS)},
        "calibration": calibration,
        "note": "timings on a shared machine are noisy (see load averages); CPU times much less so",
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["plans"]
    rc = result["rank_correlation_predicted_vs_measured"]["fixed_24"]
    exact = (result["optimizer_plans"].get("exact") or {}).get("runs_as")
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.4))
    for ax, key, label in ((axes[0], "batch_seconds", "measured wall time of the interval (s)"),
                           (axes[1], "task_cpu_seconds", "measured CPU time of the tasks (s)")):
        fx = [r for r in rows if r["kind"] == "fixed"]
        ax.scatter([r["predicted_seconds"] for r in fx], [r[key] for r in fx], color="#4c72b0",
                   label="24 fixed orders")
        for r in fx:
            ax.annotate(r["order"], (r["predicted_seconds"], r[key]), fontsize=6, alpha=0.7)
        for r in rows:
            if r["kind"] == "optimizer":
                is_exact = r["order"] == exact
                same = [n for n, c in result["optimizer_plans"].items() if c.get("runs_as") == r["order"]]
                ax.scatter([r["predicted_seconds"]], [r[key]], marker="*" if is_exact else "D",
                           s=220 if is_exact else 60, color="#c44e52" if is_exact else "#55a868", zorder=3,
                           label=f"{same[0]}" + (f" (+{len(same) - 1} same)" if len(same) > 1 else "")
                           + (f" = fixed {r['same_orders_as_fixed']}" if r.get("same_orders_as_fixed") else ""))
        ax.set_xscale("log")
        ax.set_xlabel("predicted probing seconds (calibrated cost model x statistics per cycle)")
        ax.set_ylabel(label)
        ax.set_title(f"{key}: Spearman rho (24 fixed) = {rc[key]['rho']:.2f}")
        ax.legend(fontsize=7, loc="upper left")
    by = rows
    x = list(range(len(by)))
    axes[2].bar(x, [r["batch_seconds"] for r in by], color=["#c44e52" if r["order"] == exact else
                                                             "#55a868" if r["kind"] == "optimizer" else "#4c72b0"
                                                             for r in by], label="wall time (median)")
    axes[2].plot(x, [r["task_cpu_seconds"] for r in by], "k.", label="tasks' CPU time")
    axes[2].plot(x, [r["probe_cpu_seconds"] for r in by], "x", color="#dd8452", label="probing CPU time")
    axes[2].set_xticks(x, [r["order"] for r in by], rotation=90, fontsize=7)
    axes[2].set_ylabel("seconds (median over rounds)")
    axes[2].set_title("by predicted cost (red: exact, green: other optimizer plans)")
    axes[2].legend(fontsize=7)
    p = result["parameters"]
    fig.suptitle(f"selective synthetic workload (mu_hot {p['mu_hot']:g}, rare gamma ~{p['mu_rare']:g}, "
                 f"{p['batches']} batches of {p['cycle_s']}s, {p['rounds']} rounds), load average "
                 f"{result['load_average_before'][0]:.1f}-{result['load_average_after'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: domain 240, 5 minutes, 1 round")
    p.add_argument("--domain", type=int, default=None, help="keys shared by s0, s1, s2 (default 2400)")
    p.add_argument("--window", type=int, default=60, help="window of every stream, seconds")
    p.add_argument("--mu-hot", type=float, default=50.0, help="tuples per key in a hot stream's window")
    p.add_argument("--mu-mid", type=float, default=0.3, help="tuples per key in s2's window")
    p.add_argument("--rare-share", type=float, default=0.01, help="share of s3's keys in the others' domain")
    p.add_argument("--mu-rare", type=float, default=0.01, help="tuples per key in s3's window (~ gamma into s3)")
    p.add_argument("--duration", default=None, help="generated event time (default 11m: 9 measured batches)")
    p.add_argument("--cycle", type=int, default=60, help="batch length, seconds of event time")
    p.add_argument("--buckets", type=int, default=4)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--work", help="working folder (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--plot-only", metavar="JSON", help="redraw the plot of a results JSON and exit")
    args = p.parse_args(argv)
    if args.plot_only:
        plot(json.loads(Path(args.plot_only).read_text()), Path(args.plot_only).with_suffix(".png"))
        return 0
    args.domain = args.domain or (240 if args.quick else 2400)
    args.duration = args.duration or ("5m" if args.quick else "11m")
    args.rounds = args.rounds or (1 if args.quick else 3)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    logging.getLogger("mjoin.engine.interval").setLevel(logging.WARNING)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    stem = "selective" + ("_quick" if args.quick else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    plot(result, out / f"{stem}.png")
    rc = result["rank_correlation_predicted_vs_measured"]
    s = result["spread_fixed"]
    print(f"{len(result['plans'])} plans, results agree: {result['results_agree']} {result['result_fingerprints']}")
    for k in KEYS + ("predicted_seconds",):
        line = f"  {k:>18}: best {s[k]['best']:.4g} ({s[k]['best_order']}) worst {s[k]['worst']:.4g} " \
               f"({s[k]['worst_order']}) x{s[k]['ratio'] or 0:.2f}"
        if k in rc["fixed_24"]:
            line += f"; rho 24 fixed {rc['fixed_24'][k]['rho']:.2f}, all plans {rc['all_plans'][k]['rho']:.2f}"
        print(line)
    for name, c in result["optimizer_plans"].items():
        print(f"  {name}: runs as {c.get('runs_as')}, same orders as fixed {c.get('same_orders_as_fixed')}"
              if "runs_as" in c else f"  {name}: skipped ({c['skipped']})")
    if result["exact_rank"]:
        print("  exact's rank: " + ", ".join(f"{k} {v['among_all_plans']}/{v['of']}"
                                             for k, v in result["exact_rank"].items()))
    for name, c in result["clusters"].items():
        print(f"  {name} ({len(c['plans'])} plans): median wall {c['median_batch_seconds']:.2f}s "
              f"[{c['min_batch_seconds']:.2f}-{c['max_batch_seconds']:.2f}], task CPU {c['median_task_cpu_seconds']:.2f}s")
    for pair, f in result["engine_first_step_fanout"].items():
        print(f"  first step {pair}: engine gamma {f['gamma']:.3f} mu {f['mu'] or 0:.1f}; "
              f"statistics gamma {f['statistics_gamma']:.3f} mu {f['statistics_mu']:.1f}")
    print(f"  wrote {out / stem}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
