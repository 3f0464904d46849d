"""From statistics to a plan (docs/algorithms.md, "Cost model" and "Probe-order optimizers"): the cost model
(``cost``), the strategies by name and the entry point ``optimize`` (``strategies``), one module per search
(``baselines``: fixed, selectivity_first, greedy; ``dppick``: the paper's Algorithms 3-4; ``exact``: the subset
DP), PMJoin key groups chosen from per-cell statistics (``partitioning``), the cost model fitted to the engine's
metrics (``calibrate``), PSP's time slices (``psp``), and random graphs for tests and benchmarks (``synthetic``).
Pure: no Spark, no Airflow."""
