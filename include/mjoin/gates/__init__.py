"""Data-quality gates of the re-optimization loop (great-expectations 1.x), callable outside Airflow.

Four gates, one result type (:mod:`~mjoin.gates.result`), one config (:mod:`~mjoin.gates.config`):

- :func:`~mjoin.gates.input.check_input`: the raw files landed for an interval (schema, keys, NULL keys,
  late/future event times, flow, duplicate files);
- :func:`~mjoin.gates.stats.check_statistics`: the statistics history (complete, in range, finite, long enough);
- :func:`~mjoin.gates.forecast.check_forecast`: the forecast (finite, in range, near the recent history);
- :func:`~mjoin.gates.plan.check_plan`: the candidate plan (valid for the query, cost finite, better than
  the active plan by the hysteresis threshold, else ``no_change``).

Each returns a :class:`~mjoin.gates.result.GateResult`; none raises on bad data (``raise_for_status()`` does).
``python -m mjoin check {input,stats,forecast,plan}`` runs them from a shell. The
expectation suites are code, in :mod:`mjoin.gates.suites`.
"""
