"""Statistics gate: good statistics pass; each kind of bad statistics fails with exactly the expected expectations."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mjoin.gates.config import GateConfig
from mjoin.gates.stats import StatisticsGateError, check_statistics
from mjoin.gates.history import read_history
from mjoin.model.statistics import ROW_COLUMNS
from test_gates_support import CYCLE, cycle_iso, history, select

# history of 12 cycles; the interval under test is the last two
START, END = cycle_iso(10), cycle_iso(12)


def run(query, frame, **kw):
    return check_statistics(query, frame, kw.pop("start", START), kw.pop("end", END), kw.pop("cycle", CYCLE), **kw)


@pytest.fixture(scope="module")
def good(seed_query):
    return history(seed_query, 12)


def test_good_statistics_pass(seed_query, good):
    res = run(seed_query, good)
    assert res.status == "passed", res.summary()
    assert res.failures == []
    # every suite ran and is in the GX result
    assert {"stats.gamma_in_unit_interval", "stats.every_cycle_present", "stats.history_long_enough"} <= set(res.evaluated)
    assert all(doc["success"] for doc in res.gx_result.values())
    assert res.details["cycles_present"] == 2 and res.details["history_cycles"] == 12


def test_two_class_query_and_key_groups_pass(two_class_query):
    frame = history(two_class_query, 12, groups=(0, 1, 2))
    res = run(two_class_query, frame)
    assert res.status == "passed", res.summary()
    assert res.details["groups"] == [0, 1, 2]


@pytest.mark.parametrize("entity,stream,right,field,value,expected", [
    ("stream", "wr", None, "kappa", np.nan, {"stats.kappa_finite"}),
    ("stream", "cu", None, "lambda", np.inf, {"stats.lambda_finite"}),
    ("edge", "sr", "cr", "mu", -np.inf, {"stats.mu_finite"}),
    ("edge", "cu", "sr", "gamma", np.nan, {"stats.gamma_finite"}),
    ("stream", "sr", None, "lambda", -0.5, {"stats.lambda_non_negative"}),
    ("stream", "cr", None, "window_tuples", -1.0, {"stats.window_tuples_non_negative",
                                                   "stats.kappa_at_most_window_tuples"}),
    ("stream", "sr", None, "kappa", -3.0, {"stats.kappa_non_negative"}),
    ("edge", "cu", "sr", "gamma", 1.7, {"stats.gamma_in_unit_interval"}),
    ("edge", "wr", "cu", "gamma", -0.1, {"stats.gamma_in_unit_interval"}),
    ("edge", "cr", "wr", "mu", 0.5, {"stats.mu_at_least_one_where_matched"}),
    ("stream", "cu", None, "kappa", 1e9, {"stats.kappa_at_most_window_tuples"}),
])
def test_bad_value_fails_exactly(seed_query, good, entity, stream, right, field, value, expected):
    bad = good.copy()
    mask = select(bad, entity=entity, stream=stream, right=right, cycle=cycle_iso(11))
    assert mask.sum() == 1
    bad.loc[mask, field] = value
    res = run(seed_query, bad)
    assert res.status == "failed"
    assert res.failed_expectations == sorted(expected)
    f = next(f for f in res.failures if f.expectation == sorted(expected)[0])
    assert f.count == 1
    where = f"[{stream}]" if right is None else f"[{stream}][{right}]"
    assert f.values[0]["where"] == f"{where}@{cycle_iso(11)}"
    # the report names the value (NaN / inf / the number)
    text = f.describe()
    assert f"{where}@{cycle_iso(11)}" in text


def test_report_line_names_expectation_row_and_value(seed_query, good):
    bad = good.copy()
    for k in (10, 11):
        bad.loc[select(bad, entity="edge", stream="cu", right="sr", cycle=cycle_iso(k)), "gamma"] = 1.7
    res = run(seed_query, bad)
    (f,) = res.failures
    assert f.describe().startswith(f"stats.gamma_in_unit_interval failed on 2 rows: gamma[cu][sr]@{cycle_iso(10)} = 1.7; "
                                   f"gamma[cu][sr]@{cycle_iso(11)} = 1.7")
    assert f.column == "gamma" and f.count == 2
    # the GX result itself carries the expectation name and the failing values
    doc = res.gx_result[f"mjoin.stats.values.{seed_query.name}"]
    failed = [r for r in doc["results"] if not r["success"]]
    assert [r["expectation_config"]["meta"]["name"] for r in failed] == ["stats.gamma_in_unit_interval"]
    assert failed[0]["result"]["partial_unexpected_list"] == [1.7, 1.7]


def test_mu_below_one_is_fine_where_nothing_matched(seed_query, good):
    bad = good.copy()
    mask = select(bad, entity="edge", stream="cr", right="wr", cycle=cycle_iso(11))
    bad.loc[mask, ["gamma", "mu"]] = [0.0, 0.0]
    assert run(seed_query, bad).status == "passed"


def test_bad_rows_before_the_interval_do_not_block_it(seed_query, good):
    bad = good.copy()
    bad.loc[select(bad, entity="edge", stream="cu", right="sr", cycle=cycle_iso(3)), "gamma"] = 7.0
    assert run(seed_query, bad).status == "passed"


def test_missing_stream(seed_query, good):
    bad = good[~select(good, entity="stream", stream="wr", cycle=cycle_iso(10))]
    res = run(seed_query, bad)
    assert res.failed_expectations == ["stats.every_stream_present"]
    assert res.failures[0].rendered == [f"[wr]@{cycle_iso(10)} missing"]


def test_missing_edge(seed_query, good):
    bad = good[~select(good, entity="edge", stream="cr", right="sr", cycle=cycle_iso(11))]
    res = run(seed_query, bad)
    assert res.failed_expectations == ["stats.every_edge_present"]
    assert res.failures[0].values[0]["where"] == f"[cr][sr]@{cycle_iso(11)}"


def test_missing_key_group_in_one_cycle(two_class_query):
    frame = history(two_class_query, 12, groups=(0, 1))
    bad = frame[~((frame["group"] == 1) & (frame["cycle_start"] == cycle_iso(11)))]
    res = run(two_class_query, bad)
    assert res.failed_expectations == ["stats.every_edge_present", "stats.every_stream_present"]
    streams = next(f for f in res.failures if f.expectation == "stats.every_stream_present")
    assert streams.count == len(two_class_query.stream_names)
    assert all(v["where"].endswith(" g1") for v in streams.values)


def test_missing_cycle(seed_query, good):
    bad = good[good["cycle_start"] != cycle_iso(10)]
    res = run(seed_query, bad)
    assert res.failed_expectations == ["stats.every_cycle_present"]
    assert res.failures[0].values[0]["where"] == cycle_iso(10)


def test_cycle_off_the_grid(seed_query, good):
    bad = good.copy()
    bad.loc[bad["cycle_start"] == cycle_iso(11), "cycle_start"] = "2026-01-01T00:11:30Z"
    res = run(seed_query, bad)
    # the cycle at 00:11:00 is now missing and one at 00:11:30 is off the grid
    assert res.failed_expectations == ["stats.cycles_on_grid", "stats.every_cycle_present"]


def test_too_short_history(seed_query):
    short = history(seed_query, 4, start=cycle_iso(8))
    res = run(seed_query, short)
    # a warning: recorded and shown, the gate passes (the forecast falls back and is gated itself)
    assert (res.status, res.failed_expectations, res.warning_expectations) == ("passed", [],
                                                                              ["stats.history_long_enough"])
    (f,) = res.failures
    assert f.severity == "warning" and f.values[0]["observed_value"] == 4 and f.values[0]["min_value"] == 10
    assert "1 warning" in res.summary() and "  warning: stats.history_long_enough failed on 1 row" in res.summary()
    assert run(seed_query, short, config=GateConfig(min_history=4)).warning_expectations == []


def test_statistics_of_another_query(seed_query, good):
    bad = good.copy()
    bad.loc[bad["cycle_start"] == cycle_iso(11), "query"] = "some_other_query"
    res = run(seed_query, bad)
    assert res.failed_expectations == ["stats.for_this_query"]
    assert res.failures[0].count == len(seed_query.stream_names) + len(seed_query.directed_edges)


def test_unknown_stream_and_duplicate_row(seed_query, good):
    row = good[select(good, entity="stream", stream="cu", cycle=cycle_iso(11))].copy()
    ghost = row.assign(stream="ghost")
    res = run(seed_query, pd.concat([good, ghost, row], ignore_index=True))
    assert res.failed_expectations == ["stats.one_row_per_entity_and_cycle", "stats.only_known_entities"]
    dup = next(f for f in res.failures if f.expectation == "stats.one_row_per_entity_and_cycle")
    assert dup.count == 2  # both copies are reported


def test_missing_column_stops_early(seed_query, good):
    res = run(seed_query, good.drop(columns=["mu"]))
    assert res.failed_expectations == ["stats.columns_present"]
    assert res.failures[0].values[0]["missing"] == ["mu"]
    assert res.evaluated == ["stats.columns_present"]


def test_no_rows_at_all(seed_query):
    res = run(seed_query, pd.DataFrame(columns=list(ROW_COLUMNS)))
    assert res.failed_expectations == ["stats.every_cycle_present"]
    assert res.warning_expectations == ["stats.history_long_enough"] and res.status == "failed"


def test_cycle_length_recorded_in_rows_is_used(seed_query, good):
    res = check_statistics(seed_query, good, START, END)
    assert res.status == "passed" and res.details["cycle_seconds"] == CYCLE
    with pytest.raises(StatisticsGateError):
        check_statistics(seed_query, good.assign(cycle_seconds=None), START, END)


def test_history_read_back_from_parquet_and_json(seed_query, good, tmp_path):
    """The lake layout <lake>/stats/<query>/cycle=<epoch>/ as written by the stats job."""
    from test_gates_support import write_history

    root = write_history(good, tmp_path / "stats")
    back = read_history(root)
    assert len(back) == len(good)
    assert run(seed_query, back).status == "passed"
    bad = good.copy()
    bad.loc[select(bad, entity="edge", stream="cu", right="sr") & (pd.to_datetime(bad["cycle_start"], utc=True)
                                                                    == pd.Timestamp(cycle_iso(11))), "gamma"] = 1.5
    write_history(bad[pd.to_datetime(bad["cycle_start"], utc=True) == pd.Timestamp(cycle_iso(11))], root)
    assert run(seed_query, read_history(root)).failed_expectations == ["stats.gamma_in_unit_interval"]
    snaps = tmp_path / "snapshots"
    snaps.mkdir()
    from mjoin.model.statistics import Statistics

    for c, part in good.groupby("cycle_start"):
        Statistics.from_rows(part.to_dict("records")).save(snaps / f"{pd.Timestamp(c).value}.json")
    assert len(read_history(snaps)) == len(good)


def test_result_json_is_strict_and_names_values(seed_query, good):
    bad = good.copy()
    bad.loc[select(bad, entity="stream", stream="wr", cycle=cycle_iso(11)), "kappa"] = np.nan
    res = run(seed_query, bad)
    text = res.dumps()
    def reject(token):
        raise AssertionError(f"non-standard JSON constant {token}")

    doc = json.loads(text, parse_constant=reject)  # strict JSON: NaN became the string "NaN"
    assert doc["status"] == "failed" and doc["failed_expectations"] == ["stats.kappa_finite"]
    assert doc["failures"][0]["values"][0]["kappa_raw"] == "NaN"
    assert set(doc["gx_result"]) == {f"mjoin.stats.{s}.{seed_query.name}" for s in
                                     ("columns", "values", "coverage", "cycles", "history")}


def test_unreadable_cycle_start_is_reported(seed_query, good):
    bad = good.copy()
    bad.loc[select(bad, entity="stream", stream="cu", cycle=cycle_iso(11)), "cycle_start"] = "yesterday-ish"
    res = run(seed_query, bad)
    # the row is reported, and its (cycle, stream) is then missing
    assert res.failed_expectations == ["stats.cycle_start_readable", "stats.every_stream_present"]
    f = next(f for f in res.failures if f.expectation == "stats.cycle_start_readable")
    assert f.rendered == ["[cu]@yesterday-ish: cycle_start unreadable"]


# ---- key groups: expected from the partitioning, not from the rows present ----------------------

RULE2 = {"method": "hash", "attr_class": "c0", "groups": 2}


def test_key_group_missing_from_the_whole_interval(seed_query):
    """Group 1 of a 2-group partitioning is absent from both cycles of the interval: without the
    partitioning the rows look complete (a note says so); with it, every stream and edge of g1 is missing."""
    frame = history(seed_query, 12, groups=(0, 1))
    bad = frame[~((frame["group"] == 1) & frame["cycle_start"].isin([cycle_iso(10), cycle_iso(11)]))]
    blind = run(seed_query, bad)
    assert blind.status == "passed" and blind.details["groups_from"] == "statistics rows"
    assert any("cannot be detected" in n for n in blind.details["notes"])
    for partitioning in (RULE2, 2, [0, 1]):
        res = run(seed_query, bad, partitioning=partitioning)
        assert res.failed_expectations == ["stats.every_edge_present", "stats.every_stream_present"], partitioning
        streams = next(f for f in res.failures if f.expectation == "stats.every_stream_present")
        assert streams.count == 2 * len(seed_query.stream_names)  # 2 cycles x 4 streams, all in g1
        assert f"[cu]@{cycle_iso(10)} g1 missing" in streams.rendered
        assert res.details["groups"] == [0, 1] and res.details["groups_from"] == "partitioning given"
    # the complete history passes with the partitioning
    assert run(seed_query, frame, partitioning=RULE2).status == "passed"


def test_partitioning_from_a_plan_and_none(seed_query):
    from mjoin.model.plan import make_plan, orders_from_permutation

    orders = orders_from_permutation(seed_query, ["cu", "sr", "wr", "cr"])
    plan = make_plan(seed_query, {0: orders, 1: orders}, "pmjoin", partitioning=RULE2)
    one_group = history(seed_query, 12)
    assert run(seed_query, one_group, partitioning=plan).failed_expectations == [
        "stats.every_edge_present", "stats.every_stream_present"]
    assert run(seed_query, one_group, partitioning=None).status == "passed"  # no partitioning: group 0


def test_group_outside_the_partitioning(seed_query):
    """Rows of a key group the partitioning does not define were computed with another partitioning."""
    frame = history(seed_query, 12, groups=(0, 1, 2))
    res = run(seed_query, frame, partitioning=RULE2)
    assert res.failed_expectations == ["stats.groups_of_partitioning"]
    (f,) = res.failures
    assert f.count == 2 * (len(seed_query.stream_names) + len(seed_query.directed_edges))  # group 2, two cycles
    assert f.rendered[0] == f"[cu]@{cycle_iso(10)} g2: key group 2 is not one of the partitioning's groups 0,1"


def test_partitioning_recorded_by_the_stats_job_is_used(seed_query, tmp_path):
    """read_history keeps each cycle's _cycle.json: the gate expects the recorded partitioning's groups."""
    from test_gates_support import write_history

    frame = history(seed_query, 12, groups=(0, 1))
    bad = frame[~((frame["group"] == 1) & frame["cycle_start"].isin([cycle_iso(10), cycle_iso(11)]))]
    root = write_history(bad, tmp_path / "stats", meta={"partitioning": RULE2})
    res = run(seed_query, read_history(root))
    assert res.failed_expectations == ["stats.every_edge_present", "stats.every_stream_present"]
    assert res.details["groups_from"] == "partitioning recorded by the stats job"
    root = write_history(frame, tmp_path / "stats2", meta={"partitioning": RULE2})
    assert run(seed_query, read_history(root)).status == "passed"


def test_bad_partitioning_argument(seed_query, good):
    from mjoin.gates.config import GateConfigError

    with pytest.raises(GateConfigError, match="defines no key groups"):
        run(seed_query, good, partitioning={"method": "zigzag"})
    with pytest.raises(GateConfigError, match="defines no key groups"):
        run(seed_query, good, partitioning=0)
