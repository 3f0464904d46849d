"""Benchmark: the contract's duplicate check (``contract.Seen``) as the number of files grows.

    python bench/scale/bench_seen.py                         # this tree against main, 720 and 5,000 files
    python bench/scale/bench_seen.py --base <rev> --files 720 5000 20000

Side by side in one process, ``Seen`` of ``--base`` (its ``include/mjoin/lake/contract.py`` from git) and of
this tree, on the same synthetic files (no footer is read: ``FileFacts`` as the contract builds them,
4 streams, the lake's positional names ``part-<n>.parquet``, distinct footer fingerprints, sizes drawn
from 20-60 kB, so equal sizes occur and are compared by their bytes, here of files that do not exist: both
versions then fall back on name and fingerprint, the same way). Two uses, medians of ``--rounds``:

- **interval**: every file of the interval checked against the files accepted before it, then added
  (``normalize.inspect_files`` with a fresh ``Seen``: the interval run and the input gate);
- **micro-batch**: a streaming job's ``Seen`` restored from its manifest with all the files remembered,
  then one micro-batch of 40 new files checked and added.

Writes ``results/seen-<n>.json`` (machine, load before/after, versions, commits, parameters).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))


def contract_of(rev: str):
    """``mjoin.lake.contract`` as it is at git ``rev`` (a module of its own, beside this tree's)."""
    import mjoin

    src = subprocess.run(["git", "show", f"{rev}:include/mjoin/lake/contract.py"], cwd=PROJECT, check=True,
                         capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader(f"mjoin._contract_{rev}", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = mjoin.__name__
    sys.modules[spec.name] = mod  # (dataclasses look their module up)
    exec(compile(src, f"{rev}:include/mjoin/lake/contract.py", "exec"), mod.__dict__)
    return mod


def landing(C, n: int, seed: int = 0) -> list:
    """``n`` files of 4 streams in arrival order, as the contract's ``FileFacts``."""
    rng = random.Random(seed)
    streams = ["customer", "store_returns", "web_returns", "catalog_returns"]
    return [C.FileFacts(path=f"/nonexistent/streams/{s}/arrival={1_700_000_000 + 10 * (i // 4)}/part-00000.parquet",
                        stream=s, size=rng.randrange(20_000, 60_000), rows=rng.randrange(500, 2000),
                        fingerprint=f"{i:064x}", ts_max=1_700_000_000.0 + 10 * (i // 4))
            for i, s in ((i, streams[i % 4]) for i in range(n))]


def interval(C, facts) -> tuple[float, int]:
    seen, dups = C.Seen(), 0
    t0 = time.perf_counter()
    for f in facts:
        if seen.duplicate_of(f):
            dups += 1
        else:
            seen.add(f)
    return time.perf_counter() - t0, dups


def micro_batch(C, facts, batch: int = 40) -> tuple[float, int]:
    remembered = C.Seen()
    for f in facts[:-batch]:
        remembered.add(f)
    doc = remembered.to_json()
    t0 = time.perf_counter()
    seen, dups = C.Seen(doc), 0
    for f in facts[-batch:]:
        if seen.duplicate_of(f):
            dups += 1
        else:
            seen.add(f)
    return time.perf_counter() - t0, dups


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="main", help="git revision to compare against (default: main)")
    ap.add_argument("--files", type=int, nargs="*", default=[720, 5000])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    from mjoin.lake import contract as new
    from mjoin.engine.metrics import git_commit, machine

    old = contract_of(args.base)
    base_commit = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=PROJECT, capture_output=True,
                                 text=True).stdout.strip()
    doc = {"benchmark": "seen", "machine": machine(), "load_before": os.getloadavg(), "git_commit": git_commit(PROJECT),
           "base": {"rev": args.base, "commit": base_commit}, "versions": {"python": sys.version.split()[0]},
           "parameters": {"files": args.files, "rounds": args.rounds, "streams": 4, "micro_batch_files": 40},
           "results": {}}
    for n in args.files:
        row = {}
        for use, fn in (("interval", interval), ("micro_batch", micro_batch)):
            times: dict = {"base": [], "this": []}
            dups = {}
            for r in range(args.rounds):  # alternating, so both see the same load
                for tree, C in (("base", old), ("this", new)) if r % 2 == 0 else (("this", new), ("base", old)):
                    facts = landing(C, n)
                    t, dups[tree] = fn(C, facts)
                    times[tree].append(t)
            assert dups["base"] == dups["this"], (n, use, dups)
            row[use] = {tree: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
                        for tree, v in times.items()}
            row[use]["duplicates"] = dups["this"]
            row[use]["speedup"] = row[use]["base"]["median"] / row[use]["this"]["median"]
            print(f"{n} files, {use}: base {row[use]['base']['median'] * 1e3:.1f} ms, "
                  f"this {row[use]['this']['median'] * 1e3:.1f} ms ({row[use]['speedup']:.1f}x), "
                  f"{dups['this']} duplicates", flush=True)
        doc["results"][str(n)] = row
    doc["load_after"] = os.getloadavg()
    out = HERE / "results" / f"seen-{'-'.join(map(str, args.files))}.json"
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
