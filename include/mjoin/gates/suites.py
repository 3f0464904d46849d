"""The expectation suites of the four gates, as code (great-expectations 1.x).

Each function returns one ``ExpectationSuite`` for one summary frame that a gate
builds in pandas (the frames and their columns are described with each suite).
Every expectation has a stable name, ``<gate>.<rule>``: those names are what the
task log, the JSON result, the CLI and the tests use. ``EXPECTATIONS`` lists
them all with their meaning (docs/gates.md is generated from the same text).

Row-wise rules that need several columns (``kappa <= window_tuples``, ``mu >= 1
where gamma > 0``, "forecast within k spreads of the recent history") are
either GX column-pair expectations or GX row conditions, or a column computed in
pandas first (a deviation, a finiteness flag) that a built-in expectation checks.
"""
from __future__ import annotations

import functools
import sys

from mjoin.gates.config import GateConfig
from mjoin.gates.gxengine import expect, make_suite
from mjoin.gates.result import NO_CHANGE, WARNING
from mjoin.model.query import load_query

STREAM_FIELDS = ("lambda", "kappa", "window_tuples")
EDGE_FIELDS = ("gamma", "mu")
MAX_FLOAT = sys.float_info.max

#: every expectation name -> what it checks (the source of the table in docs/gates.md)
EXPECTATIONS: dict[str, str] = {}


def _doc(name: str, text: str) -> str:
    EXPECTATIONS[name] = text
    return name


_SUITES: dict = {}  # (suite function, query name and fingerprint, the other arguments) -> ExpectationSuite
_SUITES_MAX = 256


def _built_once(fn):
    """A suite function that builds its suite once per query spec (name and fingerprint) and arguments
    (the gate settings are a frozen GateConfig) and then returns the same object: building a suite costs
    ~5 ms, and the GX runner registers a suite only when it sees a new object (:mod:`mjoin.gates.gxengine`)."""

    @functools.wraps(fn)
    def suite(*args, **kwargs):
        key = (fn.__name__, tuple((a.name, a.fingerprint) if hasattr(a, "stream_names") else a for a in args),
               tuple(sorted(kwargs.items())))
        try:
            hash(key)
        except TypeError:  # an unhashable argument: build every time, as before
            return fn(*args, **kwargs)
        got = _SUITES.get(key)
        if got is None:
            if len(_SUITES) >= _SUITES_MAX:
                _SUITES.clear()
            got = _SUITES[key] = fn(*args, **kwargs)
        return got

    return suite


# ---- 1. input gate ---------------------------------------------------------------------

_doc("input.files_readable", "every landed Parquet file of the interval can be opened and its footer read")
_doc("input.schema_matches_spec", "every declared column of the stream is present with a type compatible with the spec "
                                  "(key columns: see input.key_columns_present)")
_doc("input.key_columns_present", "every join-key column of the stream is present in the file")
_doc("input.event_time_parseable", "a file with rows has an event time on at least one of them (a file whose every "
                                   "event time is NULL is rejected whole)")
_doc("input.event_time_not_future", "no file has more than half of its rows with an event time at or after its "
                                    "arrival folder's epoch + future_allowance (such a file is quarantined whole by "
                                    "the join engine; its other future rows one by one)")
_doc("input.no_duplicate_files", "no file repeats another file of the stream landed in the interval or in the "
                                 "lookback before it: same bytes, same (non-positional) file name, or same rows by "
                                 "the footer fingerprint")
_doc("input.null_key_fraction_below_max", "per stream and cycle (and over the interval): NULL-key rows <= the binomial "
                                          "upper bound of the checked rows at the stream's tolerated share (its history's "
                                          "share x fraction_slack, at most null_key_fraction_max)")
_doc("input.late_fraction_below_max", "per stream and cycle (and over the interval): rows with event time < start - "
                                      "late_tolerance <= the binomial upper bound at the tolerated share (cap "
                                      "late_fraction_max)")
_doc("input.future_fraction_below_max", "per stream and cycle (and over the interval): rows with event time >= "
                                        "their arrival folder's epoch + future_allowance (the landing contract's "
                                        "future rows) <= the binomial upper bound at the tolerated share (cap "
                                        "future_fraction_max)")
_doc("input.stream_flows_when_expected", "every stream not in quiet_streams lands >= min_rows_per_cycle rows in every "
                                         "cycle, or, if its history shows it is sparse, at least its Poisson lower "
                                         "bound per cycle and over the interval")


@_built_once
def input_files_suite(query, cfg):
    """Frame ``files``: one row per landed file of the interval (where = path in the lake, stream,
    arrival, cycle, rows, read_error, schema_problem, missing_keys, no_event_time, future_file, duplicate_of,
    duplicate_kind): the file-level rules of the landing contract (:mod:`mjoin.lake.contract`)."""
    return make_suite(f"mjoin.input.files.{query.name}", [
        expect("ExpectColumnValuesToBeNull", "input.files_readable", "an unreadable file cannot be joined",
               "{where}: {read_error}", column="read_error"),
        expect("ExpectColumnValuesToBeNull", "input.schema_matches_spec",
               f"the join job reads the columns and types declared in the spec of {query.name}",
               "{where}: {schema_problem}", column="schema_problem"),
        expect("ExpectColumnValuesToBeNull", "input.key_columns_present", "a tuple without its join key cannot be joined",
               "{where}: missing key column(s) {missing_keys}", column="missing_keys"),
        expect("ExpectColumnValuesToBeNull", "input.event_time_parseable", "a tuple without an event time has no window",
               "{where}: {no_event_time}", column="no_event_time"),
        expect("ExpectColumnValuesToBeNull", "input.event_time_not_future",
               "a file whose rows are mostly from the future has a broken clock; the join job quarantines it whole",
               "{where}: {future_file}", column="future_file"),
        expect("ExpectColumnValuesToBeNull", "input.no_duplicate_files",
               "a file landed twice double-counts every join result it takes part in",
               "{where} duplicates {duplicate_of} ({duplicate_kind})", column="duplicate_of"),
    ])


@_built_once
def input_cycles_suite(query, cfg, late_tolerance: float):
    """Frame ``cycles``: one row per stream and arrival cycle (where = ``stream@cycle``) and per stream over
    the interval (``stream@interval``): rows, min_rows; null_key_rows of key_checked_rows, late and future
    of ts_checked_rows, each with its fraction, its limit (``<kind>_limit``: the binomial upper bound at the
    tolerated share ``<kind>_share``, from ``<kind>_basis``). Checked per cycle, so one bad cycle is not
    diluted by the good ones, and over the interval, so a shift too small for one cycle is seen."""
    conf = f"{cfg.fraction_confidence:.1%} confidence"
    return make_suite(f"mjoin.input.cycles.{query.name}", [
        expect("ExpectColumnPairValuesAToBeGreaterThanB", "input.null_key_fraction_below_max",
               f"rows with a NULL join key never join; more than the stream's usual share (at {conf}; at most "
               f"{cfg.null_key_fraction_max:.1%}) suggests a broken feed",
               "{where}: {null_key_rows} of {key_checked_rows} rows have a NULL join key ({null_key_fraction}), more "
               "than the {null_key_limit} expected at most at the tolerated share {null_key_share} ({null_key_basis})",
               column_A="null_key_limit", column_B="null_key_rows", or_equal=True,
               ignore_row_if="either_value_is_missing"),
        expect("ExpectColumnPairValuesAToBeGreaterThanB", "input.late_fraction_below_max",
               f"event time before the interval start - {late_tolerance:g}s: dropped by the window; more than the "
               f"stream's usual share (at {conf}; at most {cfg.late_fraction_max:.1%}) is a failure",
               "{where}: {late} of {ts_checked_rows} rows are late ({late_fraction}), more than the {late_limit} "
               "expected at most at the tolerated share {late_share} ({late_basis}); earliest event time {ts_min}",
               column_A="late_limit", column_B="late", or_equal=True, ignore_row_if="either_value_is_missing"),
        expect("ExpectColumnPairValuesAToBeGreaterThanB", "input.future_fraction_below_max",
               "event time at or after the arrival folder's epoch + the future allowance: a clock or replay error, "
               "quarantined by the join job and never moving a watermark; more than the "
               f"stream's usual share (at {conf}; at most {cfg.future_fraction_max:.1%}) is a failure",
               "{where}: {future} of {ts_checked_rows} rows are from the future ({future_fraction}), more than the "
               "{future_limit} expected at most at the tolerated share {future_share} ({future_basis}); latest event "
               "time {ts_max}",
               column_A="future_limit", column_B="future", or_equal=True, ignore_row_if="either_value_is_missing"),
        expect("ExpectColumnPairValuesAToBeGreaterThanB", "input.stream_flows_when_expected",
               f"a stream expected to flow delivered fewer than min_rows_per_cycle={cfg.min_rows_per_cycle} rows "
               "in a cycle, or (a sparse stream) fewer than its history's rate allows at "
               f"{conf} in a cycle or over the interval (streams in quiet_streams are exempt)",
               "{where}: {rows} rows, expected >= {min_rows}",
               column_A="rows", column_B="min_rows", or_equal=True),
    ])


# ---- 2. statistics (and the value rules the forecast shares) ---------------------------

#: columns a tidy statistics frame must have (the counts tuples, q, m, s are optional)
REQUIRED_COLUMNS = ("query", "cycle_start", "group", "entity", "stream", "right") + STREAM_FIELDS + EDGE_FIELDS


@_built_once
def columns_suite(query, prefix: str = "stats"):
    """Frame: the statistics rows as given (only their columns matter)."""
    return make_suite(f"mjoin.{prefix}.columns.{query.name}", [
        expect("ExpectTableColumnsToMatchSet", _doc(f"{prefix}.columns_present",
                                                     "the tidy statistics frame has the columns of ROW_COLUMNS "
                                                     "(the counts tuples, q, m, s are optional)"),
               "the tidy statistics rows (mjoin.model.statistics.ROW_COLUMNS) need these columns",
               "missing column(s) {missing}", column_set=list(REQUIRED_COLUMNS), exact_match=False),
    ])


def _value_rules(prefix: str, query) -> list:
    """Rules on the wide tidy frame made by :func:`mjoin.gates.frames.tidy_frame`.

    Columns: ``<f>`` (the value if finite, else NaN), ``<f>_raw`` (as given, for the report),
    ``<f>_is_finite`` (True/False on the rows the field belongs to, None elsewhere: GX skips
    missing values, so no row condition is needed), ``mu_where_matched`` (mu where gamma > 0),
    ``known``, ``key``. Row conditions cost a pandas ``query`` each (~7 ms); computed columns do not.
    """
    rules = [
        expect("ExpectColumnValuesToBeInSet", _doc(f"{prefix}.for_this_query", "every row names the query being checked"),
               f"statistics of another query cannot plan {query.name}", "{where}: query {query}",
               column="query", value_set=[query.name]),
        expect("ExpectColumnValuesToBeInSet", _doc(f"{prefix}.only_known_entities",
                                                    "every row is a stream or a directed edge of the join graph"),
               f"a stream or edge that is not in the join graph of {query.name} means mixed-up statistics",
               "{where}: {entity} is not in the join graph", column="known", value_set=[True]),
        expect("ExpectColumnValuesToBeInSet", _doc(f"{prefix}.cycle_start_readable",
                                                    "every row's cycle_start is a readable instant"),
               "a row that cannot be placed in time cannot be part of a series", "{where}: cycle_start unreadable",
               column="cycle_readable", value_set=[True]),
        expect("ExpectColumnValuesToBeInSet", _doc(f"{prefix}.groups_of_partitioning",
                                                    "every row's key group is one of the groups of the partitioning "
                                                    "the statistics were computed with (when it is known)"),
               "statistics of a key group the partitioning does not define were computed with another partitioning",
               "{where}: key group {group} is not one of the partitioning's groups {expected_groups}",
               column="group_expected", value_set=[True]),
        expect("ExpectColumnValuesToBeUnique", _doc(f"{prefix}.one_row_per_entity_and_cycle",
                                                     "no stream or edge appears twice in one cycle and key group"),
               "two rows for one series make the history ambiguous", "{where} appears more than once", column="key"),
    ]
    for f in STREAM_FIELDS:
        rules.append(expect("ExpectColumnValuesToBeInSet",
                            _doc(f"{prefix}.{f}_finite", f"{f} of every stream is a finite number (not NaN, not inf)"),
                            f"{f} feeds the cost model; NaN or inf makes every plan cost NaN or inf",
                            f"{f}{{where}} = {{{f}_raw}}", column=f"{f}_is_finite", value_set=[True]))
        rules.append(expect("ExpectColumnValuesToBeBetween",
                            _doc(f"{prefix}.{f}_non_negative", f"{f} >= 0 for every stream"),
                            f"{f} counts tuples or keys and cannot be negative",
                            f"{f}{{where}} = {{{f}_raw}}", column=f, min_value=0))
    rules.append(expect("ExpectColumnPairValuesAToBeGreaterThanB",
                        _doc(f"{prefix}.kappa_at_most_window_tuples", "kappa <= window_tuples for every stream"),
                        "a window cannot hold more distinct keys than tuples",
                        "kappa{where} = {kappa_raw} > window_tuples = {window_tuples_raw}",
                        column_A="window_tuples", column_B="kappa", or_equal=True, ignore_row_if="either_value_is_missing"))
    for f in EDGE_FIELDS:
        rules.append(expect("ExpectColumnValuesToBeInSet",
                            _doc(f"{prefix}.{f}_finite", f"{f} of every directed edge is a finite number"),
                            f"{f} feeds the cost model; NaN or inf makes every plan cost NaN or inf",
                            f"{f}{{where}} = {{{f}_raw}}", column=f"{f}_is_finite", value_set=[True]))
    rules.append(expect("ExpectColumnValuesToBeBetween",
                        _doc(f"{prefix}.gamma_in_unit_interval", "0 <= gamma <= 1 for every directed edge"),
                        "gamma is a match rate m/q (Eq. 9) and must lie in [0, 1]",
                        "gamma{where} = {gamma_raw}", column="gamma", min_value=0, max_value=1))
    rules.append(expect("ExpectColumnValuesToBeBetween",
                        _doc(f"{prefix}.mu_at_least_one_where_matched", "mu >= 1 for every directed edge with gamma > 0"),
                        "mu is the mean number of matches per successful lookup s/m (Eq. 10): >= 1 where lookups matched",
                        "mu{where} = {mu_raw} with gamma = {gamma_raw}", column="mu_where_matched", min_value=1))
    return rules


@_built_once
def stats_values_suite(query, cfg):
    """Frame ``values``: the tidy statistics rows of the history (one per cycle x group x stream or
    directed edge) with ``where`` = ``[s]@cycle`` or ``[l][r]@cycle`` (`` g<k>`` for key group k > 0)."""
    return make_suite(f"mjoin.stats.values.{query.name}", _value_rules("stats", query))


@_built_once
def history_columns_suite(query):
    """Frame: the statistics history the forecast is compared with (only its columns matter)."""
    return make_suite(f"mjoin.forecast.history_columns.{query.name}", [
        expect("ExpectTableColumnsToMatchSet", _doc("forecast.history_columns_present",
                                                     "the statistics history the forecast is compared with has the "
                                                     "tidy columns; if not, the plausibility rules cannot run"),
               "without a readable history the forecast cannot be compared with anything",
               "history: missing column(s) {missing}", column_set=list(REQUIRED_COLUMNS), exact_match=False),
    ])


@_built_once
def coverage_suite(prefix: str, query):
    """Frame ``coverage``: one row per (cycle present, key group, stream or directed edge of the graph);
    ``stream_present`` / ``edge_present`` is True/False on stream / edge rows and None on the others."""
    return make_suite(f"mjoin.{prefix}.coverage.{query.name}", [
        expect("ExpectColumnValuesToBeInSet",
               _doc(f"{prefix}.every_stream_present", "every stream of the join graph has a row (per cycle and key group "
                                                       "of the partitioning)"),
               "the optimizer needs lambda, kappa and window_tuples of every stream", "{where} missing",
               column="stream_present", value_set=[True]),
        expect("ExpectColumnValuesToBeInSet",
               _doc(f"{prefix}.every_edge_present",
                    "every directed edge of the join graph has a row (per cycle and key group of the partitioning)"),
               "the optimizer needs gamma and mu of every directed edge", "{where} missing",
               column="edge_present", value_set=[True]),
    ])


_doc("stats.every_cycle_present", "every cycle of the interval [start, end) has statistics rows")
_doc("stats.cycles_on_grid", "every cycle in the interval starts on the grid start + k * cycle")
_doc("stats.history_long_enough", "at least min_history cycles of history before the interval end")


@_built_once
def stats_cycles_suite(query, cfg):
    """Frame ``cycles``: one row per cycle expected in the interval or present in it (expected, present)."""
    return make_suite(f"mjoin.stats.cycles.{query.name}", [
        expect("ExpectColumnValuesToBeInSet", "stats.every_cycle_present",
               "a missing cycle leaves a hole in every forecast series", "cycle {where} missing",
               column="present", value_set=[True]),
        expect("ExpectColumnValuesToBeInSet", "stats.cycles_on_grid",
               "statistics cut with another cycle length cannot be forecast as one series", "cycle {where} is off the grid",
               column="expected", value_set=[True]),
    ])


@_built_once
def stats_history_suite(query, cfg):
    """Frame ``history``: one row per distinct cycle present before the interval end."""
    return make_suite(f"mjoin.stats.history.{query.name}", [
        expect("ExpectTableRowCountToBeBetween", "stats.history_long_enough",
               f"Holt smoothing needs about {cfg.min_history} points; fewer falls back to last value or mean "
               "(a warning: the fallback forecast is still checked by the forecast gate)",
               "{observed_value} cycles of history, need >= {min_value}", severity=WARNING, min_value=cfg.min_history),
    ])


# ---- 3. forecast -------------------------------------------------------------------------

@_built_once
def forecast_document_suite(query):
    """Frame ``document``: one row (schema_problem: why the forecast could not be read, or None)."""
    return make_suite(f"mjoin.forecast.document.{query.name}", [
        expect("ExpectColumnValuesToBeNull", _doc("forecast.schema_valid",
                                                   "the forecast validates against schemas/statistics.schema.json"),
               "only a well-formed statistics document can be planned with", "{schema_problem}", column="schema_problem"),
    ])


@_built_once
def forecast_values_suite(query, cfg):
    """Frame ``values``: the forecast snapshot as tidy rows (same columns as the statistics gate's)."""
    return make_suite(f"mjoin.forecast.values.{query.name}", _value_rules("forecast", query))


_doc("forecast.has_recent_history", "every forecast value has at least one value of recent history to compare with")
_doc("forecast.near_recent_history", "every forecast value is within forecast_spread_k spreads of the range of the recent history")


@_built_once
def forecast_plausibility_suite(query, cfg):
    """Frame ``plausibility``: one row per forecast value (where, field, value, median, low, high, spread,
    deviation, n_history); deviation = distance from value to [min, max] of the recent history / spread."""
    floor = (f"spread >= max({cfg.forecast_floor_rel:g} x |median|, {cfg.forecast_floor_abs:g}; "
             f"{cfg.forecast_floor_abs_gamma:g} for gamma)")
    spread = "1.4826 x median absolute deviation" if cfg.forecast_spread == "mad" else "standard deviation"
    return make_suite(f"mjoin.forecast.plausibility.{query.name}", [
        expect("ExpectColumnValuesToBeBetween", "forecast.has_recent_history",
               "a forecast for a series without recent history cannot be judged (a warning: the value rules still "
               "hold it finite and in range)", "{field}{where}: no recent history", severity=WARNING,
               column="n_history", min_value=1),
        expect("ExpectColumnValuesToBeBetween", "forecast.near_recent_history",
               f"more than k={cfg.forecast_spread_k:g} spreads outside the range of the last {cfg.forecast_window} cycles "
               f"(spread = {spread}, {floor})",
               "{field}{where} = {value}: recent range [{low}, {high}], median {median}, spread {spread}, "
               "{deviation} spreads outside",
               column="deviation", max_value=cfg.forecast_spread_k),
    ])


# ---- 4. plan ---------------------------------------------------------------------------------

_doc("plan.schema_valid", "the plan document validates against schemas/plan.schema.json")
_doc("plan.for_this_query", "the plan names this query")
_doc("plan.same_spec_version", "the plan's query_fingerprint (if set) is the fingerprint of this query spec")
_doc("plan.valid_for_query", "Plan.problems(query) is empty: partitioning, key groups, every order a connected "
                             "expansion of the join graph, options usable")
_doc("plan.every_stream_has_complete_order", "in every key group every stream has an order reaching all other streams")
_doc("plan.estimated_cost_finite", "the candidate's estimated cost (under the given statistics) is a finite number >= 0")
_doc("plan.improves_on_active", "(cost_active - cost_new) / cost_active >= improvement_threshold; below it the outcome "
                                "is no_change, not a failure")


@_built_once
def plan_document_suite(query, cfg, *, schema_only: bool = False, for_query_only: bool = False,
                        with_cost: bool = True):
    """Frame ``plan``: one row (schema_problem, plan_query, fingerprint, problems, estimated_cost,
    cost_is_finite, active_cost, improvement)."""
    rules = [expect("ExpectColumnValuesToBeNull", "plan.schema_valid", "only a well-formed plan can be deployed",
                    "{schema_problem}", column="schema_problem")]
    if schema_only:
        return make_suite(f"mjoin.plan.document.{query.name}", rules)
    rules.append(expect("ExpectColumnValuesToBeInSet", "plan.for_this_query",
                        f"a plan for another query cannot run {query.name}", "plan is for query {plan_query}",
                        column="plan_query", value_set=[query.name]))
    if for_query_only:
        return make_suite(f"mjoin.plan.document.{query.name}", rules)
    rules += [
        expect("ExpectColumnValuesToBeInSet", "plan.same_spec_version",
               f"the plan was made for another version of the spec (this one is {query.fingerprint})",
               "plan fingerprint {fingerprint}", column="fingerprint", value_set=[query.fingerprint]),
        expect("ExpectColumnValuesToBeNull", "plan.valid_for_query", "the join job can only execute a valid plan",
               "{problems}", column="problems"),
    ]
    if with_cost:
        rules += [
            expect("ExpectColumnValuesToBeInSet", "plan.estimated_cost_finite",
                   "a plan whose cost is NaN or inf cannot be compared", "estimated cost = {estimated_cost}",
                   column="cost_is_finite", value_set=[True]),
            expect("ExpectColumnValuesToBeBetween", "plan.improves_on_active",
                   f"deploy only when the estimated cost improves by >= {cfg.improvement_threshold:.1%} "
                   "(hysteresis: plans do not flap on noise)",
                   "improvement {improvement_pct} (cost {estimated_cost} vs active {active_cost})",
                   outcome=NO_CHANGE, column="improvement", min_value=cfg.improvement_threshold),
        ]
    return make_suite(f"mjoin.plan.document.{query.name}", rules)


@_built_once
def plan_orders_suite(query, cfg):
    """Frame ``orders``: one row per key group x stream (where = ``order[s] g<k>``, order, complete)."""
    return make_suite(f"mjoin.plan.orders.{query.name}", [
        expect("ExpectColumnValuesToBeInSet", "plan.every_stream_has_complete_order",
               "every new tuple of every stream must be probed against all other streams",
               "order{where} = {order}", column="complete", value_set=[True]),
    ])


def _register_all():
    """Build every suite once with defaults so EXPECTATIONS lists every name (used by the docs test)."""
    q, cfg = load_query("tpcds_returns_by_address"), GateConfig()
    for fn in (input_files_suite, stats_values_suite, stats_cycles_suite, stats_history_suite,
               forecast_values_suite, forecast_plausibility_suite, plan_orders_suite):
        fn(q, cfg)
    input_cycles_suite(q, cfg, 0.0)
    columns_suite(q)
    history_columns_suite(q)
    coverage_suite("stats", q)
    coverage_suite("forecast", q)
    forecast_document_suite(q)
    plan_document_suite(q, cfg)
    return dict(EXPECTATIONS)


def severities() -> dict[str, str]:
    """Every expectation name -> its GX severity, ``critical`` or ``warning`` (docs/gates.md, "Severities")."""
    _register_all()
    return {e.meta["name"]: str(getattr(e.severity, "value", e.severity))
            for suite in list(_SUITES.values()) for e in suite.expectations}
