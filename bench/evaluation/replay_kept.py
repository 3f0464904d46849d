"""Replay the loop offline on a kept drift run: the same statistics history, the engine's measured chains, today's code.

    .venv/bin/python bench/evaluation/replay_kept.py --work W --evaluation results/evaluation_quick_<tag>.json \\
        [--presets twoclass-burst ...] [--out replay.json]

``run_evaluation.py --keep`` leaves, per drift preset, the statistics history of every cycle and the engine's metrics of
the covering fixed orders (``cycle_loop.covering_orders``: every probe order of every stream). Any schedule of plans is
composed from those exactly in lookups and matches (``cycle_loop.compose``), and in task CPU as the last engine round
measured it. This replays the loop (gates, forecast, every strategy, the plan gate) with the code as it is now on that
history and prints, per strategy, the composed probe work and task CPU beside the run's own: a change of the cost model
or of an optimizer is measured against the engine's work in minutes, without running the engine again. The engine's
results do not depend on the plan (the run checked their fingerprints), so only the work is replayed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent / "include"))

import run_evaluation as ev  # noqa: E402
from mjoin.engine.metrics import read_metrics  # noqa: E402
from mjoin.evaluation.cycle_loop import chain_costs, merge_runs  # noqa: E402


def replay_preset(work: Path, preset: str, doc: dict) -> dict:
    """``{strategy: {"work", "cpu"}}`` composed for the spec order's loop (gated), as the run's ``totals_spec_order``."""
    label = f"drift-{preset}"
    query = ev.spec_of(Path(doc["lake"]), None)
    tau, length = int(doc["cycle_s"]), int(doc["length_L"])
    start, end = int(doc["loop_from"]), int(doc["interval"][1])
    offset = (int(doc["interval"][0]) - start) // tau
    runs = [chain_costs(read_metrics(str(work / label / "engine" / "orders" / name / "metrics" / query.name)),
                       query.stream_names)
            for name in doc["engine_orders"]]
    measured = {"rounds": [merge_runs(runs)], "batch_ids": list(range(1, int(doc["batches"]) + 1))}
    loop_orders = [tuple(query.stream_names)]
    sched = ev.run_loop(None, query, doc["lake"], start, end, tau, length, loop_orders, ev.STRATEGIES, work / label,
                        history=work / label / "history")
    sched = ev.from_batch(sched, offset)
    costs = ev.compose_all(sched, measured)
    return {s: {"work": costs[("gated", loop_orders[0], s)]["work"], "cpu": costs[("gated", loop_orders[0], s)]["cpu"]
                ["median"]} for s in ev.STRATEGIES}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="the run's kept work folder (run_evaluation.py --keep --work)")
    ap.add_argument("--evaluation", required=True, help="the run's results JSON")
    ap.add_argument("--presets", nargs="+", help="default: every drift preset of the run")
    ap.add_argument("--out", help="write the replayed totals here (JSON)")
    args = ap.parse_args(argv)
    presets_doc = json.loads(Path(args.evaluation).read_text())["drift"]["presets"]
    out = {}
    for preset in args.presets or list(presets_doc):
        doc = presets_doc[preset]
        got = replay_preset(Path(args.work), preset, doc)
        run = doc["drift"]["totals_spec_order"]
        out[preset] = {"replayed": got, "run": {s: run[s] for s in got if s in run}}
        print(f"{preset}: probe work (replayed / the run's), task CPU of the last round")
        for s, v in got.items():
            r = run.get(s, {})
            print(f"  {s:18s} {v['work']:>12,.0f} / {r.get('work', 0):>12,.0f}   cpu {v['cpu']:.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
