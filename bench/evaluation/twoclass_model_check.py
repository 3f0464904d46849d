"""Does the cost model rank the probe orders of the two-class query as the engine measures them? (offline)

Reads a drift run's work folder (``run_evaluation.py --sections drift --presets twoclass-burst``: the loop's
statistics history and the engine metrics of the 6 covering fixed orders) and, per measured batch, stream and
probe order, compares the model's cost on the batch's own measured statistics (what the oracle optimizes) with
the engine's measured lookups + matches of that stream's chain. No Spark: numpy and the history's parquet.

Versions of the model compared (this check led to the class-change price of ``mjoin.optimizer.cost``;
``bench/optimizer/classes.py`` now makes the same comparison on every workload of an evaluation run):

- ``last_mu``: ``rho_k = u_k`` at a class change with the lowest-gamma edge, the model before the class-change price
  (:func:`cost_last_mu`; the run's oracle optimized it, so its picked work was the run's oracle work, a check that
  the statistics are read as the loop read them);
- ``run_product``: ``rho_k`` the product of ``u`` over the run of same-class steps before the class change, i.e.
  every partial result the factorised run materialises (the first prototype);
- ``max_gamma``: ``run_product`` with the lookup's representative edge the class-``c`` edge with the *highest*
  gamma instead of the lowest (what the remaining misprice, s0 looked up from ``{s2, s3}``, pointed at); with the
  residual filters applied at the class change only, this is ``mjoin.optimizer.cost.order_cost`` now.

For each, per (batch, stream): Spearman of the model's cost against the measured work over the stream's valid
orders, and the measured work of the order the model picks (argmin of the calibrated model, as exact/the oracle),
of greedy's pick (greedy_MSJ on the same statistics) and of the best measured order, summed over streams and
batches (absolute lookups + matches).

Run (from the repo root)::

    .venv/bin/python bench/evaluation/twoclass_model_check.py --work /tmp/h37/work \\
        --out bench/evaluation/results/twoclass_model_check.json
"""
from __future__ import annotations

import argparse
import glob
import itertools
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "include"))

from mjoin.optimizer.cost import CostModel, JoinProblem, order_cost  # noqa: E402
from mjoin.model.query import load_query  # noqa: E402
from mjoin.stats.history import read_history, snapshot  # noqa: E402

#: one unit per lookup and per fetched tuple: the model's cost in the engine's lookups + matches
WORK = CostModel(alpha_q=1.0, alpha_m=1.0, c=1.0, state="hash", m_slots=None)


def _lowest_gamma_terms(problem: JoinProblem, mask: int, r: int, c: int) -> tuple[float, float, float]:
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


class LowestGamma(JoinProblem):
    """The lookup's representative edge the lowest gamma (ties: lowest mu), as before the class-change price."""

    def step_terms(self, joined_mask, r, c):
        return _lowest_gamma_terms(self, joined_mask, r, c)


def _lowest(problem: JoinProblem) -> JoinProblem:
    return LowestGamma(problem.names, problem.classes, problem.cls, problem.gamma, problem.mu, problem.lam,
                       problem.kappa, problem.window, problem.group)


def cost_last_mu(problem: JoinProblem, model: CostModel, start: int, pairs) -> float:
    """The model before the class-change price: ``C(o_k) = q + g (alpha_m u + phi rho C(o_{k+1}))``, ``rho = u_k``
    at a class change, the lowest-gamma edge."""
    problem = _lowest(problem)
    mask, steps = 1 << start, []
    for l, r in pairs:
        c = int(problem.cls[l, r])
        g, u, phi = problem.step_terms(mask, r, c)
        steps.append((float(model.query_cost(problem.kappa[r])), g, u, phi, c))
        mask |= 1 << r
    cost, nxt = 0.0, None
    for q, g, u, phi, c in reversed(steps):
        cost = q + g * (model.alpha_m * u + phi * (1.0 if nxt is None or nxt == c else u) * cost)
        nxt = c
    return cost


def cost_run_product(problem: JoinProblem, model: CostModel, start: int, pairs) -> float:
    """Eq. 8 with ``rho_k`` the product of ``u`` over the run of same-class steps ending at ``k`` (a class change
    after ``k``), on the affine form ``C(o_k; m) = A_k + m B_k`` (``m``: partial results per key the run carries),
    the lowest-gamma edge, the residual filters inside the run."""
    if not isinstance(problem, LowestGamma) and type(problem) is JoinProblem:
        problem = _lowest(problem)
    mask = 1 << start
    steps = []
    for l, r in pairs:
        c = int(problem.cls[l, r])
        g, u, phi = problem.step_terms(mask, r, c)
        steps.append((float(model.query_cost(problem.kappa[r])), g, u, phi, c))
        mask |= 1 << r
    a = b = 0.0
    nxt = None
    for q, g, u, phi, c in reversed(steps):
        if nxt is None or nxt == c:  # the run goes on (or the order ends): its lookups stay factorised
            a, b = q + g * (model.alpha_m * u + phi * a), g * phi * u * b
        else:  # a class change after this step: every partial result of the run looks its own key up
            a, b = q + g * model.alpha_m * u, g * phi * u * (a + b)
        nxt = c
    return a + b


def cost_max_gamma(problem: JoinProblem, model: CostModel, start: int, pairs) -> float:
    """``cost_run_product`` with the representative edge of a lookup the highest-gamma one (ties: lowest mu)."""

    class MaxGamma(JoinProblem):
        def step_terms(self, joined_mask, r, c):
            _, _, phi = _lowest_gamma_terms(self, joined_mask, r, c)
            ms = [m for m in self.class_members[c][r] if joined_mask >> m & 1]
            best = max(ms, key=lambda m: (self.gamma[m, r], -self.mu[m, r]))
            return float(self.gamma[best, r]), float(self.mu[best, r]), phi

    mg = MaxGamma(problem.names, problem.classes, problem.cls, problem.gamma, problem.mu, problem.lam,
                  problem.kappa, problem.window, problem.group)
    return cost_run_product(mg, model, start, pairs)


def spearman(a, b) -> float | None:
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return None
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def pairs_of(problem: JoinProblem, s: str, order) -> list | None:
    """The index pairs of ``s``'s order (earliest joined neighbour as ``l``), None if not a connected expansion."""
    joined, pairs = [s], []
    for r in order:
        ls = [m for m in joined if problem.cls[problem.index[m], problem.index[r]] >= 0]
        if not ls:
            return None
        pairs.append((problem.index[ls[0]], problem.index[r]))
        joined.append(r)
    return pairs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/h37/work")
    ap.add_argument("--preset", default="twoclass-burst")
    ap.add_argument("--workload", default="syn-twoclass-burst-8m")
    ap.add_argument("--results", default=str(ROOT / "bench/evaluation/results/evaluation_quick_drift8m-twoclass.json"))
    ap.add_argument("--burst", default="18-30", help="batch ids of s3's burst (inclusive)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    work = Path(args.work)
    run = json.loads(Path(args.results).read_text())["drift"]["presets"][args.preset]
    calibrated = CostModel.from_json(json.loads(Path(args.results).read_text())["drift"]["presets"][args.preset]
                                     ["loop"]["settings"]["cost_model"])
    query = load_query(str(work / args.workload / "query.yaml"))
    hist = read_history(str(work / f"drift-{args.preset}" / "history"), query.name, meta=True)
    tau, first = int(run["cycle_s"]), int(run["interval"][0])
    meas = {}
    for f in glob.glob(str(work / f"drift-{args.preset}" / "engine" / "orders" / "*" / "metrics" / "*" / "metrics.jsonl")):
        for line in open(f):
            r = json.loads(line)
            for c in r["chains"]:
                o = tuple(st["right"] for st in c["steps"])
                meas[(int(r["batch_id"]), c["stream"], o)] = {
                    "work": sum(int(st["lookups"]) + int(st["matches"]) for st in c["steps"]), "rows_in": int(c["rows_in"]),
                    "steps": [[st["right"], int(st["lookups"]), int(st["matches"])] for st in c["steps"]]}
    lo, hi = (int(x) for x in args.burst.split("-"))
    models = {"last_mu": cost_last_mu, "run_product": cost_run_product, "max_gamma": cost_max_gamma,
              "model": order_cost}
    rows = []
    for b in range(1, int(run["batches"]) + 1):
        st = snapshot(hist, first + (b - 1) * tau)
        P = JoinProblem.from_statistics(query, st)
        for s in query.stream_names:
            cands = []
            for o in itertools.permutations([x for x in query.stream_names if x != s]):
                pairs = pairs_of(P, s, o)
                m = meas.get((b, s, o))
                if pairs is None or m is None or m["rows_in"] == 0:
                    continue
                rec = {"order": "".join(o), "measured_work": m["work"], "measured_per_tuple": m["work"] / m["rows_in"],
                       "steps": m["steps"]}
                for name, fn in models.items():
                    rec[f"{name}_work_per_tuple"] = fn(P, WORK, P.index[s], pairs)
                    rec[f"{name}_calibrated"] = fn(P, calibrated, P.index[s], pairs)
                cands.append(rec)
            if len(cands) < 2:
                continue
            # greedy_MSJ's pick on the same statistics (immediate cost, calibrated model)
            from mjoin.optimizer.baselines import greedy

            gp = greedy(P, calibrated)[P.index[s]]
            g_order = "".join(P.names[r] for _, r in gp)
            row = {"batch": b, "stream": s, "burst": lo <= b <= hi, "rows_in": cands[0]["steps"][0][1],
                   "orders": cands, "best_measured": min(c["measured_work"] for c in cands),
                   "greedy_order": g_order,
                   "greedy_measured": next((c["measured_work"] for c in cands if c["order"] == g_order), None)}
            for name in models:
                row[f"{name}_spearman"] = spearman([c[f"{name}_work_per_tuple"] for c in cands],
                                                   [c["measured_work"] for c in cands])
                pick = min(cands, key=lambda c: c[f"{name}_calibrated"])
                row[f"{name}_pick"], row[f"{name}_pick_measured"] = pick["order"], pick["measured_work"]
            rows.append(row)

    def summary(sel) -> dict:
        out = {"chains": len(sel), "best_measured_work": int(sum(r["best_measured"] for r in sel)),
               "greedy_pick_measured_work": int(sum(r["greedy_measured"] or 0 for r in sel))}
        for name in models:
            sp = [r[f"{name}_spearman"] for r in sel if r[f"{name}_spearman"] is not None]
            out[name] = {"pick_measured_work": int(sum(r[f"{name}_pick_measured"] for r in sel)),
                         "spearman_median": float(np.median(sp)) if sp else None,
                         "spearman_mean": float(np.mean(sp)) if sp else None,
                         "picks_worse_than_greedy": sum(1 for r in sel if r["greedy_measured"] is not None
                                                        and r[f"{name}_pick_measured"] > r["greedy_measured"])}
        return out

    doc = {"preset": args.preset, "work": str(work), "burst_batches": [lo, hi],
           "calibrated_model": calibrated.to_json(),
           "summary": {"all": summary(rows), "burst": summary([r for r in rows if r["burst"]]),
                       "outside_burst": summary([r for r in rows if not r["burst"]])},
           "rows": rows}
    print(json.dumps(doc["summary"], indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
