"""Error of the sketch mode against exact mode, per statistic, on TPC-DS and on skewed synthetic data.

Error per (cycle, key group, stream or edge) is the skimmed-sketch paper's symmetric error
``max(x/x', x'/x) - 1`` (capped at 10 when exactly one side is 0), over the cells where the
exact value is > 0; reported as mean, p90 and max, per sketch size. A second, numpy-only
part repeats the paper's comparison of skimmed vs basic hash sketches for the join size of
two right-shifted Zipf streams at equal memory.

    python bench/stats/sketch_error.py --quick
    python bench/stats/sketch_error.py            # sf 1, 10^6-key domains, more sketch sizes

Writes bench/stats/results/sketch-error[-quick].json and .png.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "include"))

from _common import land_skewed, land_tpcds_replay, machine_info, spark_session, write_json, zipf_keys  # noqa: E402

EDGE_STATS = ("m", "s", "gamma", "mu")


def errors(exact: pd.DataFrame, approx: pd.DataFrame) -> dict:
    from mjoin.stats.sketch import symmetric_error

    keys = ["cycle_start", "group", "entity", "stream", "right"]
    m = exact.merge(approx, on=keys, suffixes=("_x", "_s"))
    out = {}
    for stat, ent in [("kappa", "stream")] + [(s, "edge") for s in EDGE_STATS]:
        sub = m[(m.entity == ent) & (m[f"{stat}_x"] > 0)]
        if stat in ("gamma", "mu"):
            sub = sub[sub["m_x"] > 0]
        e = np.array([symmetric_error(a, b) for a, b in zip(sub[f"{stat}_s"], sub[f"{stat}_x"])])
        out[stat] = {"cells": int(len(e)), "mean": float(e.mean()) if len(e) else None,
                     "p90": float(np.quantile(e, 0.9)) if len(e) else None, "max": float(e.max()) if len(e) else None}
    ed = m[m.entity == "edge"]
    out["total_s"] = symmetric_error(float(ed["s_s"].sum()), float(ed["s_x"].sum()))
    out["total_m"] = symmetric_error(float(ed["m_s"].sum()), float(ed["m_x"].sum()))
    return out


def spark_part(args, configs) -> dict:
    from mjoin.lake.layout import Lake
    from mjoin.model.query import load_query
    from mjoin.stats.sketch import SketchConfig
    from mjoin.stats.job import StatsConfig, compute_statistics

    query = load_query("tpcds_returns_by_address")
    spark = spark_session()
    tmp = Path(tempfile.mkdtemp(prefix="mjoin-sketch-error-"))
    workloads = {}
    span = int(args.minutes * 60)
    lake = Lake(str(tmp / "tpcds" / "lake"))
    t0, t1, counts = land_tpcds_replay(lake, args.sf, args.rate)
    workloads["tpcds"] = (lake, t0, min(t1, t0 + span) // args.cycle * args.cycle, {"sf": args.sf, "rows": counts})
    for z in (1.0, 1.5):
        lake = Lake(str(tmp / f"zipf{z}" / "lake"))
        shifts = {"cu": 0, "sr": 30, "wr": 100, "cr": 300}
        t0, t1 = land_skewed(lake, span, args.rate / 4, z, args.domain, shifts, seed=int(z * 10))
        workloads[f"zipf{z}"] = (lake, t0, t1, {"z": z, "domain": args.domain, "shifts": shifts})
    out = {}
    for name, (lake, t0, t1, meta) in workloads.items():
        exact = compute_statistics(spark, query, lake, t0, t1, args.cycle)
        res = {"meta": meta, "interval_seconds": t1 - t0,
               "exact_seconds": exact.summary["wall_seconds"]["compute"], "configs": []}
        for width, sample_keys, dense in configs:
            cfg = SketchConfig(width=width, sample_keys=sample_keys, dense_keys=dense)
            run = compute_statistics(spark, query, lake, t0, t1, args.cycle, StatsConfig(mode="sketch", sketch=cfg))
            rec = {"width": width, "depth": cfg.depth, "sample_keys": sample_keys, "dense_keys": dense,
                   "sketch": run.summary["sketch"], "seconds": run.summary["wall_seconds"]["compute"],
                   "errors": errors(exact.rows, run.rows)}
            res["configs"].append(rec)
            e = rec["errors"]
            print(f"{name:8s} w={width:5d} sample={sample_keys:5d}: "
                  + "  ".join(f"{k} {e[k]['mean']:.3f}" for k in ("kappa",) + EDGE_STATS if e[k]["mean"] is not None)
                  + f"  total_s {e['total_s']:.3f}  bytes/slice {run.summary['sketch']['max_slice_bytes']}")
        out[name] = res
    return out


def numpy_part(args) -> dict:
    """Skimmed vs basic hash sketch, join size of Zipf(z) and Zipf(z) shifted, equal memory."""
    from mjoin.stats import sketch as sk

    rng = np.random.default_rng(3)
    out = []
    n = 200_000 if not args.quick else 50_000
    for z in (1.0, 1.5):
        for shift in (0, 50, 200):
            a = zipf_keys(rng, n, z, args.domain)
            b = zipf_keys(rng, n, z, args.domain) + shift
            ua, ca = np.unique(a, return_counts=True)
            ub, cb = np.unique(b, return_counts=True)
            _, ia, ib = np.intersect1d(ua, ub, return_indices=True)
            J = float((ca[ia] * cb[ib]).sum())
            for width in (256, 1024):
                h = sk.NumpyHasher(5, width, seed=shift)
                dense = np.union1d(ua[np.argsort(-ca)[:64]], ub[np.argsort(-cb)[:64]])
                skim = sk.join_size(sk.build(a, h, dense=dense), sk.build(b, h, dense=dense))
                # equal memory: the basic sketch gets the dense keys' bytes as extra buckets
                hb = sk.NumpyHasher(5, width + len(dense) * 16 // (5 * 8), seed=shift)
                basic = sk.join_size(sk.build(a, hb, dense_keys=0), sk.build(b, hb, dense_keys=0))
                out.append({"z": z, "shift": shift, "width": width, "join_size": J,
                            "skimmed_error": sk.symmetric_error(skim, J), "basic_error": sk.symmetric_error(basic, J)})
                print(f"numpy z={z} shift={shift} w={width}: skimmed {out[-1]['skimmed_error']:.3f} "
                      f"basic {out[-1]['basic_error']:.3f}")
    return {"rows_per_stream": n, "results": out}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sf", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=2000.0)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--cycle", type=int, default=10)
    ap.add_argument("--domain", type=int, default=1_000_000)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    configs = [(256, 256, 16), (1024, 1024, 64), (4096, 8192, 128)]
    if args.quick:
        args.sf, args.rate, args.minutes, args.domain = 0.1, 400.0, 3, 100_000
        configs = [(256, 256, 16), (1024, 4096, 64)]
    doc = {"benchmark": "sketch-error", "machine": machine_info(),
           "parameters": {"sf": args.sf, "rate": args.rate, "minutes": args.minutes, "cycle": args.cycle,
                          "domain": args.domain, "configs": configs,
                          "error": "symmetric max(x/x', x'/x) - 1 over cells with exact > 0"},
           "numpy_skimmed_vs_basic": numpy_part(args), "spark": spark_part(args, configs)}
    name = "sketch-error-quick" if args.quick else "sketch-error"
    write_json(Path(args.out) / f"{name}.json", doc)
    _plot(doc, Path(args.out) / f"{name}.png")
    return 0


def _plot(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (wl, res) in zip(axes, doc["spark"].items()):
        for stat in ("kappa",) + EDGE_STATS:
            xs = [c["sketch"]["max_slice_bytes"] / 1024 for c in res["configs"]]
            ys = [c["errors"][stat]["mean"] for c in res["configs"]]
            ax.plot(xs, ys, "o-", label=stat)
        ax.set_xscale("log")
        ax.set_xlabel("sketch KiB per stream slice")
        ax.set_ylabel("mean symmetric error vs exact")
        ax.set_title(wl, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
