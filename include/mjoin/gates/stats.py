"""Gate 2: the statistics of an interval (complete, in range, finite, enough history for the forecast)."""
from __future__ import annotations

import pandas as pd

from mjoin.gates.base import GateRun
from mjoin.gates.config import GateConfig
from mjoin.gates.frames import (UNKNOWN, coverage_frame, groups_of, mark_expected_groups, missing_columns,
                                recorded_groups, tidy_frame, to_cycle)
from mjoin.gates.result import GateResult
from mjoin.gates.suites import (columns_suite, coverage_suite, stats_cycles_suite, stats_history_suite,
                                stats_values_suite)
from mjoin.model.statistics import ROW_COLUMNS
from mjoin.model.timeutil import cycles as cycle_starts, iso, parse_duration, parse_time


class StatisticsGateError(ValueError):
    """The statistics gate cannot run (e.g. no cycle length given or recorded)."""


def check_statistics(query, history: pd.DataFrame, start, end, cycle_seconds: float | str | None = None, *,
                     config: GateConfig | None = None, partitioning=UNKNOWN) -> GateResult:
    """Check the tidy statistics ``history`` (``ROW_COLUMNS``) for the interval ``[start, end)``.

    Values, completeness and grid are checked on the cycles of the interval; the history
    length counts every cycle present before ``end`` (the forecast reads back that far).

    Every key group must be present in every cycle. The groups expected come from
    ``partitioning`` (a rule, None = one group, a number of groups, group ids or a Plan:
    :func:`~mjoin.gates.frames.groups_of`), else from the partitioning the stats job recorded
    per cycle (``read_history(..., meta=True)``), else from the groups present in the
    interval (a note then says that a group missing from the whole interval cannot be seen).
    """
    cfg = config or GateConfig()
    run = GateRun("stats", query, cfg)
    t0, t1 = parse_time(start), parse_time(end)
    run.details.update({"start": iso(t0), "end": iso(t1)})

    if run.check(columns_suite(query), history.iloc[:0].copy()):
        run.skip(["stats.*"], f"the frame lacks column(s) {', '.join(missing_columns(history))}")
        return run.result()

    if cycle_seconds is not None:
        cycle_seconds = parse_duration(cycle_seconds)
    else:
        recorded = pd.to_numeric(history.get("cycle_seconds"), errors="coerce").dropna() if "cycle_seconds" in history else []
        if len(recorded) == 0:
            raise StatisticsGateError("no cycle length given and none recorded in the statistics (cycle_seconds)")
        cycle_seconds = float(pd.Series(recorded).mode().iloc[0])
    if not cycle_seconds > 0:
        raise StatisticsGateError(f"cycle length {cycle_seconds!r} must be positive")
    run.details["cycle_seconds"] = cycle_seconds

    df = tidy_frame(history, query)
    ts0, ts1 = pd.Timestamp(t0), pd.Timestamp(t1)
    no_cycle = df["cycle"].isna()
    after = int((df["cycle"] >= ts1).sum())
    if after:
        run.note(f"{after} row(s) at or after the interval end not checked")
    inside = df[(df["cycle"] >= ts0) & (df["cycle"] < ts1)]
    before_end = df[df["cycle"] < ts1]

    # the key groups expected in each cycle present in the interval
    present_cycles = sorted(inside["cycle"].unique())
    data_groups = sorted(int(g) for g in inside["group"].unique()) or [0]
    if partitioning is not UNKNOWN:
        given = groups_of(partitioning)
        expected_groups = {c: given for c in present_cycles}
        groups_from = "partitioning given"
    else:
        expected_groups = {c: recorded_groups(history, c) for c in present_cycles}
        unrecorded = [c for c, g in expected_groups.items() if g is None]
        groups_from = "partitioning recorded by the stats job" if not unrecorded else (
            "statistics rows" if len(unrecorded) == len(present_cycles) else
            "partitioning recorded by the stats job; statistics rows where none is recorded")
        if unrecorded:
            run.note(f"key groups of {len(unrecorded)} cycle(s) taken from the statistics rows themselves "
                     f"({', '.join(map(str, data_groups))}): a key group missing from every cycle of the interval "
                     "cannot be detected; pass the partitioning (check stats --partitioning) when the history does not record it")
    known = {c: g for c, g in expected_groups.items() if g is not None}
    coverage_groups = {c: (expected_groups[c] if expected_groups[c] is not None else data_groups) for c in present_cycles}

    # values, uniqueness, query, key groups: the rows of the interval, and rows that cannot be placed in time
    run.check(stats_values_suite(query, cfg), mark_expected_groups(pd.concat([inside, df[no_cycle]]), known or None))

    # completeness per cycle present in the interval and key group
    run.check(coverage_suite("stats", query), coverage_frame(inside, query, present_cycles, coverage_groups))

    # every cycle of the interval, on the grid
    expected = list(to_cycle(cycle_starts(t0, t1, cycle_seconds)))
    exp_keys = {round(c.timestamp(), 3) for c in expected}
    have_keys = {round(pd.Timestamp(c).timestamp(), 3) for c in present_cycles}
    all_cycles = sorted({*expected, *map(pd.Timestamp, present_cycles)})
    cyc = pd.DataFrame({
        "where": [iso(c) for c in all_cycles],
        "expected": [round(c.timestamp(), 3) in exp_keys for c in all_cycles],
        "present": [round(c.timestamp(), 3) in have_keys for c in all_cycles],
    })
    run.check(stats_cycles_suite(query, cfg), cyc)

    # history length before the interval end
    hist_cycles = sorted(before_end["cycle"].unique())
    hist = pd.DataFrame({"where": [iso(c) for c in hist_cycles]})
    run.check(stats_history_suite(query, cfg), hist)

    run.details.update({
        "rows_in_interval": int(len(inside)),
        "cycles_expected": len(expected),
        "cycles_present": len(present_cycles),
        "history_cycles": len(hist_cycles),
        "groups": sorted({int(g) for gs in coverage_groups.values() for g in gs} or set(data_groups)),
        "groups_from": groups_from,
    })
    return run.result()


def history_from_statistics(snapshots) -> pd.DataFrame:
    """Tidy rows (``ROW_COLUMNS``) from :class:`~mjoin.model.statistics.Statistics` snapshots."""
    rows = [r for s in snapshots for r in s.to_rows()]
    return pd.DataFrame(rows, columns=list(ROW_COLUMNS))
