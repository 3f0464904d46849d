"""How many time slices a band-joined state gets (PSP; Wang & Rundensteiner, EDBT 2009, Sec. 5.2). Pure.

PSP cuts a stream's window state into ``N`` time slices on a ring of ``N`` workers; every new tuple
visits every slice. With ``L_C`` the centralised work of one tuple (``T_j`` per comparison times the
``lambda W`` tuples of the window it probes), ``T_s`` the per-slice overhead of a tuple, ``T_n`` the
cost of passing it on to the next worker and ``M`` the rounds (streams) of a result, the average
response latency is (docs/algorithms.md Eq. 58, the PSP paper's Eq. 5)

    tau(N) = (N - 1) / 2 T_n + max{ L_C / N + T_s L_C / (lambda W T_j),  M N T_n }

which is smallest at ``N = min(N1, N2)`` with

    L_C / N1 + T_s L_C / (lambda W T_j) = M N1 T_n      and      (N2 - 1) / 2 T_n = L_C / N2,

both quadratics in ``N``. On this engine the "ring" is one Spark stage: the slices are tasks that run in
parallel on the executors' cores, ``T_n`` is what sending a tuple's copy to one more slice task costs
and ``max_slices`` the cores that can work on them at once (more slices than cores only add copies).
"""
from __future__ import annotations

import math


def latency(n: int, l_c: float, t_n: float, t_s: float, lam_w_tj: float, m: int = 2) -> float:
    """Eq. 58: average response latency of a tuple with ``n`` slices (seconds)."""
    return (n - 1) / 2 * t_n + max(l_c / n + t_s * l_c / lam_w_tj, m * n * t_n)


def optimal_slices(l_c: float, t_n: float, t_s: float, lam_w_tj: float, m: int = 2) -> float:
    """``min(N1, N2)`` of Eq. 59-60 (real-valued; ``inf`` when passing tuples on is free)."""
    if t_n <= 0:
        return math.inf
    b = t_s * l_c / lam_w_tj
    n1 = (b + math.sqrt(b * b + 4 * m * t_n * l_c)) / (2 * m * t_n)
    n2 = (1 + math.sqrt(1 + 8 * l_c / t_n)) / 2
    return min(n1, n2)


def choose_slices(lam: float, window: float, t_j: float, t_s: float, t_n: float, *, m: int = 2,
                  max_slices: int = 64) -> int:
    """The whole number of slices with the smallest Eq. 58 latency around (Eq. 61) ``min(N1, N2)``, at most
    ``max_slices``: ``lam`` tuples/s into a window of ``window`` seconds, ``t_j`` seconds per comparison,
    ``t_s`` per tuple and slice, ``t_n`` per hop."""
    lam_w_tj = max(lam * window * t_j, 1e-12)
    l_c = lam_w_tj  # the work of one tuple against the whole window
    best = optimal_slices(l_c, t_n, t_s, lam_w_tj, m)
    candidates = {1, max_slices} | ({math.floor(best), math.ceil(best)} if math.isfinite(best) else set())
    candidates = {min(max(int(c), 1), max_slices) for c in candidates}
    return min(sorted(candidates), key=lambda n: latency(n, l_c, t_n, t_s, lam_w_tj, m))


#: per tuple and slice, the cost of one more slice (routing a copy to another task, probing there): measured
#: by bench/psp on this machine (about 2 us); used when nothing better is known
DEFAULT_T_S = 2e-6
#: seconds per comparison (a matched state tuple), as calibrated on this engine (bench/engine: 2-8e-8 s)
DEFAULT_T_J = 5e-8


def slices_for(query, lam: dict, *, t_j: float = DEFAULT_T_J, t_s: float = DEFAULT_T_S, cores: int = 2) -> int:
    """Eq. 61's slice count for ``query``'s band classes (the most demanding one decides): per band class,
    the larger of its streams' ``lam`` (tuples/s; missing: 10) into the larger window; 1 without bands."""
    best = 1
    for b in query.band_classes.values():
        rate = max(float(lam.get(b.left, 10.0)), float(lam.get(b.right, 10.0)))
        window = max(query.stream(b.left).window, query.stream(b.right).window)
        best = max(best, choose_slices(rate, window, t_j, t_s, t_s, m=len(query.streams), max_slices=cores))
    return best
