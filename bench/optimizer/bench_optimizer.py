"""Optimizer time for n = 4..16 streams: exact (subset DP), dppick (the paper's DFS),
greedy and selectivity_first, on random connected join graphs.

    python bench/optimizer/bench_optimizer.py            # full: n = 4..16, dppick until 60 s
    python bench/optimizer/bench_optimizer.py --quick    # smoke test, a few seconds

Graphs (``mjoin.optimizer.synthetic``): ``complete`` = one attribute class over all
streams (K_n, the seed query's shape grown to n streams; the worst case for dppick)
and ``random`` = a random spanning tree plus extra edges with probability 0.4 and three
predicate labels (mixed attribute classes, cycles, residual edges). Times are for the
search on a compiled key group (``exact_dp``, ``dp_pick``, ...) and, for exact, also
for the whole ``optimize()`` call (compile + search + cost evaluation + plan
validation). Writes JSON (machine, versions, date, parameters, every measurement) and
a log-scale PNG next to it. Goal (the issue): exact under 50 ms at n = 12 and under 1 s
at n = 16. Timings on a shared machine are noisy; the minimum over repeats is reported
alongside the median.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "include"))

from mjoin.optimizer.cost import CostModel, JoinProblem  # noqa: E402
from mjoin.optimizer.strategies import optimize  # noqa: E402
from mjoin.optimizer import baselines  # noqa: E402
from mjoin.optimizer.dppick import dp_pick  # noqa: E402
from mjoin.optimizer.exact import exact_dp  # noqa: E402
from mjoin.optimizer.synthetic import query_from_edges, random_edges, random_statistics  # noqa: E402

GOALS = {12: 0.050, 16: 1.0}


def timed(fn, repeats: int) -> tuple[list[float], object]:
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def run(ns, shapes, repeats: int, graphs: int, dppick_limit: float, seed: int) -> list[dict]:
    model = CostModel()
    rows = []
    for shape in shapes:
        dppick_alive, last_dp = True, None
        for n in ns:
            for gi in range(graphs):
                rng = random.Random(f"{seed}-{shape}-{n}-{gi}")
                labels = 1 if shape == "complete" else 3
                q = query_from_edges(n, random_edges(n, shape, rng, labels, p=0.4), name=f"{shape}{n}")
                stats = random_statistics(q, rng)
                problem = JoinProblem.from_statistics(q, stats)
                base = {"shape": shape, "n": n, "graph": gi, "classes": problem.K, "edges": len(q.edges)}

                t, best = timed(lambda: exact_dp(problem, model), repeats)
                rows.append({**base, "strategy": "exact", "what": "search", "seconds": t})
                t, _ = timed(lambda: optimize(q, stats, "exact", cost_model=model), repeats)
                rows.append({**base, "strategy": "exact", "what": "optimize()", "seconds": t})
                for name, fn in (("greedy", baselines.greedy), ("selectivity_first", baselines.selectivity_first)):
                    t, _ = timed(lambda: fn(problem, model), repeats)
                    rows.append({**base, "strategy": name, "what": "search", "seconds": t})

                exact_ms = min(rows[-4]["seconds"]) * 1000
                dp_note = ""
                if dppick_alive and gi == 0:
                    # dppick costs about n! sequences in all: project a factor k per added stream k
                    projected = None
                    if last_dp is not None:
                        projected = last_dp[1]
                        for k in range(last_dp[0] + 1, n + 1):
                            projected *= k
                    if projected is not None and projected > dppick_limit:
                        rows.append({**base, "strategy": "dppick", "what": "search", "seconds": None,
                                     "skipped": f"projected {projected:.0f} s > {dppick_limit:.0f} s"})
                        dppick_alive = False
                        dp_note = f"   dppick skipped (projected {projected:.0f} s)"
                    else:
                        t, dp = timed(lambda: dp_pick(problem, model, max_streams=99), 1)
                        agree = max(abs(dp[s][1] - best[s][1]) / max(1.0, abs(best[s][1])) for s in dp)
                        rows.append({**base, "strategy": "dppick", "what": "search", "seconds": t,
                                     "max_rel_diff_vs_exact": agree})
                        last_dp = (n, t[0])
                        dppick_alive = t[0] <= dppick_limit
                        dp_note = f"   dppick {t[0]:.3f} s (rel diff vs exact {agree:.1e})"
                print(f"{shape:>8} n={n:<2} K={problem.K:<2} graph {gi}: exact {exact_ms:8.2f} ms{dp_note}", flush=True)
    for r in rows:
        if r["seconds"]:
            r["min"] = min(r["seconds"])
            r["median"] = statistics.median(r["seconds"])
    return rows


def machine() -> dict:
    import numpy

    info = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "numpy": numpy.__version__}
    try:
        info["load_average"] = os.getloadavg()
    except OSError:
        pass
    try:
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                 if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return info


def summarize(rows) -> dict:
    out = {}
    for goal_n, limit in GOALS.items():
        times = [r["min"] for r in rows if r["strategy"] == "exact" and r["what"] == "search" and r["n"] == goal_n]
        full = [r["min"] for r in rows if r["strategy"] == "exact" and r["what"] == "optimize()" and r["n"] == goal_n]
        if times:
            out[f"exact_n{goal_n}"] = {"goal_seconds": limit, "worst_search_seconds": max(times),
                                       "worst_optimize_seconds": max(full), "met": max(full) < limit}
    dp = [r for r in rows if r["strategy"] == "dppick" and r.get("seconds")]
    if dp:
        out["dppick_largest_n"] = {s: max(r["n"] for r in dp if r["shape"] == s) for s in {r["shape"] for r in dp}}
        out["dppick_max_rel_diff_vs_exact"] = max(r["max_rel_diff_vs_exact"] for r in dp)
    return out


def plot(rows, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"complete": "-", "random": "--"}
    colors = {"exact": "C0", "exact optimize()": "C4", "dppick": "C3", "greedy": "C2", "selectivity_first": "C1"}
    for shape in sorted({r["shape"] for r in rows}):
        for key in colors:
            strategy, _, what = key.partition(" ")
            sel = [r for r in rows if r["shape"] == shape and r["strategy"] == strategy and r.get("min")
                   and r["what"] == (what or "search")]
            if not sel:
                continue
            ns = sorted({r["n"] for r in sel})
            worst = [max(r["min"] for r in sel if r["n"] == n) for n in ns]
            ax.plot(ns, worst, styles.get(shape, "-"), marker="o", ms=3, color=colors[key], label=f"{key} ({shape})")
    for n, limit in GOALS.items():
        ax.plot([n], [limit], marker="*", ms=14, color="k", linestyle="none")
        ax.annotate(f"goal {limit * 1000:g} ms" if limit < 1 else f"goal {limit:g} s", (n, limit),
                    textcoords="offset points", xytext=(-30, 8), fontsize=8)
    ax.axhline(60, color="grey", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("streams n")
    ax.set_ylabel("seconds (worst graph, min over repeats)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke test: few sizes, 1 graph, dppick up to 5 s")
    p.add_argument("--min-n", type=int, default=4)
    p.add_argument("--max-n", type=int, default=16)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--graphs", type=int, default=None, help="random graphs per (shape, n)")
    p.add_argument("--dppick-limit", type=float, default=None, help="seconds; stop dppick beyond (default 60)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON path (default bench/optimizer/results/<mode>.json)")
    args = p.parse_args(argv)
    if args.quick:
        ns = [n for n in (4, 6, 8, 10, 12, 14, 16) if args.min_n <= n <= args.max_n]
        repeats, graphs, limit = args.repeats or 3, args.graphs or 1, args.dppick_limit or 5.0
    else:
        ns = list(range(args.min_n, args.max_n + 1))
        repeats, graphs, limit = args.repeats or 5, args.graphs or 3, args.dppick_limit or 60.0
    mode = "quick" if args.quick else "full"
    out = Path(args.out) if args.out else HERE / "results" / f"{mode}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc)
    rows = run(ns, ["complete", "random"], repeats, graphs, limit, args.seed)
    doc = {"benchmark": "optimizer", "mode": mode, "date": started.isoformat().replace("+00:00", "Z"),
           "wall_seconds": (datetime.now(timezone.utc) - started).total_seconds(), "machine": machine(),
           "parameters": {"n": ns, "shapes": ["complete", "random"], "repeats": repeats, "graphs": graphs,
                          "dppick_limit_seconds": limit, "seed": args.seed, "cost_model": CostModel().to_json()},
           "summary": summarize(rows), "results": rows}
    out.write_text(json.dumps(doc, indent=1))
    plot(rows, out.with_suffix(".png"), f"mjoin optimizer time ({mode}; {doc['machine'].get('cpu_model', '')}, "
         f"load {doc['machine'].get('load_average', ['?'])[0]:.1f})")
    print(json.dumps(doc["summary"], indent=1))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
