"""Synthetic join graphs and statistics: for the optimizer benchmark, the tests and demos.

Graphs are real query specs (``mjoin.model.query.parse_query``), so attribute classes and
implied edges come from the one place that defines them. An edge ``(a, b, label)`` is
the predicate ``a.k<label> = b.k<label>``; equal labels that touch join into one class
(which makes that part of the graph complete), so a chain stays a chain only with
alternating labels.
"""
from __future__ import annotations

import random
from typing import Sequence

from mjoin.model.query import Query, parse_query
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StreamStats

SHAPES = ("complete", "star", "chain", "cycle", "random")


def query_from_edges(n: int, edges: Sequence[tuple], name: str = "synthetic", window: str = "5m") -> Query:
    """A query over streams ``s0..s{n-1}`` with one predicate per ``(a, b, label)``."""
    keys = {i: set() for i in range(n)}
    preds = []
    for a, b, label in edges:
        keys[a].add(label)
        keys[b].add(label)
        preds.append(f"s{a}.k{label} = s{b}.k{label}")
    streams = []
    for i in range(n):
        cols = {"ts": "timestamp", **{f"k{lab}": "long" for lab in sorted(keys[i])}}
        streams.append({"name": f"s{i}", "event_time": "ts", "window": window, "columns": cols,
                        "keys": [f"k{lab}" for lab in sorted(keys[i])]})
    doc = {"spec_version": 1, "name": name, "streams": streams, "predicates": preds,
           "output": [f"s{i}.ts AS ts{i}" for i in range(n)]}
    return parse_query(doc, source=f"<{name}>")


def random_edges(n: int, shape: str, rng: random.Random, classes: int = 1, p: float = 0.4) -> list[tuple]:
    """Edges of a connected graph of ``shape`` with labels drawn from ``0..classes-1``
    (chain and cycle alternate labels when ``classes > 1`` so they stay sparse)."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} ({', '.join(SHAPES)})")
    lab = lambda: rng.randrange(classes)  # noqa: E731
    if shape == "complete":
        return [(a, b, lab()) for a in range(n) for b in range(a + 1, n)]
    if shape == "star":
        return [(0, b, lab()) for b in range(1, n)]
    if shape in ("chain", "cycle"):
        out = [(i, i + 1, i % classes if classes > 1 else 0) for i in range(n - 1)]
        if shape == "cycle" and n > 2:
            out.append((n - 1, 0, (n - 1) % classes if classes > 1 else 0))
        return out
    # random: a random spanning tree plus extra edges with probability p
    perm = list(range(n))
    rng.shuffle(perm)
    out, seen = [], set()
    for i in range(1, n):
        a, b = perm[rng.randrange(i)], perm[i]
        out.append((a, b, lab()))
        seen.add(frozenset((a, b)))
    for a in range(n):
        for b in range(a + 1, n):
            if frozenset((a, b)) not in seen and rng.random() < p:
                out.append((a, b, lab()))
    return out


def random_statistics(query: Query, rng: random.Random, groups: int = 1, kind: str = "synthetic") -> Statistics:
    """Plausible statistics: rates 1..1000/s, 10..1e6 keys, 1..5 tuples per key,
    gamma 0..1 (some 0 and 1), mu 1..50."""
    out = {}
    for g in range(groups):
        gs = GroupStats()
        for s in query.stream_names:
            kappa = 10 ** rng.uniform(1, 6)
            gs.streams[s] = StreamStats(lam=10 ** rng.uniform(0, 3), kappa=kappa,
                                        window_tuples=kappa * rng.uniform(1, 5))
        for l, r in query.directed_edges:
            x = rng.random()
            gamma = 0.0 if x < 0.05 else 1.0 if x > 0.95 else rng.random()
            gs.edges[(l, r)] = EdgeStats(gamma=gamma, mu=1 + 10 ** rng.uniform(0, 1.7) - 1)
        out[g] = gs
    partitioning = None
    if groups > 1:
        cls = next((c for c, members in query.attribute_classes.items()
                    if len({s for s, _ in members}) == len(query.streams)), None)
        if cls is None:
            raise ValueError("per-group statistics need an attribute class that holds every stream")
        partitioning = {"method": "hash", "attr_class": cls, "groups": groups}
    return Statistics(query=query.name, groups=out, kind=kind, partitioning=partitioning)
