"""mjoin_join_job: the streaming join job's lifecycle (continuous mode).

Trigger with `action`:
- start: refuse if it is already running, then run the streaming join job with a
  processingTime trigger through spark-submit; the task lasts as long as the job;
  it picks up each newly activated plan at its next batch boundary, and computes the
  statistics of every `stats_cycle` itself (mjoin_reoptimize's continuous mode uses them);
- stop: ask the job to stop between batches and wait until it has;
- restart: stop, then start again from its checkpoint and committed state;
- status: log whether it is running, its last batch and plan version.
"""
from __future__ import annotations

from pathlib import Path

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param, dag, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from mjoin.loop.params import DEFAULT_QUERY, OPTIONAL_TEXT, query_choices, spark_conf, spark_env

JOBS = Path(__file__).resolve().parent.parent / "jobs"


@dag(
    dag_id="mjoin_join_job",
    description="start, stop, restart or check the streaming multi-way join job",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "action": Param("status", type="string", enum=["start", "stop", "restart", "status"]),
        "query": Param(DEFAULT_QUERY, type="string", enum=query_choices(), description="query spec (include/queries/)"),
        "lake": Param(None, type=OPTIONAL_TEXT, description="lake root (empty: MJOIN_LAKE or the project's .lake)"),
        "namespace": Param(None, type=OPTIONAL_TEXT, description="lake namespace of the job (empty: live)"),
        "interval": Param(10, type="integer", minimum=1, maximum=3600, description="micro-batch trigger, seconds"),
        "stats_cycle": Param(10, type="integer", minimum=0, maximum=3600,
                             description="the job computes the statistics of every cycle of this many seconds itself "
                                         "(mjoin_reoptimize's cycle, for its continuous mode); 0: off"),
        "arrival_cycle": Param(None, type=["null", "integer"], minimum=1, maximum=86400,
                               description="the lake's arrival cycle, seconds (empty: the most common gap between "
                                           "landed arrival folders, known once two have landed); rows more than two "
                                           "cycles ahead of the newest folder are quarantined as future"),
        "stop_timeout": Param(300, type="integer", minimum=5, maximum=7200, description="seconds to wait for a stop"),
    },
    tags=["mjoin"],
    doc_md=__doc__,
)
def mjoin_join_job():
    @task(multiple_outputs=True)
    def control() -> dict:
        from mjoin.engine.control import JobControl
        from mjoin.lake.layout import Lake
        from mjoin.model.query import load_query
        from mjoin.runtime.resources import Resources

        ctx = get_current_context()
        p = ctx["params"]
        lake, namespace = p["lake"] or Resources.from_env().lake, p["namespace"] or ""
        jc = JobControl(Lake(lake, namespace), load_query(p["query"]).name)
        st = jc.status()
        print(f"join job of {p['query']}: {'running' if st['running'] else st['state']}: {st}")
        if p["action"] in ("stop", "restart") and st["running"]:
            jc.request_stop(by=ctx["dag_run"].run_id, reason=p["action"])
            st = jc.wait_stopped(p["stop_timeout"])
            if st["running"]:
                raise AirflowFailException(f"the join job did not stop within {p['stop_timeout']} s")
            print(f"stopped after batch {st.get('last_batch_id')}")
        if p["action"] == "start" and st["running"]:
            raise AirflowFailException(f"already running (pid {st.get('pid')} since {st.get('started_at')}); "
                                       "use action=restart")
        args = ["--stream", "--trigger", "processingTime", "--interval", str(p["interval"]), "--query", p["query"],
                "--lake", lake, "--stats-cycle", str(p["stats_cycle"])] + \
            (["--arrival-cycle", str(p["arrival_cycle"])] if p["arrival_cycle"] else []) + \
            (["--namespace", namespace] if namespace else [])
        return {"start": p["action"] in ("start", "restart"), "args": args}

    @task.short_circuit
    def should_start(start: bool) -> bool:
        return start

    c = control()
    run = SparkSubmitOperator(task_id="run_join_job", application=str(JOBS / "join.py"), application_args=c["args"],
                              conn_id="spark_default", name="mjoin-join-stream", env_vars=spark_env(),
                              conf=spark_conf())
    should_start(c["start"]) >> run


mjoin_join_job()
