"""Differential: a plan with any key-to-group rule and D returns the results of one group (count and a
fingerprint over all output columns), in interval runs and streaming, also when the rule changes at batch
boundaries mid-stream; the state is kept by key bucket, not by group, so a rule change leaves it untouched."""
from __future__ import annotations

from itertools import permutations

import pytest

from engine_helpers import T0, no_leaked_queries
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.runs import run_interval, run_stream
from mjoin.engine.batch import BatchRunner
from mjoin.engine.sparkplan import apply_engine_conf, restore_conf
from mjoin.engine.compiled import key_name
from mjoin.engine.inputs import compile_plan
from mjoin.engine.interval import _cycles, prepare_interval, run_interval_plans, warm_up
from mjoin.engine.results import result_fingerprint
from mjoin.engine.state import StateStore, load_state
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.lake.registry import PlanRegistry

pytestmark = pytest.mark.spark
_ = no_leaked_queries
START, END, CYCLE = T0 + 60, T0 + 180, 30  # 4 batches of 30 s after a 1-minute warm-up


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    """The generator's 4-stream query, skewed keys over 400 values, 1-minute windows (results in every batch)."""
    from mjoin.model.query import load_query
    from mjoin.workloads.synthetic import generate_synthetic

    root = tmp_path_factory.mktemp("pmjoin") / "w"
    generate_synthetic(root, streams=4, duration="3m", rate=4, domain=400, window="1m", cycle="30s", seed=5)
    return root, load_query(str(root / "query.yaml"))


def plans_of(q) -> dict:
    """One group, and hash / range / table rules, each group probing in another order."""
    perms = list(permutations(q.stream_names))
    cls = list(q.attribute_classes)[0]

    def plan(rule, n):
        orders = {g: orders_from_permutation(q, perms[(7 * g + 3) % len(perms)]) for g in range(n)}
        return make_plan(q, orders, "pmjoin-test", partitioning=rule)

    return {
        "one": plan(None, 1),
        "hash4": plan({"method": "hash", "attr_class": cls, "groups": 4}, 4),
        "range3": plan({"method": "range", "attr_class": cls, "bounds": [40, 200]}, 3),
        "table5": plan({"method": "table", "attr_class": cls, "modulus": 64,
                        "assignment": [(b * 7 + b // 9) % 5 for b in range(64)], "groups": 5}, 5),
    }


def test_any_rule_and_d_give_the_results_of_one_group(spark, workload, tmp_path):
    root, q = workload
    plans = {k: v for k, v in plans_of(q).items() if k != "range3"}  # range: the next two tests
    summaries = run_interval_plans(spark, q, plans, Lake(str(root)), START, END, CYCLE, str(tmp_path),
                                   config=EngineConfig(buckets=2))
    prints = {name: result_fingerprint(s.results_path) for name, s in summaries.items()}
    assert prints["one"]["rows"] > 100
    assert all(p == prints["one"] for p in prints.values()), prints
    for name, s in summaries.items():  # each ran its rule: one chain per (stream, group) present
        groups = {c["group"] for r in read_metrics(s.metrics_path) for c in r["chains"] if c["rows_in"]}
        assert groups == set(plans[name].group_ids), name


def _state(runner: BatchRunner, q) -> dict:
    """The committed state as ``{(class, stream, bucket): sorted rows}``."""
    store = StateStore(runner.store.root)
    out = {}
    for key, entry in (store.latest() or {}).get("files", {}).items():
        cls, stream, bucket = key.split("/")
        rows, _ = load_state(store.root, entry, key_name(cls), 0)
        t = rows.table.drop_columns([c for c in rows.table.column_names if c.startswith("_") and c != key_name(cls)])
        out[key] = t.sort_by([(c, "ascending") for c in t.column_names])
    return out


def test_a_rule_change_at_a_batch_boundary_touches_no_state(spark, workload, tmp_path):
    """Batch after batch, the same interval with one plan, and with a plan whose rule changes at every boundary:
    the same results, and after every batch the same state (state tuples and keys per bucket; rows at the end)."""
    root, q = workload
    plans = plans_of(q)
    config = EngineConfig(buckets=2)
    runs = {"one": ["one"] * 4, "changing": ["hash4", "table5", "range3", "one"]}
    before = apply_engine_conf(spark)
    out = {}
    try:
        for name, seq in runs.items():
            runner = BatchRunner(spark, q, Lake(str(tmp_path / name)), config, mode="interval")
            prepared = prepare_interval(spark, q, runner, Lake(str(root)), START, END, CYCLE)
            try:
                warm_up(runner, compile_plan(q, plans[seq[0]], config), prepared)
                bounds, extras = _cycles(prepared)
                records = [runner.run(b, prepared.batch_input(b), compile_plan(q, plans[p], config),
                                      purge_bound=bounds[b], extra=extras[b]) for b, p in enumerate(seq, start=1)]
            finally:
                prepared.release()
            out[name] = (records, _state(runner, q), result_fingerprint(runner.results_root))
    finally:
        restore_conf(spark, before)
    (rec1, st1, fp1), (rec2, st2, fp2) = out["one"], out["changing"]
    assert fp1 == fp2 and fp1["rows"] > 100
    for a, b in zip(rec1, rec2):  # the state committed after every batch: tuples and keys per stream
        assert (a["state_tuples"], a["state_keys"]) == (b["state_tuples"], b["state_keys"])
    assert st1.keys() == st2.keys() and all(st1[k].equals(st2[k]) for k in st1)
    for rec, p in zip(rec2, runs["changing"]):  # each batch ran the plan in force at its start
        assert {c["group"] for c in rec["chains"]} == set(plans[p].group_ids)


def test_streaming_picks_up_rule_changes_at_batch_boundaries(spark, workload, tmp_path, monkeypatch):
    """One running query, four micro-batches; after each the registry's active plan changes its key-to-group rule
    (one group -> hash 4 -> table 5 -> range 3): the union of the batches equals one group's results."""
    from mjoin.engine import stream

    root, q = workload
    from mjoin.workloads.lander import land

    lake = Lake(str(tmp_path / "lake"))
    land(root, lake, None)  # cycle by cycle, in arrival order
    plans = plans_of(q)
    reg = PlanRegistry(lake, q.name)
    cli_plan = tmp_path / "one.json"
    plans["one"].save(cli_plan)
    order = ["hash4", "table5", "range3"]
    changes = [lambda n=n: reg.activate(reg.publish(plans[n]), by="test") for n in order] + [lambda: None]
    process = stream.StreamJob.process

    def process_then_change_plan(self, df, batch_id):  # what a DAG run does between two batches
        process(self, df, batch_id)
        changes[batch_id]()

    monkeypatch.setattr(stream.StreamJob, "process", process_then_change_plan)
    n_files = sum(1 for _ in (tmp_path / "lake" / "streams").rglob("*.parquet"))
    s = run_stream(spark, q, lake, plan=str(cli_plan),
                   config=EngineConfig(buckets=2, max_files_per_trigger=-(-n_files // 4)))
    assert s.batches == [0, 1, 2, 3]
    records = read_metrics(lake, q.name)
    assert [r["plan_version"] for r in records] == [None, 1, 2, 3]
    for r, name in zip(records, ["one"] + order):
        assert {c["group"] for c in r["chains"]} == set(plans[name].group_ids)
    one = run_interval(spark, q, plans["one"], Lake(str(root)), T0, T0 + 181, 181, str(tmp_path / "ref"),
                       config=EngineConfig(buckets=2))
    ref = result_fingerprint(one.results_path)
    assert ref["rows"] > 100 and result_fingerprint(lake, q.name) == ref
