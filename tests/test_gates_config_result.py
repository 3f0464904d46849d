"""GateConfig overrides and the GateResult format (pure code, no GX runs except the docs check)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mjoin.gates.result import FAILED, NO_CHANGE, PASSED, Failure, GateFailed, GateResult
from mjoin.gates.config import GateConfig, GateConfigError
from mjoin.gates.result import jsonable, status_of

DOCS = Path(__file__).resolve().parent.parent / "docs" / "gates.md"


def test_defaults_are_documented_values():
    cfg = GateConfig()
    assert cfg.null_key_fraction_max == 0.10 and cfg.min_history == 10 and cfg.improvement_threshold == 0.05
    assert cfg.forecast_spread_k == 6.0 and cfg.forecast_spread == "mad" and cfg.input_engine == "pyarrow"
    # what a DAG imports: the class defaults, and all of them as JSON-ready values
    assert GateConfig.improvement_threshold == 0.05
    d = GateConfig.defaults()
    assert set(d) == set(GateConfig.keys()) and d["quiet_streams"] == [] and d["late_tolerance"] is None
    assert GateConfig.from_dict(d) == cfg


def test_overrides_from_strings_and_values():
    cfg = GateConfig.from_dict({"min_history": "20", "late_tolerance": "2m", "quiet_streams": "cu, sr",
                                "improvement_threshold": 0.1, "duplicate_lookback": "none"})
    assert cfg.min_history == 20 and cfg.late_tolerance == 120.0 and cfg.quiet_streams == ("cu", "sr")
    assert cfg.improvement_threshold == 0.1 and cfg.duplicate_lookback is None
    again = GateConfig.from_pairs(["forecast_spread_k=3", "forecast_spread=std"], base=cfg)
    assert again.forecast_spread_k == 3.0 and again.forecast_spread == "std" and again.min_history == 20
    assert GateConfig.from_dict(cfg.to_dict()) == cfg  # round trip (what a DAG param holds)


@pytest.mark.parametrize("overrides,match", [
    ({"min_histroy": 5}, "unknown gate setting.*min_histroy"),
    ({"null_key_fraction_max": 1.5}, "fraction"),
    ({"min_history": "ten"}, "min_history"),
    ({"min_history": 2.5}, "integer"),
    ({"forecast_spread": "iqr"}, "mad"),
    ({"late_tolerance": "soon"}, "late_tolerance"),
    ({"improvement_threshold": math.nan}, "improvement_threshold"),
    ({"input_engine": "dask"}, "pyarrow"),
    ({"positional_file_names": "part-(\\d+"}, "not a regular expression"),
    ({"min_history": 5, "gates_typo": 1, "another": 2}, r"unknown gate setting\(s\) another, gates_typo; known: "),
])
def test_bad_overrides_are_rejected_clearly(overrides, match):
    with pytest.raises(GateConfigError, match=match):
        GateConfig.from_dict(overrides)


def test_from_pairs_needs_key_value():
    with pytest.raises(GateConfigError, match="key=value"):
        GateConfig.from_pairs(["min_history"])


def _result(*outcomes):
    fails = [Failure(f"x.rule{i}", "c", "why", [{"where": "w", "c": math.nan}], 1, ["w = NaN"], o)
             for i, o in enumerate(outcomes)]
    return GateResult("stats", status_of(fails), fails, details={"v": np.float64(math.inf)}, query="q",
                      evaluated=["x.rule0", "x.rule1"])


def test_status_from_failures():
    assert _result().status == PASSED
    assert _result(NO_CHANGE).status == NO_CHANGE and _result(NO_CHANGE).ok
    assert _result(NO_CHANGE, FAILED).status == FAILED and not _result(FAILED).ok


def test_json_round_trip_is_strict():
    res = _result(FAILED)
    text = res.dumps()
    doc = json.loads(text, parse_constant=lambda t: pytest.fail(f"non-standard constant {t}"))
    assert doc["failures"][0]["values"][0]["c"] == "NaN" and doc["details"]["v"] == "Infinity"
    back = GateResult.from_json(doc)
    assert back.status == FAILED and back.failed_expectations == ["x.rule0"]
    assert back.failures[0].rendered == ["w = NaN"]


def test_summary_and_raise():
    res = _result(FAILED)
    lines = res.summary().splitlines()
    assert lines[0] == "gate stats (q): FAILED, 2 expectations checked"
    assert lines[1] == "  x.rule0 failed on 1 row: w = NaN [why]"
    with pytest.raises(GateFailed, match="x.rule0") as exc:
        res.raise_for_status()
    assert exc.value.result is res
    assert _result(NO_CHANGE).raise_for_status().no_change


def test_jsonable():
    from datetime import datetime, timezone

    import pandas as pd

    assert jsonable({"a": (np.int64(3), -math.inf), "t": datetime(2026, 1, 1, tzinfo=timezone.utc), "n": pd.NaT}) == \
        {"a": [3, "-Infinity"], "t": "2026-01-01T00:00:00Z", "n": None}


def test_every_expectation_is_documented():
    """docs/gates.md lists every expectation name the suites define, and no name that does not exist."""
    import re

    from mjoin.gates.suites import _register_all

    names = set(_register_all())
    text = DOCS.read_text()
    documented = set(re.findall(r"`((?:input|stats|forecast|plan)\.[a-z_]+)`", text))
    assert names - documented == set(), f"undocumented: {sorted(names - documented)}"
    assert documented - names == set(), f"documented but not defined: {sorted(documented - names)}"


def test_gates_import_neither_spark_nor_airflow():
    """House rule: pure gate logic imports no Spark and no Airflow (the Spark scan is imported on demand)."""
    import subprocess
    import sys

    code = ("import sys, mjoin.gates, mjoin.gates.plan, mjoin.gates.input, mjoin.commands.check; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'airflow', 'great_expectations')))")
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent / "include"), "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"  # GX too is imported only when a gate first runs


def test_gx_context_is_reused_and_keeps_no_results(seed_query):
    """One context per process; validation results are not accumulated in it."""
    from mjoin.gates.plan import check_plan
    from mjoin.gates.gxengine import runner
    from mjoin.model.plan import make_plan, orders_from_permutation

    plan = make_plan(seed_query, orders_from_permutation(seed_query, ["cu", "sr", "wr", "cr"]), "x", estimated_cost=1.0)
    first = runner()
    for _ in range(3):
        assert check_plan(seed_query, plan).passed
    assert runner() is first
    assert first.context.validation_results_store.list_keys() == []


def test_expectation_that_could_not_run_is_a_failure():
    """A GX metric error (e.g. a column missing from the frame) fails its expectation with the message."""
    import pandas as pd

    from mjoin.gates.gxengine import expect, make_suite, run_suite

    suite = make_suite("mjoin.test.error", [
        expect("ExpectColumnValuesToBeBetween", "test.needs_column", "why", "{where}", column="nope", min_value=0)])
    gx = {}
    (f,) = run_suite(suite, pd.DataFrame({"where": ["a"], "x": [1.0]}), gx)
    assert f.expectation == "test.needs_column" and f.count == 1
    assert f.rendered[0].startswith("could not be evaluated") and "nope" in f.rendered[0]
    assert gx["mjoin.test.error"]["success"] is False
