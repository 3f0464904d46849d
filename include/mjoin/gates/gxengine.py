"""Running expectation suites with great-expectations 1.x on small pandas summary frames.

One ephemeral context per process, made on first use and reused (importing GX
costs ~2.5 s once; a validation on it then takes ~0.02-0.1 s, see
docs/gates.md). Kept warm: a suite is registered with its validation definition
once, when a new suite object is first validated (the suite functions of
:mod:`mjoin.gates.suites` return the same object for the same query and
settings), and a validation runs GX's validator on the in-memory frame and
stamps the result as ``ValidationDefinition.run`` does, without the per-call
freshness check and results store (bench/evaluation/README.md, "The loop's
overhead", measures what that saves). Each gate builds its summary frames in pandas, each frame is
validated by one suite (``mjoin.<gate>.<frame>``), and the failed
expectations are read back from the GX result into :class:`Failure` records.

Every expectation carries, in its ``meta``: ``name`` (the stable id printed and
tested, e.g. ``stats.gamma_in_unit_interval``), ``render`` (a format string
over the frame's columns for one failing row, e.g. ``gamma{where} = {gamma}``)
and ``outcome`` (``failed``, or ``no_change`` for the plan gate's hysteresis);
its ``notes`` say why the rule exists. The GX result therefore names every
failure itself.
"""
from __future__ import annotations

import datetime
import logging
import math
import string
import threading
from typing import Iterable

from mjoin.gates.result import CRITICAL, FAILED, MAX_VALUES, Failure
from mjoin.model.timeutil import iso

# great_expectations is imported inside the functions that use it, not at the top: it takes ~2.5-8 s to
# import, and every gate module (so every step of the loop, and the CLI's gate commands) imports this one.

WHERE, ROW_ID = "where", "row_id"
_lock = threading.Lock()
_runner = None


def expect(cls_name: str, name: str, reason: str, render: str, outcome: str = FAILED, severity: str = CRITICAL,
           **kwargs):
    """A GX expectation (class from ``great_expectations.expectations``) tagged with our id and rendering, and
    GX's own ``severity`` (``critical``: a failure fails the gate; ``warning``: recorded and shown, the run goes
    on; see docs/gates.md, "Severities")."""
    import great_expectations.expectations as gxe

    cls = getattr(gxe, cls_name)
    # Data Docs render the description in place of GX's generic sentence: our name, severity and why
    description = f"{name} [{severity}]: {reason}".replace("$", "$$")
    return cls(meta={"name": name, "render": render, "outcome": outcome}, notes=reason, severity=severity,
               description=description, **kwargs)


def col(name: str):
    """A GX row-condition column (``col("entity") == "edge"``)."""
    from great_expectations.expectations.row_conditions import Column

    return Column(name)


def make_suite(name: str, expectations: Iterable):
    """An ExpectationSuite (GX binds suites to the process's context, so the runner is made first)."""
    import great_expectations as gx

    runner()
    return gx.ExpectationSuite(name=name, expectations=list(expectations))


def _quiet_gx_logging() -> None:
    """GX logs hundreds of INFO lines at import (docs decorators, datasource loading); keep WARNING and
    above unless the application configured the ``great_expectations`` logger itself."""
    gx_log = logging.getLogger("great_expectations")
    if gx_log.level == logging.NOTSET:
        gx_log.setLevel(logging.WARNING)


_quiet_gx_logging()  # before anything here imports great_expectations


class GXRunner:
    """One ephemeral GX context with a pandas data source; one asset and validation definition per suite,
    registered when a suite object is first validated and reused while the gates pass the same object."""

    def __init__(self):
        _quiet_gx_logging()
        import great_expectations as gx
        from great_expectations.data_context.types.base import (DataContextConfig, InMemoryStoreBackendDefaults,
                                                                ProgressBarsConfig)

        self._gx = gx
        config = DataContextConfig(analytics_enabled=False, progress_bars=ProgressBarsConfig(globally=False),
                                   store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False))
        self.context = gx.get_context(mode="ephemeral", project_config=config)
        _cache_configurations()
        self.source = self.context.data_sources.add_pandas("mjoin")
        self._batches: dict = {}
        self._definitions: dict = {}  # suite name -> (the suite object registered, its ValidationDefinition)

    def _batch_definition(self, suite_name: str):
        bd = self._batches.get(suite_name)
        if bd is None:
            asset = self.source.add_dataframe_asset(suite_name)
            bd = asset.add_batch_definition_whole_dataframe("whole")
            self._batches[suite_name] = bd
        return bd

    def _definition(self, suite):
        """The validation definition of ``suite``: registered (suite and definition, as before every run until
        now) only when this suite object is new, i.e. the first time or after the suite was rebuilt."""
        known = self._definitions.get(suite.name)
        if known is not None and known[0] is suite:
            return known[1]
        bd = self._batch_definition(suite.name)
        registered = self.context.suites.add_or_update(suite)
        vd = self.context.validation_definitions.add_or_update(
            self._gx.ValidationDefinition(name=suite.name, data=bd, suite=registered))
        self._definitions[suite.name] = (suite, vd)
        return vd

    def validate(self, suite, frame) -> dict:
        """Validate ``frame`` (must hold ``where`` and ``row_id``) with ``suite``; the GX result as JSON."""
        return self.validate_result(suite, frame).to_json_dict()

    def validate_result(self, suite, frame):
        """The GX ``ExpectationSuiteValidationResult`` of ``frame`` under ``suite`` (what a gate's Checkpoint
        stores, :mod:`mjoin.gates.gxproject`)."""
        with _lock:
            vd = self._definition(suite)
            return _run(vd, {"dataframe": frame}, RESULT_FORMAT)


RESULT_FORMAT = {"result_format": "SUMMARY", "partial_unexpected_count": MAX_VALUES,
                 "unexpected_index_column_names": [WHERE, ROW_ID]}


def _run(vd, batch_parameters: dict, result_format: dict):
    """``vd.run(batch_parameters=..., result_format=...)`` without what a private, already registered definition
    does not need: the freshness check against the context's stores (the definition was just registered and
    nothing else writes to this process's ephemeral context) and the results store (the caller owns the result;
    storing then dropping it cost ~25 ms per validation). The result, its ``meta`` included, is what ``run``
    returns (GX 1.x ``ValidationDefinition.run``; the gates tests compare the two)."""
    from great_expectations.constants import DATAFRAME_REPLACEMENT_STR
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.validator.v1_validator import Validator

    global _configurations
    validator = Validator(batch_definition=vd.batch_definition, batch_parameters=batch_parameters,
                          result_format=result_format)
    _configurations = {}
    try:
        results = validator.validate_expectation_suite(vd.suite, None)
    finally:
        _configurations = None
    run_id = RunIdentifier(run_time=datetime.datetime.now(datetime.timezone.utc))
    results.meta["validation_id"] = vd.id
    results.meta["checkpoint_id"] = None
    results.meta["run_id"] = run_id
    results.meta["validation_time"] = run_id.run_time
    results.meta["batch_parameters"] = {k: (DATAFRAME_REPLACEMENT_STR if k == "dataframe" else v)
                                        for k, v in batch_parameters.items()}
    return results


#: while :func:`_run` validates (under ``_lock``): id(expectation) -> (expectation, its configuration)
_configurations: dict | None = None


def _cache_configurations() -> None:
    """Let GX's ``Expectation.configuration`` be computed once per expectation object and validation.

    GX 1.x rebuilds the property (a pydantic ``dict()`` and a new ``ExpectationConfiguration``) on every
    access, and one validation reads it ~500 times for a 16-expectation suite: about a third of a gate's
    time (bench/evaluation/README.md, "The loop's overhead"). Within one of our validations the expectation
    objects (made from the registered suite for that run) do not change, so the value is kept for the
    run and dropped after it; outside :func:`_run` the property is computed as GX does."""
    from great_expectations.expectations.expectation import Expectation

    prop = Expectation.__dict__.get("configuration")
    if not isinstance(prop, property) or getattr(prop.fget, "_mjoin_per_run", False):
        return
    compute = prop.fget

    def configuration(self):
        cache = _configurations
        if cache is None:
            return compute(self)
        hit = cache.get(id(self))
        if hit is None or hit[0] is not self:
            hit = cache[id(self)] = (self, compute(self))
        return hit[1]

    configuration._mjoin_per_run = True
    Expectation.configuration = property(configuration, doc=prop.__doc__)


def runner() -> GXRunner:
    """The process's GX runner (made on first use)."""
    global _runner
    with _lock:
        if _runner is None:
            _runner = GXRunner()
    return _runner


def run_suite(suite, frame, gx_results: dict, kept: list | None = None) -> list[Failure]:
    """Validate ``frame`` with ``suite``, store the GX JSON in ``gx_results[suite.name]``, return the failures;
    ``kept`` (a list) also gets ``(suite, the GX result object)`` for the gate's Checkpoint to store."""
    frame = frame.reset_index(drop=True)
    if ROW_ID not in frame.columns:
        frame[ROW_ID] = range(len(frame))
    if WHERE not in frame.columns:
        frame[WHERE] = [str(i) for i in range(len(frame))]
    result = runner().validate_result(suite, frame)
    doc = result.to_json_dict()
    gx_results[suite.name] = doc
    if kept is not None:
        kept.append((suite, result))
    return failures_from(doc, frame)


def evaluated_names(suite) -> list[str]:
    return [e.meta["name"] for e in suite.expectations]


def failures_from(doc: dict, frame) -> list[Failure]:
    """The failed expectations of a GX validation result, with their failing rows rendered from ``frame``."""
    out = []
    by_id = frame.set_index(ROW_ID, drop=False) if len(frame) else None
    for r in doc.get("results", []):
        if r.get("success"):
            continue
        cfg = r.get("expectation_config") or {}
        meta = cfg.get("meta") or {}
        kwargs = cfg.get("kwargs") or {}
        name = meta.get("name") or cfg.get("type", "?")
        reason = cfg.get("notes") or ""
        if isinstance(reason, list):
            reason = " ".join(reason)
        column = kwargs.get("column") or kwargs.get("column_A")
        outcome = meta.get("outcome", FAILED)
        severity = cfg.get("severity") or CRITICAL
        severity = str(getattr(severity, "value", severity))  # GX's FailureSeverity is a str Enum
        render = meta.get("render") or "{where}"
        res = r.get("result") or {}
        exc = r.get("exception_info") or {}
        raised = exc.get("raised_exception") or any(
            isinstance(v, dict) and v.get("raised_exception") for v in exc.values())
        if raised:
            msg = exc.get("exception_message") or next(
                (v.get("exception_message") for v in exc.values() if isinstance(v, dict) and v.get("exception_message")), "")
            out.append(Failure(name, column, reason, values=[{"error": msg}], count=1,
                               rendered=[f"could not be evaluated: {msg}"], outcome=outcome, severity=severity))
            continue
        index_list = res.get("partial_unexpected_index_list")
        if index_list is not None and "unexpected_count" in res:
            fields = [c for c in (kwargs.get("column"), kwargs.get("column_A"), kwargs.get("column_B")) if c]
            fields += [f for f in _fields(render) if f not in fields]
            values, rendered = [], []
            for entry in index_list[:MAX_VALUES]:
                row = by_id.loc[entry[ROW_ID]] if by_id is not None and entry.get(ROW_ID) in by_id.index else entry
                if getattr(row, "ndim", 1) > 1:  # duplicated row ids cannot happen, but stay safe
                    row = row.iloc[0]
                value = {WHERE: row[WHERE]}
                for f in fields:
                    if f in row:
                        value[f] = _plain(row[f])
                values.append(value)
                rendered.append(_render(render, value))
            out.append(Failure(name, column, reason, values=values, count=int(res.get("unexpected_count") or len(values)),
                               rendered=rendered, outcome=outcome, severity=severity))
        else:  # table-level expectation: one observed value
            value = {"observed_value": _plain(res.get("observed_value"))}
            mismatched = (res.get("details") or {}).get("mismatched") or {}
            if isinstance(mismatched, dict):
                value.update({k: v for k, v in mismatched.items() if k in ("missing", "unexpected")})
            value.update({k: _plain(v) for k, v in kwargs.items() if k not in ("batch_id", "row_condition")})
            out.append(Failure(name, column, reason, values=[value], count=1, rendered=[_render(render, value)],
                               outcome=outcome, severity=severity))
    return out


def _fields(fmt: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(fmt) if f]


def _plain(v):
    if hasattr(v, "item") and callable(v.item):
        try:
            return v.item()
        except (ValueError, TypeError):
            return str(v)
    if hasattr(v, "isoformat") and v == v:
        try:
            return iso(v)
        except (TypeError, ValueError):
            return str(v)
    return v


def fmt_value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.6g}"
    return str(v)


def _render(fmt: str, value: dict) -> str:
    class _Missing(dict):
        def __missing__(self, key):
            return "?"

    try:
        return fmt.format_map(_Missing({k: fmt_value(v) for k, v in value.items()}))
    except (ValueError, IndexError, KeyError):
        return str(value)
