"""The statistics schema: JSON and tidy-row forms of the same records, and their checks."""
import math

import pytest

from mjoin.model.schemas import SchemaError
from mjoin.model.statistics import EdgeStats, GroupStats, Statistics, StatisticsError, StreamStats


def uniform_stats(query, gamma=0.5, mu=2.0):
    g = GroupStats()
    for s in query.stream_names:
        g.streams[s] = StreamStats(lam=10.0, kappa=100.0, window_tuples=300.0, tuples=100)
    for l, r in query.directed_edges:
        g.edges[(l, r)] = EdgeStats(gamma=gamma, mu=mu)
    return Statistics(query=query.name, groups={0: g}, cycle_start="2026-01-01T00:00:00Z", cycle_seconds=10.0)


def test_eq_9_10_from_counts():
    e = EdgeStats.from_counts(q=200, m=50, s=150)
    assert e.gamma == 0.25 and e.mu == 3.0
    none = EdgeStats.from_counts(q=0, m=0, s=0)
    assert none.gamma == 0.0 and none.mu == 1.0


def test_json_and_rows_roundtrip(seed_query, tmp_path):
    st = uniform_stats(seed_query)
    back = Statistics.load(st.save(tmp_path / "s.json"))
    assert back.to_json() == st.to_json()
    assert back.gamma("cu", "sr") == 0.5 and back.lam("wr") == 10.0
    rows = st.to_rows()
    assert len(rows) == 4 + 12
    again = Statistics.from_rows(rows)
    assert again.to_json()["groups"] == st.to_json()["groups"]
    assert seed_query and st.check(seed_query) is st


@pytest.mark.parametrize("mutate, words", [
    (lambda g: g.streams.pop("wr"), "stream wr missing"),
    (lambda g: g.edges.pop(("sr", "cu")), "edge sr->cu missing"),
    (lambda g: setattr(g.edges[("cu", "sr")], "gamma", 1.5), "gamma[cu][sr] = 1.5"),
    (lambda g: setattr(g.edges[("cu", "sr")], "gamma", math.nan), "gamma[cu][sr] = nan"),
    (lambda g: setattr(g.edges[("cu", "sr")], "mu", 0.5), "mu[cu][sr] = 0.5"),
    (lambda g: setattr(g.streams["cu"], "kappa", -1.0), "cu.kappa = -1.0"),
    (lambda g: setattr(g.streams["cu"], "lam", math.inf), "cu.lambda = inf"),
])
def test_problems_are_named(seed_query, mutate, words):
    st = uniform_stats(seed_query)
    mutate(st.groups[0])
    problems = st.problems(seed_query)
    assert any(words in p for p in problems), problems
    with pytest.raises(StatisticsError):
        st.check(seed_query)


def test_wrong_query_and_schema(seed_query, two_class_query):
    st = uniform_stats(seed_query)
    assert "not 'tpcds_returns_by_customer_and_address'" in st.problems(two_class_query)[0]
    doc = st.to_json()
    doc["groups"][0]["edges"][0].pop("gamma")
    with pytest.raises(SchemaError, match="'gamma' is a required property"):
        Statistics.from_json(doc)
    rows = st.to_rows()
    rows[0] = dict(rows[0], cycle_start="2026-01-01T00:00:10Z")
    with pytest.raises(StatisticsError, match="one cycle"):
        Statistics.from_rows(rows)
