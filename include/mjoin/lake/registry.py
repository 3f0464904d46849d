"""The plan registry: versioned plans per query, lineage, one atomically switched ACTIVE pointer.

Layout under ``<lake>/plans/<query>/`` (``Lake.plans``)::

    v000001.json            the plan, its ``version`` field set
    v000001.lineage.json    what it came from: statistics, forecast, gate results, run
    ACTIVE                  {"version": N, "previous": M, "activated_at": ..., "by": ..., "reason": ...}
    activations.jsonl       every change of ACTIVE, appended (action activate or rollback)
    .lock                   serialises publish/activate/rollback between concurrent DAG runs

Rollback semantics: the activation log is a stack. ``activate(N)`` pushes N (unless
N is already active); ``rollback()`` pops the active version and re-activates the
one below it. So rolling back twice goes two activations back and never returns
to a version that a rollback undid: after ``activate 1, activate 2, activate 3``,
two rollbacks give 2 then 1, and a third says there is nothing to roll back to.
A later ``activate`` of any version (even one rolled back before) pushes it again.
``rollback(expect_active=N)`` rolls back only while N is still active, so an
automatic rollback never undoes a manual activation made in between.

Validation and repair: ``activate`` and ``rollback`` check the target plan against the query as
``publish`` does (given the query). A damaged ``ACTIVE`` (not JSON, no version number: a hand edit, a
foreign tool) raises :class:`DamagedPointer` when read, never a ``KeyError``; ``activate`` over it works
(it replaces the pointer), ``rollback`` follows the activation log, and :meth:`PlanRegistry.repair`
points ACTIVE back at the newest activation of the log whose plan is valid (or removes it: no active
plan). A damaged version file is listed as damaged by :meth:`PlanRegistry.history`, the others as usual;
an unreadable line of the activation log is skipped.

Readers (the join job at every batch boundary) only read ``ACTIVE`` and one
immutable ``v*.json``, so they never see a torn state: ACTIVE is replaced by
an atomic rename, and a version file is complete before ACTIVE can name it.
Writers take an exclusive ``flock`` on ``.lock`` for the read-modify-write of
version numbers and ACTIVE (two DAG runs at once: a backfill and a scheduled
run). Locking needs a local or POSIX-mounted lake; on an object store use one
scheduler per query namespace (docs/operations.md).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone

from mjoin.model.plan import Plan, PlanError, load_plan
from mjoin.model.timeutil import iso
from mjoin.runtime import fsutil

VERSION_FILE = re.compile(r"^v(\d{6})\.json$")
log = logging.getLogger(__name__)


class RegistryError(RuntimeError):
    """A registry operation that cannot be done (no such version, nothing to roll back to)."""


class DamagedPointer(RegistryError):
    """``ACTIVE`` exists but names no version (not JSON, no whole version number) or cannot be read."""


@dataclass(frozen=True)
class Activation:
    """One change of ACTIVE: ``version`` became active, ``previous`` was active before it."""

    version: int
    previous: int | None
    activated_at: str
    by: str
    reason: str
    action: str = "activate"  # activate | rollback (logs written before rollbacks were marked: activate)

    def to_json(self) -> dict:
        return {"version": self.version, "previous": self.previous, "activated_at": self.activated_at,
                "by": self.by, "reason": self.reason, "action": self.action}

    @classmethod
    def from_json(cls, doc) -> "Activation":
        """An activation record; ValueError when ``doc`` is not one (no whole version number >= 1)."""
        if not isinstance(doc, dict):
            raise ValueError(f"not a JSON object but {type(doc).__name__}")
        v = doc.get("version")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"no version number (version: {json.dumps(v)})")
        prev = doc.get("previous")
        return cls(version=v, previous=prev if isinstance(prev, int) and not isinstance(prev, bool) else None,
                   activated_at=str(doc.get("activated_at", "")), by=str(doc.get("by", "")),
                   reason=str(doc.get("reason", "")), action=str(doc.get("action", "activate")))


class PlanRegistry:
    def __init__(self, lake, query: str):
        self.lake = lake
        self.query = query
        self.root = lake.plans(query)

    # ---- paths ----------------------------------------------------------------
    def _plan_path(self, version: int) -> str:
        return fsutil.join(self.root, f"v{version:06d}.json")

    def _lineage_path(self, version: int) -> str:
        return fsutil.join(self.root, f"v{version:06d}.lineage.json")

    @property
    def _active_path(self) -> str:
        return fsutil.join(self.root, "ACTIVE")

    @property
    def _log_path(self) -> str:
        return fsutil.join(self.root, "activations.jsonl")

    @contextlib.contextmanager
    def _locked(self):
        if fsutil.is_url(self.root):
            yield  # remote lakes: see the module docstring
            return
        fsutil.makedirs(self.root)
        with open(os.path.join(fsutil.resolve(self.root)[1], ".lock"), "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # ---- reading ----------------------------------------------------------------
    def versions(self) -> list[int]:
        return sorted(int(m.group(1)) for n in fsutil.listdir(self.root) if (m := VERSION_FILE.match(n)))

    def get(self, version: int, query=None) -> Plan:
        """Plan ``version`` (checked against ``query`` when given): :class:`RegistryError` if there is no such
        version, :class:`~mjoin.model.plan.PlanError` if its file is damaged or it cannot run the query."""
        path = self._plan_path(version)
        if not fsutil.exists(path):
            raise RegistryError(f"{self.query}: no plan version {version} (have {self.versions() or 'none'})")
        plan = load_plan(path, query)
        if plan.query != self.query:
            raise PlanError(f"{path}: a plan for query {plan.query!r}, not {self.query!r}")
        return plan

    def problem(self, version: int, query=None) -> str | None:
        """Why plan ``version`` cannot be activated (None: it can): missing, damaged, or invalid for ``query``."""
        try:
            self.get(version, query)
        except (RegistryError, PlanError, OSError) as exc:
            return str(exc)
        return None

    def lineage(self, version: int) -> dict:
        path = self._lineage_path(version)
        return json.loads(fsutil.read_text(path)) if fsutil.exists(path) else {}

    def active_record(self) -> Activation | None:
        """What ACTIVE says (None: no ACTIVE, no plan activated yet); :class:`DamagedPointer` if it cannot be read
        or names no version."""
        try:
            text = fsutil.read_text(self._active_path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DamagedPointer(f"{self.query}: cannot read the ACTIVE pointer {self._active_path}: {exc}") from None
        try:
            return Activation.from_json(json.loads(text))
        except ValueError as exc:
            raise DamagedPointer(f"{self.query}: the ACTIVE pointer {self._active_path} is damaged ({exc}; it holds "
                                 f"{text[:80]!r}); repair it with python -m mjoin plans repair --query {self.query}, "
                                 "or activate a version") from None

    def pointer_problem(self) -> str | None:
        """Why ACTIVE is damaged (None: it is fine, or there is none)."""
        try:
            self.active_record()
        except DamagedPointer as exc:
            return str(exc)
        return None

    def active_version(self) -> int | None:
        rec = self.active_record()
        return rec.version if rec else None

    def active_version_or_none(self) -> tuple[int | None, str | None]:
        """``(version, problem)``: the active version and None, or None and why ACTIVE is damaged (for readers
        that report the registry and must not fail on it: the UI, an outcome, the drift watcher)."""
        try:
            return self.active_version(), None
        except DamagedPointer as exc:
            return None, str(exc)

    def active(self, query=None) -> Plan | None:
        """The active plan (None before the first activation)."""
        v = self.active_version()
        return None if v is None else self.get(v, query)

    def activations(self) -> list[dict]:
        """The activation log's records, oldest first (a line that is not a record is skipped, with a warning)."""
        if not fsutil.exists(self._log_path):
            return []
        out = []
        for n, line in enumerate(fsutil.read_text(self._log_path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                out.append(Activation.from_json(json.loads(line)).to_json())
            except ValueError as exc:
                log.warning("%s: line %d of %s is not an activation record (%s): skipped", self.query, n,
                            self._log_path, exc)
        return out

    def history(self) -> list[dict]:
        """Every version with its strategy, creation time, lineage summary and whether it is active; a version
        whose file cannot be read is listed with ``damaged`` (why) and no strategy."""
        active, _ = self.active_version_or_none()
        out = []
        for v in self.versions():
            try:
                plan = self.get(v)
                lin = self.lineage(v)
            except (RegistryError, PlanError, OSError, ValueError) as exc:
                out.append({"version": v, "strategy": None, "created_at": None, "estimated_cost": None,
                            "active": v == active, "run": None, "statistics": None, "forecast": None,
                            "damaged": str(exc)})
                continue
            out.append({"version": v, "strategy": plan.strategy, "created_at": plan.created_at,
                        "estimated_cost": plan.estimated_cost, "active": v == active,
                        "run": lin.get("run"), "statistics": lin.get("statistics"), "forecast": lin.get("forecast"),
                        "damaged": None})
        return out

    # ---- writing ----------------------------------------------------------------
    def publish(self, plan: Plan, lineage: dict | None = None, query=None) -> int:
        """Store ``plan`` as the next version (not yet active); returns the version number."""
        if plan.query != self.query:
            raise PlanError(f"plan is for query {plan.query!r}, registry is for {self.query!r}")
        if query is not None:
            plan.validate(query)
        with self._locked():
            versions = self.versions()
            version = (versions[-1] if versions else 0) + 1
            doc = plan.to_json()
            doc["version"] = version
            # lineage first: a version file never exists without its lineage
            fsutil.atomic_write_text(self._lineage_path(version), json.dumps(
                {"version": version, "published_at": _now(), **(lineage or {})}, indent=2, default=str))
            fsutil.atomic_write_text(self._plan_path(version), json.dumps(doc, indent=2))
        plan.version = version
        return version

    def activate(self, version: int, by: str = "manual", reason: str = "activate", query=None) -> Activation:
        """Point ACTIVE at ``version`` (atomically); the change is appended to the activation log. The plan is
        checked first (with ``query``: that it can run it, as :meth:`publish` checks). A damaged ACTIVE is
        replaced (``previous`` is then None)."""
        with self._locked():
            if not fsutil.exists(self._plan_path(version)):
                raise RegistryError(f"{self.query}: cannot activate v{version}: no such version "
                                    f"(have {self.versions() or 'none'})")
            self.get(version, query)  # PlanError: damaged, or not valid for the query
            try:
                current = self.active_version()
            except DamagedPointer as exc:
                log.warning("%s; activating v%d replaces it", exc, version)
                current = None
            rec = Activation(version=version, previous=current, activated_at=_now(), by=by, reason=reason)
            fsutil.atomic_write_text(self._active_path, json.dumps(rec.to_json()))
            self._append_log(rec)
        return rec

    def rollback(self, by: str = "manual", reason: str = "rollback", expect_active: int | None = None,
                 query=None) -> Activation:
        """Undo the last activation: re-activate the version below the active one on the activation stack.

        Rolling back twice goes two activations back (never to a version a rollback
        undid; see the module docstring). ``expect_active``: roll back only if that
        version is still the active one, else raise :class:`RegistryError` (so an
        automatic rollback never undoes a manual activation made in the meantime).
        The target is checked as :meth:`activate` checks it (``query``). Over a damaged ACTIVE the
        activation log says which version was active."""
        with self._locked():
            try:
                rec = self.active_record()
            except DamagedPointer as exc:
                stack = self.activation_stack()
                if not stack:
                    raise RegistryError(f"{exc}; the activation log is empty: nothing to roll back to") from None
                log.warning("%s; the activation log says v%d was active", exc, stack[-1])
                rec = Activation(version=stack[-1], previous=None, activated_at="", by="activation log",
                                 reason="ACTIVE damaged")
            if expect_active is not None and (rec is None or rec.version != expect_active):
                raise RegistryError(f"{self.query}: not rolled back: the active version is "
                                    f"{'v%d' % rec.version if rec else 'none'}, not v{expect_active} "
                                    f"(changed by {rec.by if rec else '-'}: {rec.reason if rec else '-'})")
            stack = self.activation_stack()
            if rec is not None and (not stack or stack[-1] != rec.version):
                stack.append(rec.version)  # ACTIVE written, log append lost (crash in between): ACTIVE wins
            if rec is None or len(stack) < 2:
                raise RegistryError(f"{self.query}: nothing to roll back to (active: {rec.version if rec else 'none'})")
            target = stack[-2]
            why = self.problem(target, query)
            if why:
                raise RegistryError(f"{self.query}: cannot roll back to v{target}: {why}")
            new = Activation(version=target, previous=rec.version, activated_at=_now(), by=by, reason=reason,
                             action="rollback")
            fsutil.atomic_write_text(self._active_path, json.dumps(new.to_json()))
            self._append_log(new)
        return new

    def repair(self, by: str = "manual", query=None) -> tuple[Activation | None, bool]:
        """Make ACTIVE name a valid plan again; returns ``(ACTIVE's record or None, whether it changed)``. Kept
        when it does; else pointed at the newest version of the activation stack whose plan is valid (with
        ``query``: for it), recorded as action ``repair``; with none, removed (no active plan: the join job runs
        its fallback)."""
        with self._locked():
            try:
                rec = self.active_record()
            except DamagedPointer:
                rec = None
            if rec is not None and self.problem(rec.version, query) is None:
                return rec, False
            broken = rec.version if rec is not None else None
            for v in reversed(self.activation_stack()):
                if v != broken and self.problem(v, query) is None:
                    new = Activation(version=v, previous=broken, activated_at=_now(), by=by,
                                     reason="repair: ACTIVE " + ("damaged" if rec is None else f"named v{broken}, "
                                                                 "which cannot run"), action="repair")
                    fsutil.atomic_write_text(self._active_path, json.dumps(new.to_json()))
                    self._append_log(new)
                    return new, True
            fsutil.remove(self._active_path)
            return None, True

    def activation_stack(self) -> list[int]:
        """The versions a rollback would go back through, oldest first (the active one last)."""
        stack: list[int] = []
        for e in self.activations():
            v = int(e["version"])
            if e.get("action") == "repair":  # the log's stack continues at the version repaired to
                while stack and stack[-1] != v and v in stack:
                    stack.pop()
                if not stack or stack[-1] != v:
                    stack.append(v)
            elif e.get("action") == "rollback" and stack:
                stack.pop()  # the version rolled away from
                if not stack or stack[-1] != v:  # the log should already end at v; be defensive
                    stack.append(v)
            elif not stack or stack[-1] != v:
                stack.append(v)
        return stack

    def _append_log(self, rec: Activation) -> None:
        # under the lock: read, append, atomically replace (object stores have no append)
        old = fsutil.read_text(self._log_path) if fsutil.exists(self._log_path) else ""
        fsutil.atomic_write_text(self._log_path, old + json.dumps(rec.to_json()) + "\n")


def _now() -> str:
    return iso(datetime.now(timezone.utc))
