"""Query specs: loading, the join graph, attribute classes, and errors that name the field."""
import copy

import pytest
import yaml

from mjoin.model.query import QuerySpecError, list_queries, load_query, parse_query

BASE = {
    "name": "q",
    "streams": [
        {"name": "a", "source": "src_a", "event_time": "ts", "window": "10s",
         "columns": {"ts": "timestamp", "x": "long", "v": "string"}, "keys": ["x"]},
        {"name": "b", "event_time": "ts", "window": 30,
         "columns": {"ts": "timestamp", "x": "long", "y": "int"}, "keys": ["x", "y"]},
        {"name": "c", "event_time": {"expr": "timestamp_seconds(t)"}, "window": "2m",
         "columns": {"t": "long", "y": "long"}, "keys": ["y"]},
    ],
    "predicates": ["a.x = b.x", "b.y = c.y"],
    "output": ["a.v", "b.x AS bx", "c.y"],
}


def spec(**changes):
    doc = copy.deepcopy(BASE)
    for path, value in changes.items():
        target = doc
        parts = path.split("__")
        for p in parts[:-1]:
            target = target[int(p)] if p.isdigit() else target[p]
        last = parts[-1]
        if value is KeyError:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return doc


def test_shipped_specs_load():
    assert "tpcds_returns_by_address" in list_queries()
    for name in list_queries():
        assert load_query(name).name == name


def test_seed_query_is_one_class_and_complete_graph(seed_query):
    q = seed_query
    assert q.stream_names == ["cu", "sr", "wr", "cr"]
    assert list(q.attribute_classes) == ["c0"]
    assert q.single_class
    assert len(q.edges) == 6  # K4: every pair joins through the shared address key
    assert len(q.directed_edges) == 12
    implied = {(e.a, e.b) for e in q.edges if not e.explicit}
    assert implied == {("cu", "wr"), ("cu", "cr"), ("sr", "cr")}
    assert q.edge("wr", "sr").column_of("wr") == "wr_refunded_addr_sk"
    assert q.max_window == 300


def test_two_class_query_graph(two_class_query):
    q = two_class_query
    assert len(q.attribute_classes) == 2
    assert q.classes_of("cu") == ["c0", "c1"]
    assert q.key_column("cu", "c1") == "c_current_addr_sk"
    assert not q.has_edge("sr", "wr")
    assert q.has_edge("wr", "cr")  # implied within class c1
    assert q.neighbors("sr") == ["cu"]
    assert q.edge("cu", "wr").attr_class == "c1"


def test_parse_minimal_and_defaults():
    q = parse_query(spec())
    assert q.stream("b").source == "b"  # source defaults to the name
    assert q.stream("a").window == 10 and q.stream("b").window == 30 and q.stream("c").window == 120
    assert q.stream("c").event_time.expr == "timestamp_seconds(t)"
    assert [o.name for o in q.output] == ["v", "bx", "y"]
    assert parse_query(q.to_spec()) == q  # canonical form round-trips
    assert parse_query(q.to_spec()).fingerprint == q.fingerprint


def test_expansion_error_messages(seed_query):
    q = seed_query
    assert q.expansion_error("cu", [("cu", "sr"), ("sr", "wr"), ("cu", "cr")]) is None
    assert "already in the partial result" in q.expansion_error("cu", [("cu", "sr"), ("sr", "cu"), ("cu", "cr")])
    assert "not yet in the partial result" in q.expansion_error("cu", [("wr", "sr"), ("cu", "wr"), ("cu", "cr")])
    assert "never reaches cr" in q.expansion_error("cu", [("cu", "sr"), ("cu", "wr")])
    assert "unknown stream 'zz'" in q.expansion_error("cu", [("cu", "zz")])


@pytest.mark.parametrize("changes, field, words", [
    ({"name": KeyError}, "name", "is required"),
    ({"name": "bad name"}, "name", "not an identifier"),
    ({"streams": [BASE["streams"][0]]}, "streams", "at least 2"),
    ({"streams__0__window": "5 minutes"}, "streams[0] (a).window", "not a duration"),
    ({"streams__0__window": 0}, "streams[0] (a).window", "must be positive"),
    ({"streams__1__columns__y": "varchar"}, "streams[1] (b).columns.y", "unknown type"),
    ({"streams__0__keys": ["nope"]}, "streams[0] (a).keys", "not one of the declared columns"),
    ({"streams__0__keys": ["v"]}, "streams[0] (a).keys", "must be integral"),
    ({"streams__0__event_time": "missing"}, "streams[0] (a).event_time", "not one of the declared columns"),
    ({"streams__0__event_time": "v"}, "streams[0] (a).event_time", "needs a format"),
    ({"streams__1__name": "a"}, "streams[1].name", "duplicate stream name"),
    ({"streams__0__colour": "red"}, "streams[0]", "unknown field"),
    ({"predicates": ["a.x == b.x"]}, "predicates[0]", "not an equi-join"),
    ({"predicates": ["a.x = z.x", "b.y = c.y"]}, "predicates[0]", "unknown stream 'z'"),
    ({"predicates": ["a.v = b.x", "b.y = c.y"]}, "predicates[0]", "not in the keys"),
    ({"predicates": ["a.x = b.x", "a.x = b.x", "b.y = c.y"]}, "predicates[1]", "composite keys"),
    ({"predicates": ["a.x = b.x"]}, "streams[1] (b).keys", "not used by any predicate"),
    ({"output": ["a.nope"]}, "output[0]", "not a declared column"),
    ({"output": ["a.v", "b.x AS v"]}, "output[1]", "used twice"),
    ({"lateness": "soon"}, "lateness", "not a duration"),
    ({"spec_version": 7}, "spec_version", "not supported"),
])
def test_errors_name_the_field(changes, field, words):
    with pytest.raises(QuerySpecError) as info:
        parse_query(spec(**changes))
    assert info.value.field == field
    assert words in str(info.value)


def test_disconnected_graph_is_rejected():
    doc = spec()
    doc["streams"].append({"name": "d", "event_time": "ts", "window": 5,
                           "columns": {"ts": "timestamp", "y": "long"}, "keys": ["y"]})
    doc["streams"][1]["keys"] = ["x"]
    doc["predicates"] = ["a.x = b.x", "c.y = d.y"]
    with pytest.raises(QuerySpecError, match="not connected: c, d cannot be reached"):
        parse_query(doc)


def test_two_columns_of_one_stream_in_one_class():
    doc = spec()
    doc["streams"][1]["columns"]["y"] = "long"
    doc["predicates"] = ["a.x = b.x", "a.x = c.y", "c.y = b.y"]
    with pytest.raises(QuerySpecError, match="two columns of stream b"):
        parse_query(doc)


def test_load_from_file_and_yaml_errors(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(spec()))
    assert load_query(str(good)).name == "q"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(QuerySpecError, match="not valid YAML"):
        load_query(str(bad))
    with pytest.raises(QuerySpecError, match="no query spec 'nope'"):
        load_query("nope")


STREAM_FIELD = r"^streams\[\d+\]( \([A-Za-z_]\w*\))?(\.[\w.]+)?$"


@pytest.mark.parametrize("changes", [
    {"streams__0__window": "5 minutes"}, {"streams__1__columns__y": "varchar"}, {"streams__0__keys": ["v"]},
    {"streams__0__event_time": "v"}, {"streams__1__name": "a"}, {"streams__0__colour": "red"},
    {"predicates": ["a.x = b.x"]}, {"streams__2__source": "no/slash"}, {"streams__1__window": KeyError},
])
def test_stream_field_paths_are_indexed(changes):
    """Every error inside a stream names its index (and its name once known): ``streams[1] (b).keys``."""
    import re

    with pytest.raises(QuerySpecError) as info:
        parse_query(spec(**changes))
    assert re.match(STREAM_FIELD, info.value.field), info.value.field
