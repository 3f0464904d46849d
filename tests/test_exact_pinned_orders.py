"""exact's orders on the optimizer benchmark's several-class random graphs stay the orders it chose before its DP was
made faster (bench/optimizer/classes.py, "timing": the ``random`` shape, three predicate labels, seed 0, graphs 0-9
of n = 8 and 12). The pins are a hash of every start's order, computed with the implementation before the speed-up;
the property tests (test_optimize_properties.py) keep the cost equal to brute force.

Pure: no Spark.
"""
from __future__ import annotations

import hashlib
import json
import random

import pytest

from mjoin.optimizer.cost import CostModel, JoinProblem, order_cost
from mjoin.optimizer.exact import exact_dp
from mjoin.optimizer.synthetic import query_from_edges, random_edges, random_statistics

PINS = {
    "8-0": "826130ec9f77f602", "8-1": "554d3ad0a256aca2", "8-2": "1ab3e67df5269dcc", "8-3": "329263136ea9e335",
    "8-4": "845f13a1901c2766", "8-5": "8e23450bee54265d", "8-6": "d51086e360d4bea5", "8-7": "208fb0aa217b4b76",
    "8-8": "0865e3bcb4b3d73a", "8-9": "3b4343a2dec61e24",
    "12-0": "609d616d83f9dd76", "12-1": "73645af7b795f3eb", "12-2": "dca0a97bd5970755", "12-3": "401c37880eb5ebe7",
    "12-4": "afc07f4b2b9cff3e", "12-5": "a6ca90630e2bd5a2", "12-6": "295914943dbcfb94", "12-7": "cadaf57eac0b1ea6",
    "12-8": "eaea1308aaad89e5", "12-9": "6e106782090f3bef",
}


@pytest.mark.parametrize("key", sorted(PINS, key=lambda k: tuple(map(int, k.split("-")))))
def test_exact_orders_as_before_on_the_benchmark_graphs(key):
    n, gi = map(int, key.split("-"))
    rng = random.Random(f"0-random-{n}-{gi}")  # bench_optimizer.run's graphs
    q = query_from_edges(n, random_edges(n, "random", rng, 3, p=0.4), name=f"random{n}")
    problem = JoinProblem.from_statistics(q, random_statistics(q, rng))
    model = CostModel()
    best = exact_dp(problem, model)
    doc = json.dumps({str(s): [list(map(int, x)) for x in pairs] for s, (pairs, _) in sorted(best.items())})
    assert hashlib.sha256(doc.encode()).hexdigest()[:16] == PINS[key]
    for s, (pairs, cost) in best.items():  # the cost returned is the order's cost under the model
        assert cost == pytest.approx(order_cost(problem, model, s, pairs), rel=1e-12)
