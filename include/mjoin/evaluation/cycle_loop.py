"""The re-optimization loop replayed cycle by cycle over history, and what each strategy's plans cost.

The paper's operator re-optimizes every statistics cycle tau: after cycle k has landed, its statistics
(Eq. 9-11) join the history, Holt forecasts cycle k+1 from the last L cycles, the optimizer picks orders on
the forecast, and the new plan runs from the next batch on. :class:`CycleLoop` does exactly the steps of one
``mjoin_reoptimize`` run (``mjoin.loop``), once per cycle instead of once per period:

    statistics of cycle k (Spark job, appended to the history)  -> statistics gate
      -> Holt forecast of cycle k+1 (last L cycles)              -> forecast gate
      -> per strategy: optimize -> plan gate against its active plan (hysteresis) -> active for batch k+1

The forecast keeps each Holt value within the forecast gate's range (else the series' last value:
``LoopSettings.forecast_bound``, :mod:`mjoin.forecast.bound`), as the DAG's does. A failed statistics or
forecast gate keeps every strategy's active plan; ``no_change`` from the plan gate
keeps the strategy's. Per strategy the plan gate is called (and timed) every cycle for the first initial order's
active plan, as the DAG calls it for its one plan; for the other initial orders it is called once per distinct
(statistics, candidate, active plan), shared by the strategies (its outcome depends on nothing else), and not at
all where the active plan is the candidate (no outcome changes it). ``dppick_nosmooth`` optimizes on the last cycle's values (no forecast, so no forecast
gate: the statistics gate has checked those values); ``oracle`` is ``exact`` on batch k+1's own measured
statistics (hindsight: no gate, re-planned every cycle); ``fixed`` is never re-planned. Before the first
deploy every strategy runs its initial order, as the paper's operator does.

The engine side (:func:`chain_costs`, :func:`compose`): within one attribute class the work of a batch is a
plan-independent part (reading, routing, state maintenance, writing the same results) plus one chain per
stream whose cost depends only on that stream's probe order and the batch. The 24 fixed orders run every
one of the (n-1)! orders of every stream on every batch, so the cost of any schedule of plans (switching at
batch boundaries) is the per-batch base plus the measured chains of the orders it runs: lookups and matches
exactly (they are deterministic), times as measured in those runs.
"""
from __future__ import annotations

import logging
import statistics as stats_mod
import time
from dataclasses import dataclass, field
from itertools import permutations
from math import factorial

from mjoin.evaluation.evaluate import RECIPES
from mjoin.forecast.holt import ForecastConfig, forecast, last_value
from mjoin.gates.config import GateConfig
from mjoin.gates.forecast import check_forecast
from mjoin.gates.plan import check_plan
from mjoin.gates.stats import check_statistics
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.optimizer.cost import plan_cost, resolve_cost_model
from mjoin.optimizer.strategies import optimize
from mjoin.runtime import fsutil
from mjoin.stats.history import read_history, snapshot
from mjoin.stats.job import run_statistics

log = logging.getLogger(__name__)

#: per-cycle steps shared by every strategy, and per strategy
SHARED_STEPS = ("statistics", "history", "stats_gate", "forecast", "forecast_gate")
STRATEGY_STEPS = ("optimize", "plan_gate")


def order_key(plan, stream: str) -> tuple:
    """The probe order of ``stream`` in ``plan`` (group 0) as the tuple of streams it probes."""
    return tuple(r for _, r in plan.orders[plan.group_ids[0]][stream])


def plan_key(plan) -> tuple:
    """What a plan executes within one key group: each stream's probe order."""
    return tuple(sorted((s, order_key(plan, s)) for s in plan.orders[plan.group_ids[0]]))


@dataclass
class LoopSettings:
    strategies: tuple  # names of mjoin.evaluation.evaluate.RECIPES
    length: int = 60  # L
    cycle: float = 10.0  # tau, seconds
    gates: dict = field(default_factory=dict)  # GateConfig overrides (improvement_threshold: the hysteresis)
    cost_model: object = None  # CostModel, path or None
    #: a Holt forecast outside the forecast gate's range becomes the series' last value (mjoin.forecast.holt)
    forecast_bound: bool = True


@dataclass
class Schedules:
    """The loop's outcome: per (initial order, strategy) the plan key of every batch (gated: as deployed through
    the plan gate; ungated: the candidate every cycle whose statistics passed), the plans by key, and per cycle
    what ran and how long it took."""

    batches: list  # batch index -> cycle start (epoch seconds)
    gated: dict  # (order, strategy) -> [plan key per batch]
    ungated: dict
    plans: dict  # plan key -> Plan
    cycles: list  # per cycle: timings and gate outcomes
    settings: dict = field(default_factory=dict)


class CycleLoop:
    """One replay of the loop over the cycles of an interval, for several initial orders and strategies."""

    def __init__(self, query, settings: LoopSettings, initial_orders: list):
        unknown = [s for s in settings.strategies if s not in RECIPES]
        if unknown:
            raise ValueError(f"unknown strategies {unknown} (known: {', '.join(RECIPES)})")
        self.query = query
        self.settings = settings
        self.model = resolve_cost_model(settings.cost_model)
        self.gate_config = GateConfig.from_dict(dict(settings.gates or {}))
        self.orders = [tuple(o) for o in initial_orders]
        self.plans: dict = {}
        self.initial = {}
        for o in self.orders:
            p = make_plan(query, orders_from_permutation(query, list(o)), "fixed")
            self.initial[o] = self._keep(p)
        self.active = {(o, s): self.initial[o] for o in self.orders for s in settings.strategies}
        self.ungated_active = dict(self.active)
        self.gated = {k: [] for k in self.active}
        self.ungated = {k: [] for k in self.active}
        self.cycles: list = []

    def _keep(self, plan) -> tuple:
        k = plan_key(plan)
        self.plans.setdefault(k, plan)
        return k

    def record_batch(self, oracle_stats=None) -> None:
        """The plans that run the next batch: every strategy's active one, the oracle's from the batch's own
        statistics (``oracle_stats``; none yet: its active plan)."""
        oracle_key = None
        if oracle_stats is not None and "oracle" in self.settings.strategies:
            oracle_key = self._keep(optimize(self.query, oracle_stats, "exact", cost_model=self.model))
        for k in self.active:
            if k[1] == "oracle" and oracle_key is not None:
                self.active[k] = self.ungated_active[k] = oracle_key
            self.gated[k].append(self.active[k])
            self.ungated[k].append(self.ungated_active[k])

    def step(self, history, cycle_start: float, stats_seconds: float = 0.0) -> dict:
        """Cycle ``[cycle_start, cycle_start + tau)`` has landed and its statistics are in ``history`` (tidy rows of
        the last L cycles up to it): gate, forecast, gate, and per strategy optimize and gate. Returns the cycle's
        record (seconds per step, gate outcomes, deploys)."""
        q, cfg, tau = self.query, self.gate_config, self.settings.cycle
        end = cycle_start + tau
        rec = {"cycle_start": cycle_start, "seconds": {"statistics": stats_seconds}, "strategies": {}}
        t = time.perf_counter()
        g_stats = check_statistics(q, history, cycle_start, end, tau, config=cfg)
        rec["seconds"]["stats_gate"] = time.perf_counter() - t
        rec["stats_gate"] = g_stats.status
        fc = None
        if g_stats.ok:
            t = time.perf_counter()
            bound = cfg.forecast_bound() if self.settings.forecast_bound else None
            fc = forecast(history, end, length=self.settings.length, config=ForecastConfig(bound=bound)).statistics
            rec["seconds"]["forecast"] = time.perf_counter() - t
            rec["forecast_out_of_range"] = len(fc.meta["out_of_range"])
            rec["forecast_lagging"] = len(fc.meta.get("lagging", []))  # Holt lagging a shift: the last value (Eq. 71)
            t = time.perf_counter()
            g_fc = check_forecast(q, fc, history, config=cfg)
            rec["seconds"]["forecast_gate"] = time.perf_counter() - t
            rec["forecast_gate"] = g_fc.status
            if not g_fc.ok:
                fc = None
        lv = None
        if g_stats.ok and "dppick_nosmooth" in self.settings.strategies:
            t = time.perf_counter()
            lv = last_value(history, end, length=self.settings.length)
            rec["seconds"]["last_value"] = time.perf_counter() - t

        gate_cache: dict = {}  # (statistics source, candidate, active) -> GateResult, shared by the strategies
        for name in self.settings.strategies:
            optimizer, source = RECIPES[name]
            if name in ("fixed", "oracle"):
                continue
            st = {"forecast": fc, "last_value": lv}[source]
            srec = rec["strategies"][name] = {"deploys": 0, "no_change": 0}
            if st is None:
                srec["skipped"] = "statistics or forecast gate failed"
                continue
            t = time.perf_counter()
            cand = optimize(q, st, optimizer, cost_model=self.model)
            srec["optimize_seconds"] = time.perf_counter() - t
            ck = self._keep(cand)
            outcomes = set()
            for i, o in enumerate(self.orders):
                k = (o, name)
                self.ungated_active[k] = ck
                act = self.active[k]
                ckey = (source, ck, act)
                if i == 0:
                    # the loop's own plan gate, called and timed every cycle as the DAG calls it for its one active
                    # plan (also when the candidate has the active plan's orders)
                    t = time.perf_counter()
                    gate_cache[ckey] = self._gate(cand, act, st)
                    srec["plan_gate_seconds"] = time.perf_counter() - t
                elif act == ck:
                    srec["no_change"] += 1  # whatever the gate says, the active plan stays: no call needed
                    continue
                elif ckey not in gate_cache:
                    # the outcome depends only on the two plans' orders and the statistics they are costed under:
                    # once per distinct (statistics, candidate, active), whichever strategy or initial order asks
                    gate_cache[ckey] = self._gate(cand, act, st)
                res = gate_cache[ckey]
                outcomes.add(res.status)
                if res.passed and act != ck:
                    self.active[k] = ck
                    srec["deploys"] += 1
                else:
                    srec["no_change"] += 1
            srec["gate_outcomes"] = sorted(outcomes)
        rec["plan_gate_calls"] = len(gate_cache)
        self.cycles.append(rec)
        return rec

    def _gate(self, cand, active_key, st):
        """Gate 4 on ``cand`` against the active plan ``active_key``, both costed under ``st`` (the hysteresis)."""
        q = self.query
        return check_plan(q, cand, active=self.plans[active_key], config=self.gate_config,
                          cost_fn=lambda p: plan_cost(q, st, p, self.model))

    def schedules(self, batches: list) -> Schedules:
        return Schedules(batches=batches, gated=self.gated, ungated=self.ungated, plans=self.plans,
                         cycles=self.cycles, settings={"strategies": list(self.settings.strategies),
                                                       "length": self.settings.length, "cycle": self.settings.cycle,
                                                       "gates": self.gate_config.to_dict(),
                                                       "forecast_bound": self.settings.forecast_bound,
                                                       "cost_model": self.model.to_json()})


def replay(spark, query, lake, start: float, end: float, settings: LoopSettings, initial_orders: list, *,
           history_root: str, stats_config=None, progress: int = 30, reuse_history: bool = False) -> Schedules:
    """Run the loop over the cycles of ``[start, end)`` on the lake's data: per cycle the statistics job of that
    cycle (``mjoin.stats.job.run_statistics``, appended to the history under ``history_root``), the history of
    the last L cycles read back, then :meth:`CycleLoop.step`. Batch k of the engine is cycle k; its plan is the
    one active after cycle k-1 (batch 0: the initial order). ``reuse_history``: the history under ``history_root``
    already holds these cycles (another replay's): read them instead of running the statistics job (the
    statistics' seconds are then not recorded)."""
    tau = settings.cycle
    lake = lake if isinstance(lake, Lake) else Lake(str(lake))
    n = int(round((end - start) / tau))
    if not reuse_history:
        fsutil.remove(history_root)
    loop = CycleLoop(query, settings, initial_orders)
    batches = [start + k * tau for k in range(n)]
    measured = None
    for k, c in enumerate(batches):
        if reuse_history:
            rows = read_history(history_root, query.name, start=c, end=c + tau)
            measured = snapshot(rows, c) if len(rows) else None
            stats_seconds = 0.0
        else:
            t = time.perf_counter()
            run = run_statistics(spark, query, lake, c, c + tau, tau, out=history_root, config=stats_config)
            stats_seconds = time.perf_counter() - t
            measured = run.snapshot(c) if len(run.rows) else None
        loop.record_batch(oracle_stats=measured)  # batch k runs the plans active before cycle k's re-optimization
        t = time.perf_counter()
        history = read_history(history_root, query.name, start=c + tau - settings.length * tau, end=c + tau)
        history_seconds = time.perf_counter() - t
        rec = loop.step(history, c, stats_seconds)
        rec["seconds"]["history"] = history_seconds
        if progress and (k % progress == 0 or k == n - 1):
            log.info("cycle %d/%d: %s", k + 1, n, {s: round(v, 3) for s, v in rec["seconds"].items()})
    return loop.schedules(batches)


# ---- the engine's costs of a schedule -------------------------------------------------------------

def chain_costs(records: list, streams) -> tuple[dict, dict]:
    """From one run's per-batch metrics: ``({(batch, stream, order): cost}, {batch: base cost})`` with cost
    ``{"cpu": chain CPU, "seconds": chain time, "lookups", "matches"}`` and the base the batch's task CPU and
    time outside the chains (``cpu``, ``seconds``, ``wall``: its apportioned wall time minus chain time)."""
    chains, base = {}, {}
    for r in records:
        b = int(r["batch_id"])
        cpu = sec = 0.0
        for c in r.get("chains", []):
            order = tuple(st["right"] for st in c.get("steps", []))
            key = (b, c["stream"], order)
            acc = chains.setdefault(key, {"cpu": 0.0, "seconds": 0.0, "lookups": 0, "matches": 0})
            acc["cpu"] += float(c.get("cpu_seconds") or 0.0)
            acc["seconds"] += float(c.get("seconds") or 0.0)
            acc["lookups"] += sum(int(st.get("lookups") or 0) for st in c.get("steps", []))
            acc["matches"] += sum(int(st.get("matches") or 0) for st in c.get("steps", []))
            cpu += float(c.get("cpu_seconds") or 0.0)
            sec += float(c.get("seconds") or 0.0)
        base[b] = {"cpu": float(r.get("task_cpu_seconds") or 0.0) - cpu,
                   "seconds": float(r.get("task_seconds") or 0.0) - sec,
                   "wall": float(r.get("wall_seconds") or 0.0) - sec * _wall_share(r)}
    return chains, base


def _wall_share(r: dict) -> float:
    """A batch's wall time per second of task time (pipelined runs apportion wall time by task time)."""
    task = float(r.get("task_seconds") or 0.0)
    return float(r.get("wall_seconds") or 0.0) / task if task > 0 else 1.0


def merge_runs(runs: list) -> tuple[dict, dict]:
    """Chain and base costs of several runs (e.g. the 24 fixed orders of one repetition) as one table: each
    (batch, stream, order) keeps the median over the runs that measured it; the base, the median over runs."""
    chains: dict = {}
    bases: dict = {}
    for ch, base in runs:
        for k, v in ch.items():
            chains.setdefault(k, []).append(v)
        for b, v in base.items():
            bases.setdefault(b, []).append(v)
    med = lambda vs, f: stats_mod.median(v[f] for v in vs)  # noqa: E731
    return ({k: {f: med(vs, f) for f in ("cpu", "seconds", "lookups", "matches")} for k, vs in chains.items()},
            {b: {f: med(vs, f) for f in ("cpu", "seconds", "wall")} for b, vs in bases.items()})


def compose(schedule: list, plans: dict, chains: dict, base: dict, batch_ids: list) -> dict:
    """The engine's cost of running ``schedule`` (a plan key per batch, switching at batch boundaries): per batch
    the base plus the chains of the orders its plan runs. Returns totals and per-batch CPU (all, and the chains')."""
    tot = {"cpu": 0.0, "seconds": 0.0, "wall": 0.0, "lookups": 0, "matches": 0, "chain_cpu": 0.0}
    per_batch, per_batch_chain = [], []
    missing = 0
    for b, key in zip(batch_ids, schedule):
        bb = base.get(b)
        if bb is None:
            continue
        cpu, sec, wall = bb["cpu"], bb["seconds"], bb["wall"]
        chain_cpu = 0.0
        for stream, order in key:
            c = chains.get((b, stream, order))
            if c is None:
                missing += 1  # no new tuple of the stream in this batch (no chain ran) or an order never measured
                continue
            cpu += c["cpu"]
            chain_cpu += c["cpu"]
            sec += c["seconds"]
            wall += c["seconds"]
            tot["lookups"] += c["lookups"]
            tot["matches"] += c["matches"]
        tot["cpu"] += cpu
        tot["chain_cpu"] += chain_cpu
        tot["seconds"] += sec
        tot["wall"] += wall
        per_batch.append(cpu)
        per_batch_chain.append(chain_cpu)
    tot["per_batch_cpu"] = per_batch
    tot["per_batch_chain_cpu"] = per_batch_chain
    tot["chains_not_measured"] = missing
    return tot


def plan_changes(schedule: list, plans_cost) -> dict:
    """Plan changes of a schedule and whether each paid: a change at batch b from plan A to B pays when B's
    measured cost over the batches until the next change is below A's over the same batches (``plans_cost(key,
    batches)`` gives a plan's measured cost on those batches)."""
    changes = []
    idx = [i for i in range(1, len(schedule)) if schedule[i] != schedule[i - 1]]
    for n, i in enumerate(idx):
        j = idx[n + 1] if n + 1 < len(idx) else len(schedule)
        span = list(range(i, j))
        new, old = plans_cost(schedule[i], span), plans_cost(schedule[i - 1], span)
        changes.append({"batch": i, "batches": len(span), "new_cpu": new, "old_cpu": old, "paid": new <= old})
    return {"changes": len(changes), "paid": sum(c["paid"] for c in changes),
            "did_not_pay": sum(not c["paid"] for c in changes),
            "gain_cpu": sum(c["old_cpu"] - c["new_cpu"] for c in changes), "detail": changes}


def covering_orders(streams) -> list[tuple]:
    """A smallest set of initial orders (permutations) whose fixed plans run every probe order of every stream:
    each stream's induced orders (the permutation without it) are all distinct, so (n-1)! permutations cover
    the (n-1)! orders of each stream (for 4 streams: 6 runs instead of 24). Backtracking, lexicographic."""
    streams = list(streams)
    need = factorial(len(streams) - 1)
    perms = list(permutations(streams))

    def induced(p, s):
        return tuple(x for x in p if x != s)

    def search(chosen, start):
        if len(chosen) == need:
            return chosen
        for j in range(start, len(perms)):
            cand = chosen + [perms[j]]
            if all(len({induced(p, s) for p in cand}) == len(cand) for s in streams):
                got = search(cand, j + 1)
                if got:
                    return got
        return None

    found = search([], 0)
    if found is None:  # pragma: no cover - exists for every n tried (2..5); fall back to all
        return perms
    return found
