"""The statistics of edges a band filters count the matches within the band (PSP residuals): checked
against DuckDB over the same landed files, per cycle; the optimizer prices those steps with them."""
from __future__ import annotations

import pytest

from engine_helpers import duckdb_connect, replay_tpcds
from mjoin.lake.layout import Lake
from mjoin.model.query import load_query

pytestmark = pytest.mark.spark


def test_band_edges_count_only_matches_within_the_band(spark, tmp_path):
    from mjoin.stats.job import compute_statistics
    from mjoin.stats.sources import US

    lake = Lake(str(tmp_path / "lake"))
    info = replay_tpcds(lake, 0.01, rate=40.0, arrival_cycle=20, tables=("store_returns", "web_returns",
                                                                         "catalog_returns"))
    q = load_query("tpcds_returns_similar_amounts")
    start, cycle = info["start"] + 60, 30
    end = start + 4 * cycle
    run = compute_statistics(spark, q, lake, start, end, cycle)
    rows = run.rows[(run.rows["entity"] == "edge") & (run.rows["group"] == 0)]
    files = {s.name: ", ".join(f"'{f}'" for f in lake.stream_files(s.source)) for s in q.streams}
    con = duckdb_connect()
    checked = 0
    for left, right, lx, ry in (("sr", "wr", "sr_return_amt", "wr_return_amt"),
                                ("wr", "sr", "wr_return_amt", "sr_return_amt")):
        lk, rk = q.stream(left).keys[0], q.stream(right).keys[0]
        for j in range(4):
            c0, c1 = (start + j * cycle) * US, (start + (j + 1) * cycle) * US
            qq, m, s = con.execute(f"""
                WITH l AS (SELECT row_number() OVER () AS id, {lk} AS k, epoch_us(ts) AS t, {lx} AS x
                           FROM read_parquet([{files[left]}]) WHERE {lk} IS NOT NULL),
                     r AS (SELECT {rk} AS k, epoch_us(ts) AS t, {ry} AS y FROM read_parquet([{files[right]}])),
                     p AS (SELECT l.id, count(r.k) AS n FROM l LEFT JOIN r ON r.k = l.k AND r.t <= l.t
                           AND r.t > l.t - 300000000 AND abs(l.x - r.y) <= 50
                           WHERE l.t >= {c0} AND l.t < {c1} GROUP BY l.id)
                SELECT count(*), count(*) FILTER (WHERE n > 0), coalesce(sum(n), 0) FROM p""").fetchone()
            got = rows[(rows["stream"] == left) & (rows["right"] == right)].sort_values("cycle_start").iloc[j]
            assert (int(got["q"]), int(got["m"]), int(got["s"])) == (qq, m, s), (left, right, j)
            checked += s
    assert checked > 0
    # the band makes these edges more selective than the key alone (the unfiltered cu-less seed query)
    seed_like = compute_statistics(spark, load_query("tpcds_returns_by_address"), lake, start, end, cycle).rows
    e0 = seed_like[(seed_like["entity"] == "edge") & (seed_like["stream"] == "sr") & (seed_like["right"] == "wr")]
    e1 = rows[(rows["stream"] == "sr") & (rows["right"] == "wr")]
    assert e1["s"].sum() < e0["s"].sum()


def test_optimizer_prices_band_steps_with_their_matches(spark, tmp_path):
    """With the band measured, an order's predicted cost falls (fewer matches per hit on band edges), so the
    optimizer weighs a band step by what the engine really does."""
    from mjoin.optimizer.cost import plan_cost
    from mjoin.optimizer.strategies import optimize
    from mjoin.model.plan import make_plan, orders_from_permutation
    from mjoin.model.query import parse_query
    from mjoin.stats.job import compute_statistics

    lake = Lake(str(tmp_path / "lake"))
    info = replay_tpcds(lake, 0.01, rate=40.0, arrival_cycle=20, tables=("store_returns", "web_returns",
                                                                         "catalog_returns"))
    q = load_query("tpcds_returns_similar_amounts")
    keys_only = parse_query(dict(q.to_spec(), predicates=[str(p) for p in q.predicates]), source="keys only")
    start = info["start"] + 60
    banded = compute_statistics(spark, q, lake, start, start + 120, 120)
    plain = compute_statistics(spark, keys_only, lake, start, start + 120, 120)
    sb, sp = banded.snapshot(start), plain.snapshot(start)
    assert sb.mu("sr", "wr") <= sp.mu("sr", "wr") and sb.gamma("sr", "wr") < sp.gamma("sr", "wr")
    order = make_plan(q, orders_from_permutation(q, ["sr", "wr", "cr"]), "fixedOrder")
    assert plan_cost(q, sb, order) < plan_cost(keys_only, sp, make_plan(keys_only, orders_from_permutation(
        keys_only, ["sr", "wr", "cr"]), "fixedOrder"))
    plan = optimize(q, sb, "exact")
    assert plan.estimated_cost <= plan_cost(q, sb, order) + 1e-12


def test_band_alone_edges_and_keyless_streams(spark, tmp_path):
    """A pair joined by a band alone (PSP): its edges count the pairs within the band and the window (no key);
    the keyless stream's own statistics come from its band column (kappa: distinct values in the window);
    the optimizer plans over them and the statistics gate accepts them."""
    import sys

    from mjoin.gates.stats import check_statistics
    from mjoin.optimizer.strategies import optimize
    from mjoin.model.query import parse_query
    from mjoin.stats.job import compute_statistics
    from mjoin.stats.sources import US

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from test_engine_psp import SPEC

    lake = Lake(str(tmp_path / "lake"))
    info = replay_tpcds(lake, 0.01, rate=40.0, arrival_cycle=20, tables=("store_returns", "web_returns",
                                                                         "catalog_returns"))
    q = parse_query(SPEC, source="psp3")
    start, cycle = info["start"] + 60, 30
    run = compute_statistics(spark, q, lake, start, start + 2 * cycle, cycle)
    rows = run.rows
    files = {s.name: ", ".join(f"'{f}'" for f in lake.stream_files(s.source)) for s in q.streams}
    con = duckdb_connect()
    for j in range(2):
        c0, c1 = (start + j * cycle) * US, (start + (j + 1) * cycle) * US
        qq, m, s = con.execute(f"""
            WITH l AS (SELECT row_number() OVER () AS id, epoch_us(ts) AS t, wr_return_amt AS x
                       FROM read_parquet([{files['wr']}])),
                 r AS (SELECT epoch_us(ts) AS t, cr_return_amount AS y FROM read_parquet([{files['cr']}])),
                 p AS (SELECT l.id, count(r.t) AS n FROM l LEFT JOIN r ON r.t <= l.t AND r.t > l.t - 120000000
                       AND abs(l.x - r.y) <= 2.5 WHERE l.t >= {c0} AND l.t < {c1} GROUP BY l.id)
            SELECT count(*), count(*) FILTER (WHERE n > 0), coalesce(sum(n), 0) FROM p""").fetchone()
        got = rows[(rows["entity"] == "edge") & (rows["stream"] == "wr") & (rows["right"] == "cr")] \
            .sort_values("cycle_start").iloc[j]
        assert (int(got["q"]), int(got["m"]), int(got["s"])) == (qq, m, s), j
        kappa = con.execute(f"""SELECT count(DISTINCT cr_return_amount) FROM read_parquet([{files['cr']}])
                                WHERE epoch_us(ts) <= {c1} - 1 AND epoch_us(ts) > {c1} - 1 - 120000000""").fetchone()[0]
        cr = rows[(rows["entity"] == "stream") & (rows["stream"] == "cr")].sort_values("cycle_start").iloc[j]
        assert cr["lambda"] > 0 and abs(cr["kappa"] - kappa) <= 1, (cr["kappa"], kappa)
    snap = run.snapshot(start + cycle)
    assert optimize(q, snap, "exact").orders[0]["cr"][0] == ("cr", "wr")  # cr reaches the others through the band
    gate = check_statistics(q, run.rows, start, start + 2 * cycle, cycle, partitioning=None)
    failed = [f.expectation for f in gate.failures]
    assert not [f for f in failed if "edge" in f or "complete" in f], gate.summary()  # every band edge present
