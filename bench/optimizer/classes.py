"""The class-change price, side by side: the model against the engine, the exact DP's time, the plans' work, AJOSC.

    .venv/bin/python bench/optimizer/classes.py --work /tmp/oc-eval/work \\
        --evaluation bench/evaluation/results/evaluation_quick_classes*.json     # everything, one run
    .venv/bin/python bench/optimizer/classes.py --parts timing --ns 8 12          # a part of it

Writes ``bench/optimizer/results/classes.json`` (machine, load before and after each part, versions, date, commit,
parameters, every measurement) and ``classes.png``. Parts (``--parts``, all by default):

- ``model`` (offline, from a kept evaluation work folder, ``run_evaluation.py --keep``): per workload (every drift
  preset, both TPC-DS queries, the selective workload), batch and stream, the cost of each of the stream's probe
  orders the engine ran (the covering fixed orders) under the batch's own measured statistics, in the engine's
  units (one per lookup and per fetched tuple), against the engine's measured lookups + matches of that chain:
  Spearman per (batch, stream), median and mean per workload; and the measured work of the order each model picks
  against the best measured order and greedy's pick. Models: ``model`` (``mjoin.optimizer.cost.order_cost``: the
  product of the run's ``u phi`` at a class change, the highest-gamma edge), ``product_lowest_gamma`` (the same
  with the lowest-gamma edge), ``before`` (the model before the class-change price: the last step's ``mu``, the
  lowest-gamma edge, residual filters inside runs).
- ``timing`` (offline): the optimizers' time on the optimizer benchmark's several-class random graphs
  (``bench_optimizer.py``'s ``random`` shape: a random spanning tree plus edges with probability 0.4, three
  predicate labels, random statistics; seed 0, graphs 0.. of each n): ``exact`` (search and the whole
  ``optimize()``), AJOSC's ``DecideOrder`` (``mjoin.optimizer.ajosc``, n <= 16), greedy, and dppick on the first
  two graphs of n = 8 (its gap to exact); wall and CPU time, the minimum over repeats per graph (n = 20: one run),
  percentiles over graphs.
- ``evaluation`` (from ``run_evaluation.py``'s JSON): per drift preset and strategy the composed probe work and
  task CPU (spec order, gated), the goals of the class-change price (dppick's probe work at most greedy's and within
  2% of the oracle's; on ``twoclass-burst`` task CPU at least 20% below fixed and selectivity_first).
- ``ajosc`` (offline, from the work folder's statistics histories): per drift preset, cycle after cycle on the
  measured statistics, the time of one re-optimization by exact from scratch, by AJOSC from scratch
  (``DecideOrder``) and incrementally (``IncrDecideOrder``, its CDG kept from the cycle before), how many CDG edges
  the incremental step refreshed and how often its orders differ from the scratch ones; both plans' cost under both
  models; and reuse of exact's previous plan while no statistic moved by AJOSC's threshold (its regret).
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "include"))

from mjoin.engine.metrics import git_commit, machine  # noqa: E402
from mjoin.model.query import load_query  # noqa: E402
from mjoin.optimizer import baselines  # noqa: E402
from mjoin.optimizer.ajosc import CDG, ajosc_cost, ajosc_statistics, changed  # noqa: E402
from mjoin.optimizer.cost import CostModel, JoinProblem, order_cost  # noqa: E402
from mjoin.optimizer.dppick import dp_pick  # noqa: E402
from mjoin.optimizer.exact import exact_dp  # noqa: E402
from mjoin.optimizer.strategies import optimize  # noqa: E402
from mjoin.optimizer.synthetic import query_from_edges, random_edges, random_statistics  # noqa: E402
from mjoin.stats.history import cycle_starts, read_history, snapshot  # noqa: E402

#: one unit per lookup and per fetched tuple: the model's cost in the engine's lookups + matches
WORK = CostModel(alpha_q=1.0, alpha_m=1.0, c=1.0, state="hash", m_slots=None)
GOALS = {12: 0.050, 16: 1.0}
RESULTS = HERE / "results"


# ---- the models compared with the engine -----------------------------------------------------------------

def _terms(problem: JoinProblem, mask: int, r: int, c: int, highest: bool) -> tuple[float, float, float]:
    """``(g, u, phi)`` with the representative edge the highest (``mjoin.optimizer.cost``) or lowest gamma."""
    if highest:
        return problem.step_terms(mask, r, c)
    best, phi = None, 1.0
    for cc in range(problem.K):
        ms = [m for m in problem.class_members[cc][r] if mask >> m & 1]
        if not ms:
            continue
        if cc == c:
            best = min((problem.gamma[m, r], problem.mu[m, r]) for m in ms)
        else:
            phi *= min(problem.gamma[m, r] for m in ms)
    return float(best[0]), float(best[1]), float(phi)


def cost_variant(problem: JoinProblem, model: CostModel, start: int, pairs, *, product: bool, highest: bool) -> float:
    """The cost of one order under a variant: ``product`` (Eq. 65: the run's ``u phi`` at a class change, no
    filter inside a run) or the model before it (``rho = u`` of the last step, ``phi`` on every step's tail)."""
    if product and highest:
        return order_cost(problem, model, start, pairs)
    mask, steps = 1 << start, []
    for l, r in pairs:
        c = int(problem.cls[l, r])
        g, u, phi = _terms(problem, mask, r, c, highest)
        steps.append((float(model.query_cost(problem.kappa[r])), g, u, phi, c))
        mask |= 1 << r
    a = b = 0.0
    nxt = None
    for q, g, u, phi, c in reversed(steps):
        if product:
            if nxt is None:
                a, b = q + g * model.alpha_m * u, 0.0
            elif nxt == c:
                a, b = q + g * (model.alpha_m * u + a), g * u * phi * b
            else:
                a, b = q + g * model.alpha_m * u, g * u * phi * (a + b)
        else:
            rho = 1.0 if nxt is None or nxt == c else u
            a = q + g * (model.alpha_m * u + phi * rho * a)
        nxt = c
    return a + b


MODELS = {"model": dict(product=True, highest=True), "product_lowest_gamma": dict(product=True, highest=False),
          "before": dict(product=False, highest=False)}


def spearman(a, b) -> float | None:
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return None
    ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(float)
    rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def _pairs_of(problem: JoinProblem, s: str, order) -> list | None:
    """The index pairs of ``s``'s order (earliest joined neighbour as ``l``), None if not a connected expansion."""
    joined, pairs = [s], []
    for r in order:
        ls = [m for m in joined if problem.cls[problem.index[m], problem.index[r]] >= 0]
        if not ls:
            return None
        pairs.append((problem.index[ls[0]], problem.index[r]))
        joined.append(r)
    return pairs


def _workload_query(work: Path, label: str, doc: dict):
    if label.startswith("drift-"):
        return load_query(str(next((work).glob(f"syn-{label[len('drift-'):]}-*/query.yaml"))))
    if label == "selective":
        return load_query(str(Path(doc["lake"]) / "query.yaml"))
    return load_query(doc["query"])


def model_part(work: Path, evaluation: dict, calibrated: CostModel) -> dict:
    """Spearman of each model's cost against the engine's work per (batch, stream), per workload."""
    docs = {**evaluation.get("paper", {}), **{f"drift-{p}": d for p, d in evaluation.get("drift", {})
                                               .get("presets", {}).items()}}
    out = {}
    for label, doc in docs.items():
        folder = work / label
        if not (folder / "history").exists():
            continue
        query = _workload_query(work, label, doc)
        hist = read_history(str(folder / "history"), query.name)
        tau, first = int(doc["cycle_s"]), int(doc["interval"][0])
        meas: dict = {}
        for f in glob.glob(str(folder / "engine" / "orders" / "*" / "metrics" / "**" / "*.jsonl"), recursive=True):
            for line in open(f):
                rec = json.loads(line)
                for ch in rec.get("chains", []):
                    key = (int(rec["batch_id"]), ch["stream"], tuple(st["right"] for st in ch["steps"]))
                    w = sum(int(st["lookups"]) + int(st["matches"]) for st in ch["steps"])
                    m = meas.setdefault(key, {"work": 0, "rows_in": 0})
                    m["work"] += w
                    m["rows_in"] += int(ch.get("rows_in", 0))
        rows = []
        for b in range(1, int(doc["batches"]) + 1):
            try:
                st = snapshot(hist, first + (b - 1) * tau)
            except Exception:  # a cycle without statistics (nothing landed): no model to compare
                continue
            P = JoinProblem.from_statistics(query, st)
            for s in query.stream_names:
                cands = []
                for o in itertools.permutations([x for x in query.stream_names if x != s]):
                    m = meas.get((b, s, o))
                    pairs = _pairs_of(P, s, o)
                    if pairs is None or m is None or m["rows_in"] == 0:
                        continue
                    rec = {"order": o, "measured": m["work"]}
                    for name, kw in MODELS.items():
                        rec[name] = cost_variant(P, WORK, P.index[s], pairs, **kw)
                        rec[name + "_calibrated"] = cost_variant(P, calibrated, P.index[s], pairs, **kw)
                    cands.append(rec)
                if len(cands) < 2:
                    continue
                g_order = tuple(P.names[r] for _, r in baselines.greedy(P, calibrated)[P.index[s]])
                row = {"batch": b, "stream": s, "best": min(c["measured"] for c in cands),
                       "greedy": next((c["measured"] for c in cands if c["order"] == g_order), None)}
                for name in MODELS:
                    row[name] = spearman([c[name] for c in cands], [c["measured"] for c in cands])
                    row[name + "_pick"] = min(cands, key=lambda c: c[name + "_calibrated"])["measured"]
                rows.append(row)
        summary = {"chains": len(rows), "orders_per_chain": len(list(itertools.permutations(query.stream_names[1:]))),
                   "best_measured_work": int(sum(r["best"] for r in rows)),
                   "greedy_pick_measured_work": int(sum(r["greedy"] or 0 for r in rows))}
        for name in MODELS:
            sp = [r[name] for r in rows if r[name] is not None]
            summary[name] = {"spearman_median": float(np.median(sp)) if sp else None,
                             "spearman_mean": float(np.mean(sp)) if sp else None, "chains_ranked": len(sp),
                             "pick_measured_work": int(sum(r[name + "_pick"] for r in rows))}
        out[label] = summary
        print(f"model {label:24s} " + "  ".join(f"{n} {summary[n]['spearman_mean'] or float('nan'):.3f}"
                                              for n in MODELS), flush=True)
    return out


# ---- optimizer time -----------------------------------------------------------------------------------

def _times(fn, repeats: int) -> tuple[float, float, object]:
    wall, cpu, out = [], [], None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu), out


def _pct(values) -> dict:
    v = np.asarray(values, float)
    return {"p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90)), "max": float(v.max()),
            "graphs": int(v.size)}


def timing_part(ns, graphs: dict, repeats: int, dppick_graphs: int = 2) -> dict:
    model = CostModel()
    rows = []
    for n in ns:
        for gi in range(graphs.get(n, 3)):
            rng = random.Random(f"0-random-{n}-{gi}")  # bench_optimizer.run's graphs
            q = query_from_edges(n, random_edges(n, "random", rng, 3, p=0.4), name=f"random{n}")
            stats = random_statistics(q, rng)
            problem = JoinProblem.from_statistics(q, stats)
            rep = repeats if n <= 16 else 1
            row = {"n": n, "graph": gi, "classes": int(problem.K), "edges": len(q.edges),
                   "load_average": os.getloadavg()[0]}
            w, c, best = _times(lambda: exact_dp(problem, model), rep)
            row["exact_search"] = {"wall": w, "cpu": c}
            w, c, _ = _times(lambda: optimize(q, stats, "exact", cost_model=model), rep)
            row["exact_optimize"] = {"wall": w, "cpu": c}
            w, c, _ = _times(lambda: baselines.greedy(problem, model), rep)
            row["greedy"] = {"wall": w, "cpu": c}
            if n <= 16:
                deg, inter = ajosc_statistics(problem)
                cdg = CDG(problem)
                w, c, _ = _times(lambda: cdg.decide(deg, inter), rep)
                row["ajosc_decide"] = {"wall": w, "cpu": c}
            if n <= 8 and gi < dppick_graphs:  # O(n!): a minute or two per graph here
                w, c, dp = _times(lambda: dp_pick(problem, model), 1)
                row["dppick"] = {"wall": w, "cpu": c, "max_rel_gap_vs_exact": max(
                    abs(dp[s][1] - best[s][1]) / max(1.0, abs(best[s][1])) for s in dp)}
            rows.append(row)
            print(f"timing n={n} graph {gi} K={problem.K}: exact {row['exact_search']['wall']:.4f} s "
                  f"(cpu {row['exact_search']['cpu']:.4f}), optimize() {row['exact_optimize']['wall']:.4f} s, "
                  f"load {row['load_average']:.1f}", flush=True)
    summary = {}
    for n in ns:
        sel = [r for r in rows if r["n"] == n]
        summary[str(n)] = {k: {t: _pct([r[k][t] for r in sel if k in r]) for t in ("wall", "cpu")}
                           for k in ("exact_search", "exact_optimize", "greedy", "ajosc_decide", "dppick")
                           if any(k in r for r in sel)}
        if n in GOALS:
            summary[str(n)]["goal_seconds"] = GOALS[n]
            summary[str(n)]["goal_met_wall"] = summary[str(n)]["exact_optimize"]["wall"]["max"] < GOALS[n]
            summary[str(n)]["goal_met_cpu"] = summary[str(n)]["exact_optimize"]["cpu"]["max"] < GOALS[n]
        if any("dppick" in r for r in sel):
            summary[str(n)]["dppick_max_rel_gap_vs_exact"] = max(r["dppick"]["max_rel_gap_vs_exact"] for r in sel
                                                                 if "dppick" in r)
    return {"rows": rows, "summary": summary}


# ---- the evaluation's strategies --------------------------------------------------------------------------

def evaluation_part(evaluation: dict) -> dict:
    out = {}
    for label, doc in evaluation.get("paper", {}).items():  # the TPC-DS queries: means over the initial orders
        tab = doc.get("strategies", {})
        work = {s: v["gated"]["work_mean"] for s, v in tab.items() if "gated" in v}
        cpu = {s: v["gated"]["cpu_mean"] for s, v in tab.items() if "gated" in v}
        if not work:
            continue
        out[label] = {"probe_work": work, "task_cpu": cpu, "over": "mean over the initial orders, gated",
                      "dppick_work_vs_greedy": work["dppick"] / work["greedy"] - 1,
                      "dppick_work_vs_oracle": work["dppick"] / work["oracle"] - 1,
                      "results_agree": doc["engine"].get("results_agree"),
                      "switching_run_equal": {k: doc.get("switching_run", {}).get(k)
                                              for k in ("work_equal", "results_equal")}}
        print(f"evaluation {label:15s} dppick work vs greedy {out[label]['dppick_work_vs_greedy']:+.3f}, vs oracle "
              f"{out[label]['dppick_work_vs_oracle']:+.3f}", flush=True)
    for preset, doc in evaluation.get("drift", {}).get("presets", {}).items():
        tot = doc["drift"]["totals_spec_order"]
        work = {s: tot[s]["work"] for s in tot}
        cpu = {s: tot[s]["cpu"] for s in tot}
        row = {"probe_work": work, "task_cpu": cpu, "over": "spec order, gated",
               "fixed_mean_over_orders": doc["drift"]["fixed_mean_over_orders"],
               "dppick_work_vs_greedy": work["dppick"] / work["greedy"] - 1 if work["greedy"] else None,
               "dppick_work_vs_oracle": work["dppick"] / work["oracle"] - 1 if work["oracle"] else None,
               "dppick_cpu_below_fixed": 1 - cpu["dppick"] / cpu["fixed"] if cpu["fixed"] else None,
               "dppick_cpu_below_selectivity_first": 1 - cpu["dppick"] / cpu["selectivity_first"]
               if cpu["selectivity_first"] else None,
               "results_agree": doc["engine"].get("results_agree"),
               "switching_run_equal": {k: doc.get("switching_run", {}).get(k) for k in ("work_equal", "results_equal")}}
        row["goal_work"] = (row["dppick_work_vs_greedy"] is not None and row["dppick_work_vs_greedy"] <= 0
                            and row["dppick_work_vs_oracle"] <= 0.02)
        if preset == "twoclass-burst":
            row["goal_cpu"] = row["dppick_cpu_below_fixed"] >= 0.20 and row["dppick_cpu_below_selectivity_first"] >= 0.20
        out[preset] = row
        print(f"evaluation {preset:15s} dppick work vs greedy {row['dppick_work_vs_greedy']:+.3f}, vs oracle "
              f"{row['dppick_work_vs_oracle']:+.3f}; cpu below fixed {row['dppick_cpu_below_fixed']:+.3f}", flush=True)
    return out


# ---- AJOSC on the presets' statistics ----------------------------------------------------------------------

def _plan_costs(problem, model, deg, inter, orders) -> tuple[float, float]:
    """``(sum lambda C under mjoin's model, sum lambda value under AJOSC's)`` of ``{start: pairs}``."""
    ours = sum(problem.lam[s] * order_cost(problem, model, s, p) for s, p in orders.items())
    theirs = sum(problem.lam[s] * ajosc_cost(problem, deg, inter, s, [r for _, r in p]) for s, p in orders.items())
    return float(ours), float(theirs)


def _moved(prev: JoinProblem, new: JoinProblem) -> bool:
    """Did any statistic move by AJOSC's threshold (``changed``)?"""
    edge = new.cls >= 0
    pairs = [(prev.gamma[edge], new.gamma[edge]), (prev.mu[edge], new.mu[edge]), (prev.lam, new.lam),
             (prev.kappa, new.kappa)]
    return any(changed(float(b), float(a)) for xs, ys in pairs for a, b in zip(xs, ys))


def ajosc_part(work: Path, evaluation: dict, calibrated: CostModel) -> dict:
    out = {}
    docs = {**evaluation.get("paper", {}), **{f"drift-{p}": d for p, d in evaluation.get("drift", {})
                                               .get("presets", {}).items()}}
    for label, doc in docs.items():
        preset = label
        folder = work / label / "history"
        if not folder.exists():
            continue
        query = _workload_query(work, label, doc)
        hist = read_history(str(folder), query.name)
        cdg, prev_problem, prev_plan = None, None, None
        rec = {k: [] for k in ("exact", "ajosc_scratch", "ajosc_incremental")}
        refreshed, differ, cycles, reused, regret = [], 0, 0, 0, []
        costs = {k: [] for k in ("exact_ours", "exact_ajosc", "ajosc_ours", "ajosc_ajosc")}
        for c in cycle_starts(hist):
            P = JoinProblem.from_statistics(query, snapshot(hist, c))
            w, t, ex = _times(lambda: exact_dp(P, calibrated), 3)
            rec["exact"].append(t)
            ex = {s: p for s, (p, _) in ex.items()}
            deg, inter = ajosc_statistics(P)
            scratch = CDG(P)
            w, t, _ = _times(lambda: scratch.decide(deg, inter), 3)
            rec["ajosc_scratch"].append(t)
            aj = {s: scratch.pairs(s) for s in range(P.n)}
            if cdg is None:
                cdg = CDG(P)
                cdg.decide(deg, inter)
            else:
                c0 = time.process_time()
                refreshed.append(cdg.incremental(deg, inter))
                rec["ajosc_incremental"].append(time.process_time() - c0)
                differ += any(cdg.order(s) != scratch.order(s) for s in range(P.n))
            cycles += 1
            for k, v in zip(("exact_ours", "exact_ajosc"), _plan_costs(P, calibrated, deg, inter, ex)):
                costs[k].append(v)
            for k, v in zip(("ajosc_ours", "ajosc_ajosc"), _plan_costs(P, calibrated, deg, inter, aj)):
                costs[k].append(v)
            # reuse: keep exact's previous plan while no statistic moved by AJOSC's threshold
            if prev_problem is not None and not _moved(prev_problem, P):
                reused += 1
                fresh = costs["exact_ours"][-1]
                kept = _plan_costs(P, calibrated, deg, inter, prev_plan)[0]
                regret.append(kept / fresh - 1 if fresh else 0.0)
            else:
                prev_problem, prev_plan = P, ex
        tot = {k: float(sum(v)) for k, v in costs.items()}
        out[preset] = {
            "cycles": cycles,
            "seconds_cpu": {k: _pct(v) | {"mean": float(np.mean(v))} for k, v in rec.items() if v},
            "incremental_edges_refreshed_mean": float(np.mean(refreshed)) if refreshed else None,
            "incremental_cycles_with_other_orders_than_scratch": differ,
            "cost_sums": tot,
            "ajosc_plans_vs_exact_under_our_model": tot["ajosc_ours"] / tot["exact_ours"] - 1 if tot["exact_ours"] else None,
            "exact_plans_vs_ajosc_under_ajosc_model": tot["exact_ajosc"] / tot["ajosc_ajosc"] - 1
            if tot["ajosc_ajosc"] else None,
            "reuse_of_exact": {"cycles_reused": reused, "share": reused / max(cycles - 1, 1),
                               "regret_mean": float(np.mean(regret)) if regret else 0.0,
                               "regret_max": float(np.max(regret)) if regret else 0.0},
        }
        s = out[preset]["seconds_cpu"]
        print(f"ajosc {preset:15s} exact {s['exact']['p50'] * 1e3:.2f} ms, ajosc scratch "
              f"{s['ajosc_scratch']['p50'] * 1e3:.2f} ms, incremental "
              f"{s.get('ajosc_incremental', {}).get('p50', float('nan')) * 1e3:.2f} ms", flush=True)
    return out


# ---- the plot ----------------------------------------------------------------------------------------------

def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0, 0]
    t = doc.get("timing", {}).get("summary", {})
    if t:
        ns = sorted(int(n) for n in t)
        for key, color in (("exact_search", "C0"), ("exact_optimize", "C4"), ("ajosc_decide", "C1"), ("greedy", "C2")):
            xs = [n for n in ns if key in t[str(n)]]
            if xs:
                ax.plot(xs, [t[str(n)][key]["cpu"]["max"] for n in xs], "-o", color=color, ms=3, label=f"{key} CPU, worst")
                ax.plot(xs, [t[str(n)][key]["cpu"]["p50"] for n in xs], "--", color=color, lw=1, label=f"{key} CPU, p50")
                ax.plot(xs, [t[str(n)][key]["wall"]["max"] for n in xs], ":", color=color, lw=1, label=f"{key} wall, worst")
        for n, g in GOALS.items():
            ax.plot([n], [g], "k*", ms=12)
        load = doc.get("load_average", {}).get("timing") or {}
        ax.set_yscale("log")
        ax.set_xlabel("streams n (several-class random graphs)")
        ax.set_ylabel("seconds")
        ax.set_title(f"optimizer time (stars: goals); load {load.get('before', [0])[0]:.1f} -> "
                     f"{load.get('after', [0])[0]:.1f} on 2 cores", fontsize=9)
        ax.legend(fontsize=6)
    ax = axes[0, 1]
    m = doc.get("model", {})
    if m:
        labels = list(m)
        x = np.arange(len(labels))
        for i, name in enumerate(MODELS):
            ax.bar(x + (i - 1) * 0.27, [m[w][name]["spearman_mean"] or 0 for w in labels], 0.27, label=name)
        ax.set_xticks(x, [w.replace("drift-", "") for w in labels], rotation=60, fontsize=7)
        ax.set_ylabel("Spearman, model vs measured work per batch (mean)")
        ax.set_title("the model against the engine", fontsize=9)
        ax.legend(fontsize=7)
    e = doc.get("evaluation", {})
    if e:
        presets = [p for p in e if "ref" not in p and "fixed" in e[p]["task_cpu"] and "ajosc" in e[p]["task_cpu"]] or list(e)
        strategies = ("fixed", "selectivity_first", "greedy", "dppick", "dppick_nosmooth", "ajosc", "oracle")
        for ax, key, ref, title in ((axes[1, 0], "probe_work", "oracle", "probe work / the oracle's"),
                                    (axes[1, 1], "task_cpu", "fixed", "task CPU / fixed's")):
            x = np.arange(len(presets))
            for i, s in enumerate(strategies):
                ys = [e[p][key].get(s, np.nan) / e[p][key].get(ref, np.nan) for p in presets]
                ax.bar(x + (i - 3) * 0.12, ys, 0.12, label=s)
            ax.axhline(1.0, color="k", lw=0.6)
            ax.set_xticks(x, presets, rotation=60, fontsize=7)
            ax.set_title(title + " (per workload, gated)", fontsize=9)
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", default=["model", "timing", "evaluation", "ajosc"],
                    choices=["model", "timing", "evaluation", "ajosc"])
    ap.add_argument("--work", help="a kept run_evaluation.py work folder (model, ajosc)")
    ap.add_argument("--evaluation", nargs="+", default=[],
                    help="run_evaluation.py's results JSON(s) of the work folder (paper and drift parts are merged)")
    ap.add_argument("--ns", nargs="+", type=int, default=[8, 12, 16, 20])
    ap.add_argument("--graphs", type=int, default=10, help="graphs per n (n = 20: 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "classes.json"))
    args = ap.parse_args(argv)
    evaluation, sources = {"paper": {}, "drift": {"presets": {}}}, []
    for path in args.evaluation:
        ev = json.loads(Path(path).read_text())
        evaluation["paper"].update(ev.get("paper", {}))
        evaluation["drift"]["presets"].update(ev.get("drift", {}).get("presets", {}))
        sources.append({"file": Path(path).name, "git_commit": ev.get("git_commit"), "command": ev.get("command"),
                        "date": ev.get("date"), "load_average_after": ev.get("load_average_after"),
                        "seconds_total": ev.get("seconds_total")})
    if not evaluation["drift"]["presets"]:
        evaluation.pop("drift")
    loops = [d["loop"]["settings"]["cost_model"] for d in [*evaluation["paper"].values(),
                                                           *evaluation.get("drift", {}).get("presets", {}).values()]]
    calibrated = CostModel.from_json(loops[0]) if loops else CostModel()
    started = datetime.now(timezone.utc)
    out_path = Path(args.out)
    doc = {"benchmark": "optimizer_classes", "date": started.isoformat(timespec="seconds"), "machine": machine(),
           "git_commit": git_commit(HERE), "numpy": np.__version__,
           "parameters": {k: v for k, v in vars(args).items()}, "calibrated_model": calibrated.to_json(),
           "load_average": {}}
    old_doc = json.loads(out_path.read_text()) if out_path.exists() else {}
    doc["evaluation_sources"] = [x for x in old_doc.get("evaluation_sources", [])
                                 if x["file"] not in {y["file"] for y in sources}] + sources
    if out_path.exists():  # keep the parts not re-run
        old = old_doc
        for part in ("model", "timing", "evaluation", "ajosc"):
            if part not in args.parts and part in old:
                doc[part] = old[part]
                for key, load in old.get("load_average", {}).items():  # the part's own and its kept workloads'
                    if key == part or key.startswith(part + "_"):
                        doc["load_average"][key] = load
                if part in old.get("kept_workloads", {}):
                    doc.setdefault("kept_workloads", {})[part] = old["kept_workloads"][part]
    for part in args.parts:
        before = list(os.getloadavg())
        if part == "model" and args.work and args.evaluation:
            doc["model"] = model_part(Path(args.work), evaluation, calibrated)
        elif part == "timing":
            doc["timing"] = timing_part(args.ns, {n: (3 if n >= 20 else args.graphs) for n in args.ns}, args.repeats)
            if out_path.exists():  # sizes not re-run keep their rows (and the load they were measured under)
                old = json.loads(out_path.read_text()).get("timing", {})
                kept = [r for r in old.get("rows", []) if r["n"] not in args.ns]
                for n in sorted({r["n"] for r in kept}):
                    doc["timing"]["summary"][str(n)] = old["summary"][str(n)]
                doc["timing"]["rows"] = kept + doc["timing"]["rows"]
                doc["timing"]["summary"] = dict(sorted(doc["timing"]["summary"].items(), key=lambda kv: int(kv[0])))
                if kept:
                    doc["load_average"]["timing_kept_sizes"] = old.get("load_average_timing") or \
                        json.loads(out_path.read_text()).get("load_average", {}).get("timing")
        elif part == "evaluation" and (evaluation.get("drift") or evaluation["paper"]):
            doc["evaluation"] = evaluation_part(evaluation)
        elif part == "ajosc" and args.work and args.evaluation:
            doc["ajosc"] = ajosc_part(Path(args.work), evaluation, calibrated)
        if part != "timing" and part in doc:
            # workloads of another evaluation run keep their rows (and say which run they come from)
            first_run = (old_doc.get("evaluation_sources") or [{}])[0].get("file")
            kept = {w: {**v, "evaluation_run": v.get("evaluation_run") or first_run}
                    for w, v in old_doc.get(part, {}).items() if w not in doc[part]}
            for w in doc[part]:
                doc[part][w]["evaluation_run"] = sources[0]["file"] if sources else None
            doc[part] = {**kept, **doc[part]}
            doc.setdefault("kept_workloads", {})[part] = sorted(kept)
            if kept:
                doc["load_average"][f"{part}_kept"] = (old_doc.get("load_average", {}).get(f"{part}_kept")
                                                       or old_doc.get("load_average", {}).get(part))
        doc["load_average"][part] = {"before": before, "after": list(os.getloadavg())}
    doc["wall_seconds"] = (datetime.now(timezone.utc) - started).total_seconds()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=1) + "\n")
    plot(doc, out_path.with_suffix(".png"))
    print(f"wrote {out_path} and {out_path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
