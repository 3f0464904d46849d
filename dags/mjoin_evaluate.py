"""mjoin_evaluate: what would each strategy have cost over history?

For each interval of the chosen range: the plans of every strategy (fixed from the
initial order, selectivity_first, greedy, dppick, exact, the ablations, dpPick on
last values = noSmooth) from statistics known before the interval, and the hindsight
oracle's plan, all run by the engine's interval evaluation on the same data. Writes a
table and an HTML report with plots; the last task prints the comparison. All outputs
go to an evaluation namespace of the lake, never the live deployment.
"""
from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from mjoin.loop.params import DEFAULT_QUERY, EVAL_STRATEGY_NAMES, OPTIONAL_TEXT, query_choices, spark_conf, spark_env

JOBS = Path(__file__).resolve().parent.parent / "jobs"
EVAL_STRATEGIES = list(EVAL_STRATEGY_NAMES)


@dag(
    dag_id="mjoin_evaluate",
    description="cost every strategy's plans and the hindsight oracle on the same historical data",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "query": Param(DEFAULT_QUERY, type="string", enum=query_choices(), description="query spec (include/queries/)"),
        "lake": Param(None, type=OPTIONAL_TEXT, description="lake root (empty: MJOIN_LAKE or the project's .lake)"),
        "start": Param("2026-01-01T00:00:00Z", type="string", format="date-time", description="first interval start"),
        "end": Param("2026-01-01T00:30:00Z", type="string", format="date-time", description="end of the range (exclusive)"),
        "period": Param(300, type="integer", minimum=10, maximum=86400, description="interval length, seconds"),
        "cycle": Param(10, type="integer", minimum=1, maximum=3600, description="statistics cycle tau, seconds"),
        "length": Param(60, type="integer", minimum=2, maximum=10000, description="L: cycles the forecast reads"),
        "strategies": Param(EVAL_STRATEGIES, type="array", items={"type": "string", "enum": EVAL_STRATEGIES},
                            description="strategies to compare"),
        "initial_order": Param(None, type=OPTIONAL_TEXT,
                               description="comma-separated initial order for fixed ('all' = 24 orders; empty: the spec's order)"),
        "namespace": Param("eval/evaluate", type="string", minLength=1, description="lake namespace for the outputs"),
    },
    tags=["mjoin"],
    doc_md=__doc__,
)
def mjoin_evaluate():
    @task
    def arguments() -> list[str]:
        """The evaluation's arguments, after checking that data landed in the range (an empty range fails
        here with a clear message instead of an all-zero report)."""
        from mjoin.evaluation.evaluate import EvalConfig, EvaluationError, check_has_data
        from mjoin.runtime.resources import Resources

        p = get_current_context()["params"]
        lake = p["lake"] or Resources.from_env().lake
        try:
            files = check_has_data(EvalConfig(query=p["query"], lake=lake, start=p["start"], end=p["end"],
                                              period=p["period"], cycle=p["cycle"]))
        except EvaluationError as exc:
            raise AirflowFailException(str(exc))
        print(f"files landed in [{p['start']}, {p['end']}) per source: {files}")
        args = ["--query", p["query"], "--lake", lake, "--from", p["start"],
                "--to", p["end"], "--period", str(p["period"]), "--cycle", str(p["cycle"]), "--length", str(p["length"]),
                "--strategies", ",".join(p["strategies"]), "--namespace", p["namespace"]]
        if p["initial_order"]:
            args += ["--initial-order", p["initial_order"]]
        return args

    @task
    def show_comparison() -> dict:
        import json

        from mjoin.runtime import fsutil
        from mjoin.evaluation.report import format_summary
        from mjoin.lake.layout import Lake
        from mjoin.model.query import load_query
        from mjoin.runtime.resources import Resources

        p = get_current_context()["params"]
        lake = Lake(p["lake"] or Resources.from_env().lake, p["namespace"])
        folder = fsutil.join(lake.reports(load_query(p["query"]).name), "evaluation")
        doc = json.loads(fsutil.read_text(fsutil.join(folder, "summary.json")))
        print(format_summary(doc["summary"]))
        print(f"report: {folder}/index.html")
        return {"report": f"{folder}/index.html", "strategies": len(doc["summary"])}

    args = arguments()
    run = SparkSubmitOperator(task_id="evaluate", application=str(JOBS / "evaluate.py"), application_args=args,
                              conn_id="spark_default", name="mjoin-evaluate", env_vars=spark_env(),
                              conf=spark_conf())
    args >> run >> show_comparison()


mjoin_evaluate()
