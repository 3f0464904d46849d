"""The text summary of run_evaluation.py's results (printed at the end of a run; ``python report.py JSON``)."""
from __future__ import annotations

import json
import sys


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def print_summary(r: dict) -> None:
    print(f"evaluation ({r.get('mode')}), {r.get('seconds_total', 0):.0f} s, commit {r.get('git_commit')}, "
          f"load {r['machine']['load_average'][0]:.1f} -> {r.get('load_average_after', ['?'])[0]}")
    for label, doc in (r.get("paper") or {}).items():
        if not isinstance(doc, dict) or "strategies" not in doc:
            continue
        eng = doc.get("engine", {})
        share = eng.get("order_share", {})
        print(f"\n[{label}] {doc['query']}: {doc['batches']} batches of {doc['cycle_s']} s, results agree "
              f"{eng.get('results_agree')} {eng.get('result_rows')}; chains = "
              f"{share.get('chain_share_of_task_cpu', 0):.0%} of task CPU; fixed orders: task CPU "
              f"{share.get('task_cpu', {}).get('min', 0):.2f}-{share.get('task_cpu', {}).get('max', 0):.2f} s, "
              f"engine {share.get('engine_seconds', {}).get('min', 0):.2f}-{share.get('engine_seconds', {}).get('max', 0):.2f} s, "
              f"probe work x{share.get('probe_work', {}).get('ratio', 0):.2f}")
        for s, row in doc.get("strategies", {}).items():
            g, u = row.get("gated", {}), row.get("ungated", {})
            if g:
                print(f"  {s:>17}: CPU {g['cpu_mean']:.3f} s  engine {g['wall_mean']:.3f} s  work {g['work_mean']:.4g}  "
                      f"changes {g['plan_changes_mean']:.1f} (ungated {u.get('plan_changes_mean', 0):.1f})")
        for m, pm in doc.get("paper", {}).items():
            red = ", ".join(f"{b} {_pct(v['mean'])} [{_pct(v['min'])}, {_pct(v['max'])}]"
                            for b, v in pm["reduction_vs"].items())
            print(f"  by {m}: dppick fastest in {pm['dppick_fastest']}/{pm['orders']} "
                  f"(strictly {pm['dppick_strictly_fastest']}); reduction vs {red}")
            if pm.get("smoothing_beats_nosmooth"):
                sm = pm["smoothing_beats_nosmooth"]
                print(f"    smoothing beats noSmooth in {sm['orders']}/{pm['orders']} (ties {sm['ties']}), "
                      f"gain {sm['gain_min']:.1%}..{sm['gain_max']:.1%}")
        sw = doc.get("switching_run")
        if sw:
            print(f"  real switching run ({sw.get('plan_switches')} switches): work equal {sw.get('work_equal')}, "
                  f"results equal {sw.get('results_equal')}, CPU {sw.get('task_cpu_seconds', 0):.3f} vs composed "
                  f"{sw.get('composed_task_cpu', 0):.3f}")
        ov = doc.get("overhead")
        if ov:
            print(f"  loop per cycle: {ov['loop_seconds_per_cycle']['median']:.2f} s median; total "
                  f"{ov['loop_seconds_total']:.1f} s vs the join's {ov['join_engine_seconds']:.1f} s "
                  f"({ov['fraction_of_join_engine_time']:.0%})")
    per = (r.get("overhead") or {}).get("per_period")
    if per:
        for p in per["periods"]:
            print(f"  per period ({per['period_seconds']} s): loop {p['total']:.2f} s vs join "
                  f"{p['join_engine_seconds']:.2f} s -> {p['fraction_of_join_engine_time'] or 0:.0%}")
    sens = r.get("sensitivity") or {}
    for d in sens.get("cycle", []):
        print(f"  tau {d['tau']:>3}: dppick CPU {d['dppick']['cpu']:.3f} engine {d['dppick']['wall']:.2f} "
              f"(fixed {d['fixed']['cpu']:.3f}, oracle {d['oracle']['cpu']:.3f}); loop {d['overhead']['loop_seconds_total']:.1f} s")
    for d in sens.get("length", []):
        print(f"  L {d['L']:>4}: dppick CPU {d['dppick']['cpu']:.3f} work {d['dppick']['work']} "
              f"(oracle {d['oracle']['cpu']:.3f}), plan changes {d['plan_changes']}")
    for name, doc in ((r.get("drift") or {}).get("presets") or {}).items():
        g = doc["drift"]["goals"]
        print(f"  drift {name:>12}: " + "; ".join(
            f"{s} {m}: vs oracle {_pct(g[s][m]['vs_oracle'])}, below fixed {_pct(g[s][m]['below_fixed_mean'])}, "
            f"below sel.first {_pct(g[s][m]['below_selectivity_first'])} {'OK' if g[s][m]['goal_met'] else 'MISSED'}"
            for s in ("dppick",) for m in ("cpu", "chain_cpu", "work")))
    for label, doc in (r.get("peers") or {}).items():
        if not isinstance(doc, dict) or "systems" not in doc:
            continue
        print(f"\n[peers {label}] {doc['input_tuples']:,} tuples")
        for n, s in doc["systems"].items():
            if "error" in s:
                print(f"  {n:>16}: ERROR {s['error'][-300:]}")
                continue
            sec = s.get("seconds", {})
            print(f"  {n:>16}: {sec.get('median', 0):.2f} s [{sec.get('min', 0):.2f}, {sec.get('max', 0):.2f}]  "
                  f"{s.get('throughput_tuples_per_s', 0):,.0f} tuples/s  rows {s.get('result_rows', s.get('fingerprint', {}).get('rows'))} "
                  f"same as DuckDB {s.get('results_equal_duckdb')}  x{s.get('mjoin_speedup', 0):.2f} of mjoin's time")


if __name__ == "__main__":
    print_summary(json.loads(open(sys.argv[1]).read()))


def _s(x, nd=3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def markdown(r: dict) -> str:
    """The README's tables from a results document."""
    out = []
    papers = {k: v for k, v in (r.get("paper") or {}).items() if isinstance(v, dict) and "strategies" in v}
    for label, doc in papers.items():
        eng = doc["engine"]
        sh = eng["order_share"]
        out.append(f"\n**{label}** (`{doc['query']}`, {doc['batches']} batches of {doc['cycle_s']} s after "
                   f"{doc['loop']['gate_outcomes']['measured_from_cycle']} warm-up cycles, {len(doc['initial_orders'])} "
                   f"initial orders, engine runs: {len(doc['engine_orders'])} fixed orders x {doc['reps']}; "
                   f"{eng['result_rows'][0]:,} result rows, the same for every plan). The chains (the order-dependent "
                   f"work) are {sh['chain_share_of_task_cpu']:.0%} of the task CPU; over the fixed orders task CPU "
                   f"{sh['task_cpu']['min']:.2f}-{sh['task_cpu']['max']:.2f} s ({sh['task_cpu']['range_share']:.0%} "
                   f"range), engine time {sh['engine_seconds']['min']:.2f}-{sh['engine_seconds']['max']:.2f} s, "
                   f"probe work x{sh['probe_work']['ratio']:.2f}.\n")
        out.append("| strategy | task CPU (s) | chains' CPU (s) | engine time (s) | lookups + matches | plan changes (ungated) |")
        out.append("|---|---|---|---|---|---|")
        for s, row in doc["strategies"].items():
            g, u = row.get("gated"), row.get("ungated", {})
            if not g:
                continue
            chain = g.get("chain_cpu_mean")
            out.append(f"| {s} | {g['cpu_mean']:.3f} | {_s(chain)} | {g['wall_mean']:.3f} | "
                       f"{g['work_mean']:,.0f} | {g['plan_changes_mean']:.1f} ({u.get('plan_changes_mean', 0):.1f}) |")
        out.append("")
        out.append("| measure | dppick fastest (strictly) | vs fixed | vs selectivity_first | vs greedy | vs dppick_query | "
                   "vs dppick_match | vs noSmooth | vs oracle |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for m, pm in doc["paper"].items():
            red = pm["reduction_vs"]
            cells = [f"{_pct(red[b]['mean'])} [{_pct(red[b]['min'])}, {_pct(red[b]['max'])}]" if b in red else "-"
                     for b in ("fixed", "selectivity_first", "greedy", "dppick_query", "dppick_match",
                               "dppick_nosmooth", "oracle")]
            out.append(f"| {m} | {pm['dppick_fastest']}/{pm['orders']} ({pm['dppick_strictly_fastest']}) | "
                       + " | ".join(cells) + " |")
        sw = doc.get("switching_run")
        if sw:
            out.append(f"\nReal switching run (dppick, order {sw['initial_order']}, {sw['plan_switches']} switches, one "
                       f"Spark job per batch): lookups+matches equal to the composed ones: {sw['work_equal']}; results "
                       f"equal: {sw['results_equal']}; task CPU {sw['task_cpu_seconds']:.2f} s vs composed "
                       f"{sw['composed_task_cpu']:.2f} s (per-batch jobs cost more than pipelined ones).")
    return "\n".join(out)
