"""Data-quality gates of the re-optimization loop (great-expectations 1.x), callable outside Airflow.

Four gates, one result type, one config:

- :func:`check_input`: the raw files landed for an interval (schema, keys, NULL keys,
  late/future event times, flow, duplicate files);
- :func:`check_statistics`: the statistics history (complete, in range, finite, long enough);
- :func:`check_forecast`: the forecast (finite, in range, near the recent history);
- :func:`check_plan`: the candidate plan (valid for the query, cost finite, better than
  the active plan by the hysteresis threshold, else ``no_change``).

Each returns a :class:`GateResult`; none raises on bad data (``raise_for_status()`` does).
``python -m mjoin check {input,stats,forecast,plan}`` runs them from a shell. The
expectation suites are code, in :mod:`mjoin.gates.suites`.
"""
from mjoin.gates.config import GateConfig, GateConfigError
from mjoin.gates.forecast import check_forecast
from mjoin.gates.history import read_history
from mjoin.gates.input import check_input, summarize_input
from mjoin.gates.plan import check_plan
from mjoin.gates.result import FAILED, NO_CHANGE, PASSED, Failure, GateFailed, GateResult
from mjoin.gates.stats import StatisticsGateError, check_statistics, history_from_statistics

__all__ = [
    "GateConfig", "GateConfigError", "GateResult", "Failure", "GateFailed", "PASSED", "FAILED", "NO_CHANGE",
    "check_input", "summarize_input", "check_statistics", "check_forecast", "check_plan",
    "history_from_statistics", "read_history", "StatisticsGateError",
]
