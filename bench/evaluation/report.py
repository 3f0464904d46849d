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




def _s(x, nd=3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _above(doc: dict, strategy: str) -> str:
    """A drift preset's lookups + matches of ``strategy`` (fixed: the mean over the initial orders) against the
    oracle's, first initial order."""
    d = doc["drift"]
    oracle = d["totals_spec_order"]["oracle"]["work"]
    v = d["fixed_mean_over_orders"]["work"] if strategy == "fixed" else d["totals_spec_order"][strategy]["work"]
    return _pct(v / oracle - 1) if oracle else "-"


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
    ov = r.get("overhead") or {}
    if ov.get("per_cycle"):
        pc = ov["per_cycle"]
        st = pc["median_step_seconds"]
        out.append(f"\n**The loop's overhead** ({pc['cycles']} re-optimizations, one per 10-s cycle): median per cycle "
                   f"{pc['loop_seconds_per_cycle']['median']:.2f} s = statistics job {st['statistics']:.2f} + history "
                   f"read {st['history']:.2f} + statistics gate {st['stats_gate']:.2f} + Holt {st['forecast']:.2f} + "
                   f"forecast gate {st['forecast_gate']:.2f} + dppick {st['optimize']:.4f} + plan gate "
                   f"{st['plan_gate']:.2f}; in total {pc['loop_seconds_total']:.0f} s against the join's "
                   f"{pc['join_engine_seconds']:.1f} s of engine time ({pc['join_task_cpu_seconds']:.1f} s task CPU) "
                   f"for the same batches: {pc['fraction_of_join_engine_time']:.0%}.")
        per = ov.get("per_period") or {}
        for p in per.get("periods", []):
            out.append(f"- per {per['period_seconds']} s period: loop {p['total']:.2f} s "
                       f"({', '.join(f'{k} {v:.2f}' for k, v in p['seconds'].items())}) vs the join's "
                       f"{p['join_engine_seconds']:.2f} s: {_pct(p['fraction_of_join_engine_time']).lstrip('+')}")
    drift = (r.get("drift") or {}).get("presets") or {}
    if drift:
        out.append("\n| preset | base rate (tuples/s) | batches | result rows | chains' share of task CPU | task CPU over the "
                   "fixed orders (s) | probe work max / min | work above the oracle's: fixed (mean), selectivity_first, dppick | "
                   "forecast gate failed / cycles |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for name, doc in drift.items():
            sh = doc["engine"]["order_share"]
            go = doc["loop"]["gate_outcomes"]
            fg = go.get("forecast_gate", {})
            out.append(f"| {name} | {doc['drift'].get('base_rate', '-')} | {doc['batches']} | "
                       f"{doc['engine']['result_rows'][0]:,} | {sh['chain_share_of_task_cpu']:.0%} | "
                       f"{sh['task_cpu']['min']:.2f}-{sh['task_cpu']['max']:.2f} | x{sh['probe_work']['ratio']:.1f} | "
                       f"{_above(doc, 'fixed')}, {_above(doc, 'selectivity_first')}, {_above(doc, 'dppick')} | "
                       f"{fg.get('failed', 0)} / {go['cycles']}{_bounded(go)} |")
        out.append("\n| preset | measure | dppick vs oracle | exact vs oracle | dppick below fixed (mean of orders) | "
                   "dppick below selectivity_first | exact below fixed / selectivity_first | goal met (dppick, exact) | "
                   "plan changes dppick gated / ungated (paid) |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for name, doc in drift.items():
            g = doc["drift"]["goals"]
            ch = doc.get("plan_changes", {}).get("dppick", {})
            chs = (f"{ch['gated']['changes']} ({ch['gated']['paid']}) / {ch['ungated']['changes']} "
                   f"({ch['ungated']['paid']})") if ch else "-"
            for m in [x for x in ("chain_cpu", "cpu", "wall", "work") if x in g["dppick"]]:
                d, e = g["dppick"][m], g["exact"][m]
                met = f"{'yes' if d['goal_met'] else 'no'}, {'yes' if e['goal_met'] else 'no'}"
                out.append(f"| {name} | {m} | {_pct(d['vs_oracle'])} | {_pct(e['vs_oracle'])} | "
                           f"{_pct(d['below_fixed_mean'])} | {_pct(d['below_selectivity_first'])} | "
                           f"{_pct(e['below_fixed_mean'])} / {_pct(e['below_selectivity_first'])} | {met} | "
                           f"{chs if m == 'chain_cpu' else ''} |")
        flap = {name: doc.get("plan_changes", {}) for name, doc in drift.items()}
        out.append("\nPlan changes with the gate's hysteresis (5% threshold) and without it, first initial order, "
                   "changes (of them paid, measured task CPU until the next change):\n")
        strategies = [s for s in ("selectivity_first", "greedy", "dppick", "exact", "dppick_nosmooth", "oracle")
                      if any(s in f for f in flap.values())]
        out.append("| preset | " + " | ".join(f"{s} gated / ungated" for s in strategies) + " |")
        out.append("|---|" + "---|" * len(strategies))
        for name, f in flap.items():
            cells = []
            for s in strategies:
                c = f.get(s)
                cells.append(f"{c['gated']['changes']} ({c['gated']['paid']}) / {c['ungated']['changes']} "
                             f"({c['ungated']['paid']})" if c else "-")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    sens = r.get("sensitivity") or {}
    if sens.get("cycle"):
        out.append("\n| tau (s) | batches | dppick task CPU (s) | dppick engine (s) | fixed CPU | oracle CPU | loop total (s) |")
        out.append("|---|---|---|---|---|---|---|")
        for d in sens["cycle"]:
            out.append(f"| {d['tau']} | {d['batches']} | {d['dppick']['cpu']:.3f} | {d['dppick']['wall']:.2f} | "
                       f"{d['fixed']['cpu']:.3f} | {d['oracle']['cpu']:.3f} | {d['overhead']['loop_seconds_total']:.0f} |")
    if sens.get("length"):
        out.append("\n| L | dppick task CPU (s) | dppick chains' CPU (s) | lookups + matches | oracle CPU | plan changes |")
        out.append("|---|---|---|---|---|---|")
        for d in sens["length"]:
            out.append(f"| {d['L']} | {d['dppick']['cpu']:.3f} | {d['dppick'].get('chain_cpu', 0):.3f} | "
                       f"{d['dppick']['work']:,} | {d['oracle']['cpu']:.3f} | {d['plan_changes']} |")
    peers = {k: v for k, v in (r.get("peers") or {}).items() if isinstance(v, dict) and "systems" in v}
    for label, doc in peers.items():
        out.append(f"\n**{label}**: {doc['input_tuples']:,} input tuples (CSV copies for Flink made in "
                   f"{doc['csv_conversion_seconds']:.1f} s, not timed)\n")
        out.append("| system | end to end (s), median [min, max] | input tuples/s | result rows | same rows as DuckDB "
                   "(fingerprint) | peak RSS (GB) | state (tuples) | time / mjoin's |")
        out.append("|---|---|---|---|---|---|---|---|")
        for n, sy in doc["systems"].items():
            if "error" in sy:
                if sy.get("timeout_seconds"):  # stopped by --peer-timeout (warm-up and repetitions together)
                    out.append(f"| {n} | did not finish: > {sy['timeout_seconds']:g} s for its warm-up and runs "
                               f"(stopped) | | | | | | |")
                else:
                    out.append(f"| {n} | error | | | | | | |")
                continue
            sec = sy["seconds"]
            rss = sy.get("peak_rss_bytes")
            rss = rss.get("median") if isinstance(rss, dict) else rss
            rows = sy.get("result_rows") or (sy.get("fingerprint") or {}).get("rows")
            out.append(f"| {n} | {sec['median']:.2f} [{sec['min']:.2f}, {sec['max']:.2f}] | "
                       f"{sy['throughput_tuples_per_s']:,.0f} | {rows:,} | {sy.get('results_equal_duckdb')} | "
                       f"{(rss or 0) / 1e9:.2f} | {sy.get('state_tuples') or '-'} | x{sy.get('mjoin_speedup', 0):.2f} |")
    return "\n".join(out)


def _bounded(gate_outcomes: dict) -> str:
    """Runs with the forecast's bound (mjoin.forecast.bound): in how many cycles Holt values were replaced."""
    b = gate_outcomes.get("forecast_out_of_range")
    return f"; Holt replaced by the last value in {b['cycles']} ({b['series']} series)" if b else ""


def results_section(paths: list) -> str:
    """The README's results: per results file a heading with its provenance, then :func:`markdown`'s tables."""
    from pathlib import Path

    out = []
    for path in paths:
        r = json.loads(Path(path).read_text())
        m = r.get("machine", {})
        p = r.get("parameters", {})
        what = ", ".join(str(x) for x in p.get("sections", []))
        out.append(f"\n### [`{Path(path).name}`](results/{Path(path).name}) ({r.get('mode')}: {what}; "
                   f"sf {', '.join(f'{x:g}' for x in p.get('sf', []))})\n")
        # the commit is in the results file (linked above), not in the prose
        out.append(f"{r.get('date', '?')[:16]} UTC, {r.get('seconds_total', 0) / 60:.0f} min, "
                   f"load average {m.get('load_average', ['?'])[0]:.1f} before, "
                   f"{r.get('load_average_after', ['?'])[0]:.1f} after, {m.get('cpus', '?')} cores; "
                   f"`{r.get('command', '').split('run_evaluation.py', 1)[-1].strip()}`")
        out.append(markdown(r))
    return "\n".join(out)


if __name__ == "__main__":
    if "--readme" in sys.argv:
        print(results_section([a for a in sys.argv[1:] if not a.startswith("--")]))
    else:
        doc = json.loads(open(sys.argv[1]).read())
        print(markdown(doc) if "--markdown" in sys.argv else "", end="")
        if "--markdown" not in sys.argv:
            print_summary(doc)
