"""The feeder (mjoin.workloads.feeder) on real files: staged folders land complete, in order, on schedule; its
record's achieved rate matches; a reader polling the lake never sees a partial folder; passes of the replay get
disjoint keys; the command line runs it end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from mjoin.lake.layout import Lake
from mjoin.workloads.feeder import achieved, prepare_feed, read_record, run_feed
from mjoin.workloads.manifest import load_manifest
from mjoin.workloads.synthetic import generate_synthetic

PROJECT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    """A small synthetic replay: 4 streams, 60 s at 50 tuples/s per stream (12,000 rows)."""
    out = tmp_path_factory.mktemp("feed") / "syn"
    return generate_synthetic(out, streams=4, duration="60s", rate=50, cycle=10, seed=3)


def _folder_rows(path: str) -> int:
    return sum(pq.read_metadata(os.path.join(path, f)).num_rows for f in os.listdir(path) if f.endswith(".parquet"))


def test_folders_land_complete_in_order_on_time_and_the_record_matches(workload, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    rate, cycle, duration = 20_000.0, 1, 5
    start = time.time() + 4
    plan = prepare_feed(workload, lake, rate=rate, duration=duration, start=start, cycle=cycle, rows_per_file=1_500,
                        pace="compressed")
    assert plan.rows == int(rate * duration)
    assert plan.passes == 9  # 100,000 rows from a 12,000-row replay
    expected = {(f.source, f.arrival): f.rows for f in plan.folders}
    assert all(f.files >= 2 for f in plan.folders)  # several files per folder: a partial one could be seen

    seen, partial, halt = {}, [], threading.Event()

    def reader():  # polls the lake as a streaming job lists it: every folder it sees must be whole
        streams = Path(lake.root, "streams")
        while not halt.is_set():
            for src in (streams.iterdir() if streams.exists() else []):
                for d in src.iterdir():
                    if d.name.startswith("."):
                        continue
                    key = (src.name, int(d.name.split("=")[1]))
                    if key in seen:
                        continue
                    rows = _folder_rows(str(d))
                    if rows != expected[key]:
                        partial.append((key, rows, expected[key]))
                    seen[key] = rows

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    record = tmp_path / "record.jsonl"
    result = run_feed(plan, record)
    time.sleep(0.3)
    halt.set()
    t.join(5)

    lines = read_record(record)
    assert not partial, partial
    assert result.folders == len(plan.folders) == len(lines) == len(seen)
    assert [(x["source"], x["arrival"]) for x in lines] == [(f.source, f.arrival) for f in plan.folders]
    arrivals = [x["arrival"] for x in lines]
    assert arrivals == sorted(arrivals) and len(set(arrivals)) == duration
    for x in lines:  # each on its cycle's end, within 0.25 s
        assert x["planned"] == x["arrival"] + cycle
        assert 0 <= x["landed"] - x["planned"] < 0.25, x
        assert x["rows"] == expected[(x["source"], x["arrival"])]
    summary = achieved(lines, cycle)
    assert summary["rows"] == plan.rows
    assert abs(summary["rate"] - rate) / rate < 0.05, summary
    # the landed files hold the rows, event times inside their folder's cycle, at the planned rate
    ts = []
    for f in plan.folders:
        tab = pq.read_table(lake.arrival_dir(f.source, f.arrival))
        t_us = tab.column("ts").cast("int64").to_numpy()
        assert t_us.min() >= f.arrival * 1e6 and t_us.max() < (f.arrival + cycle) * 1e6
        ts.append(t_us)
    ts = np.sort(np.concatenate(ts))
    assert len(ts) == plan.rows
    assert abs(np.median(np.diff(ts)) - 1e6 / rate) <= 1  # one tuple every 50 us
    assert not os.listdir(os.path.join(plan.staging)) or all(
        not os.listdir(os.path.join(plan.staging, s)) for s in os.listdir(plan.staging) if s != "feed.json")


def test_passes_of_the_replay_get_disjoint_keys(workload, tmp_path):
    manifest = load_manifest(workload.root)
    n = sum(manifest.rows(s) for s in manifest.sources)
    lake = Lake(str(tmp_path / "lake"))
    plan = prepare_feed(workload, lake, rate=n / 4, duration=8, start=1_000_000_000, cycle=2,
                        pace="compressed")  # exactly two passes
    assert plan.passes == 2 and plan.rows == 2 * n
    span = plan.key_span
    for s in manifest.sources:
        import pyarrow as pa

        orig = pa.concat_tables([pq.read_table(Path(workload.root, "streams", s, f"arrival={a}"))
                                 for a in manifest.arrivals(s)])
        staged = pa.concat_tables([pq.read_table(os.path.join(plan.staging, f.source, f"arrival={f.arrival}"))
                                   for f in plan.folders if f.source == s])
        assert staged.num_rows == 2 * orig.num_rows
        for c in plan.key_columns[s]:
            o = orig.column(c).drop_null().to_numpy()
            k = staged.column(c).drop_null().to_numpy()
            assert sorted(np.unique(k // span)) == [0, 1]  # pass 0 as generated, pass 1 shifted by the span
            assert np.array_equal(np.sort(k[k < span]), np.sort(o))
            assert np.array_equal(np.sort(k[k >= span] - span), np.sort(o))


def test_replay_pace_keeps_each_keys_pace_and_grows_the_rate_with_the_keys(workload, tmp_path):
    import pyarrow as pa

    manifest = load_manifest(workload.root)
    n = sum(manifest.rows(s) for s in manifest.sources)  # 12,000 rows over 60 s: 200 tuples/s
    lake = Lake(str(tmp_path / "lake"))
    rate, duration, start = 2_000.0, 30, 1_000_000_000
    plan = prepare_feed(workload, lake, rate=rate, duration=duration, start=start, cycle=5)
    assert plan.pace == "replay" and plan.lane_seconds == pytest.approx(n / rate)
    assert abs(plan.rows - rate * duration) / (rate * duration) < 0.05  # ten lanes at once, 200 tuples/s each
    span, t0 = plan.key_span, int(manifest.start_epoch * 1e6)
    for s in manifest.sources:
        orig = pa.concat_tables([pq.read_table(Path(workload.root, "streams", s, f"arrival={a}"))
                                 for a in manifest.arrivals(s)])
        o_ts = orig.column("ts").cast("int64").to_numpy() - t0
        key = plan.key_columns[s][0]
        o_key: dict = {}  # replay time -> the keys of its rows (rows may share a time)
        for t, k in zip(o_ts.tolist(), orig.column(key).to_pylist()):
            o_key.setdefault(t, set()).add(k)
        staged = pa.concat_tables([pq.read_table(os.path.join(plan.staging, f.source, f"arrival={f.arrival}"))
                                   for f in plan.folders if f.source == s])
        ts = staged.column("ts").cast("int64").to_numpy()
        keys = staged.column(key).to_pylist()
        lanes = set()
        for t, k in zip(ts.tolist(), keys):
            if k is None:
                continue
            lane = k // span
            lanes.add(lane)
            rel = t - start * 1_000_000 - int(round((lane * plan.lane_seconds - plan.replay_seconds) * 1e6))
            # the replay's row at the replay's time (within the lane start's 1-us rounding), keys shifted by the lane
            assert any(k - lane * span in o_key.get(rel + d, ()) for d in (-1, 0, 1)), (t, k, lane)
        assert len(lanes) >= 10


def test_stop_ends_between_folders_and_later_folders_stay_staged(workload, tmp_path):
    lake = Lake(str(tmp_path / "lake"))
    plan = prepare_feed(workload, lake, rate=5_000, duration=30, start=time.time() - 2, cycle=1)
    landed = []
    result = run_feed(plan, tmp_path / "r.jsonl", stop=lambda: len(landed) >= 8, on_folder=landed.append)
    assert result.stopped and result.folders == 8  # folders already due land at once; stop() is asked before each
    assert len(read_record(tmp_path / "r.jsonl")) == 8
    assert len(list(Path(lake.root, "streams").glob("*/arrival=*"))) == 8
    assert len(list(Path(plan.staging).glob("*/arrival=*"))) == len(plan.folders) - 8


def test_feed_command_lands_and_prints_the_achieved_rate(workload, tmp_path):
    lake = tmp_path / "lake"
    out = subprocess.run([sys.executable, "-m", "mjoin", "feed", "--workload", workload.root, "--lake", str(lake),
                          "--rate", "4000", "--duration", "3s", "--cycle", "1", "--start", "+1s",
                          "--pace", "compressed"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(PROJECT / "include")})
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 12_000 and summary["folders"] == 12
    assert abs(summary["rate"] - 4000) / 4000 < 0.1
    assert len(read_record(lake / "feed-record.jsonl")) == 12
