"""mjoin_evaluate: what would each strategy have cost over history?

For each interval of the chosen range: the plans of every strategy (fixed from the
initial order, selectivity_first, greedy, dppick, exact, the ablations, dpPick on
last values = noSmooth) from statistics known before the interval, and the hindsight
oracle's plan, all run by the engine's interval evaluation on the same data, `rounds`
times. Writes a table and an HTML report with plots, the strategies ranked by the engine
CPU they measured (median over the rounds, with the spread), probe work beside it; the
last task prints the comparison. All outputs
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
        "start": Param(None, type=OPTIONAL_TEXT, description="ISO-8601 start of the first interval (empty: "
                                                             "6 periods before the end)"),
        "end": Param(None, type=OPTIONAL_TEXT, description="ISO-8601 end of the range, exclusive (empty: the run's "
                                                           "time, on the cycle grid)"),
        "period": Param(300, type="integer", minimum=10, maximum=86400, description="interval length, seconds"),
        "cycle": Param(10, type="integer", minimum=1, maximum=3600, description="statistics cycle tau, seconds"),
        "length": Param(60, type="integer", minimum=2, maximum=10000, description="L: cycles the forecast reads"),
        "rounds": Param(3, type="integer", minimum=1, maximum=20,
                        description="runs of every distinct plan per interval: the report ranks by the median engine "
                                    "CPU, with the rounds' spread"),
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
        from mjoin.evaluation.evaluate import EvalConfig, EvaluationError, check_has_data, recent_range
        from mjoin.runtime.resources import Resources

        ctx = get_current_context()
        p = ctx["params"]
        lake = p["lake"] or Resources.from_env().lake
        try:
            start, end = recent_range(p["start"], p["end"], ctx.get("logical_date") or ctx["dag_run"].run_after,
                                      p["period"], p["cycle"])
            files = check_has_data(EvalConfig(query=p["query"], lake=lake, start=start, end=end,
                                              period=p["period"], cycle=p["cycle"]))
        except (EvaluationError, ValueError) as exc:
            raise AirflowFailException(str(exc))
        print(f"files landed in [{start}, {end}) per source: {files}")
        args = ["--query", p["query"], "--lake", lake, "--from", start,
                "--to", end, "--period", str(p["period"]), "--cycle", str(p["cycle"]), "--length", str(p["length"]),
                "--strategies", ",".join(p["strategies"]), "--namespace", p["namespace"], "--repeats", str(p["rounds"])]
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
