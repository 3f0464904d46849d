"""The end-to-end demo (``make demo``): TPC-DS streams through the real re-optimization DAG.

1. generate the TPC-DS workload (DuckDB dsdgen, offline, cached) replayed as four streams;
2. run ``mjoin_demo`` (``mjoin_reoptimize``'s tasks without a schedule) with ``airflow dags test``
   for several consecutive intervals of the simulated clock (the ``interval_end`` param; cycle mode:
   each run lands its interval, joins it with the active plan via spark-submit, collects statistics,
   forecasts, optimizes, gates and deploys); the runs are recorded in the project's Airflow database
   under their own DAG id with the real time they ran at (``dags test`` starts a run at its logical
   date, so a simulated date would draw a months-long bar in the grid), visible in ``make airflow``
   and apart from the live DAG's history;
3. run ``mjoin_evaluate`` over the same history: every strategy and the hindsight
   oracle on the same data;
4. print the re-optimization outcomes, the strategy comparison and the report path.
"""
from __future__ import annotations

import json
import shutil
import time
from datetime import timedelta
from pathlib import Path

from mjoin.evaluation.report import format_summary
from mjoin.lake.layout import Lake
from mjoin.loop.airflow_env import airflow_cmd, airflow_env, ensure_db, register_lake
from mjoin.loop.config import LoopConfig, run_dir
from mjoin.model.query import load_query
from mjoin.model.timeutil import iso, parse_time
from mjoin.runtime import fsutil
from mjoin.runtime.resources import PROJECT_DIR
from mjoin.workloads.tpcds_replay import generate_tpcds

START = "2026-01-01T00:00:00Z"
#: the demo's runs: mjoin_reoptimize's tasks under their own DAG id (dags/mjoin_reoptimize.py)
DEMO_DAG = "mjoin_demo"


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def _dags_test(env, dag_id: str, conf: dict, log_path: Path) -> tuple[int, float]:
    """``airflow dags test`` at the time it runs (no logical date: the run starts now, and its grid bar is its
    real duration); the simulated time is in ``conf``."""
    t = time.perf_counter()
    with open(log_path, "a") as log:
        log.write(f"\n==== airflow dags test {dag_id} {json.dumps(conf)}\n")
        log.flush()
        proc = airflow_cmd(["dags", "test", dag_id, "--conf", json.dumps(conf)], env, check=False, capture=True)
        log.write(proc.stdout or "")
    return proc.returncode, time.perf_counter() - t


def run_demo(*, sf: float = 0.1, periods: int = 3, period_minutes: int = 2, cycle: int = 10, strategy: str = "exact",
             workdir: Path | None = None, query: str = "tpcds_returns_by_address", evaluate: bool = True) -> dict:
    t_all = time.perf_counter()
    workdir = Path(workdir or PROJECT_DIR / ".demo")
    workload, lake_dir, log_path = workdir / "workload", workdir / "lake", workdir / "airflow.log"
    workdir.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    period = period_minutes * 60
    start = parse_time(START)


    t = time.perf_counter()
    manifest = generate_tpcds(workload, sf=sf, duration=f"{periods * period}s", cycle=cycle, start=START, overwrite=True)
    _say(f"TPC-DS sf={sf}: {sum(manifest.rows(s) for s in manifest.sources):,} tuples in 4 streams over "
         f"{periods * period_minutes} simulated minutes ({time.perf_counter() - t:.1f}s) -> {workload}")
    if lake_dir.exists():
        shutil.rmtree(lake_dir)
    lake = Lake(str(lake_dir))

    env = airflow_env(lake=str(lake_dir))
    env["MJOIN_PERIOD_MINUTES"] = str(period_minutes)
    ensure_db(env)
    register_lake(env, "demo", str(lake_dir))  # the mjoin page of `make airflow` shows the demo's lake too
    _say(f"Airflow home {env['AIRFLOW_HOME']} (SQLite); DAG runs are logged to {log_path}")

    outcomes = []
    conf = {"query": query, "lake": str(lake_dir), "workload": str(workload), "strategy": strategy, "cycle": cycle,
            "mode": "cycle"}
    for k in range(1, periods + 1):
        end = iso(start + timedelta(seconds=k * period))
        rc, secs = _dags_test(env, DEMO_DAG, {**conf, "interval_end": end}, log_path)
        outcome = _outcome(lake, query, end)
        outcomes.append(outcome or {"interval_end": end, "status": f"no outcome (airflow exit {rc})"})
        _say(f"{DEMO_DAG} until {end}: {_describe(outcome, rc)} ({secs:.0f}s)")

    result = {"outcomes": outcomes, "lake": str(lake_dir), "workload": str(workload)}
    if evaluate:
        ev_conf = {"query": query, "lake": str(lake_dir), "start": START, "end": iso(start + timedelta(seconds=periods * period)),
                   "period": period, "cycle": cycle, "length": 60, "namespace": "eval/demo"}
        rc, secs = _dags_test(env, "mjoin_evaluate", ev_conf, log_path)

        folder = fsutil.join(Lake(str(lake_dir), "eval/demo").reports(load_query(query).name), "evaluation")
        summary_path = fsutil.join(folder, "summary.json")
        if rc == 0 and fsutil.exists(summary_path):
            doc = json.loads(fsutil.read_text(summary_path))
            _say(f"mjoin_evaluate over {periods} intervals ({secs:.0f}s): every strategy on the same data")
            print(format_summary(doc["summary"]))
            result["report"] = f"{folder}/index.html"
            result["summary"] = doc["summary"]
        else:
            _say(f"mjoin_evaluate failed (airflow exit {rc}); see {log_path}")
            result["evaluate_failed"] = True
    _say(f"done in {time.perf_counter() - t_all:.0f}s.")
    if result.get("report"):
        _say(f"report: {result['report']}")
    _say(f"browse the runs (DAG {DEMO_DAG}), the plans, outcomes and the report (menu 'mjoin plans', the demo lake) "
         "with: make airflow")
    return result


def _outcome(lake: Lake, query_ref: str, logical: str) -> dict | None:
    name = load_query(query_ref).name
    path = fsutil.join(run_dir(LoopConfig(query=query_ref, lake=lake.root), name, logical), "outcome.json")
    return json.loads(fsutil.read_text(path)) if fsutil.exists(path) else None


def _describe(outcome: dict | None, rc: int) -> str:
    if not outcome:
        return f"no outcome recorded (airflow exit {rc})"
    status, active = outcome["status"], outcome.get("active_version")
    if status == "deployed":
        gain = outcome.get("estimated_gain")
        gain = f", estimated gain {gain:.1%}" if isinstance(gain, (int, float)) else ""
        changes = "; ".join(outcome.get("changes") or [])[:160]
        return f"deployed plan v{outcome['version']}{gain}: {changes}"
    if status == "rolled_back":
        return f"plan v{outcome.get('version')} rolled back (the job did not switch); active plan v{active}"
    if status == "failed":
        return f"FAILED at {', '.join(outcome.get('failed_tasks') or [])}; active plan kept (v{active})"
    return f"{status} (active plan v{active})"
