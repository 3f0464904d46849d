"""Benchmark: the engine with and without an environment switch, alternating in one process (issue 15). For
each density of one size and each engine path (``bench_scale.engine_config``), the interval run of
``bench_scale.run_mjoin`` with every variant of ``--env`` (``NAME=VALUE``, several per variant with ``,``),
one untimed warm-up of each, then ``--rounds`` rounds, the variants' order alternating; results compared by
fingerprint. The footers cache is off (``MJOIN_FOOTERS_CACHE=0``: every run checks its files cold, as a first
run does), unless a variant sets it.

    flock /tmp/mjoin-bench.lock nice -n 5 .venv/bin/python bench/scale/ab_env.py --sf 1 \\
        --env MJOIN_DUCKDB_READ=0 MJOIN_DUCKDB_READ=1 --paths default spark --tag reader

Writes ``results/ab-<tag>-sf<sf>.json`` (machine, versions, load, git commit, date, one row per run, medians
and spread per (density, path, variant)) and prints one JSON line per run."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_scale as B  # noqa: E402  (puts include/ and tests/ on sys.path)


def parse_variant(text: str) -> dict:
    """``"A=1,B=x"`` -> ``{"A": "1", "B": "x"}``."""
    out = {}
    for part in filter(None, text.split(",")):
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise SystemExit(f"--env: {part!r} is not NAME=VALUE")
        out[name.strip()] = value.strip()
    return out


def summarise(runs: list) -> dict:
    """Per ``density/path/variant``: medians and spread of the wall, the input share, the phases."""
    out: dict = {}
    for key in dict.fromkeys((r["density"], r["path"], r["variant"]) for r in runs):
        rs = [r for r in runs if (r["density"], r["path"], r["variant"]) == key]
        out["/".join(key)] = {
            "wall_seconds": B.median_spread([r["wall_seconds"] for r in rs]),
            "prepare_seconds": B.median_spread([r["prepare_seconds"] for r in rs]),
            "input_share": B.median_spread([r["input_share"] for r in rs]),
            "phases": {k: B.median_spread([r["phases"][k] for r in rs]) for k in rs[0]["phases"]},
            "result_rows": rs[0]["result_rows"], "execution": rs[0]["execution"]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sf", type=float, default=1)
    ap.add_argument("--densities", nargs="+", choices=list(B.DENSITIES), default=list(B.DENSITIES))
    ap.add_argument("--paths", nargs="+", choices=("default", "spark", "driver"), default=["default", "spark"])
    ap.add_argument("--env", nargs="+", required=True, help="variants, each NAME=VALUE[,NAME=VALUE]")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/tmp/scale-work")
    ap.add_argument("--tag", required=True)
    args = ap.parse_args(argv)
    variants = {v: parse_variant(v) for v in args.env}
    os.environ.setdefault("MJOIN_FOOTERS_CACHE", "0")
    from mjoin import contract
    from mjoin.engine.metrics import git_commit, machine
    from mjoin.resources import Resources
    from mjoin.sparkutil import get_spark

    spark = get_spark("bench-ab-env", Resources(spark_master="local[2]", shuffle_partitions=4),
                      conf={"spark.driver.memory": "6g"})
    out = Path(args.work) / f"ab-env-out-{os.getpid()}"
    doc = {"benchmark": "ab_env", "sf": args.sf, "variants": variants, "paths": args.paths,
           "machine": machine(), "versions": B.versions(), "git_commit": git_commit(HERE.parent.parent),
           "load_before": os.getloadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "command": " ".join(sys.argv), "runs": []}
    base = dict(os.environ)

    def run(density, landed, span, path, variant, r):
        os.environ.clear()
        os.environ.update({**base, **variants[variant]})
        contract.FOOTERS.clear()
        try:
            load = os.getloadavg()[0]
            res = B.run_mjoin(spark, landed, out, span, B.engine_config(path))
        finally:
            os.environ.clear()
            os.environ.update(base)
        row = {"density": density, "path": path, "variant": variant, "round": r, "load": load,
               **{k: v for k, v in res.items() if k != "spark_stages"}}
        print(json.dumps(row, default=str), flush=True)
        return row

    for density in args.densities:
        landed, manifest = B.workload(args.sf, density, Path(args.work))
        start = int(manifest.doc["start_epoch"])
        span = (start, start + B.DENSITIES[density])
        for path in args.paths:
            names = list(variants)
            for v in names:  # warm-up
                run(density, landed, span, path, v, -1)
            for r in range(args.rounds):
                for v in (names if r % 2 == 0 else names[::-1]):
                    doc["runs"].append(run(density, landed, span, path, v, r))
    shutil.rmtree(out, ignore_errors=True)
    spark.stop()
    doc["load_after"] = os.getloadavg()
    doc["summary"] = summarise(doc["runs"])
    doc["identical_results"] = {d: len({json.dumps(r["fingerprint"], sort_keys=True) for r in doc["runs"]
                                        if r["density"] == d}) == 1 for d in args.densities}
    path = HERE / "results" / f"ab-{args.tag}-sf{args.sf:g}.json"
    path.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps({"summary": doc["summary"], "identical_results": doc["identical_results"]}, indent=1))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
