"""The drift watcher: an Airflow event trigger that polls the lake for drift that makes the active plan bad.

Used as the AssetWatcher of the asset ``mjoin.drift.<query>`` (dags/mjoin_reoptimize.py schedules the DAG on
the period OR that asset). The triggerer runs :meth:`DriftTrigger.run`: every ``poll`` seconds it calls
``mjoin.loop.drift.watch`` in a thread (the two signals, each against a bound from history, and the debounce:
at most one event per ``debounce`` seconds per query); the first event ends the run with a TriggerEvent,
which Airflow records as an asset event (its ``payload`` says why) and turns into an asset-triggered run of
mjoin_reoptimize; the triggerer then starts the watcher again. No heavy import at DAG parse: the drift module
(pandas) is imported by the triggerer when the watcher runs.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class DriftTrigger(BaseEventTrigger):
    def __init__(self, lake: str, query: str, poll: float = 30.0, debounce: float = 300.0, k: float = 4.0,
                 confirm: int = 2):
        super().__init__()
        self.lake, self.query, self.poll, self.debounce, self.k, self.confirm = lake, query, poll, debounce, k, confirm

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("mjoin_drift_trigger.DriftTrigger", {"lake": self.lake, "query": self.query, "poll": self.poll,
                                                     "debounce": self.debounce, "k": self.k, "confirm": self.confirm})

    def _watch(self):
        from mjoin.lake.layout import Lake
        from mjoin.loop.drift import DriftConfig, watch

        return watch(Lake(self.lake), self.query, DriftConfig(k=self.k, confirm=self.confirm, debounce=self.debounce))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                event = await asyncio.to_thread(self._watch)
            except Exception as exc:  # a lake being written under us: log, poll again (a watcher must not die)
                self.log.warning("drift watcher of %s: %s: %s", self.query, type(exc).__name__, exc)
                event = None
            if event:
                self.log.info("drift of %s: %s", self.query, "; ".join(event["reasons"]))
                yield TriggerEvent(event)
                return
            await asyncio.sleep(self.poll)
