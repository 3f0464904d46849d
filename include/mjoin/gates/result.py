"""The one result type of every gate: status, the failed expectations with their values, the GX results.

``status`` is ``"passed"``, ``"failed"`` or ``"no_change"`` (the plan gate's
"the candidate is not enough better than the active plan": not a failure, but
nothing to deploy). Gates never raise on bad data; the caller decides, or calls
:meth:`GateResult.raise_for_status`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any

from mjoin.model.timeutil import iso
from mjoin.runtime.fsutil import atomic_write_text

PASSED, FAILED, NO_CHANGE = "passed", "failed", "no_change"
STATUSES = (PASSED, FAILED, NO_CHANGE)
#: GX's severities (``great_expectations.expectations.metadata_types.FailureSeverity``): a failed ``critical``
#: expectation fails its gate; a failed ``warning`` one is recorded and shown, and the gate passes
CRITICAL, WARNING = "critical", "warning"
#: how many failing values a Failure keeps (the GX result holds the same sample)
MAX_VALUES = 10


@dataclass
class Failure:
    """One expectation that did not hold: its name, the column, why it matters, a sample of values."""

    expectation: str  # e.g. "stats.gamma_in_unit_interval"
    column: str | None
    reason: str
    values: list = field(default_factory=list)  # sample (<= MAX_VALUES) of {"where": ..., column: value, ...}
    count: int = 0  # failing rows (1 for a table-level expectation)
    rendered: list = field(default_factory=list)  # the values as readable strings, e.g. "gamma[cu][sr]@... = 1.7"
    outcome: str = FAILED  # FAILED, or NO_CHANGE for the plan gate's improvement rule
    severity: str = CRITICAL  # CRITICAL fails the gate, WARNING is recorded and shown

    @property
    def fails_gate(self) -> bool:
        return self.outcome == FAILED and self.severity != WARNING

    @property
    def warning(self) -> bool:
        return self.outcome == FAILED and self.severity == WARNING

    def describe(self) -> str:
        what = "row" if self.count == 1 else "rows"
        head = f"{self.expectation} failed on {self.count} {what}"
        shown = "; ".join(self.rendered[:MAX_VALUES])
        more = f" (+{self.count - len(self.rendered[:MAX_VALUES])} more)" if self.count > len(self.rendered[:MAX_VALUES]) else ""
        return f"{head}: {shown}{more}" + (f" [{self.reason}]" if self.reason else "")

    def to_json(self) -> dict:
        return {"expectation": self.expectation, "column": self.column, "reason": self.reason, "count": self.count,
                "values": jsonable(self.values), "rendered": list(self.rendered), "outcome": self.outcome,
                "severity": self.severity}

    @classmethod
    def from_json(cls, doc: dict) -> "Failure":
        return cls(expectation=doc["expectation"], column=doc.get("column"), reason=doc.get("reason", ""),
                   values=list(doc.get("values") or []), count=int(doc.get("count", 0)),
                   rendered=list(doc.get("rendered") or []), outcome=doc.get("outcome", FAILED),
                   severity=doc.get("severity", CRITICAL))


class GateFailed(RuntimeError):
    """Raised by :meth:`GateResult.raise_for_status`; carries the result."""

    def __init__(self, result: "GateResult"):
        self.result = result
        super().__init__(result.summary())


@dataclass
class GateResult:
    gate: str  # "input" | "stats" | "forecast" | "plan"
    status: str
    failures: list = field(default_factory=list)  # Failure, outcome FAILED or NO_CHANGE
    details: dict = field(default_factory=dict)
    gx_result: dict = field(default_factory=dict)  # suite name -> GX validation result JSON
    query: str | None = None
    checked_at: str = ""
    evaluated: list = field(default_factory=list)  # names of every expectation that ran

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")
        if not self.checked_at:
            self.checked_at = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")

    # ---- reading ---------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        """True unless the gate failed (``no_change`` is ok: nothing is wrong, nothing to deploy)."""
        return self.status != FAILED

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    @property
    def no_change(self) -> bool:
        return self.status == NO_CHANGE

    @property
    def failed_expectations(self) -> list[str]:
        """Names of the critical expectations that failed (outcome FAILED), sorted: why the gate failed."""
        return sorted({f.expectation for f in self.failures if f.fails_gate})

    @property
    def warning_expectations(self) -> list[str]:
        """Names of the expectations of severity ``warning`` that failed, sorted (the gate still passes)."""
        return sorted({f.expectation for f in self.failures if f.warning})

    @property
    def no_change_expectations(self) -> list[str]:
        return sorted({f.expectation for f in self.failures if f.outcome == NO_CHANGE})

    def summary(self) -> str:
        """A few readable lines for the task log."""
        label = {PASSED: "passed", FAILED: "FAILED", NO_CHANGE: "no change"}[self.status]
        head = f"gate {self.gate}" + (f" ({self.query})" if self.query else "") + f": {label}"
        head += f", {len(self.evaluated)} expectations checked"
        warnings = len(self.warning_expectations)
        if warnings:
            head += f", {warnings} warning" + ("s" if warnings > 1 else "")
        lines = [head]
        for f in self.failures:
            prefix = "  no change: " if f.outcome == NO_CHANGE else "  warning: " if f.warning else "  "
            lines.append(prefix + f.describe())
        for note in self.details.get("notes", []):
            lines.append(f"  note: {note}")
        docs = self.details.get("data_docs") or {}
        if docs.get("error"):
            lines.append(f"  data docs: not stored ({docs['error']})")
        elif self.status == FAILED or warnings:
            failing = {n for n, v in self.gx_result.items() if not v.get("success", True)}
            for suite, page in (docs.get("pages") or {}).items():
                if suite in failing:
                    lines.append(f"  data docs: {docs.get('site', '')}/{page}".replace("//", "/"))
        return "\n".join(lines)

    # ---- status ------------------------------------------------------------------------
    def raise_for_status(self) -> "GateResult":
        """Raise :class:`GateFailed` if the gate failed; returns self otherwise (also on no_change)."""
        if self.status == FAILED:
            raise GateFailed(self)
        return self

    # ---- JSON --------------------------------------------------------------------------
    def to_json(self) -> dict:
        """A strict-JSON document (non-finite numbers become the strings "NaN", "Infinity", "-Infinity")."""
        return {
            "gate": self.gate,
            "status": self.status,
            "ok": self.ok,
            "query": self.query,
            "checked_at": self.checked_at,
            "failed_expectations": self.failed_expectations,
            "no_change_expectations": self.no_change_expectations,
            "warning_expectations": self.warning_expectations,
            "failures": [f.to_json() for f in self.failures],
            "evaluated": list(self.evaluated),
            "details": jsonable(self.details),
            "gx_result": jsonable(self.gx_result),
        }

    def dumps(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_json(), indent=indent, allow_nan=False)

    def save(self, path) -> None:
        atomic_write_text(path, self.dumps())

    @classmethod
    def from_json(cls, doc: dict) -> "GateResult":
        return cls(gate=doc["gate"], status=doc["status"], failures=[Failure.from_json(f) for f in doc.get("failures", [])],
                   details=doc.get("details") or {}, gx_result=doc.get("gx_result") or {}, query=doc.get("query"),
                   checked_at=doc.get("checked_at", ""), evaluated=list(doc.get("evaluated") or []))


def status_of(failures) -> str:
    """FAILED if a critical expectation failed, else NO_CHANGE if any failure says so, else PASSED (failed
    expectations of severity ``warning`` alone leave the gate passed)."""
    if any(f.fails_gate for f in failures):
        return FAILED
    if any(f.outcome == NO_CHANGE for f in failures):
        return NO_CHANGE
    return PASSED


def jsonable(obj: Any):
    """Plain JSON values: numpy scalars unwrapped, datetimes ISO, non-finite floats as strings."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, datetime):
        if obj != obj:  # pandas NaT
            return None

        return iso(obj)
    if isinstance(obj, date):
        return obj.isoformat()
    if hasattr(obj, "item") and callable(obj.item):  # numpy / pandas scalar
        try:
            obj = obj.item()
        except (ValueError, TypeError):
            return str(obj)
        if not isinstance(obj, (int, float)):
            return jsonable(obj)
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if math.isnan(obj):
            return "NaN"
        if math.isinf(obj):
            return "Infinity" if obj > 0 else "-Infinity"
        return obj
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    return str(obj)
