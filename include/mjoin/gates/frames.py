"""Summary frames shared by the statistics and forecast gates: tidy statistics rows made checkable.

The tidy form is ``mjoin.model.statistics.ROW_COLUMNS`` (one row per cycle x key group x
stream or directed edge). :func:`tidy_frame` adds what the suites check on:
``cycle`` (UTC timestamp), ``where`` (``[cu]@2026-01-01T00:10:00Z``,
``[cu][sr]@...``, `` g<k>`` for key group k > 0), ``known`` (in the join graph),
``key`` (series + cycle, for uniqueness) and ``<field>_is_finite``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from mjoin.gates.config import GateConfigError
from mjoin.gates.suites import EDGE_FIELDS, REQUIRED_COLUMNS, STREAM_FIELDS
from mjoin.model.keygroups import num_groups
from mjoin.model.timeutil import iso

FIELDS = STREAM_FIELDS + EDGE_FIELDS


class _Unknown:
    def __repr__(self):
        return "UNKNOWN"


#: ``partitioning=`` not given to a gate: the key groups come from what the statistics record, else the data
UNKNOWN = _Unknown()


def groups_of(partitioning) -> list[int]:
    """The key group ids a partitioning defines: a rule (:mod:`mjoin.model.keygroups`; ``None`` or ``{}`` = no
    partitioning, one group 0), a number of groups, a list of group ids, or a Plan (its partitioning)."""
    if hasattr(partitioning, "orders") and hasattr(partitioning, "partitioning"):  # a mjoin.model.plan.Plan
        partitioning = partitioning.partitioning
    try:
        if partitioning is None or (isinstance(partitioning, dict) and not partitioning):
            return [0]
        if isinstance(partitioning, bool):
            raise TypeError("a boolean")
        if isinstance(partitioning, int):
            if partitioning < 1:
                raise ValueError(f"{partitioning} groups")
            return list(range(partitioning))
        if isinstance(partitioning, (list, tuple, set, frozenset)):
            ids = sorted({int(g) for g in partitioning})
            if not ids or ids[0] < 0:
                raise ValueError(f"group ids {list(partitioning)!r}")
            return ids
        if isinstance(partitioning, dict):
            return list(range(num_groups(partitioning)))
        raise TypeError(type(partitioning).__name__)
    except (TypeError, ValueError, KeyError) as exc:
        raise GateConfigError(f"partitioning {partitioning!r} defines no key groups ({exc}); give a partitioning "
                              "rule, None (one group), a number of groups, a list of group ids or a plan") from None


def recorded_groups(history: pd.DataFrame, cycle) -> list[int] | None:
    """The key groups of the partitioning the stats job recorded for ``cycle`` (``_cycle.json``, read with
    ``read_history(..., meta=True)`` into ``history.attrs["cycles"]``); None if nothing is recorded."""
    meta = (getattr(history, "attrs", {}).get("cycles") or {}).get(iso(cycle)) if cycle is not None else None
    if not meta or "partitioning" not in meta:
        return None
    return groups_of(meta["partitioning"])


def mark_expected_groups(df: pd.DataFrame, expected) -> pd.DataFrame:
    """Set ``group_expected`` (True/False; None where unknown) and ``expected_groups`` (for the report) from
    ``expected``: None (unknown), a list of group ids, or ``{cycle: list or None}``."""
    df = df.copy()
    flags, shown = [], []
    for c, g in zip(df["cycle"], df["group"]):
        ids = expected.get(c) if isinstance(expected, dict) else expected
        flags.append(None if ids is None else bool(g in ids))
        shown.append(None if ids is None else ",".join(map(str, ids)))
    df["group_expected"] = pd.Series(flags, index=df.index, dtype=object)
    df["expected_groups"] = pd.Series(shown, index=df.index, dtype=object)
    return df


def missing_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in REQUIRED_COLUMNS if c not in frame.columns]


def to_cycle(values) -> pd.Series:
    """UTC timestamps from ISO strings, datetimes or epoch seconds; None and unreadable values become NaT."""
    s = pd.Series(values)
    if s.empty:
        return pd.Series(pd.to_datetime([], utc=True))
    if pd.api.types.is_numeric_dtype(s):
        return pd.to_datetime(s, unit="s", utc=True)
    if pd.api.types.is_datetime64_any_dtype(s):
        return pd.to_datetime(s, utc=True)

    def one(v):
        if v is None or (isinstance(v, float) and v != v):
            return None
        try:
            return iso(v)
        except (TypeError, ValueError, OverflowError):
            return None
    return pd.to_datetime(s.map(one), utc=True, format="ISO8601")


def where_label(entity, stream, right, group, cycle) -> str:
    """``[s]`` or ``[l][r]``, then ``@<cycle>`` and `` g<k>`` for key group k > 0."""
    out = f"[{stream}]" if entity == "stream" else f"[{stream}][{right}]"
    if cycle is not None and not pd.isna(cycle):
        out += f"@{iso(cycle)}"
    try:
        g = int(group)
    except (TypeError, ValueError):
        g = group
    if g != 0:
        out += f" g{g}"
    return out


def tidy_frame(rows: pd.DataFrame, query) -> pd.DataFrame:
    """The checkable form of tidy statistics rows (see the module docstring)."""
    df = rows.copy().reset_index(drop=True)
    df["cycle"] = to_cycle(df["cycle_start"]).reset_index(drop=True)
    df["group"] = pd.to_numeric(df["group"], errors="coerce").fillna(-1).astype(int)
    is_entity = {"stream": (df["entity"] == "stream").to_numpy(), "edge": (df["entity"] == "edge").to_numpy()}
    for f in FIELDS:
        raw = pd.to_numeric(df[f], errors="coerce").astype(float)
        finite = np.isfinite(raw.to_numpy())
        mine = is_entity["stream" if f in STREAM_FIELDS else "edge"]
        df[f"{f}_raw"] = raw.where(mine, np.nan)
        df[f] = raw.where(mine & finite, np.nan)  # range rules see finite values only
        df[f"{f}_is_finite"] = pd.Series(finite, dtype=object).where(mine, None)  # None: not this entity's field
    gamma_pos = (df["gamma"] > 0).to_numpy()
    df["mu_where_matched"] = df["mu"].where(gamma_pos, np.nan)
    df["right"] = df["right"].astype(object).where(df["right"].notna(), None)
    streams = set(query.stream_names)
    edges = set(query.directed_edges)
    df["known"] = [
        (e == "stream" and s in streams) or (e == "edge" and (s, r) in edges)
        for e, s, r in zip(df["entity"], df["stream"], df["right"])
    ]
    df["where"] = [where_label(e, s, r, g, c) for e, s, r, g, c in
                   zip(df["entity"], df["stream"], df["right"], df["group"], df["cycle"])]
    # a cycle_start that was given but cannot be read (None is allowed: a forecast may have none)
    given = df["cycle_start"].map(lambda v: v is not None and not (isinstance(v, float) and v != v))
    df["cycle_readable"] = (df["cycle"].notna() | ~given).astype(object)
    unread = df["cycle"].isna() & given
    if unread.any():
        df.loc[unread, "where"] = df.loc[unread, "where"] + "@" + df.loc[unread, "cycle_start"].astype(str)
    df["key"] = df["entity"].astype(str) + "|" + df["where"]
    df["group_expected"] = pd.Series([None] * len(df), index=df.index, dtype=object)  # see mark_expected_groups
    df["expected_groups"] = pd.Series([None] * len(df), index=df.index, dtype=object)
    return df


def coverage_frame(df: pd.DataFrame, query, cycles, groups) -> pd.DataFrame:
    """One row per (cycle, group, stream or directed edge of the graph) with ``present``; ``groups`` is a list
    of group ids for every cycle or ``{cycle: list}``."""
    have = set(zip(df["cycle"], df["group"], df["entity"], df["stream"], df["right"].map(lambda v: v or None)))
    out = []
    for c in cycles:
        for g in (groups[c] if isinstance(groups, dict) else groups):
            for s in query.stream_names:
                out.append(("stream", s, None, g, c, (c, g, "stream", s, None) in have))
            for l, r in query.directed_edges:
                out.append(("edge", l, r, g, c, (c, g, "edge", l, r) in have))
    frame = pd.DataFrame(out, columns=["entity", "stream", "right", "group", "cycle", "present"])
    frame["where"] = [where_label(e, s, r, g, c) for e, s, r, g, c, _ in out]
    for entity in ("stream", "edge"):
        frame[f"{entity}_present"] = frame["present"].astype(object).where(frame["entity"] == entity, None)
    return frame
