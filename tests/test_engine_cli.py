"""python -m mjoin run: interval evaluation through the CLI, and the errors a user can fix (exit 2)."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from engine_helpers import T0, write_stream_file
from mjoin.cli import main
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.lake.layout import Lake
from mjoin.model.plan import make_plan, orders_from_permutation

pytestmark = pytest.mark.spark


@pytest.fixture
def tiny_lake(tmp_path):
    """Three customers and returns at two addresses, by hand: 2 results."""
    lake = Lake(str(tmp_path / "lake"))
    ts = lambda s: pa.array([(T0 + x) * 1_000_000 for x in s], pa.int64()).cast(pa.timestamp("us"))
    write_stream_file(lake, "customer", T0, pa.table({"ts": ts([1, 2, 3]), "c_customer_sk": [1, 2, 3],
                                                      "c_current_addr_sk": [10, 10, 20]}))
    write_stream_file(lake, "store_returns", T0, pa.table({"ts": ts([4]), "sr_addr_sk": [10], "sr_ticket_number": [7],
                                                           "sr_item_sk": [70]}))
    write_stream_file(lake, "web_returns", T0, pa.table({"ts": ts([5]), "wr_refunded_addr_sk": [10],
                                                         "wr_order_number": [8], "wr_item_sk": [80]}))
    write_stream_file(lake, "catalog_returns", T0, pa.table({"ts": ts([6, 400]), "cr_refunded_addr_sk": [10, 10],
                                                             "cr_order_number": [9, 19], "cr_item_sk": [90, 190]}))
    return lake


def test_cli_interval_run_writes_results_and_metrics(spark, tiny_lake, tmp_path, seed_query, capsys):
    plan = tmp_path / "plan.json"
    make_plan(seed_query, orders_from_permutation(seed_query, ["cr", "wr", "sr", "cu"]), "fixedOrder").save(plan)
    out = str(tmp_path / "out")
    rc = main(["run", "--query", "tpcds_returns_by_address", "--plan", str(plan), "--lake", tiny_lake.root,
               "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-01T00:10:00Z", "--cycle", "300", "--out", out,
               "--buckets", "2"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "2 result rows" in printed and "metrics" in printed
    res = read_results(out, seed_query.name).sort_values("c_customer_sk")
    # cu 1 and 2 live at address 10 with the returns at t=4,5,6; cr at t=400 is outside every window
    assert res["c_customer_sk"].tolist() == [1, 2]
    assert res["cr_order_number"].tolist() == [9, 9]
    records = read_metrics(out, seed_query.name)
    assert [r["batch_id"] for r in records] == [1, 2]
    assert [r["result_rows"] for r in records] == [2, 0]
    with open(f"{out}/metrics/{seed_query.name}/metrics.jsonl") as fh:
        assert [json.loads(line)["batch_id"] for line in fh] == [1, 2]


@pytest.mark.parametrize("args, message", [
    (["--from", "2026-01-01T00:00:00Z", "--cycle", "60", "--out", "OUT"], "needs --to"),
    (["--from", "yesterday", "--to", "2026-01-01T00:10:00Z", "--cycle", "60", "--out", "OUT"], "is not a time"),
    (["--from", "2026-01-01T00:10:00Z", "--to", "2026-01-01T00:00:00Z", "--cycle", "60", "--out", "OUT"],
     "need start < end"),
    (["--plan", "PLANDIR/missing.json", "--from", "0", "--to", "60", "--cycle", "60", "--out", "OUT"],
     "no such plan file"),
])
def test_cli_user_errors_exit_2(spark, tiny_lake, tmp_path, capsys, args, message):
    args = [a.replace("OUT", str(tmp_path / "out")).replace("PLANDIR", str(tmp_path)) for a in args]
    rc = main(["run", "--query", "tpcds_returns_by_address", "--lake", tiny_lake.root, *args])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_cli_refuses_a_plan_of_another_query_and_a_bucket_change(spark, tiny_lake, tmp_path, two_class_query, capsys):
    plan = tmp_path / "plan.json"
    make_plan(two_class_query, orders_from_permutation(two_class_query, two_class_query.stream_names),
              "fixedOrder").save(plan)
    rc = main(["run", "--query", "tpcds_returns_by_address", "--plan", str(plan), "--lake", tiny_lake.root,
               "--stream"])
    assert rc == 2 and "not 'tpcds_returns_by_address'" in capsys.readouterr().err
    assert main(["run", "--stream", "--query", "tpcds_returns_by_address", "--lake", tiny_lake.root,
                 "--buckets", "2"]) == 0
    capsys.readouterr()
    rc = main(["run", "--stream", "--query", "tpcds_returns_by_address", "--lake", tiny_lake.root, "--buckets", "3"])
    assert rc == 2 and "built with 2 buckets" in capsys.readouterr().err


def test_processing_time_trigger_runs_until_stopped(spark, tiny_lake, seed_query):
    """Continuous mode: micro-batches every interval until the query is stopped (here: after the first)."""
    import threading
    import time

    from mjoin.runtime import fsutil
    from mjoin.engine.config import EngineConfig
    from mjoin.engine.runs import run_stream

    done = threading.Event()

    def stop_after_first_batch():
        path = fsutil.join(tiny_lake.metrics(seed_query.name), "batch=0.json")
        deadline = time.time() + 120
        while time.time() < deadline and not fsutil.exists(path):
            time.sleep(0.2)
        for q in spark.streams.active:
            q.stop()
        done.set()

    threading.Thread(target=stop_after_first_batch, daemon=True).start()
    s = run_stream(spark, seed_query, tiny_lake, trigger="processingTime", interval=0.5, timeout=150,
                   config=EngineConfig(buckets=2))
    assert done.wait(30)
    assert s.batches[:1] == [0] and s.trigger == "processingTime"
    assert read_results(tiny_lake, seed_query.name)["c_customer_sk"].sort_values().tolist() == [1, 2]
