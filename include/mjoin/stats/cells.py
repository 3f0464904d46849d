"""Statistics of any key-to-group rule from per-cell statistics (PMJoin; no Spark).

The statistics job writes, beside the statistics of the active plan's key groups, the
same statistics per key *cell* (``pmod(key, B)`` buckets, key ranges; mjoin.stats.kernel).
A rule whose groups are unions of cells has exactly the statistics of those unions:
per stream ``tuples``, ``lambda``, ``window_tuples`` and ``kappa`` (cells partition the
keys) add up, per edge ``q``, ``m``, ``s`` add up and give ``gamma = m / q``,
``mu = s / m`` (Eq. 9-10). That is how the optimizer prices rules it has not run
(:func:`regroup`), and how the forecast of a rule sees its whole history after a rule
change (:func:`history_for_rule`): cycles computed under another rule are re-aggregated
from their cells, so the first run after a change is not blind.

- hash rules ``D | B`` and table rules of modulus ``M | B`` are unions of ``B`` buckets;
- range rules whose bounds are edges of the range cells are unions of range cells;
- no rule (one group) is the union of all cells (every row the statistics count has a key, so
  every one is in a cell: rows with a NULL key are only in the cycle's NULL-key counts).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from mjoin.model.keygroups import group_of, num_groups
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StreamStats
from mjoin.model.timeutil import iso
from mjoin.stats.history import CELL_KINDS, HISTORY_SCHEMA, empty_history, read_cells, read_history


def cell_map(cell_rule: dict, rule: dict | None) -> np.ndarray | None:
    """The group of every cell of ``cell_rule`` under ``rule`` (None: ``rule``'s groups are not unions of cells)."""
    n = num_groups(cell_rule)
    if not rule:
        return np.zeros(n, dtype=np.int64)
    if rule.get("attr_class") != cell_rule.get("attr_class"):
        return None
    if cell_rule["method"] == "hash":
        B = int(cell_rule["groups"])
        if rule["method"] == "hash" and B % int(rule["groups"]) == 0:
            return np.arange(B, dtype=np.int64) % int(rule["groups"])
        if rule["method"] == "table" and B % int(rule["modulus"]) == 0:
            return np.asarray(rule["assignment"], dtype=np.int64)[np.arange(B) % int(rule["modulus"])]
        return None
    if cell_rule["method"] == "range" and rule["method"] == "range":
        edges = [int(b) for b in cell_rule["bounds"]]
        if not set(int(b) for b in rule["bounds"]) <= set(edges):
            return None
        lows = np.array([edges[0] - 1] + edges, dtype=np.int64)  # a key of each cell
        return group_of(lows, rule)
    return None


def regroup_rows(rows: pd.DataFrame, mapping: np.ndarray, groups: int) -> pd.DataFrame:
    """Tidy rows per cell (``group`` = cell) -> tidy rows per group (``group = mapping[cell]``), every group of
    ``0..groups-1`` present in every cycle (a group without cells: no tuples, ``gamma`` 0, ``mu`` 1)."""
    if rows.empty:
        return rows.copy()
    df = rows.copy()
    df["group"] = mapping[df["group"].to_numpy(dtype=np.int64)]
    keys = ["query", "cycle_start", "cycle_seconds", "group", "entity", "stream", "right"]
    num = ["tuples", "window_tuples", "kappa", "q", "m", "s"]
    out = df.groupby(keys, dropna=False, sort=False)[num].sum(min_count=1).reset_index()
    # every (cycle, group, entity) of the schema: complete statistics even for a group holding no cell
    ids = df[["query", "cycle_start", "cycle_seconds", "entity", "stream", "right"]].drop_duplicates()
    full = ids.merge(pd.DataFrame({"group": np.arange(groups, dtype=np.int64)}), how="cross")
    out = full.merge(out, on=keys, how="left")
    stream = out["entity"] == "stream"
    for c in ("tuples", "window_tuples", "kappa"):
        out.loc[stream, c] = out.loc[stream, c].fillna(0.0)
    for c in ("q", "m", "s"):
        out.loc[~stream, c] = out.loc[~stream, c].fillna(0.0)
    out["lambda"] = np.where(stream, out["tuples"] / out["cycle_seconds"], np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["gamma"] = np.where(stream, np.nan, np.where(out["q"] > 0, out["m"] / out["q"], 0.0))
        out["mu"] = np.where(stream, np.nan, np.where(out["m"] > 0, out["s"] / out["m"], 1.0))

    return out[list(HISTORY_SCHEMA.names)].sort_values(["cycle_start", "group", "entity", "stream", "right"],
                                                       kind="stable", na_position="first").reset_index(drop=True)


def regroup(cells: Statistics, cell_rule: dict, rule: dict | None) -> Statistics:
    """A snapshot per cell -> the same snapshot per group of ``rule`` (ValueError: not a union of cells)."""
    mapping = cell_map(cell_rule, rule)
    if mapping is None:
        raise ValueError(f"the groups of {rule} are not unions of the cells of {cell_rule}")
    groups: dict = {g: GroupStats() for g in range(num_groups(rule))}
    acc_s: dict = {}
    acc_e: dict = {}
    for c, gs in cells.groups.items():
        g = int(mapping[c])
        for s, st in gs.streams.items():
            a = acc_s.setdefault((g, s), [0.0, 0.0, 0.0, 0.0])
            a[0] += st.lam or 0.0
            a[1] += st.kappa or 0.0
            a[2] += st.window_tuples or 0.0
            a[3] += st.tuples or 0.0
        for (l, r), e in gs.edges.items():
            a = acc_e.setdefault((g, l, r), [0.0, 0.0, 0.0])
            q, m, s_ = _counts(e)
            a[0] += q
            a[1] += m
            a[2] += s_
    names = {s for gs in cells.groups.values() for s in gs.streams}
    pairs = {e for gs in cells.groups.values() for e in gs.edges}
    for g, gs in groups.items():
        for s in names:
            lam, kappa, wt, tup = acc_s.get((g, s), (0.0, 0.0, 0.0, 0.0))
            gs.streams[s] = StreamStats(lam=lam, kappa=kappa, window_tuples=wt, tuples=tup)
        for (l, r) in pairs:
            gs.edges[(l, r)] = EdgeStats.from_counts(*acc_e.get((g, l, r), (0.0, 0.0, 0.0)))
    return Statistics(query=cells.query, groups=groups, kind=cells.kind, cycle_start=cells.cycle_start,
                      cycle_seconds=cells.cycle_seconds, partitioning=rule or None,
                      meta={**(cells.meta or {}), "regrouped_from": cell_rule})


def _counts(e: EdgeStats) -> tuple[float, float, float]:
    """``(q, m, s)`` of an edge; without counts (a forecast), weight 1 lookup: ``(1, gamma, gamma mu)``."""
    if e.q is not None and math.isfinite(e.q):
        return float(e.q), float(e.m or 0.0), float(e.s or 0.0)
    return 1.0, float(e.gamma), float(e.gamma) * float(e.mu)


def history_for_rule(root, query_name: str, rule: dict | None, start=None, end=None) -> tuple[pd.DataFrame, dict]:
    """The history of ``[start, end)`` as if every cycle had been computed under ``rule``: a cycle computed under
    it as stored, any other re-aggregated from its cells (a cycle with neither is left out: a missing cycle to the
    forecast). ``(rows, report)``; ``rows.attrs["cycles"]`` gives every cycle ``rule`` as its partitioning (what
    the forecast reads), ``report`` counts the cycles ``as_stored``, ``regrouped`` (by cell kind) and ``missing``."""
    hist = read_history(root, query_name, start=start, end=end, meta=True)
    metas = hist.attrs.get("cycles") or {}
    rule = rule or None
    parts, keep, report = [], {}, {"as_stored": 0, "regrouped": {}, "missing": []}
    starts = pd.to_datetime(hist["cycle_start"], utc=True) if len(hist) else pd.Series([], dtype="datetime64[ns, UTC]")
    need = []
    for cyc, meta in metas.items():
        if (meta.get("partitioning") or None) == rule:
            report["as_stored"] += 1
            keep[cyc] = meta
        else:
            need.append(cyc)
    if keep:
        parts.append(hist[starts.map(iso).isin(set(keep))])
    if need:
        for kind in CELL_KINDS:
            if not need:
                break
            cells = read_cells(root, query_name, kind, start=start, end=end)
            if cells.empty:
                continue
            cstarts = pd.to_datetime(cells["cycle_start"], utc=True).map(iso)
            done = []
            for cyc in need:
                cell_rule = (cells.attrs.get("rules") or {}).get(cyc)
                mapping = None if not cell_rule else cell_map(cell_rule, rule)
                if mapping is None:
                    continue
                parts.append(regroup_rows(cells[cstarts == cyc], mapping, num_groups(rule)))
                keep[cyc] = {**metas[cyc], "partitioning": rule, "regrouped_from": cell_rule}
                report["regrouped"][kind] = report["regrouped"].get(kind, 0) + 1
                done.append(cyc)
            need = [c for c in need if c not in done]
    report["missing"] = sorted(need)

    out = pd.concat(parts, ignore_index=True) if parts else empty_history()
    out = out.sort_values(["cycle_start", "group", "entity", "stream", "right"], kind="stable",
                          na_position="first").reset_index(drop=True)
    out.attrs["cycles"] = {c: {**m, "partitioning": rule} for c, m in keep.items()}
    return out, report

