"""The per-cycle loop replay and the evaluation's pieces (bench/evaluation):

- covering orders run every probe order of every stream;
- the loop's step (gate calls shared and skipped where they cannot change a plan) deploys exactly what the plan
  gate called for every initial order and strategy with its own candidate deploys;
- a schedule's cost composed from fixed-order runs equals a real run that switches plans at every batch boundary
  (lookups and matches exactly, the same result rows);
- the SQL text the Flink peer runs (window conditions as pairwise interval predicates) returns exactly the DuckDB
  reference's rows, run by DuckDB itself over the CSV copies the peer reads, and by Flink when its venv exists.
"""
from __future__ import annotations

import json
import subprocess
import sys
from itertools import permutations
from pathlib import Path

import pytest

from mjoin.evaluation.cycle_loop import chain_costs, compose, covering_orders, merge_runs, plan_changes

PROJECT = Path(__file__).resolve().parent.parent
EVAL = PROJECT / "bench" / "evaluation"
FLINK_PY = EVAL / ".flink-venv" / "bin" / "python"


def _peers():
    sys.path.insert(0, str(EVAL))
    import peers

    return peers


@pytest.mark.parametrize("n", [3, 4])
def test_covering_orders_run_every_order_of_every_stream(n):
    streams = [f"s{i}" for i in range(n)]
    chosen = covering_orders(streams)
    assert len(chosen) == len(list(permutations(range(n - 1))))
    for s in streams:
        induced = {tuple(x for x in p if x != s) for p in chosen}
        assert induced == set(permutations([x for x in streams if x != s]))


def test_compose_adds_the_base_and_the_chains_of_each_batch():
    chains = {(1, "a", ("b",)): {"cpu": 1.0, "seconds": 2.0, "lookups": 3, "matches": 4},
              (2, "a", ("b",)): {"cpu": 10.0, "seconds": 20.0, "lookups": 30, "matches": 40},
              (1, "b", ("a",)): {"cpu": 0.5, "seconds": 0.5, "lookups": 1, "matches": 0}}
    base = {1: {"cpu": 0.25, "seconds": 0.5, "wall": 1.0}, 2: {"cpu": 0.25, "seconds": 0.5, "wall": 1.0}}
    key = (("a", ("b",)), ("b", ("a",)))
    got = compose([key, key], {}, chains, base, [1, 2])
    assert got["cpu"] == pytest.approx(0.25 + 1.0 + 0.5 + 0.25 + 10.0)
    assert (got["lookups"], got["matches"]) == (34, 44)
    assert got["chains_not_measured"] == 1  # b had no new tuple in batch 2: no chain ran
    assert got["per_batch_cpu"] == pytest.approx([1.75, 10.25])


def test_plan_changes_pay_when_the_new_plan_measures_less_until_the_next_change():
    cost = {"A": 1.0, "B": 0.5, "C": 2.0}
    r = plan_changes(["A", "A", "B", "B", "C"], lambda key, batches: cost[key] * len(batches))
    assert (r["changes"], r["paid"], r["did_not_pay"]) == (2, 1, 1)
    assert r["gain_cpu"] == pytest.approx((1.0 - 0.5) * 2 + (0.5 - 2.0) * 1)


def test_merge_runs_takes_each_chain_median():
    run = lambda cpu: ({(1, "a", ("b",)): {"cpu": cpu, "seconds": cpu, "lookups": 2, "matches": 1}},  # noqa: E731
                       {1: {"cpu": cpu, "seconds": cpu, "wall": cpu}})
    chains, base = merge_runs([run(1.0), run(3.0), run(2.0)])
    assert chains[(1, "a", ("b",))]["cpu"] == 2.0 and base[1]["wall"] == 2.0


def test_loop_step_deploys_what_gating_every_order_and_strategy_deploys(seed_query):
    """The step calls the plan gate once per distinct (statistics, candidate, active plan) and not at all where the
    active plan is the candidate; the plans it deploys equal gating each (initial order, strategy) on its own."""
    import pandas as pd
    from test_gates_support import CYCLE, EPOCH0, snapshot

    from mjoin.optimizer.cost import plan_cost
    from mjoin.evaluation.cycle_loop import CycleLoop, LoopSettings, plan_key
    from mjoin.evaluation.evaluate import RECIPES
    from mjoin.forecast.holt import forecast, last_value
    from mjoin.gates.plan import check_plan
    from mjoin.optimizer.strategies import optimize
    from mjoin.model.statistics import ROW_COLUMNS

    q = seed_query
    first = q.stream_names[0]

    def snap(k):  # plausible cycles; from cycle 11 the first stream's rate grows by 60% of its level each cycle
        st = snapshot(q, EPOCH0 + k * CYCLE, seed=k)
        s0, f = st.groups[0].streams[first], 1 + 0.6 * max(0, k - 10)
        s0.window_tuples, s0.tuples, s0.lam, s0.kappa = (v * f for v in (s0.window_tuples, s0.tuples, s0.lam,
                                                                         s0.kappa))
        return st

    hist = pd.DataFrame([r for k in range(16) for r in snap(k).to_rows()], columns=list(ROW_COLUMNS))
    strategies = ("fixed", "greedy", "dppick", "dppick_nosmooth", "oracle")
    orders = [list(permutations(q.stream_names))[i] for i in (0, 11, 23)]
    loop = CycleLoop(q, LoopSettings(strategies=strategies, length=60, cycle=CYCLE), orders)
    deploys = skipped = 0
    for k in range(13, 16):
        c = EPOCH0 + k * CYCLE
        h = hist[pd.to_datetime(hist["cycle_start"], utc=True) < pd.Timestamp(c + CYCLE, unit="s", tz="UTC")]
        loop.record_batch(oracle_stats=snap(k))
        before = dict(loop.active)
        rec = loop.step(h, c)
        assert rec["stats_gate"] == rec["forecast_gate"] == "passed"
        st = {"forecast": forecast(h, c + CYCLE, length=60).statistics, "last_value": last_value(h, c + CYCLE, length=60)}
        asked = set()
        for (o, s), old in before.items():
            if s in ("fixed", "oracle"):
                assert loop.active[(o, s)] == old
                continue
            optimizer, source = RECIPES[s]
            cand = optimize(q, st[source], optimizer, cost_model=loop.model)
            ck = plan_key(cand)
            assert loop.ungated_active[(o, s)] == ck
            if old == ck:  # the candidate is the active plan: no outcome of the gate changes it
                assert loop.active[(o, s)] == old
                skipped += o != orders[0]
            else:
                res = check_plan(q, cand, active=loop.plans[old], config=loop.gate_config,
                                 cost_fn=lambda p, x=st[source]: plan_cost(q, x, p, loop.model))
                want = ck if res.passed else old
                assert loop.active[(o, s)] == want, (k, o, s, res.status)
                deploys += want != old
            if o == orders[0] or old != ck:
                asked.add((source, ck, old))
        assert rec["plan_gate_calls"] == len(asked)
    assert deploys > 0 and skipped > 0  # both paths ran



@pytest.mark.parametrize("bound", [True, False])
def test_loop_step_after_a_step_keeps_re_planning_with_the_forecast_bound(seed_query, bound, holt_global_fit):
    """The first stream's rate steps up x50..x200 in cycles 12-15 (it turns hot): Holt's trend overshoots the new
    level. With the forecast bound (the default) that series gets its last value, the forecast gate passes and
    dppick re-plans; without it the gate fails and dppick is skipped (keeps its plan), as before the bound."""
    import pandas as pd
    from test_gates_support import CYCLE, EPOCH0, snapshot

    from mjoin.evaluation.cycle_loop import CycleLoop, LoopSettings
    from mjoin.model.statistics import ROW_COLUMNS

    q = seed_query
    first, step = q.stream_names[0], {12: 50, 13: 100, 14: 150, 15: 200}

    def snap(k):
        st = snapshot(q, EPOCH0 + k * CYCLE, seed=k)
        s0, f = st.groups[0].streams[first], step.get(k, 1)
        s0.window_tuples, s0.tuples, s0.lam, s0.kappa = (v * f for v in (s0.window_tuples, s0.tuples, s0.lam,
                                                                         s0.kappa))
        return st

    hist = pd.DataFrame([r for k in range(16) for r in snap(k).to_rows()], columns=list(ROW_COLUMNS))
    loop = CycleLoop(q, LoopSettings(strategies=("fixed", "dppick"), length=60, cycle=CYCLE, forecast_bound=bound),
                     [q.stream_names])
    assert loop.schedules([]).settings["forecast_bound"] is bound
    for k in (14, 15):
        c = EPOCH0 + k * CYCLE
        loop.record_batch()
        rec = loop.step(hist[pd.to_datetime(hist["cycle_start"], utc=True) < pd.Timestamp(c + CYCLE, unit="s",
                                                                                            tz="UTC")], c)
        assert rec["stats_gate"] == "passed"
        assert isinstance(rec["forecast_lagging"], int)  # the lag test's replacements (Eq. 71), counted per cycle
        if bound:
            assert rec["forecast_gate"] == "passed" and rec["forecast_out_of_range"] >= 1
            assert "skipped" not in rec["strategies"]["dppick"] and "optimize_seconds" in rec["strategies"]["dppick"]
        else:
            assert rec["forecast_gate"] == "failed" and rec["forecast_out_of_range"] == 0
            assert rec["strategies"]["dppick"]["skipped"] == "statistics or forecast gate failed"


@pytest.fixture(scope="module")
def tiny_tpcds(tmp_path_factory):
    from engine_helpers import replay_tpcds

    from mjoin.lake.layout import Lake

    lake = Lake(str(tmp_path_factory.mktemp("tiny") / "lake"))
    info = replay_tpcds(lake, 0.01, rate=20.0, arrival_cycle=10)
    return lake, info


def test_flink_sql_text_returns_the_reference_rows_in_duckdb(tiny_tpcds, seed_query, tmp_path):
    """The regular-join text of the Flink peer (the windows as pairwise conditions on integer microseconds),
    run by DuckDB over the very CSV copies Flink reads, equals the DuckDB reference over the Parquet files."""
    import duckdb
    from engine_helpers import assert_same_results, reference

    peers = _peers()
    lake, _ = tiny_tpcds
    copies = peers.csv_copies(seed_query, lake, tmp_path / "csv")
    con = duckdb.connect()
    for s in seed_query.streams:
        cols = {c: {"timestamp": "BIGINT", "long": "BIGINT"}[s.columns[c]] for c in copies[s.name]["columns"]}
        con.execute(f"CREATE VIEW \"{s.name}\" AS SELECT * FROM read_csv('{copies[s.name]['path']}/*.csv', "
                    f"header = false, nullstr = '{peers.NULL_LITERAL}', columns = {cols!r})")
    got = con.execute(peers.flink_sql(seed_query, "binary", quote='"')).fetch_df()
    expected = reference(seed_query, lake)
    assert len(expected) > 100  # the tiny replay joins: the comparison is not vacuous
    assert_same_results(got, expected, "Flink's SQL text in DuckDB")
    schema = peers.result_schema(seed_query)
    import pyarrow as pa

    assert peers.fingerprint_table(pa.Table.from_pandas(got, preserve_index=False), schema, tmp_path / "a") == \
        peers.fingerprint_table(pa.Table.from_pandas(expected, preserve_index=False), schema, tmp_path / "b")


@pytest.mark.slow
def test_flink_multijoin_returns_the_reference_rows(tiny_tpcds, seed_query, tmp_path):
    if not FLINK_PY.exists():
        print("SKIP reason: no Flink venv at bench/evaluation/.flink-venv "
              "(python3.11 -m venv it and pip install -r bench/evaluation/requirements-flink.txt)")
        pytest.skip("no Flink venv at bench/evaluation/.flink-venv")
    import duckdb  # noqa: F401
    from engine_helpers import reference

    import pyarrow as pa

    peers = _peers()
    lake, _ = tiny_tpcds
    copies = peers.csv_copies(seed_query, lake, tmp_path / "csv")
    job = peers.flink_job(seed_query, copies, "multijoin", verify_to=str(tmp_path / "out"))
    job["timing"] = False
    (tmp_path / "job.json").write_text(json.dumps(job))
    p = subprocess.run([str(FLINK_PY), str(EVAL / "flink_job.py"), str(tmp_path / "job.json")], capture_output=True,
                       text=True, timeout=600)
    line = [x for x in p.stdout.splitlines() if x.startswith("FLINK_JOB_RESULT ")]
    assert line, p.stderr[-3000:]
    res = json.loads(line[0].split(" ", 1)[1])
    assert res["operators"]["MultiJoin"] == 1  # FLIP-516's operator, not binary joins
    schema = peers.result_schema(seed_query)
    got = peers.read_csv_results(str(tmp_path / "out"), schema)
    expected = pa.Table.from_pandas(reference(seed_query, lake), preserve_index=False)
    assert got.num_rows == expected.num_rows > 100
    assert peers.fingerprint_table(got, schema, tmp_path / "fa") == peers.fingerprint_table(expected, schema,
                                                                                            tmp_path / "fb")


@pytest.mark.spark
@pytest.mark.slow
def test_composed_schedule_equals_a_real_switching_run(spark, tmp_path):
    """Plans switching at every batch boundary, run for real (one job per batch, a plan per batch), do exactly the
    lookups and matches composed from the covering fixed runs, and return the fixed runs' rows."""
    sys.path.insert(0, str(EVAL))
    from run_evaluation import measure_orders, switching_run

    from mjoin.evaluation.cycle_loop import plan_key
    from mjoin.model.query import load_query
    from mjoin.workloads.synthetic import generate_synthetic

    wl = tmp_path / "w"
    m = generate_synthetic(wl, streams=3, duration="90s", rate=6.0, domain=12, schedule="rate-swap", window="30s",
                           seed=3)
    query = load_query(str(wl / "query.yaml"))
    start = int(m.start_epoch) + 30
    end = start + 30
    orders = covering_orders(query.stream_names)
    measured = measure_orders(spark, query, str(wl), start, end, 10, orders, 1, tmp_path / "e", seed=1, warmup=False)
    assert measured["results_agree"]
    plans = {plan_key(p): p for p in measured["plans"].values()}
    keys = list(plans)
    schedule = [keys[b % len(keys)] for b in range(3)]  # a switch at every boundary
    chains, base = measured["rounds"][0]
    composed = compose(schedule, plans, chains, base, measured["batch_ids"])
    real = switching_run(spark, query, str(wl), start, end, 10, schedule, plans, tmp_path / "sw")
    assert real["plan_switches"] == 2
    assert (real["lookups"], real["matches"]) == (composed["lookups"], composed["matches"])
    assert composed["lookups"] > 0
    some = next(iter(measured["fingerprints"].values()))
    assert real["fingerprint"] == some and some["rows"] > 0
