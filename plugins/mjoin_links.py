"""Airflow plugin: a "Data Docs" extra link on the gate tasks of mjoin_reoptimize (check_input, check_statistics,
check_forecast, check_plan). It opens the mjoin plugin's redirect (``/mjoin/task-docs/<dag>/<run>/<task>``,
plugins/mjoin_plugin.py) to the Data Docs page of that task's validation in that run: on a failed gate, the
page of the suite that failed, naming the failing expectation and its values (docs/gates.md). Other tasks get
no link. Computed by the api-server from the task's identity alone, so a task that failed still has it.
"""
from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink

from mjoin.loop.links import GATE_TASKS, task_docs_url

DAG_PREFIX = "mjoin_reoptimize"


class GateDataDocsLink(BaseOperatorLink):
    name = "Data Docs"

    def get_link(self, operator, *, ti_key) -> str:
        if ti_key.task_id not in GATE_TASKS or not ti_key.dag_id.startswith(DAG_PREFIX):
            return ""
        return task_docs_url(ti_key.dag_id, ti_key.run_id, ti_key.task_id)


class MjoinLinksPlugin(AirflowPlugin):
    name = "mjoin_links"
    global_operator_extra_links = [GateDataDocsLink()]
