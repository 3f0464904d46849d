"""The re-optimization loop as Airflow runs it: the steps of one run as plain functions (the DAG only
wires them), the DAG params, trigger checks, Airflow's environment and the UI views.

One run (docs/design.md, "Data flow of one re-optimization"): for the interval
``[end - period, end)`` of whole statistics cycles ending at the last cycle
boundary at or before the run's logical date (:func:`~mjoin.loop.config.interval_for`), judged
once its last cycle is complete (:func:`~mjoin.loop.collect.await_cycles`):

    land (cycle mode) -> input gate -> join (Spark) -> statistics (Spark) -> gate     collect.py
      -> forecast (Holt) -> gate -> optimize -> plan gate                           replan.py
      -> publish + activate (-> await the switch)                                    deploy.py
      -> record                                                                      outcome.py

Each step reads what the earlier ones wrote in the run folder
``<lake>[/<namespace>]/reports/<query>/runs/<end>/`` and returns a small
JSON-able dict (Airflow passes it as XCom). A failed gate raises
:class:`~mjoin.loop.config.StepFailed` after writing its machine-readable result there; a plan
that is not better than the active one is the outcome ``no_change``.

Runs of a backfill (``run_type == "backfill"``) and evaluations work in a
separate namespace of the lake (default ``eval/backfill``): their statistics,
plans, registry, results and reports never touch the live deployment, and
they read only data before each run's interval end (no look-ahead). A backfill
always runs in cycle mode (its join is the interval evaluation of its own
interval; there is no running job of the past to hot-reload), whatever ``mode``
says.

Gate thresholds: one :class:`mjoin.gates.config.GateConfig` per run, its defaults
overridden by the ``gates`` param; the ``improvement_threshold`` param is a
shortcut for ``gates.improvement_threshold`` (the latter wins when both are
given). Every step uses :meth:`~mjoin.loop.config.LoopConfig.gate_config`, and messages print the
threshold the plan gate actually used.

Outcomes: ``record`` writes ``outcome.json`` into the run folder (one file per
run, atomically), for every run, with the reason a failed one failed (the
DAG's failure callback keeps each task's error there, :func:`~mjoin.loop.outcome.note_failure`;
a run whose ``prepare`` failed gets the folder :func:`~mjoin.loop.config.fallback_context`
rebuilds); :func:`mjoin.loop.ui.read_outcomes` reads them back sorted, so two runs
at once in one namespace never lose each other's outcome.
"""
