"""python -m mjoin demo: the end-to-end demo of `make demo`."""
from __future__ import annotations

from mjoin.loop.demo import run_demo

NAME = "demo"
HELP = "generate TPC-DS streams, run the re-optimization DAG for several cycles, compare strategies"
DESCRIPTION = """Generate the TPC-DS workload (offline dsdgen, cached), run the mjoin_reoptimize DAG
with `airflow dags test` for several consecutive logical dates on the embedded default
(local Spark through spark-submit, Airflow on SQLite in .airflow/), then mjoin_evaluate
over the same history, and print the strategy comparison and the report path."""


def add_arguments(p):
    p.add_argument("--sf", type=float, default=0.1, help="TPC-DS scale factor (default 0.1)")
    p.add_argument("--periods", type=int, default=3, help="re-optimization runs (default 3)")
    p.add_argument("--period-minutes", type=int, default=2, help="simulated minutes per run (default 2)")
    p.add_argument("--cycle", type=int, default=10, help="statistics cycle, seconds (default 10)")
    p.add_argument("--strategy", default="exact", help="optimizer of the loop (default exact)")
    p.add_argument("--workdir", help="demo folder (default .demo/)")
    p.add_argument("--no-evaluate", action="store_true", help="skip the strategy comparison")


def run(args) -> int:
    result = run_demo(sf=args.sf, periods=args.periods, period_minutes=args.period_minutes, cycle=args.cycle,
                      strategy=args.strategy, workdir=args.workdir, evaluate=not args.no_evaluate)
    failed = [o for o in result["outcomes"] if o.get("status") not in ("deployed", "no_change", "dry_run")]
    return 1 if failed or result.get("evaluate_failed") else 0
