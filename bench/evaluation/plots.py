"""Plots of run_evaluation.py's results (``--plot-only RESULTS.json`` redraws them)."""
from __future__ import annotations

from pathlib import Path

STRATS = ("fixed", "selectivity_first", "greedy", "dppick", "exact", "dppick_query", "dppick_match",
          "dppick_nosmooth", "oracle")
COLORS = {"fixed": "#8c8c8c", "selectivity_first": "#dd8452", "greedy": "#c44e52", "dppick": "#4c72b0",
          "exact": "#55a868", "dppick_query": "#8172b3", "dppick_match": "#937860", "dppick_nosmooth": "#da8bc3",
          "oracle": "#000000"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_all(result: dict, stem: Path) -> list:
    out = []
    if result.get("paper"):
        out.append(plot_paper(result, Path(f"{stem}_paper.png")))
    if result.get("sensitivity", {}).get("cycle"):
        out.append(plot_sensitivity(result, Path(f"{stem}_sensitivity.png")))
    if result.get("drift", {}).get("presets"):
        out.append(plot_drift(result, Path(f"{stem}_drift.png")))
    if result.get("peers"):
        out.append(plot_peers(result, Path(f"{stem}_peers.png")))
    return out


def plot_paper(result: dict, path: Path) -> Path:
    plt = _plt()
    docs = {k: v for k, v in result["paper"].items() if isinstance(v, dict) and "strategies" in v}
    fig, axes = plt.subplots(len(docs), 2, figsize=(15, 3.6 * len(docs)), squeeze=False)
    for row, (label, doc) in zip(axes, docs.items()):
        st = doc.get("strategies", {})
        names = [s for s in STRATS if s in st and "gated" in st[s]]
        for ax, m, what in ((row[0], "cpu", "task CPU (s)"), (row[1], "wall", "engine time (s)")):
            means = [st[s]["gated"][f"{m}_mean"] for s in names]
            lo = [min(v[m]["median"] for v in st[s]["gated"]["per_order"].values()) for s in names]
            hi = [max(v[m]["median"] for v in st[s]["gated"]["per_order"].values()) for s in names]
            ax.bar(range(len(names)), means, color=[COLORS[s] for s in names],
                   yerr=[[a - b for a, b in zip(means, lo)], [b - a for a, b in zip(means, hi)]], capsize=3)
            ax.set_xticks(range(len(names)), names, rotation=30, fontsize=8)
            ax.set_ylabel(what)
            pm = doc.get("paper", {}).get(m, {})
            ax.set_title(f"{label}: {what}, mean over {pm.get('orders', '?')} initial orders (bars: min-max); "
                         f"dppick fastest in {pm.get('dppick_fastest', '?')}", fontsize=9)
            lo_y = min(lo) if lo else 0
            ax.set_ylim(bottom=max(0, lo_y * 0.9))
    fig.suptitle(f"composed engine cost per strategy (load {result.get('machine', {}).get('load_average', ['?'])[0]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sensitivity(result: dict, path: Path) -> Path:
    plt = _plt()
    sens = result["sensitivity"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    taus = [d["tau"] for d in sens["cycle"]]
    for s in ("fixed", "dppick", "oracle"):
        axes[0].plot(taus, [d[s]["cpu"] for d in sens["cycle"]], "o-", color=COLORS[s], label=s)
    axes[0].set_xlabel("statistics cycle = batch, tau (s)")
    axes[0].set_ylabel("composed task CPU of the interval (s)")
    axes[0].set_title("cycle length (paper Fig. 4)")
    axes[0].legend(fontsize=8)
    axes[1].plot(taus, [d["overhead"]["loop_seconds_total"] for d in sens["cycle"]], "s-", color="#c44e52",
                 label="the loop's steps, summed")
    axes[1].plot(taus, [d["dppick"]["wall"] for d in sens["cycle"]], "o-", color=COLORS["dppick"],
                 label="the join's engine time (dppick)")
    axes[1].set_xlabel("tau (s)")
    axes[1].set_ylabel("seconds over the interval")
    axes[1].set_yscale("log")
    axes[1].set_title("loop overhead vs join time")
    axes[1].legend(fontsize=8)
    Ls = [d["L"] for d in sens["length"]]
    for s in ("dppick", "oracle"):
        axes[2].plot(Ls, [d[s]["cpu"] for d in sens["length"]], "o-", color=COLORS[s], label=s)
    axes[2].set_xlabel("history length L (cycles)")
    axes[2].set_ylabel("composed task CPU (s)")
    axes[2].set_title("history length (paper Fig. 5)")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_drift(result: dict, path: Path) -> Path:
    import numpy as np

    plt = _plt()
    presets = result["drift"]["presets"]
    fig, axes = plt.subplots(len(presets), 1, figsize=(13, 3.0 * len(presets)), squeeze=False)
    for ax, (name, doc) in zip(axes[:, 0], presets.items()):
        per = doc["drift"].get("per_cycle_chain_cpu") or doc["drift"]["per_cycle_cpu"]
        for s in ("fixed", "selectivity_first", "greedy", "dppick", "oracle"):
            y = np.asarray(per[s], dtype=float)
            k = max(1, len(y) // 40)
            ys = np.convolve(y, np.ones(k) / k, mode="same")
            ax.plot(ys * 1000, color=COLORS[s], label=s, lw=1.6 if s in ("dppick", "oracle") else 1)
        g = doc["drift"]["goals"]["dppick"].get("chain_cpu") or doc["drift"]["goals"]["dppick"]["cpu"]
        ax.set_title(f"{name} (chains' CPU, the order-dependent part): dppick vs oracle {g['vs_oracle']:+.1%}, below fixed (mean of orders) "
                     f"{g['below_fixed_mean']:.1%}, below selectivity_first {g['below_selectivity_first']:.1%}",
                     fontsize=9)
        ax.set_ylabel("chains' CPU per batch (ms)")
        ax.legend(fontsize=7, ncol=5)
    axes[-1, 0].set_xlabel("batch (cycle)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_peers(result: dict, path: Path) -> Path:
    plt = _plt()
    cases = {k: v for k, v in result["peers"].items() if isinstance(v, dict) and "systems" in v}
    fig, axes = plt.subplots(1, len(cases), figsize=(7 * len(cases), 4.5), squeeze=False)
    for ax, (label, doc) in zip(axes[0], cases.items()):
        names = [n for n, s in doc["systems"].items() if s.get("throughput_tuples_per_s")]
        vals = [doc["systems"][n]["throughput_tuples_per_s"] for n in names]
        colors = ["#4c72b0" if n.startswith("mjoin") else "#c44e52" if "spark" in n else
                  "#55a868" if n == "duckdb" else "#dd8452" for n in names]
        ax.bar(range(len(names)), vals, color=colors)
        for i, n in enumerate(names):
            eq = doc["systems"][n].get("results_equal_duckdb")
            ax.annotate("=" if eq else "!=", (i, vals[i]), ha="center", va="bottom", fontsize=9)
        ax.set_xticks(range(len(names)), names, rotation=25, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("input tuples / s (end to end, all data available)")
        ax.set_title(f"{label}: {doc['input_tuples']:,} tuples ('=': same rows as DuckDB)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_overhead_rate(result: dict, path: Path) -> Path:
    """overhead_rate.py: the loop's time over the join's for the same interval against the arrival rate, log-log,
    per DAG period and per 10-s cycle (one line per scale factor), with the 5% goal and where the ratio crosses it."""
    plt = _plt()
    pts = sorted((p for p in result.get("points", []) if "period" in p), key=lambda p: p["rate"])
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for sf, marker in zip(sorted({p["sf"] for p in pts}), "o^sD"):
        grp = [p for p in pts if p["sf"] == sf]
        rates = [p["rate"] for p in grp]
        per_period = [p["period"]["ratio_median"] for p in grp]
        ax.plot(rates, [p["cycle"]["ratio"] for p in grp], marker + "--", color="#8c8c8c", mfc="none",
                label=f"sf {sf:g}: per 10-s cycle (all cycles)")
        ax.plot(rates, per_period, marker + "-", color=COLORS["dppick"], lw=1.8,
                label=f"sf {sf:g}: per {grp[0]['period']['seconds']}-s DAG period (median; bar: the periods)")
        if all(p["period"].get("ratio_median_round") for p in grp):
            ax.plot(rates, [p["period"]["ratio_median_round"] for p in grp], marker + ":", color=COLORS["dppick"],
                    mfc="none", lw=1, label=f"sf {sf:g}: per period, the join of the median engine round")
        for p, y in zip(grp, per_period):
            rs = [x for x in p["period"]["ratios"] if x is not None]
            if rs:
                ax.vlines(p["rate"], min(rs), max(rs), color=COLORS["dppick"], lw=1)
            ax.annotate(f"{100 * y:.0f}%", (p["rate"], y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.axhline(0.05, color="#c44e52", lw=1, label="goal: 5%")
    for name, cr in result.get("crossing", {}).items():
        x = cr.get("per_period", {}) if isinstance(cr, dict) else {}
        if name == "all" or not x.get("rate"):
            continue
        label = f"{name} per period: 5% at {x['rate']:.3g}/s ({x['how'].split(' (')[0]})"
        if x["rate"] <= 20 * max(p["rate"] for p in pts):
            ax.axvline(x["rate"], color="#c44e52", ls=":", lw=1, label=label)
        else:  # far beyond the measured rates: named, not drawn
            ax.plot([], [], " ", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("total arrival rate (tuples/s, the paper replay of TPC-DS)")
    ax.set_ylabel("loop / join engine time, same interval")
    loads = [x for p in pts for x in (p.get("load_average_before", [None])[0], p.get("load_average_after", [None])[0])
             if x is not None]
    ax.set_title("the loop's overhead against the rate (seed query"
                 + (f"; load {min(loads):.1f}-{max(loads):.1f})" if loads else ")"), fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
