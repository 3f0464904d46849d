"""Pairs joined by a band alone (PSP): each stream's window state cut into time slices, every new tuple
visiting every slice. Results equal DuckDB's reference under every probe order, in interval and streaming
mode, on the driver and the executors, for several slice counts; the state is not duplicated."""
from __future__ import annotations

import os
import shutil
from itertools import permutations

import pytest

from engine_helpers import assert_same_results, no_leaked_queries, reference, replay_tpcds
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_stream
from mjoin.engine.interval import run_interval_plans
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation
from mjoin.model.query import QuerySpecError, parse_query

pytestmark = pytest.mark.spark
_ = no_leaked_queries


def _stream(name, source, cols, keys):
    return {"name": name, "source": source, "event_time": "ts", "window": "2m",
            "columns": {"ts": "timestamp", **cols}, "keys": keys}


SPEC = {  # store and web returns to one address, and catalog returns of about the same amount as the web one
    "spec_version": 1, "name": "psp3", "lateness": "0s",
    "streams": [
        _stream("sr", "store_returns", {"sr_addr_sk": "long", "sr_ticket_number": "long"}, ["sr_addr_sk"]),
        _stream("wr", "web_returns", {"wr_refunded_addr_sk": "long", "wr_order_number": "long",
                                      "wr_return_amt": "decimal(7,2)"}, ["wr_refunded_addr_sk"]),
        _stream("cr", "catalog_returns", {"cr_order_number": "long", "cr_return_amount": "decimal(7,2)"}, []),
    ],
    "predicates": ["sr.sr_addr_sk = wr.wr_refunded_addr_sk", "abs(wr.wr_return_amt - cr.cr_return_amount) <= 2.5"],
    "output": ["sr.sr_ticket_number", "wr.wr_order_number", "wr.wr_return_amt", "cr.cr_order_number",
               "cr.cr_return_amount"],
}


@pytest.fixture(scope="module")
def psp_lake(tmp_path_factory):
    lake = Lake(str(tmp_path_factory.mktemp("psp") / "lake"))
    info = replay_tpcds(lake, 0.01, rate=40.0, arrival_cycle=20, tables=("store_returns", "web_returns",
                                                                         "catalog_returns"))
    return lake, info


def test_band_alone_joins_in_every_order_and_slice_count(spark, psp_lake, tmp_path):
    lake, info = psp_lake
    q = parse_query(SPEC, source="psp3")
    assert list(q.band_classes) == ["b0"] and q.edge("wr", "cr").attr_class == "b0"
    ref = reference(q, lake)
    assert len(ref) > 50
    plans = {"".join(p): make_plan(q, orders_from_permutation(q, p), "fixedOrder") for p in permutations(q.stream_names)}
    start = info["start"] - 3600
    for slices in (1, 3):
        out = run_interval_plans(spark, q, plans, lake, start, info["end"] + 60, 300, str(tmp_path / f"n{slices}"),
                                 config=EngineConfig(buckets=4, psp_slices=slices))
        for name, s in out.items():
            assert_same_results(read_results(s.results_path), ref, f"{slices} slices, order {name}")


@pytest.mark.parametrize("where", ["driver", "executors"])
def test_band_alone_streaming_equals_reference_and_keeps_each_tuple_once(spark, psp_lake, tmp_path, where):
    lake, info = psp_lake
    q = parse_query(SPEC, source="psp3")
    mine = Lake(str(tmp_path / "lake"))
    shutil.copytree(lake.streams(), mine.streams())
    run_stream(spark, q, mine, config=EngineConfig(buckets=4, psp_slices=4, max_files_per_trigger=7,
                                                   driver_rows=0 if where == "executors" else 10**6))
    assert_same_results(read_results(mine, q.name), reference(q, lake), f"band alone, streaming on the {where}")
    recs = read_metrics(mine, q.name)
    assert {r["execution"]["where"] for r in recs} == {where}
    # each tuple is kept in one slice: the state is not duplicated (cr's state tuples = its accepted tuples
    # still in the window: no more than what it received)
    assert max(r["state_tuples"]["cr"] for r in recs) <= sum(r["rows_in"]["cr"] for r in recs)


def test_band_alone_needs_integral_or_equal_scale_columns():
    bad = dict(SPEC, predicates=["sr.sr_addr_sk = wr.wr_refunded_addr_sk",
                                 "abs(wr.wr_return_amt - cr.cr_return_amount) <= 2.555"])
    with pytest.raises(QuerySpecError, match="more decimals than the columns"):
        parse_query(bad, source="t")
    streams = [dict(s) for s in SPEC["streams"]]
    streams[2] = dict(streams[2], columns={"ts": "timestamp", "cr_order_number": "long", "cr_return_amount": "double"})
    with pytest.raises(QuerySpecError, match="integral or decimal"):
        parse_query(dict(SPEC, streams=streams), source="t")
    lonely = dict(SPEC, predicates=["sr.sr_addr_sk = wr.wr_refunded_addr_sk"])
    with pytest.raises(QuerySpecError, match="cr.*keys"):
        parse_query(lonely, source="t")


def test_psp_slices_auto_follows_eq5_or_the_state(psp_lake, tmp_path):
    """--psp-slices auto: Eq. 5 from the landed rates, the windows and the cores (at most the cores); a number is
    taken as given; a state keeps its own slice count."""
    import argparse
    import os

    import yaml

    from mjoin.commands import UserError
    from mjoin.commands import run as run_cmd
    from mjoin.engine.state import StateStore

    lake, _ = psp_lake
    spec = tmp_path / "psp3.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    p = argparse.ArgumentParser()
    run_cmd.add_arguments(p)
    args = p.parse_args(["--stream", "--query", str(spec), "--lake", lake.root])
    n = run_cmd.config_from(args).psp_slices
    assert 1 <= n <= (os.cpu_count() or 2)
    assert run_cmd.config_from(p.parse_args(["--query", str(spec), "--lake", lake.root, "--psp-slices", "3"])).psp_slices == 3
    with pytest.raises(UserError, match="psp-slices"):
        run_cmd.config_from(p.parse_args(["--query", str(spec), "--lake", lake.root, "--psp-slices", "0"]))
    state_lake = Lake(str(tmp_path / "other"))
    StateStore(state_lake.state("psp3")).commit({"version": 0, "psp_slices": 7, "files": {}})
    os.makedirs(state_lake.streams(), exist_ok=True)
    args = p.parse_args(["--stream", "--query", str(spec), "--lake", state_lake.root])
    assert run_cmd.config_from(args).psp_slices == 7


def test_psp_slices_auto_takes_t_j_from_the_calibrated_cost_model(psp_lake, tmp_path, monkeypatch):
    """With a calibrated cost model in the lake (what `mjoin calibrate` and the loop write), Eq. 5 gets its T_j
    (alpha_m, seconds per matched tuple) from there: a comparison that costs next to nothing needs one slice."""
    import argparse
    import json

    import yaml

    from mjoin.commands import run as run_cmd
    from mjoin.optimizer.cost import CostModel

    lake, _ = psp_lake
    own = Lake(str(tmp_path / "own"))
    shutil.copytree(lake.streams(), own.streams())
    spec = tmp_path / "psp3.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    p = argparse.ArgumentParser()
    run_cmd.add_arguments(p)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    args = ["--query", str(spec), "--lake", own.root]
    default_n = run_cmd.config_from(p.parse_args(args)).psp_slices
    path = os.path.join(own.plans("psp3"), "cost_model.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(CostModel(alpha_q=1e-7, alpha_m=1e-13, calibrated=True).to_json(), f)
    assert run_cmd.config_from(p.parse_args(args)).psp_slices == 1 < default_n
