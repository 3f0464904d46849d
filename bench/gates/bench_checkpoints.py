"""What GX the way GX users use it costs: each gate's Checkpoint storing its results and rebuilding Data Docs,
against the fast path (validate, store nothing), per gate and per DAG run.

Measures (seconds, medians of --repeat, the two paths alternating so both see the same load):
  1. warm, in one process (as the evaluation's per-cycle replay runs the gates): each gate fast, stored (the default:
     pages of failed validations only; the data here pass, so none) and stored with every page rendered
     (``results_docs=all``), split into storing the results and the checkpoint's UpdateDataDocsAction;
  2. per DAG run, as Airflow runs it: each gate in a fresh Python process with great_expectations already imported
     (the scheduler's forkserver preloads it): fast (first use, then warm) and stored into a context that exists;
     what storing adds to each gate task, and the four summed;
  3. the stored stats gate, on data that fail it (its page and the index rendered), against the size of the
     results store (the Data Docs index reads the newest 30 results it lists).

Writes bench/gates/results/checkpoints[-quick].json (machine, load, versions, commit, date, parameters).

    python bench/gates/bench_checkpoints.py --quick
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))
sys.path.insert(0, str(HERE))

from bench_gates import snapshot, write_lake  # noqa: E402

GATES = ("input", "stats", "forecast", "plan")
T0 = 1767225600


def fixtures(workdir: str, bad: bool):
    """The four gates' inputs (the synthetic data of bench_gates.py): ``{gate: callable(config)}``."""
    from mjoin.gates.forecast import check_forecast
    from mjoin.gates.input import check_input
    from mjoin.gates.plan import check_plan
    from mjoin.gates.stats import check_statistics, history_from_statistics
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.model.query import load_query
    from mjoin.model.timeutil import iso

    q = load_query("tpcds_returns_by_address")
    hist = history_from_statistics([snapshot(q, iso(T0 + 60 * k), k) for k in range(60)])
    if bad:  # one impossible match rate: the stats gate fails and its Data Docs page is the one a user opens
        hist.loc[(hist["entity"] == "edge") & (hist["stream"] == "cu") & (hist["right"] == "sr"), "gamma"] = 1.7
    fc = snapshot(q, iso(T0 + 3600), 99)
    a = make_plan(q, orders_from_permutation(q, ["cu", "sr", "wr", "cr"]), "a", estimated_cost=10.0)
    b = make_plan(q, orders_from_permutation(q, ["wr", "sr", "cu", "cr"]), "b", estimated_cost=8.0)
    lake_dir = os.path.join(workdir, "input")
    lake = write_lake(lake_dir, q, 3, 2000, True, T0) if not os.path.exists(lake_dir) else __import__(
        "mjoin.lake.layout", fromlist=["Lake"]).Lake(lake_dir)
    return {
        "input": lambda cfg: check_input(q, lake, T0, T0 + 180, cycle=60.0, config=cfg),
        "stats": lambda cfg: check_statistics(q, hist, iso(T0 + 3000), iso(T0 + 3600), 60.0, config=cfg),
        "forecast": lambda cfg: check_forecast(q, fc, hist, config=cfg),
        "plan": lambda cfg: check_plan(q, b, active=a, config=cfg),
    }


def warm(repeat: int, workdir: str) -> dict:
    from mjoin.gates.config import GateConfig

    gates = fixtures(workdir, bad=False)
    fast_cfg = GateConfig()
    out = {}
    for gate, fn in gates.items():
        root = os.path.join(workdir, "gx_warm")
        stored_cfg = GateConfig.from_dict({"results_store": root, "results_run": gate})
        all_cfg = GateConfig.from_dict({"results_store": root, "results_run": gate, "results_docs": "all"})
        fn(fast_cfg), fn(stored_cfg), fn(all_cfg)  # first use: suites built and registered, templates compiled
        times = {"fast": [], "stored": [], "stored_all_pages": [], "store": [], "data_docs_all_pages": []}
        for _ in range(repeat):
            for name, cfg in (("fast", fast_cfg), ("stored", stored_cfg), ("stored_all_pages", all_cfg)):
                t = time.perf_counter()
                res = fn(cfg)
                times[name].append(time.perf_counter() - t)
                if name == "stored_all_pages":
                    times["store"].append(res.details["data_docs"]["seconds"]["store"])
                    times["data_docs_all_pages"].append(res.details["data_docs"]["seconds"]["data_docs"])
        out[gate] = {k: statistics.median(v) for k, v in times.items()}
        out[gate]["results_per_run"] = len(res.gx_result)
    return out


CHILD = r"""
import sys, time, json
import great_expectations  # preloaded by the Airflow scheduler's forkserver: not timed
sys.path.insert(0, {include!r}); sys.path.insert(0, {here!r})
from bench_checkpoints import fixtures
from mjoin.gates.config import GateConfig
fn = fixtures({workdir!r}, bad={bad!r})[{gate!r}]
out = {{}}
for name, store, docs in (("fast_first", "", "failures"), ("fast", "", "failures"), ("stored", {store!r}, "failures"),
                          ("stored_all_pages", {store!r}, "all")):
    t = time.perf_counter()
    res = fn(GateConfig.from_dict({{"results_store": store, "results_run": "bench", "results_docs": docs}}))
    out[name] = time.perf_counter() - t
out["status"] = res.status
print(json.dumps(out))
"""


def per_dag_run(repeat: int, workdir: str, bad: bool, gates=GATES) -> dict:
    """Each gate as an Airflow task runs it: a fresh process (GX imported), the gate on the fast path (its first
    use: suites built, the ephemeral context made), again (warm), then stored into a context that exists (its
    first use of the file context: opened, suites and checkpoint registered, results stored, Data Docs built).
    What storing adds to a task: ``stored - fast`` (the second fast run is the gate's own cost once warm)."""
    store = os.path.join(workdir, "gx_runs")
    fixtures(workdir, bad)  # the input lake, once

    def child(gate: str) -> dict:
        code = CHILD.format(include=str(PROJECT / "include"), here=str(HERE), workdir=workdir, bad=bad, gate=gate,
                            store=store)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    out = {}
    for gate in gates:
        child(gate)  # the context and the template cache exist, as after a deployment's first run
        runs = [child(gate) for _ in range(repeat)]
        keys = ("fast_first", "fast", "stored", "stored_all_pages")
        out[gate] = {k: statistics.median(r[k] for r in runs) for k in keys}
        out[gate]["added"] = out[gate]["stored"] - out[gate]["fast"]
        out[gate]["runs"] = runs
        print(f"  task {gate}: " + ", ".join(f"{k} {out[gate][k]:.3f} s" for k in keys), flush=True)
    if set(gates) == set(GATES):
        out["sum"] = {k: sum(out[g][k] for g in GATES) for k in ("fast_first", "fast", "stored", "stored_all_pages",
                                                                 "added")}
    return out


def against_store_size(repeat: int, workdir: str, sizes) -> dict:
    """The stored stats gate (one run: 5 results) when the store already holds ``n`` results (copies)."""
    from mjoin.gates import gxproject
    from mjoin.gates.config import GateConfig

    stats = fixtures(workdir, bad=True)["stats"]  # failing: its page and the index are rendered every run
    out = {}
    for n in sizes:
        root = os.path.join(workdir, f"gx_size_{n}")
        gxproject._projects.clear()
        first = stats(GateConfig.from_dict({"results_store": root, "results_run": "seed"}))
        if n:
            src = Path(root) / "uncommitted" / "validations"
            files = [p for p in src.rglob("*.json")]
            for i in range(n // len(files)):
                for p in files:
                    rel = p.relative_to(src).parts  # suite parts..., run name, run time, batch.json
                    dest = src.joinpath(*rel[:-3], f"copy{i:05d}", rel[-2].replace("Z", "") + f"{i % 1000:03d}Z", rel[-1])
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(p, dest)
        times, docs = [], []
        for k in range(repeat):
            t = time.perf_counter()
            res = stats(GateConfig.from_dict({"results_store": root, "results_run": f"r{k}"}))
            times.append(time.perf_counter() - t)
            docs.append(res.details["data_docs"]["seconds"]["data_docs"])
        out[str(n)] = {"gate": statistics.median(times), "data_docs": statistics.median(docs),
                       "stored_before": n + len(first.gx_result)}
    return out


def meta(args) -> dict:
    import great_expectations
    import pandas

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT, capture_output=True, text=True).stdout.strip()
    return {"date": datetime.now(timezone.utc).isoformat(), "commit": commit,
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_before": os.getloadavg()},
            "versions": {"python": platform.python_version(), "great_expectations": great_expectations.__version__,
                         "pandas": pandas.__version__},
            "parameters": {"quick": args.quick, "repeat": args.repeat}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 repeats, store sizes 0 and 300")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--sections", default="warm,tasks,store", help="which of warm, tasks, store to run")
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args()
    sections = set(args.sections.split(","))
    args.repeat = args.repeat or (3 if args.quick else 7)
    sizes = (0, 300) if args.quick else (0, 300, 1000, 3000)
    results = meta(args)
    with tempfile.TemporaryDirectory() as d:
        if "warm" in sections:
            results["warm"] = warm(args.repeat, d)
            print("warm:", json.dumps(results["warm"]), flush=True)
        if "tasks" in sections:
            results["per_dag_run"] = per_dag_run(args.repeat, d, bad=False)
            results["per_dag_run_failed_stats"] = per_dag_run(args.repeat, d, bad=True, gates=("stats",))
        if "store" in sections:
            results["store_size"] = against_store_size(args.repeat, d, sizes)
    results["machine"]["load_after"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "checkpoints" + ("" if sections == {"warm", "tasks", "store"} else "-" + "-".join(sorted(sections)))
    path = out / (stem + ("-quick.json" if args.quick else ".json"))
    path.write_text(json.dumps(results, indent=2))
    for gate, r in results.get("warm", {}).items():
        print(f"warm {gate:9} fast {r['fast']:.3f} s  stored {r['stored']:.3f} s  all pages {r['stored_all_pages']:.3f} s "
              f"(store {r['store']:.3f}, Data Docs {r['data_docs_all_pages']:.3f}; {r['results_per_run']} results)")
    if "per_dag_run" in results:
        s = results["per_dag_run"]["sum"]
        print(f"per DAG run (4 gate tasks): fast {s['fast']:.2f} s, stored {s['stored']:.2f} s, added {s['added']:.2f} s")
    for n, r in results.get("store_size", {}).items():
        print(f"store holding {r['stored_before']:5}: stats gate {r['gate']:.3f} s (Data Docs {r['data_docs']:.3f})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
