"""PSP's slice count from its latency model (Eq. 5; pure)."""
from __future__ import annotations

import math

from mjoin.optimizer.psp import choose_slices, latency, optimal_slices


def test_optimum_solves_the_two_balance_equations():
    l_c, t_n, t_s, lwt, m = 0.08, 0.001, 1e-5, 0.08, 2
    n = optimal_slices(l_c, t_n, t_s, lwt, m)
    n1 = (t_s * l_c / lwt + math.sqrt((t_s * l_c / lwt) ** 2 + 4 * m * t_n * l_c)) / (2 * m * t_n)
    n2 = (1 + math.sqrt(1 + 8 * l_c / t_n)) / 2
    assert n == min(n1, n2)
    assert abs(l_c / n1 + t_s * l_c / lwt - m * n1 * t_n) < 1e-12  # N1 balances probing and passing on
    assert abs((n2 - 1) / 2 * t_n - l_c / n2) < 1e-12


def test_chosen_slices_minimise_the_latency_and_respect_the_cores():
    # a heavy window (2,000 tuples/s over 5 min, 1 us a comparison): more slices pay off, up to the cores
    n = choose_slices(2000, 300, 1e-6, 1e-7, 0.002, max_slices=8)
    assert n == 8
    n = choose_slices(2000, 300, 1e-6, 1e-7, 0.002, max_slices=64)
    lwt = 2000 * 300 * 1e-6
    assert all(latency(n, lwt, 0.002, 1e-7, lwt) <= latency(k, lwt, 0.002, 1e-7, lwt) + 1e-12 for k in range(1, 65))
    # a light window: one slice (passing tuples on costs more than it saves)
    assert choose_slices(10, 10, 1e-6, 1e-7, 0.01) == 1
