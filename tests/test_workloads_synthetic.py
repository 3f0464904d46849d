"""Synthetic drifting workload: the schedule takes effect (measured with pandas), determinism, the spec loads."""
from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from mjoin.model.query import load_query
from mjoin.workloads.errors import ScheduleError, WorkloadError
from mjoin.workloads.synthetic import generate_synthetic
from mjoin.workloads.schedule import load_schedule, parse_schedule

RATE = 20.0
WINDOW = pd.Timedelta("60s")


def gen(tmp_path_factory, schedule, **kw):
    name = schedule if isinstance(schedule, str) else "custom"
    kw = {"duration": "10m", "rate": RATE, "seed": 1, **kw}
    return generate_synthetic(tmp_path_factory.mktemp("syn") / name, schedule=schedule, **kw)


def frame(m, stream) -> pd.DataFrame:
    files = sorted(glob.glob(os.path.join(m.root, "streams", stream, "*", "*.parquet")))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def gamma(m, left, right, periods=4) -> list:
    """Per period: share of left's tuples whose key is in right's window (a right tuple with that key in (t - W, t])."""
    lt = frame(m, left).dropna(subset=["key"]).sort_values("ts")
    rt = frame(m, right).dropna(subset=["key"]).sort_values("ts")[["ts", "key"]].rename(columns={"ts": "rts"})
    lt["key"], rt["key"] = lt["key"].astype("int64"), rt["key"].astype("int64")
    j = pd.merge_asof(lt, rt, left_on="ts", right_on="rts", by="key", direction="backward",
                      tolerance=WINDOW - pd.Timedelta("1us"))
    period = ((j["ts"] - pd.Timestamp(m.doc["start"])) / (pd.Timestamp(m.doc["end"]) - pd.Timestamp(m.doc["start"])) * periods).astype(int)
    return j["rts"].notna().groupby(period).mean().tolist()


def counts_per_period(m, stream, periods=4) -> list:
    ts = frame(m, stream)["ts"]
    period = ((ts - pd.Timestamp(m.doc["start"])) / (pd.Timestamp(m.doc["end"]) - pd.Timestamp(m.doc["start"])) * periods).astype(int)
    return period.value_counts().sort_index().reindex(range(periods), fill_value=0).tolist()


@pytest.fixture(scope="module")
def rate_swap(tmp_path_factory):
    return gen(tmp_path_factory, "rate-swap")


@pytest.fixture(scope="module")
def match_drift(tmp_path_factory):
    return gen(tmp_path_factory, "match-drift")


# ---- the schedule takes effect -----------------------------------------------------------

def test_rate_swap_swaps_the_measured_rates(rate_swap):
    """s0 runs at 0.4x and s3 at 1.6x the base rate, then they swap at 50%."""
    half = 300.0
    s0, s3 = counts_per_period(rate_swap, "s0", 2), counts_per_period(rate_swap, "s3", 2)
    for measured, expected in ((s0, [0.4, 1.6]), (s3, [1.6, 0.4])):
        for n, k in zip(measured, expected):
            assert n / half == pytest.approx(k * RATE, rel=0.08)  # about 4 sigma of a Poisson count
    s1 = counts_per_period(rate_swap, "s1", 2)
    assert s1[0] == pytest.approx(s1[1], rel=0.08)  # the others do not change


def test_rate_swap_changes_match_rates_into_the_swapped_streams(rate_swap):
    """A faster s0 holds more keys in its window: gamma(s2 -> s0) rises after the swap."""
    g = gamma(rate_swap, "s2", "s0", 2)
    assert g[1] > g[0] + 0.2


def test_match_drift_drives_gamma_to_zero(match_drift):
    # 8 periods of 75 s; the ramp moves s3's offset from 0 to the domain size over [150 s, 450 s]
    into = gamma(match_drift, "s0", "s3", 8)
    out = gamma(match_drift, "s3", "s1", 8)
    # period 0 holds the warm-up (windows still filling); period 1 is the stationary start
    assert into[1] > 0.15 and out[1] > 0.15
    assert into[7] == 0.0 and out[7] == 0.0  # a window after the ramp: the key ranges are disjoint
    assert into[1] > into[4] > into[7] and out[1] > out[4] > out[7]
    other = gamma(match_drift, "s0", "s1", 4)[1:]
    assert max(other) - min(other) < 0.15  # pairs without s3 are unaffected


def test_cycle_counts_follow_the_expected_tuples(rate_swap):
    """Observed tuples per cycle agree with schedule.parquet's expected_tuples (Poisson noise only)."""
    truth = pq.read_table(os.path.join(rate_swap.root, "schedule.parquet")).to_pandas()
    for s in ("s0", "s3"):
        df = frame(rate_swap, s)
        epoch = (df["ts"].astype("int64") // 10**6 // 10 * 10)
        obs = epoch.value_counts()
        t = truth[truth.stream == s].set_index("cycle_start")
        z = (obs.reindex(t.index, fill_value=0) - t["expected_tuples"]) / np.sqrt(t["expected_tuples"])
        assert abs(z.mean()) < 0.5 and 0.6 < z.std() < 1.4
        assert t["effective_rate"].iloc[0] == pytest.approx(0.4 * RATE if s == "s0" else 1.6 * RATE)
        assert t["effective_rate"].iloc[-1] == pytest.approx(1.6 * RATE if s == "s0" else 0.4 * RATE)


def test_burst_multiplies_the_rate_while_it_lasts(tmp_path_factory):
    m = gen(tmp_path_factory, "burst")
    c = counts_per_period(m, "s1", 10)  # 10 periods: the burst is period 4 ([40%, 50%))
    base = np.mean([c[i] for i in range(10) if i != 4])
    assert c[4] / base == pytest.approx(5.0, rel=0.1)


def test_skew_drift_shrinks_the_distinct_keys(tmp_path_factory):
    m = gen(tmp_path_factory, "skew-drift")
    df = frame(m, "s0")
    period = (df["ts"] - df["ts"].min()).dt.total_seconds() // 150
    kappa = df.groupby(period)["key"].nunique().tolist()
    assert kappa[0] > 1.5 * kappa[3]
    assert len(df[period == 0]) == pytest.approx(len(df[period == 3]), rel=0.1)  # at the same rate


def test_step_and_ramp_and_nulls_from_a_custom_schedule(tmp_path_factory):
    doc = {"defaults": {"rate": 10, "domain": 50, "zipf": 1.2},
           "streams": {"s1": {"offset": 1000, "shift": 7, "null_rate": 0.25}},
           "events": [{"type": "step", "at": "60s", "stream": "s0", "param": "rate", "value": "0x"},
                      {"type": "ramp", "from": "0%", "to": "100%", "stream": "s1", "param": "rate", "value": 30}]}
    m = gen(tmp_path_factory, doc, rate=None, duration="5m")
    s0, s1 = frame(m, "s0"), frame(m, "s1")
    assert s0["ts"].max() < pd.Timestamp(m.doc["start"]) + pd.Timedelta("60s")  # rate 0 from 60 s on
    assert len(s0) == pytest.approx(600, rel=0.12)
    q = counts_per_period(m, "s1", 4)  # linear 10 -> 30 tuples/s: quarter means 12.5, 17.5, 22.5, 27.5
    for n, mean_rate in zip(q, (12.5, 17.5, 22.5, 27.5)):
        assert n / 75 == pytest.approx(mean_rate, rel=0.12)
    nulls = s1["key"].isna()
    assert nulls.mean() == pytest.approx(0.25, abs=0.03) and m.source("s1")["null_keys"]["key"] == nulls.sum()
    keys = s1["key"].dropna().astype(int)
    assert keys.min() >= 1000 and keys.max() < 1050
    freq = keys.value_counts(normalize=True)
    assert freq.index[0] == 1007  # the most popular key is offset + shift
    p = np.arange(1, 51, dtype=float) ** -1.2
    p /= p.sum()
    expected = pd.Series(p, index=[1000 + (r + 7) % 50 for r in range(50)])
    assert np.abs(freq.reindex(expected.index, fill_value=0) - expected).max() < 0.02  # Zipf(1.2) ranks


# ---- determinism, the written spec, the manifest ---------------------------------------

def tree_hashes(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob("*")) if p.is_file()}


def test_generation_is_deterministic(tmp_path, rate_swap):
    again = generate_synthetic(tmp_path / "again", schedule="rate-swap", duration="10m", rate=RATE, seed=1)
    assert tree_hashes(again.root) == tree_hashes(rate_swap.root)
    other = generate_synthetic(tmp_path / "other", schedule="rate-swap", duration="10m", rate=RATE, seed=2)
    assert tree_hashes(other.root) != tree_hashes(rate_swap.root)


def test_the_written_spec_loads_and_fits_the_data(rate_swap):
    q = load_query(os.path.join(rate_swap.root, "query.yaml"))
    assert q.stream_names == ["s0", "s1", "s2", "s3"] and q.single_class
    assert len(q.edges) == 6  # complete graph K4
    assert q.stream("s0").window == 60
    assert [x.name for x in rate_swap.queries()] == [q.name]
    for s in q.streams:
        schema = pq.read_schema(glob.glob(os.path.join(rate_swap.root, "streams", s.source, "*", "*.parquet"))[0])
        assert str(schema.field("key").type) == "int64" and str(schema.field("ts").type) == "timestamp[us, tz=UTC]"
    m = rate_swap.doc
    assert m["kind"] == "synthetic" and m["schedule"]["name"] == "rate-swap"
    assert [e["type"] for e in m["schedule"]["events"]] == ["step", "step"]
    assert m["schedule"]["events"][0]["at"] == 300.0
    for s in rate_swap.sources:
        assert rate_swap.rows(s) == len(frame(rate_swap, s))


def test_prefix_window_and_name(tmp_path):
    m = generate_synthetic(tmp_path / "w", streams=3, duration="1m", window="5m", prefix="syn_", name="my_join")
    q = m.queries()[0]
    assert q.name == "my_join" and [s.source for s in q.streams] == ["syn_s0", "syn_s1", "syn_s2"]
    assert q.max_window == 300 and sorted(m.sources) == ["syn_s0", "syn_s1", "syn_s2"]


# ---- schedule validation ------------------------------------------------------------------

@pytest.mark.parametrize("doc, field", [
    ({"defaults": {"speed": 3}}, "defaults.speed"),
    ({"defaults": {"zipf": 11}}, "defaults.zipf"),
    ({"defaults": {"domain": 0}}, "defaults.domain"),
    ({"defaults": {"zipf": "2x"}}, "defaults.zipf"),
    ({"streams": {"s9": {"rate": 1}}}, "streams.s9"),
    ({"streams": {"s1": {"null_rate": 1.5}}}, "streams.s1.null_rate"),
    ({"events": [{"type": "jump", "at": 1, "stream": "s0"}]}, "events[0].type"),
    ({"events": [{"type": "step", "at": "110%", "stream": "s0", "param": "rate", "value": 1}]}, "events[0].at"),
    ({"events": [{"type": "step", "at": "soon", "stream": "s0", "param": "rate", "value": 1}]}, "events[0].at"),
    ({"events": [{"type": "step", "at": 5, "stream": "s0", "param": "rate"}]}, "events[0].value"),
    ({"events": [{"type": "step", "at": 5, "stream": "s7", "param": "rate", "value": 1}]}, "events[0].stream"),
    ({"events": [{"type": "step", "at": 5, "stream": "s0", "param": "colour", "value": 1}]}, "events[0].param"),
    ({"events": [{"type": "ramp", "from": "50%", "to": "10%", "stream": "s0", "param": "rate", "value": 1}]}, "events[0].to"),
    ({"events": [{"type": "burst", "from": 1, "to": 2, "stream": "s0", "factor": -1}]}, "events[0].factor"),
    ({"events": [{"type": "burst", "from": 1, "to": 2, "stream": "s0", "factor": 2, "param": "rate"}]}, "events[0]"),
    ({"events": [{"type": "ramp", "from": 0, "to": 100, "stream": "s0", "param": "rate", "value": 5},
                 {"type": "step", "at": 50, "stream": "all", "param": "rate", "value": 1}]}, "events[1]"),
    ({"events": [{"type": "step", "at": 50, "stream": "s0", "param": "shift", "value": 1},
                 {"type": "step", "at": 50, "stream": ["s0", "s1"], "param": "shift", "value": 2}]}, "events[1]"),
    ({"colour": "red"}, "schedule"),
    ({"events": {"type": "step"}}, "events"),
])
def test_bad_schedules_name_the_field(doc, field):
    with pytest.raises(ScheduleError) as exc:
        parse_schedule(doc, streams=4, duration=600)
    assert exc.value.field == field


def test_schedule_semantics():
    s = parse_schedule({"defaults": {"rate": 10}, "events": [
        {"type": "step", "at": 100, "stream": "s0", "param": "rate", "value": 40},
        {"type": "ramp", "from": 200, "to": 300, "stream": "s0", "param": "rate", "value": "0.5x"},
        {"type": "burst", "from": 250, "to": 260, "stream": ["s0", "s1"], "factor": 3},
        {"type": "burst", "from": 255, "to": 265, "stream": "s1", "factor": 2}]}, streams=2, duration=400)
    t = np.array([0, 99.9, 100, 150, 200, 250, 255, 299, 300, 399])
    np.testing.assert_allclose(s.value("s0", "rate", t), [10, 10, 40, 40, 40, 22.5, 20.75, 5.35, 5, 5])
    np.testing.assert_allclose(s.rate("s0", t), [10, 10, 40, 40, 40, 67.5, 62.25, 5.35, 5, 5])
    np.testing.assert_allclose(s.rate("s1", [249, 252, 257, 262, 265]), [10, 30, 60, 20, 10])


def test_presets_files_and_base_overrides(tmp_path):
    from mjoin.workloads.presets import PRESETS

    for name in PRESETS:
        for n in (2, 3, 6):
            sch = load_schedule(name, streams=n, duration="30m", rate=5, domain=200)
            assert sch.stream_names == tuple(f"s{i}" for i in range(n))
            assert np.mean([sch.base[s]["rate"] for s in sch.stream_names]) == pytest.approx(5)
    md = load_schedule("match-drift", streams=4, duration=1000, domain=200)
    assert md.value("s3", "offset", [0, 250, 500, 750, 1000]).tolist() == [0, 0, 100, 200, 200]
    doc = {"name": "mine", "defaults": {"rate": 7, "domain": 30}, "events": [{"type": "step", "at": "50%", "stream": "s1", "param": "rate", "value": "2x"}]}
    (tmp_path / "s.json").write_text(json.dumps(doc))
    (tmp_path / "s.yaml").write_text("defaults: {rate: 7, domain: 30}\nevents:\n  - {type: step, at: 50%, stream: s1, param: rate, value: 2x}\n")
    a = load_schedule(tmp_path / "s.json", streams=2, duration=100)
    b = load_schedule(str(tmp_path / "s.yaml"), streams=2, duration=100)
    assert a.name == "mine" and b.name == "s"
    assert a.rate("s1", [10, 60]).tolist() == b.rate("s1", [10, 60]).tolist() == [7, 14]
    c = load_schedule(tmp_path / "s.yaml", streams=2, duration=100, rate=3)  # --rate overrides and is the base of 'x'
    assert c.rate("s1", [10, 60]).tolist() == [3, 6]
    (tmp_path / "bad.yaml").write_text("events: [unclosed")
    with pytest.raises(ScheduleError, match="cannot read"):
        load_schedule(tmp_path / "bad.yaml", streams=2, duration=100)
    with pytest.raises(ScheduleError, match="neither a preset"):
        load_schedule("no-such-preset", streams=2, duration=100)


@pytest.mark.parametrize("kwargs, field", [({"streams": 1}, "--streams"), ({"streams": 27}, "--streams"),
                                           ({"rate": 0}, "--rate"), ({"domain": 0}, "--domain"),
                                           ({"window": "0s"}, "--window"), ({"duration": "long"}, "--duration"),
                                           ({"prefix": "a/b"}, "--prefix"), ({"name": "bad name"}, "--name"),
                                           ({"cycle": "0.5s"}, "--cycle")])
def test_bad_generator_arguments(tmp_path, kwargs, field):
    with pytest.raises(WorkloadError) as exc:
        generate_synthetic(tmp_path / "w", **{"duration": "1m", **kwargs})
    assert exc.value.field == field
    assert not (tmp_path / "w").exists()
