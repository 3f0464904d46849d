"""The synthetic workload's second key column (two attribute classes): one-class workloads are bit-identical to
what the generator wrote before ``key2`` existed, ``key2`` follows its own parameters, the query has two classes."""
from __future__ import annotations

import glob
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mjoin.model.query import load_query
from mjoin.workloads.presets import PRESETS
from mjoin.workloads.errors import ScheduleError
from mjoin.workloads.synthetic import generate_synthetic
from mjoin.workloads.schedule import load_schedule

#: Content digests of every preset (4 streams, 60 s, rate 20, domain 200, window 30s, seed 3), computed with the
#: code *before* the second key was added (main at b59d49d, /tmp script equal to :func:`workload_digest`). Any change
#: here means one-class workloads no longer generate what they did: the statistics and results of every earlier
#: run would no longer be reproducible from their workload's parameters.
BEFORE_KEY2 = {
    "stationary": "9eeec0ca88f3d013c0d1c5a9ef19a8d4c7553222e28c5e03020a90b30214c627",
    "rate-swap": "bce510f972fe18669c1174d553fff674bf1890233148a558478b7f381d1ceee2",
    "match-drift": "64a7995c37034e71adc7988c558379ffeaef4e41ee6533b0828609c69718f3f4",
    "skew-drift": "240e1f4834449ff0cbffdee52490c9a949433ab0d8863598eb38a8ebdea5f146",
    "burst": "f35929cea17522d26a0d31699c66d9f8fc5294a1d5344ff9b557caa85657487a",
    "mixed": "d01fc7284c765d481803c9125ddf8f9481442eb9c56422fcddf03a957bc4df6b",
    "stripes": "f76059b2d11e7b99aafdbfd76b675a30adf6b6ebb6474ec795ffa7911a4a2ecc",
    "hot-rotate": "6255556af292533e10c5a4aa36ed8ad875c9f8408052f64c83938afbdfaf4c15",
    "hot-ramp": "8210ab78f7283121e866f2d41b1b73dc090fa496947626629e2eec82331de6c0",
    "hot-burst": "7c9664f3a882cb1b32ee0fc526a54e974847c2956f8714751542a22dcf1640c6",
}
TWO = {"defaults": {"zipf": 0.0}, "keys": {"s0": ["key", "key2"], "s2": ["key2"], "s3": ["key2"]},
       "streams": {"s2": {"key2_domain": "2d"}},
       "events": [{"type": "step", "at": "50%", "stream": "s2", "param": "key2_domain", "value": "1d"}]}


def workload_digest(root) -> str:
    """sha256 over every file of a workload: parquet files by their Arrow IPC content (independent of the parquet
    writer's metadata), manifest.json without its library versions, the other files byte for byte."""
    h = hashlib.sha256()
    root = Path(root)
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        h.update(str(p.relative_to(root)).encode())
        if p.suffix == ".parquet":
            t = pq.read_table(p).replace_schema_metadata(None).combine_chunks()
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, t.schema) as w:
                w.write_table(t)
            h.update(sink.getvalue().to_pybytes())
        elif p.name == "manifest.json":
            doc = json.loads(p.read_text())
            doc.pop("generator", None)
            h.update(json.dumps(doc, sort_keys=True).encode())
        else:
            h.update(p.read_bytes())
    return h.hexdigest()


def small(out, schedule, **kw):
    kw = {"streams": 4, "duration": "60s", "rate": 20, "domain": 200, "window": "30s", "seed": 3, **kw}
    return generate_synthetic(out, schedule=schedule, overwrite=True, **kw)


def frame(m, stream) -> pd.DataFrame:
    files = sorted(glob.glob(os.path.join(m.root, "streams", stream, "*", "*.parquet")))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def test_pinned_presets_cover_every_preset():
    assert set(BEFORE_KEY2) <= set(PRESETS)


@pytest.mark.parametrize("name", sorted(BEFORE_KEY2))
def test_one_class_presets_generate_what_they_did_before_key2(tmp_path, name):
    assert workload_digest(small(tmp_path / name, name).root) == BEFORE_KEY2[name]


def test_key2_leaves_the_other_columns_alone(tmp_path):
    one = small(tmp_path / "one", {k: v for k, v in TWO.items() if k != "keys" and k != "streams" and k != "events"})
    two = small(tmp_path / "two", TWO)
    for s in ("s0", "s1", "s2", "s3"):
        a, b = frame(one, s), frame(two, s)
        assert ("key2" in b.columns) == (s != "s1") and "key2" not in a.columns
        pd.testing.assert_frame_equal(a, b.drop(columns=["key2"], errors="ignore"))
        assert list(b.columns[:2]) == (["key", "key2"] if s != "s1" else ["key", "ts"])


def test_key2_follows_its_own_parameters(tmp_path):
    m = small(tmp_path / "two", TWO, duration="120s")
    s2 = frame(m, "s2")
    first = s2[s2["ts"] < pd.Timestamp(m.doc["start"]) + pd.Timedelta("60s")]
    second = s2[s2["ts"] >= pd.Timestamp(m.doc["start"]) + pd.Timedelta("60s")]
    assert first["key2"].max() >= 300 and first["key2"].min() >= 0  # 2d = 400 keys before the step
    assert second["key2"].max() < 200  # 1d after it
    assert frame(m, "s0")["key2"].max() < 200
    sched = pq.read_table(os.path.join(m.root, "schedule.parquet")).to_pandas()
    assert sched.loc[sched.stream == "s2", "key2_domain"].tolist()[0] == 400
    assert sched.loc[sched.stream == "s1", "key2_domain"].isna().all()
    assert m.doc["sources"]["s0"]["null_keys"] == {"key": 0, "key2": 0}
    assert m.doc["schedule"]["keys"]["s1"] == ["key"]


def test_two_class_query(tmp_path):
    m = small(tmp_path / "two", TWO)
    q = load_query(os.path.join(m.root, "query.yaml"))
    members = sorted(sorted(s for s, _ in cls) for cls in q.attribute_classes.values())
    assert members == [["s0", "s1"], ["s0", "s2", "s3"]]
    assert {q.key_column(s, c) for c in q.attribute_classes for s in ("s0",)} == {"key", "key2"}


def test_key2_is_drawn_with_nulls(tmp_path):
    doc = {**TWO, "streams": {"s2": {"key2_null_rate": 0.5}}, "events": []}
    m = small(tmp_path / "nulls", doc)
    s2 = frame(m, "s2")
    assert 0.3 < s2["key2"].isna().mean() < 0.7 and s2["key"].notna().all()
    assert m.doc["sources"]["s2"]["null_keys"]["key2"] == int(s2["key2"].isna().sum())


@pytest.mark.parametrize("doc, field", [
    ({"keys": {"s0": ["key", "key2"]}}, "keys"),  # only s0 joins on key2
    ({"keys": {"s0": ["key2"], "s1": ["key2"]}}, "keys"),  # no stream carries both
    ({"keys": {"s0": ["key", "key2"], "s1": ["key", "key2"]}}, "keys"),  # a composite key between s0 and s1
    ({"keys": {"s0": ["key", "key3"], "s1": ["key2"]}}, "keys.s0"),
    ({"keys": {"s9": ["key2"]}}, "keys.s9"),
    ({"keys": {"s0": ["key", "key2"], "s2": ["key2"]}, "streams": {"s1": {"key2_domain": 5}}}, "streams.s1.key2_domain"),
    ({"keys": {"s0": ["key", "key2"], "s2": ["key2"]},
      "events": [{"type": "step", "at": "10%", "stream": "s1", "param": "key2_shift", "value": 3}]}, "events[0].param"),
    ({"streams": {"s1": {"key2_domain": 5}}}, "streams.s1.key2_domain"),
])
def test_bad_two_class_schedules(doc, field):
    with pytest.raises(ScheduleError) as err:
        load_schedule(doc, streams=4, duration=60)
    assert err.value.field == field


def test_key2_defaults_and_suffixes():
    doc = {"defaults": {"zipf": 0.5, "key2_zipf": 1.5, "domain": 50},
           "keys": {"s0": ["key", "key2"], "s1": ["key2"]}, "streams": {"s1": {"key2_offset": "2d"}}}
    sched = load_schedule(doc, streams=3, duration=60)
    assert sched.base["s0"]["key2_zipf"] == 1.5 and sched.base["s0"]["key2_domain"] == 50
    assert sched.base["s1"]["key2_offset"] == 100 and "key2_zipf" not in sched.base["s2"]
    assert sched.stream_keys("s2") == ("key",) and sched.two_class
    assert not load_schedule("hot-rotate", streams=4, duration=60).two_class
    assert np.all(sched.value("s1", "key2_offset", [0, 30]) == 100)
