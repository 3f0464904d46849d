"""The expected statistics of a drift preset's uniform keys at a time, per attribute class (the preset tests').

A probe key uniform over [0, d_l) into a stream with |W_r| tuples uniform over [0, d_r) hits with
gamma = min(d_l, d_r) / d_l * (1 - exp(-|W_r| / d_r)) and then fetches mu = (|W_r| / d_r) / (1 - exp(-|W_r| / d_r));
an edge of class ``c`` uses the domains of the two streams' class-``c`` key columns (``domain`` for ``key``,
``key2_domain`` for ``key2``), a stream's kappa its first class's.
"""
from __future__ import annotations

import math

from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StreamStats


def key_domain(sched, query, stream: str, attr_class: str, t: float) -> float:
    """The key domain of ``stream``'s column in ``attr_class`` at ``t``."""
    param = "domain" if query.key_column(stream, attr_class) == "key" else "key2_domain"
    return float(sched.value(stream, param, [t])[0])


def expected_statistics(sched, query, t: float, window: float) -> Statistics:
    """The expected statistics of uniform keys at time ``t`` of ``sched`` for ``query`` (windows of ``window`` s)."""
    names = sched.stream_names
    rate = {s: float(sched.rate(s, [t])[0]) for s in names}
    win = {s: rate[s] * window for s in names}
    g = GroupStats()
    for s in names:
        d = key_domain(sched, query, s, query.all_classes_of(s)[0], t)
        g.streams[s] = StreamStats(lam=rate[s], kappa=max(d * (1 - math.exp(-win[s] / d)), 1.0), window_tuples=win[s])
    for c, members in query.attribute_classes.items():
        streams = [s for s, _ in members]
        for left in streams:
            for right in streams:
                if left != right:
                    dl, dr = key_domain(sched, query, left, c, t), key_domain(sched, query, right, c, t)
                    dens = win[right] / dr
                    present = 1 - math.exp(-dens)
                    g.edges[(left, right)] = EdgeStats(gamma=min(dl, dr) / dl * present, mu=dens / present)
    return Statistics(query=query.name, groups={0: g}, kind="synthetic")
