"""Statistics as the join engine really holds its state (pure): under punctuations (PJoin) the engine
keeps fewer tuples and keys than the data's window holds, and does not probe new tuples of dead keys.

The statistics job measures the data (``kappa``: distinct keys in a stream's window, ``window_tuples``,
``lambda``: arrivals per second, docs/algorithms.md Eq. 9-11). The cost of a probe step into stream r is
``alpha_q log(kappa_r) q + alpha_m s`` (Eq. 6) with the keys the engine's state of r really holds, and
the lookups of a stream's chain come from the tuples it really probes. So before optimizing, the loop
takes the live join's newest batch metrics and, per stream s:

- ``kappa_s`` := min(kappa_s, mean keys of s's state in the engine);
- ``window_tuples_s`` := min(window_tuples_s, mean tuples of s's state in the engine);
- ``lambda_s`` := lambda_s x (1 - tuples of s skipped as dead / tuples of s accepted).

Only when those batches report punctuation activity (promises held); otherwise the statistics are left
as measured (the engine then holds what the window holds).
"""
from __future__ import annotations

import copy


def engine_state_summary(records: list[dict]) -> dict | None:
    """Per stream: mean state keys and tuples, and the skipped share of accepted tuples, over batch
    metrics ``records``; None when they show no punctuation at work."""
    active = [r for r in records if r.get("punctuation") and r["punctuation"].get("promises_held")]
    if not active:
        return None
    streams = list(active[0]["state_keys"])
    out = {}
    for s in streams:
        rows = sum(r["rows_in"].get(s, 0) for r in active)
        skipped = sum((r["punctuation"].get("skipped_by_stream") or {}).get(s, 0) for r in active)
        out[s] = {"keys": sum(r["state_keys"][s] for r in active) / len(active),
                  "tuples": sum(r["state_tuples"][s] for r in active) / len(active),
                  "skipped_share": skipped / rows if rows else 0.0}
    return out


def effective_statistics(stats, summary: dict | None):
    """``stats`` (a :class:`mjoin.model.statistics.Statistics`) with kappa, window_tuples and lambda as the
    engine holds and probes them (see the module docstring); ``stats`` itself when ``summary`` is None."""
    if not summary:
        return stats
    out = copy.deepcopy(stats)
    n_groups = max(len(out.groups), 1)
    for gs in out.groups.values():
        for s, st in gs.streams.items():
            eng = summary.get(s)
            if eng is None:
                continue
            st.kappa = min(st.kappa, max(eng["keys"] / n_groups, 1.0))
            st.window_tuples = min(st.window_tuples, max(eng["tuples"] / n_groups, 1.0))
            st.lam = st.lam * (1.0 - eng["skipped_share"])
    out.meta = dict(out.meta or {}, effective_state=summary)
    return out
