"""The GX runner kept warm (mjoin.gates.gxengine): suites built once and registered once, validations run
without ValidationDefinition.run's freshness check and results store, and the same results as run gives."""
from __future__ import annotations

import numpy as np

from mjoin.gates.config import GateConfig
from mjoin.gates.stats import check_statistics
from mjoin.gates import gxengine
from mjoin.gates.frames import mark_expected_groups, tidy_frame
from mjoin.gates.suites import stats_values_suite
from test_gates_support import CYCLE, cycle_iso, history, select

VOLATILE = ("run_id", "validation_time")  # the time of the call (and batch_markers.ge_load_time)


def _comparable(doc: dict) -> dict:
    doc = dict(doc)
    doc["meta"] = {k: v for k, v in doc["meta"].items() if k not in VOLATILE}
    doc["meta"]["batch_markers"] = {k: v for k, v in doc["meta"]["batch_markers"].items() if k != "ge_load_time"}
    return doc


def test_suites_are_built_once_per_query_and_settings(seed_query, two_class_query):
    cfg = GateConfig()
    assert stats_values_suite(seed_query, cfg) is stats_values_suite(seed_query, GateConfig())
    assert stats_values_suite(seed_query, cfg) is not stats_values_suite(two_class_query, cfg)
    other = GateConfig.from_dict({"min_history": 3})
    assert stats_values_suite(seed_query, other) is not stats_values_suite(seed_query, cfg)


def test_warm_validation_equals_validation_definition_run(seed_query):
    frame = history(seed_query, 3)
    bad = frame.copy()
    bad.loc[select(bad, entity="edge", stream="cu", right="sr", cycle=cycle_iso(2)), "gamma"] = 1.7
    bad.loc[select(bad, entity="stream", stream="wr", cycle=cycle_iso(1)), "kappa"] = np.nan
    suite = stats_values_suite(seed_query, GateConfig())
    r = gxengine.runner()
    for f in (frame, bad):
        checked = mark_expected_groups(tidy_frame(f, seed_query), [0]).reset_index(drop=True)
        checked[gxengine.ROW_ID] = range(len(checked))
        warm = r.validate(suite, checked)
        vd = r._definition(suite)
        cold = vd.run(batch_parameters={"dataframe": checked}, result_format=gxengine.RESULT_FORMAT).to_json_dict()
        assert _comparable(warm) == _comparable(cold)
        assert warm["success"] == (f is frame)
    store = r.context.validation_results_store
    for key in store.list_keys():  # the cold runs' results
        store.remove_key(key)
    r.validate(suite, checked)
    assert not store.list_keys()  # the warm path keeps nothing: a long-lived process does not grow


def test_gate_verdicts_and_messages_unchanged_across_calls(seed_query):
    """The second and later calls (registered suite, cached configurations) report exactly what the first did."""
    good = history(seed_query, 12)
    bad = good.copy()
    bad.loc[select(bad, entity="edge", stream="wr", right="cu", cycle=cycle_iso(11)), "gamma"] = -0.1
    runs = [check_statistics(seed_query, f, cycle_iso(10), cycle_iso(12), CYCLE) for f in (bad, good, bad)]
    assert [r.status for r in runs] == ["failed", "passed", "failed"]
    assert runs[0].summary() == runs[2].summary()
    assert [f.rendered for f in runs[0].failures] == [f.rendered for f in runs[2].failures]
    assert [f.expectation for f in runs[0].failures] == ["stats.gamma_in_unit_interval"]
    assert {k: _comparable(v) for k, v in runs[0].gx_result.items()} == \
        {k: _comparable(v) for k, v in runs[2].gx_result.items()}
