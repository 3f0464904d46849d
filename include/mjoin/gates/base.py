"""Bookkeeping shared by the gates: run suites on frames, collect failures, make the GateResult, log it."""
from __future__ import annotations

import logging

from mjoin.gates.gxengine import evaluated_names, run_suite
from mjoin.gates.gxproject import project
from mjoin.gates.result import FAILED, NO_CHANGE, GateResult, status_of

log = logging.getLogger("mjoin.gates")


class GateRun:
    def __init__(self, gate: str, query, cfg):
        self.gate = gate
        self.query = query
        self.cfg = cfg
        self.failures: list = []
        self.evaluated: list = []
        self.gx: dict = {}
        self.details: dict = {"config": cfg.to_dict(), "notes": [], "skipped": []}
        self.validated: list | None = [] if cfg.stores_results else None  # (suite, GX result) for the Checkpoint

    def check(self, suite, frame) -> list:
        """Validate ``frame`` with ``suite``; returns the failures of this suite."""
        self.evaluated += evaluated_names(suite)
        found = run_suite(suite, frame, self.gx, self.validated)
        self.failures += found
        return found

    def note(self, text: str) -> None:
        self.details["notes"].append(text)

    def skip(self, names, why: str) -> None:
        """Record expectations that were not evaluated, and why (e.g. the document is not a plan)."""
        for n in names:
            self.details["skipped"].append({"expectation": n, "why": why})

    def store(self) -> None:
        """The gate's Checkpoint stores this run's results and rebuilds Data Docs (``results_store`` set): where
        the pages are goes to ``details["data_docs"]``; a failure to store is logged and said there, the
        gate's verdict stands."""
        if not self.validated:
            return
        try:
            self.details["data_docs"] = project(self.cfg.results_store).record(
                self.gate, self.query.name, self.validated, self.cfg.results_run, self.cfg.results_keep_days,
                self.cfg.results_docs)
        except Exception as exc:  # storing is a record of the verdict, never a reason to fail the run
            log.error("gate %s: the validation results were not stored in %s (%s: %s); the verdict stands",
                      self.gate, self.cfg.results_store, type(exc).__name__, exc)
            self.details["data_docs"] = {"context": self.cfg.results_store, "error": f"{type(exc).__name__}: {exc}"}

    def result(self) -> GateResult:
        self.store()
        res = GateResult(gate=self.gate, status=status_of(self.failures), failures=self.failures,
                         details=self.details, gx_result=self.gx, query=self.query.name, evaluated=self.evaluated)
        level = {FAILED: logging.WARNING, NO_CHANGE: logging.INFO}.get(res.status, logging.INFO)
        log.log(level, "%s", res.summary())
        return res
