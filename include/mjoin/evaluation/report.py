"""The evaluation report: table (Parquet + CSV), summary JSON, plots (PNG) and one HTML page.

Plots: cost per interval per strategy (engine CPU with the rounds' spread, probe work), regret against the
hindsight oracle, forecast vs actual statistics, and plan changes over time. The summary ranks the strategies
by the engine CPU they measured (the median over rounds of the total over intervals, min-max beside it), with
the probe work beside it; every strategy has its own colour and marker (:func:`styles`).
"""
from __future__ import annotations

import html
import json
import logging
import os

import pandas as pd

from mjoin.runtime import fsutil

log = logging.getLogger(__name__)

COST = "probe_work"  # the deterministic work (lookups + matches), beside the measured CPU the report ranks by
RANK = "engine_cpu_seconds"  # what the report ranks by: the engine's CPU, median over rounds
#: one colour per strategy (matplotlib's tab20, dark and light of each hue apart): 11 strategies, 11 colours (the
#: default cycle has 10, so the 11th repeated the first)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#ad494a", "#637939", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
           "#c49c94", "#f7b6d2")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p", "8", "d", "H", "+", "x", "1", "2", "3")


def styles(names) -> dict:
    """``{strategy: (colour, marker)}``, distinct for up to 20 strategies, in the order given."""
    return {n: (PALETTE[i % len(PALETTE)], MARKERS[i % len(MARKERS)]) for i, n in enumerate(dict.fromkeys(names))}


def _plt():
    # imported on the first plot, not at the top: matplotlib.pyplot takes ~1-2 s to import, and the report's
    # tables (and the UI page that reads them) need no plot
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_evaluation_report(result, history=None, query=None) -> str:
    """Write everything under ``result.report_dir``; returns the HTML path."""
    out = result.report_dir
    fsutil.makedirs(out)
    local = None if fsutil.is_url(out) else out
    table = pd.DataFrame(result.rows)
    if len(table):
        table = table.assign(orders=table["orders"].map(lambda o: json.dumps(o, sort_keys=True)))
    fsutil.atomic_write_text(fsutil.join(out, "evaluation.csv"), table.to_csv(index=False))
    fsutil.atomic_write_text(fsutil.join(out, "summary.json"), json.dumps(
        {"summary": result.summary, "meta": result.meta, "seconds": result.seconds}, indent=2, default=str))
    fsutil.atomic_write_text(fsutil.join(out, "series.json"), json.dumps(result.series, default=str))
    if local:
        table.to_parquet(os.path.join(local, "evaluation.parquet"), index=False)
    plots = []
    if local and len(table):
        style = styles(table["strategy"])  # one colour per strategy in every plot, in the evaluation's order
        plots = [p for p in (_plot_cost(table, local, style), _plot_regret(result.summary, local, style),
                             _plot_series(result.series, local), _plot_changes(table, local)) if p]
    page = _html(result, table, plots)
    path = fsutil.join(out, "index.html")
    fsutil.atomic_write_text(path, page)
    log.info("evaluation report: %s", path)
    return path


def _first_order(table):
    return table[table["initial_order"] == table["initial_order"].iloc[0]]


def _plot_cost(table, out, style: dict) -> str:
    plt = _plt()
    t = _first_order(table)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for name, g in t.groupby("strategy", sort=False):
        g = g.sort_values("interval")
        colour, marker = style[name]
        if "engine_cpu_rounds" in g:
            lo = [min(r) for r in g["engine_cpu_rounds"]]
            hi = [max(r) for r in g["engine_cpu_rounds"]]
            mid = list(g[RANK])
            axes[0].errorbar(g["interval"], mid, yerr=[[m - a for m, a in zip(mid, lo)], [b - m for m, b in zip(mid, hi)]],
                             marker=marker, color=colour, label=name, capsize=3)
        axes[1].plot(g["interval"], g[COST], marker=marker, color=colour, label=name)
    axes[0].set(title="engine CPU per interval (median of the rounds, bars: min-max)", xlabel="interval",
                ylabel="CPU seconds")
    axes[1].set(title="probe work per interval (lookups + matches)", xlabel="interval", ylabel="probe work")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "cost_per_interval.png"), dpi=110)
    plt.close(fig)
    return "cost_per_interval.png"


def _plot_regret(summary, out, style: dict) -> str | None:
    plt = _plt()
    first = summary[0]["initial_order"] if summary else None
    rows = [s for s in summary if s["initial_order"] == first]
    if not rows:
        return None
    oracle = next((s for s in rows if s["strategy"] == "oracle"), None)
    base = oracle[COST] if oracle and oracle[COST] else None
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [s["strategy"] for s in rows]
    vals = [(s[COST] / base - 1) * 100 if base else s["regret_work"] for s in rows]
    ax.barh(names, vals, color=[style.get(n, ("#777",))[0] for n in names])
    ax.set(title="regret against the hindsight oracle" + (" (% more probe work)" if base else ""),
           xlabel="%" if base else "probe work")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "regret.png"), dpi=110)
    plt.close(fig)
    return "regret.png"


def _plot_series(series, out) -> str | None:
    if not series:
        return None
    plt = _plt()
    df = pd.DataFrame(series)
    picks = []
    for stat in ("lambda", "gamma"):
        names = df[df["statistic"] == stat]["series"].unique()[:3]
        picks += [(stat, n) for n in names]
    if not picks:
        return None
    fig, axes = plt.subplots(len(picks), 1, figsize=(9, 2.2 * len(picks)), sharex=True)
    axes = [axes] if len(picks) == 1 else axes
    for ax, (stat, name) in zip(axes, picks):
        g = df[(df["statistic"] == stat) & (df["series"] == name)].sort_values("interval")
        ax.plot(g["interval"], g["actual"], "k-o", label="actual (interval)")
        ax.plot(g["interval"], g["forecast"], "b--s", label="Holt forecast")
        ax.plot(g["interval"], g["last_value"], "r:^", label="last value")
        ax.set_ylabel(f"{stat} {name}", fontsize=8)
    axes[0].legend(fontsize=7)
    axes[-1].set_xlabel("interval")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "forecast_vs_actual.png"), dpi=110)
    plt.close(fig)
    return "forecast_vs_actual.png"


def _plot_changes(table, out) -> str | None:
    plt = _plt()
    t = _first_order(table)
    strategies = list(dict.fromkeys(t["strategy"]))
    intervals = sorted(t["interval"].unique())
    ids = sorted(t["plan_id"].unique(), key=lambda p: int(p[1:]) if p[1:].isdigit() else 0)
    code = {p: i for i, p in enumerate(ids)}
    grid = [[code[t[(t["strategy"] == s) & (t["interval"] == k)]["plan_id"].iloc[0]] for k in intervals] for s in strategies]
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(intervals) + 3), 0.4 * len(strategies) + 1.5))
    ax.imshow(grid, aspect="auto", cmap="tab20", interpolation="nearest")
    ax.set_yticks(range(len(strategies)), strategies, fontsize=8)
    ax.set_xticks(range(len(intervals)), intervals, fontsize=7)
    ax.set(title="plans over time (same colour = same plan)", xlabel="interval")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "plan_changes.png"), dpi=110)
    plt.close(fig)
    return "plan_changes.png"


def html_table(rows, columns, fmt=None) -> str:
    """An HTML table of ``rows`` (dicts) over ``columns``, each cell ``fmt(value)`` escaped (the report's and the UI's)."""
    fmt = fmt or _fmt
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _html(result, table, plots) -> str:
    meta = result.meta
    cfg = meta.get("config", {})
    parts = [f"<h1>mjoin evaluation: {html.escape(str(meta.get('query')))}</h1>",
             f"<p>{len(meta.get('intervals', []))} intervals of {cfg.get('period')} s from {html.escape(str(cfg.get('start')))} "
             f"to {html.escape(str(cfg.get('end')))}; statistics cycle {cfg.get('cycle')} s, L = {cfg.get('length')}; "
             f"evaluated in {result.seconds:.1f} s. <b>Ranked by the engine's CPU</b>: every distinct plan ran "
             f"{_rounds(result.summary)} round(s); per round the CPU of the strategy's plans summed over the intervals, "
             "the median over rounds (min-max: the rounds' spread). Probe work (lookups + matches of the engine, "
             "deterministic) beside it, and the batches' wall time. Plans only use statistics from before each interval, "
             "except the hindsight <b>oracle</b> (exact DP on the interval's own statistics). "
             "regret_work = measured probe work minus the oracle's (may be slightly negative: the cost "
             "model is a model); regret_estimated = cost minus the oracle's under the interval's own "
             "statistics (never negative).</p>",
             "<h2>Summary</h2>",
             html_table(_ranked(result.summary), ["initial_order", "rank", "strategy", "engine_cpu_seconds",
                                                  "engine_cpu_spread", "probe_work", "regret_work", "regret_estimated",
                                                  "intervals", "lookups", "matches", "probe_seconds", "batch_seconds",
                                                  "plan_changes"])]
    for p in plots:
        parts.append(f'<h2>{html.escape(p[:-4].replace("_", " "))}</h2><img src="{p}" style="max-width:100%">')
    if len(table):
        parts.append("<h2>Per interval</h2>" + html_table(table.to_dict("records"), [
            "interval", "interval_start", "initial_order", "strategy", "plan_id", "engine_cpu_seconds", "probe_work",
            "batch_seconds",
            "estimated_cost_forecast", "estimated_cost_oracle", "result_rows", "note", "orders"]))
    style = ("body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:collapse;margin:0.5em 0 1.5em}"
             "td,th{border:1px solid #ccc;padding:2px 6px;font-size:12px;text-align:left}th{background:#eee}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>mjoin evaluation</title><style>{style}</style>"
            f"</head><body>{''.join(parts)}</body></html>")


def _rounds(summary: list[dict]) -> int:
    return max((int(s.get("rounds") or 1) for s in summary), default=1)


def _ranked(summary: list[dict]) -> list[dict]:
    """The summary rows with their rank by engine CPU within their initial order and the spread as text."""
    out, rank = [], {}
    for s in summary:  # already sorted by (initial order, engine CPU)
        rank[s["initial_order"]] = rank.get(s["initial_order"], 0) + 1
        lo, hi = s.get("engine_cpu_min"), s.get("engine_cpu_max")
        out.append({**s, "rank": rank[s["initial_order"]],
                    "engine_cpu_spread": f"{lo:.3f}-{hi:.3f}" if lo is not None and hi is not None else ""})
    return out


def format_summary(summary: list[dict]) -> str:
    """The comparison as text, ranked by engine CPU (median over rounds, min-max), probe work beside it."""
    lines = [f"{'initial order':<14} {'strategy':<18} {'engine CPU s':>12} {'(min-max)':>15} {'probe work':>11} "
             f"{'vs oracle':>9} {'changes':>7}  key groups"]
    oracle = {s["initial_order"]: s["probe_work"] for s in summary if s["strategy"] == "oracle"}
    for s in _ranked(summary):
        base = oracle.get(s["initial_order"])
        rel = f"{(s['probe_work'] / base - 1) * 100:+.1f}%" if base else "-"
        cpu = s.get("engine_cpu_seconds")
        lines.append(f"{s['initial_order']:<14} {s['strategy']:<18} {cpu if cpu is not None else float('nan'):>12.3f} "
                     f"{s['engine_cpu_spread']:>15} {s['probe_work']:>11,} {rel:>9} {s['plan_changes']:>7}  "
                     + ",".join(str(g) for g in s.get("key_groups", [])))
    lines.append(f"ranked by the engine's CPU (median of {_rounds(summary)} round(s) of every plan; min-max: the "
                 "rounds' spread); probe work = lookups + matches")
    return "\n".join(lines)
