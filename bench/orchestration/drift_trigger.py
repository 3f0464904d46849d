"""How soon a new plan is active after the data changes: the scheduled loop alone (cron) against the loop plus
the drift watcher (drift-triggered runs), on the drift presets.

The loop is replayed in event time, cycle by cycle, with the project's own parts: each cycle's measured statistics
are the preset's expected statistics of uniform keys (tests/preset_statistics.py) with 3% multiplicative noise;
a run at time T forecasts the next cycle with Holt from the last L cycles (mjoin.forecast.holt), optimizes with
``exact`` and deploys when the candidate improves on the active plan by the plan gate's hysteresis (5%, costed
under the forecast), the new plan active ``--run-seconds`` after the trigger (one run at a time, as the DAG's
max_active_runs=1). Cron triggers a run every ``--period``; the drift watcher in addition checks every cycle
(mjoin.loop.drift: the forecast error of every series against the last run's forecast, and the active plan's cost
per input tuple under the measured statistics, each against its bound from history, confirmed over 2 cycles) and
triggers a run, at most one per ``--debounce`` seconds; a run whose window straddles the newest drift event's change
point forecasts from the cycles since it (mjoin.loop.drift.shift_since), as the DAG's do.

Per preset: for every change (the start of each step, ramp or burst of the schedule), the time from the change to
the first new plan active after it, cron vs drift-triggered; the runs per hour; the model cost of the active plans
over the workload relative to the oracle (the best plan of each cycle's expected statistics).

Writes bench/orchestration/results/drift_trigger[-quick].json (machine, load, versions, commit, date, parameters).

    python bench/orchestration/drift_trigger.py --quick
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))
sys.path.insert(0, str(PROJECT / "tests"))  # preset_statistics: the presets' expected statistics (shared with tests)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import preset_statistics  # noqa: E402
from mjoin.forecast.holt import forecast as holt  # noqa: E402
from mjoin.loop.drift import DriftConfig, cost_drift, forecast_errors  # noqa: E402
from mjoin.model.query import parse_query  # noqa: E402
from mjoin.model.statistics import ROW_COLUMNS  # noqa: E402
from mjoin.model.timeutil import iso  # noqa: E402
from mjoin.optimizer.cost import plan_cost  # noqa: E402
from mjoin.optimizer.strategies import optimize  # noqa: E402
from mjoin.workloads.schedule import load_schedule  # noqa: E402
from mjoin.workloads.synthetic import query_document  # noqa: E402

PRESETS = ("hot-rotate", "hot-ramp", "hot-burst", "twoclass-step", "twoclass-burst")
WINDOW, RATE, DOMAIN, STREAMS = 60.0, 200.0, 200, 4
T0 = 1767225600.0


def query_of(preset: str, sched):
    if preset.startswith("twoclass"):
        doc = query_document("twoclass", {s: s for s in sched.stream_names}, WINDOW, dict(sched.keys))
    else:
        doc = query_document("hot", {s: s for s in sched.stream_names}, WINDOW)
    return parse_query(doc, source=f"<{preset}>")


def noisy(st, rng, noise: float):
    for g in st.groups.values():
        for s in g.streams.values():
            f = 1 + noise * rng.standard_normal()
            s.lam, s.window_tuples = s.lam * f, s.window_tuples * f
            s.kappa = max(1.0, min(s.kappa * (1 + noise * rng.standard_normal()), s.window_tuples))
        for e in g.edges.values():
            e.gamma = float(np.clip(e.gamma * (1 + noise * rng.standard_normal()), 0.0, 1.0))
            e.mu = max(1.0, e.mu * (1 + noise * rng.standard_normal()))
    return st


def changes(sched_doc: dict, duration: float) -> list[float]:
    def at(v):
        return float(str(v).rstrip("%")) / 100 * duration

    out = set()
    for e in sched_doc.get("events", []):
        out.add(at(e.get("at", e.get("from"))))
        if e.get("type") == "burst":
            out.add(at(e["to"]))  # the burst ends: a change back
    return sorted(out)


def replay(preset: str, args, *, drift: bool) -> dict:
    from mjoin.workloads.presets import preset_document

    sched = load_schedule(preset, streams=STREAMS, duration=args.duration, rate=RATE, domain=DOMAIN)
    q = query_of(preset, sched)
    rng = np.random.default_rng(args.seed)
    tau = args.cycle
    n = int(args.duration // tau)
    cfg = DriftConfig(debounce=args.debounce)
    rows, measured, expected = [], [], []
    for k in range(n):
        t = k * tau
        exp = preset_statistics.expected_statistics(sched, q, t + tau / 2, WINDOW)
        expected.append(exp)
        st = noisy(preset_statistics.expected_statistics(sched, q, t + tau / 2, WINDOW), rng, args.noise)
        st.cycle_start, st.cycle_seconds, st.kind = iso(T0 + t), tau, "measured"
        measured.append(st)
        rows.extend(st.to_rows())
    hist = pd.DataFrame(rows, columns=list(ROW_COLUMNS))
    hist["cycle"] = pd.to_datetime(hist["cycle_start"], utc=True)

    active, fc, deploys, runs = None, None, [], []
    busy_until, queued, last_drift = -math.inf, None, -math.inf
    cost_log: list = []  # the active plan's measured cost per input tuple, since it became active
    total_model, total_oracle = 0.0, 0.0
    pending = None  # (time active, plan, forecast)
    since = None  # the newest drift event's change point (seconds into the workload)
    for k in range(args.warmup, n):
        now = (k + 1) * tau  # cycle k has just completed
        if pending is not None and now >= pending[0]:
            active_time, plan, new_fc = pending
            if plan is not None:
                if active is not None:  # the first plan replaces no plan: not a re-plan
                    deploys.append(active_time)
                active = plan
                cost_log = []
            fc = new_fc
            pending = None
        triggers = []
        if now % args.period < tau:  # the schedule's slot
            triggers.append("cron")
        if drift and fc is not None:
            past = hist[hist["cycle"] <= pd.Timestamp(iso(T0 + k * tau))]
            errs = forecast_errors(past[past["cycle"] >= pd.Timestamp(iso(T0 + (k - 2 * cfg.window) * tau))], fc, cfg)
            if active is not None:
                rate = sum(s.lam for s in measured[k].groups[0].streams.values())
                cost_log.append(plan_cost(q, measured[k], active) / rate if rate else math.nan)
            if (errs or (active is not None and cost_drift(cost_log, cfg))) and now - last_drift >= cfg.debounce:
                triggers.append("drift")
                last_drift = now
                if errs:  # the change point the event records (mjoin.loop.drift.shift_since reads it)
                    since = min(pd.Timestamp(e["since"]).timestamp() for e in errs) - T0
        if triggers and queued is None:
            queued = (now, triggers)
        if queued is not None and now >= busy_until and pending is None:
            t_run, why = queued
            queued = None
            past = hist[hist["cycle"] < pd.Timestamp(iso(T0 + (k + 1) * tau))]
            if since is not None and (k + 1) * tau - args.length * tau < since < (k + 1) * tau:
                past = past[past["cycle"] >= pd.Timestamp(iso(T0 + since))]  # the run forecasts since the shift
            res = holt(past.drop(columns=["cycle"]), iso(T0 + (k + 1) * tau), length=args.length)
            cand = optimize(q, res.statistics, "exact")
            deploy = active is None
            if not deploy:
                c_act, c_new = plan_cost(q, res.statistics, active), plan_cost(q, res.statistics, cand)
                deploy = c_act > 0 and (c_act - c_new) / c_act >= 0.05
            runs.append({"at": now, "why": why, "deployed": deploy})
            pending = (now + args.run_seconds, cand if deploy else None, res.statistics)
            busy_until = now + args.run_seconds
        if active is not None:
            oracle = optimize(q, expected[k], "exact") if k % args.oracle_every == 0 else None
            if oracle is not None:
                total_model += plan_cost(q, expected[k], active)
                total_oracle += plan_cost(q, expected[k], oracle)
    doc = preset_document(preset, STREAMS)
    out_changes = []
    for tc in changes(doc, args.duration):
        after = [d for d in deploys if d > tc]
        nxt = [c for c in changes(doc, args.duration) if c > tc]
        first = after[0] if after and (not nxt or after[0] <= nxt[0] + args.period + args.run_seconds) else None
        out_changes.append({"change_at": tc, "new_plan_active_at": first,
                            "latency": None if first is None else round(first - tc, 1)})
    hours = (n - args.warmup) * tau / 3600
    return {"changes": out_changes, "runs": len(runs), "runs_per_hour": round(len(runs) / hours, 2),
            "drift_runs": sum("drift" in r["why"] and "cron" not in r["why"] for r in runs),
            "deploys": len(deploys), "cost_vs_oracle": round(total_model / total_oracle, 4) if total_oracle else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="30-minute workloads, three presets")
    ap.add_argument("--duration", type=float, default=None, help="workload seconds (default 3600; quick 1800)")
    ap.add_argument("--cycle", type=float, default=10.0)
    ap.add_argument("--period", type=float, default=300.0, help="the schedule's period, seconds")
    ap.add_argument("--run-seconds", type=float, default=60.0, help="trigger to new plan active, seconds")
    ap.add_argument("--debounce", type=float, default=300.0)
    ap.add_argument("--length", type=int, default=60)
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--warmup", type=int, default=60, help="cycles of history before the loop starts")
    ap.add_argument("--oracle-every", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--presets", default=None)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    args.duration = args.duration or (1800.0 if args.quick else 3600.0)
    presets = args.presets.split(",") if args.presets else (PRESETS[:3] if args.quick else PRESETS)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT, capture_output=True, text=True).stdout.strip()
    results = {"date": datetime.now(timezone.utc).isoformat(), "commit": commit,
               "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_before": os.getloadavg()},
               "versions": {"python": platform.python_version(), "numpy": np.__version__, "pandas": pd.__version__},
               "parameters": {k: v for k, v in vars(args).items() if k != "out"}, "presets": {}}
    t0 = time.perf_counter()
    for p in presets:
        cron, drift = replay(p, args, drift=False), replay(p, args, drift=True)
        results["presets"][p] = {"cron": cron, "drift": drift}
        lat = [(c["latency"], d["latency"]) for c, d in zip(cron["changes"], drift["changes"])]
        print(f"{p:15} latency cron/drift per change: {lat}; runs/h {cron['runs_per_hour']}/{drift['runs_per_hour']}; "
              f"cost vs oracle {cron['cost_vs_oracle']}/{drift['cost_vs_oracle']}")
    summary = {"cron": [], "drift": []}
    for r in results["presets"].values():
        for c, d in zip(r["cron"]["changes"], r["drift"]["changes"]):
            if c["latency"] is not None and d["latency"] is not None:
                summary["cron"].append(c["latency"])
                summary["drift"].append(d["latency"])
    results["summary"] = {k: {"median": statistics.median(v) if v else None, "max": max(v) if v else None,
                              "changes": len(v)} for k, v in summary.items()}
    results["seconds"] = round(time.perf_counter() - t0, 1)
    results["machine"]["load_after"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("drift_trigger-quick.json" if args.quick else "drift_trigger.json")
    path.write_text(json.dumps(results, indent=2))
    print(f"median latency cron {results['summary']['cron']['median']} s, drift {results['summary']['drift']['median']} s; "
          f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
