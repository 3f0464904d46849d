"""Probe-order optimizers (ALGORITHMS.md "Probe-order optimizers"), one module each:
``baselines`` (fixed, selectivity_first, greedy), ``dppick`` (the paper's Algorithms 3-4),
``exact`` (subset DP). ``mjoin.optimizer.strategies`` is the entry point that turns their orders into
plans; ``synthetic`` makes random graphs and statistics for tests and benchmarks."""
