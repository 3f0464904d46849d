"""The streaming job as it runs in production: a backlog whose modification times do not follow arrival,
micro-batch boundaries inside an arrival cycle, a live job racing a real-time lander, restarts after
downtime, a stream that goes idle. Every scenario ends with the same results as the interval run over
the same files (a multiset of full output rows; DuckDB's reference checks the interval run), and is run
with several seeds: the loss these tests guard against was intermittent.
"""
from __future__ import annotations

import os
import random
import shutil
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest

from engine_helpers import (T0, TPCDS_TABLES, assert_same_results, kill_tree, multiset, no_leaked_queries, reference,
                            replay_tpcds, start_job, write_stream_file)
from mjoin.engine.config import EngineConfig
from mjoin.engine.metrics import read_metrics
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_interval, run_stream
from mjoin.engine.control import JobControl
from mjoin.lake.layout import Lake
from mjoin.model.query import parse_query

pytestmark = pytest.mark.spark
_ = no_leaked_queries


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """TPC-DS sf=0.01, the paper's replay at 10 tuples/s in 20-s arrival cycles (4 files per cycle)."""
    stage = Lake(str(tmp_path_factory.mktemp("staging") / "lake"))
    info = replay_tpcds(stage, 0.01, rate=10.0, arrival_cycle=20)
    arrivals = sorted({a for t in TPCDS_TABLES for a in stage.arrivals(t)})
    return stage, info, arrivals


def copy_cycle(stage: Lake, lake: Lake, source: str, arrival: int) -> str | None:
    """Land one (source, arrival) folder the way the lander does: into a hidden folder, then renamed."""
    src = stage.arrival_dir(source, arrival)
    if not os.path.isdir(src):
        return None
    dst = lake.arrival_dir(source, arrival)
    tmp = os.path.join(os.path.dirname(dst), f".arrival={arrival}.{uuid.uuid4().hex[:8]}.tmp")
    shutil.copytree(src, tmp)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.rename(tmp, dst)
    return dst


def interval_results(spark, query, lake: Lake, info: dict, out) -> "pd.DataFrame":
    start = info["start"] - 3600
    s = run_interval(spark, query, None, lake, start, info["end"] + 60, info["end"] + 60 - start, str(out),
                     config=EngineConfig(buckets=4))
    return read_results(str(out), query.name)


@pytest.fixture(scope="module")
def expected(spark, staged, seed_query, tmp_path_factory):
    """The interval run over every staged file, checked against DuckDB once."""
    stage, info, _ = staged
    res = interval_results(spark, seed_query, stage, info, tmp_path_factory.mktemp("interval"))
    ref = reference(seed_query, stage)
    assert len(ref) > 500
    assert_same_results(res, ref, "interval run vs DuckDB")
    return res


@pytest.mark.parametrize("seed,max_files", [(1, 3), (2, 5), (3, 7)])
def test_backlog_with_shuffled_modification_times(spark, staged, expected, seed_query, tmp_path, seed, max_files):
    """A restored lake: every file's modification time random; a catch-up in micro-batches of a few files
    (boundaries fall inside arrival cycles). Before per-stream watermarks and the arrival-ordered
    source this lost most results to 'late'."""
    stage, info, arrivals = staged
    lake = Lake(str(tmp_path / "lake"))
    rng = random.Random(seed)
    for a in arrivals:
        for t in TPCDS_TABLES:
            dst = copy_cycle(stage, lake, t, a)
            for f in os.listdir(dst) if dst else ():
                m = rng.uniform(1e9, 2e9)
                os.utime(os.path.join(dst, f), (m, m))
    s = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=max_files))
    n_files = sum(len(lake.stream_files(t)) for t in TPCDS_TABLES)
    assert len(s.batches) == -(-n_files // max_files)
    assert sum(v.get("late", 0) for v in s.quarantined.values()) == 0
    records = read_metrics(lake, seed_query.name)
    # the batches follow arrival, not modification time
    firsts = [r["arrivals"][0] for r in records]
    assert firsts == sorted(firsts)
    assert_same_results(read_results(lake, seed_query.name), expected, f"backlog, seed {seed}, {max_files} files/batch")


class Lander(threading.Thread):
    """Lands the staged cycles in arrival order in real time, one source folder at a time with random
    pauses, so that the job's triggers fall between the folders of one cycle. ``gates`` (arrival index ->
    event): before landing that cycle, wait for the event (e.g. until the job has committed a batch, or a
    restarted job runs), so the race does not depend on how fast Spark starts on a loaded machine."""

    def __init__(self, stage: Lake, lake: Lake, arrivals, seed: int, pause: float = 0.15,
                 gate: threading.Event | None = None, before_gate: int = 2,
                 gates: dict[int, threading.Event] | None = None):
        super().__init__(daemon=True)
        self.stage, self.lake, self.arrivals = stage, lake, arrivals
        self.rng = random.Random(seed)
        self.pause = pause
        self.gates = dict(gates or {})
        if gate is not None:  # land before_gate cycles, then wait for gate
            self.gates[before_gate] = gate
        self.error = None

    def run(self):
        try:
            for i, a in enumerate(self.arrivals):
                if i in self.gates and not self.gates[i].wait(600):
                    raise TimeoutError(f"the job did not reach the gate before cycle {i} within 600 s")
                for t in self.rng.sample(TPCDS_TABLES, len(TPCDS_TABLES)):
                    copy_cycle(self.stage, self.lake, t, a)
                    time.sleep(self.rng.uniform(0, self.pause))
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.mark.slow
@pytest.mark.parametrize("seed", [4, 5])
def test_live_job_racing_a_realtime_lander_then_restarted(spark, staged, expected, seed_query, tmp_path, seed):
    """The job runs with a 0.5-s processingTime trigger while a lander lands the cycles folder by folder;
    it is stopped part-way (downtime while the lander goes on) and restarted on the backlog.

    The race does not depend on how fast Spark starts (a loaded CI machine took over 8 s): the lander
    lands two cycles, then waits for the job's first committed batch before landing the rest, and the
    job is asked to stop (at a batch boundary, as `mjoin job stop` does) after its third batch."""
    stage, info, arrivals = staged
    lake = Lake(str(tmp_path / "lake"))
    started, done = threading.Event(), threading.Event()
    lander = Lander(stage, lake, arrivals, seed, gate=started)
    lander.start()

    def stopper():
        control = JobControl(lake, seed_query.name)
        while not done.is_set():
            try:
                n = len(read_metrics(lake, seed_query.name))
            except FileNotFoundError:  # no batch yet
                n = 0
            if n >= 1:
                started.set()
            if n >= 3 or (n >= 2 and not lander.is_alive()):
                control.request_stop(by="test", reason="downtime while the lander goes on")
                return
            time.sleep(0.1)

    watch = threading.Thread(target=stopper, daemon=True)
    watch.start()
    try:
        s1 = run_stream(spark, seed_query, lake, trigger="processingTime", interval=0.5, timeout=600,
                        config=EngineConfig(buckets=4))
    finally:
        done.set()
        started.set()
    lander.join(300)
    assert lander.error is None and not lander.is_alive()
    assert len(s1.batches) >= 2
    s2 = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4, max_files_per_trigger=6))
    assert s2.batches and s2.batches[0] == s1.batches[-1] + 1
    assert sum(v.get("late", 0) for v in list(s1.quarantined.values()) + list(s2.quarantined.values())) == 0
    assert_same_results(read_results(lake, seed_query.name), expected, f"racing lander, seed {seed}")


# ---- an idle stream ----------------------------------------------------------------------------------

IDLE_SPEC = {
    "spec_version": 1, "name": "idle3", "lateness": "0s",
    "streams": [{"name": n, "source": f"i{n}", "event_time": "ts", "window": "30s",
                 "columns": {"ts": "timestamp", "k": "long", "id": "long"}, "keys": ["k"]} for n in "abc"],
    "predicates": ["a.k = b.k", "b.k = c.k"],
    "output": ["a.id AS a", "b.id AS b", "c.id AS c"],
}


def test_idle_stream_keeps_results_and_bounds_state(spark, tmp_path):
    """Stream c lands nothing for 150 s (five of its windows) and then resumes: while it is idle the job's
    watermark advances without it (state of a and b stays bounded), its new rows are not late, and the
    results equal the interval run's."""
    q = parse_query(IDLE_SPEC, source="idle3")
    lake = Lake(str(tmp_path / "lake"))
    rng = np.random.default_rng(9)
    next_id = 0
    for k in range(30):  # 10-s cycles over 300 s
        a = k * 10
        for n in "abc":
            if n == "c" and 60 <= a < 210:
                continue
            m = 20
            ts = np.sort(rng.uniform(a, a + 10, m))
            tbl = pa.table({"ts": pa.array(((T0 + ts) * 1e6).astype(np.int64), pa.timestamp("us")),
                            "k": pa.array(rng.integers(0, 8, m), pa.int64()),
                            "id": pa.array(np.arange(next_id, next_id + m), pa.int64())})
            next_id += m
            path = write_stream_file(lake, f"i{n}", T0 + a, tbl)
            os.utime(path, (T0 + a, T0 + a))
    s = run_stream(spark, q, lake, config=EngineConfig(buckets=2, max_files_per_trigger=2))
    assert sum(sum(v.values()) for v in s.quarantined.values()) == 0
    records = read_metrics(lake, q.name)
    idle = [r for r in records if "c" in r["watermarks"]["idle"]]
    assert idle, "c must have been idle while it landed nothing"
    # while c is idle the job's watermark trails a and b by the idle timeout (30 s), so their state holds
    # idle timeout + window + the batch being purged: about 80 s of 2 tuples/s, not the whole 150-s stall
    for r in idle[3:]:
        assert r["state_tuples"]["a"] <= 20 * 8 and r["state_tuples"]["b"] <= 20 * 8, r["state_tuples"]
    assert max(r["state_tuples"]["a"] for r in idle) < 20 * 12
    assert "c" not in records[-1]["watermarks"]["idle"]  # it resumed
    res = read_results(lake, q.name)
    out = tmp_path / "interval"
    run_interval(spark, q, None, lake, T0 - 60, T0 + 400, 460, str(out), config=EngineConfig(buckets=2))
    expected = read_results(str(out), q.name)
    assert_same_results(expected, reference(q, lake), "interval vs DuckDB")
    assert_same_results(res, expected, "idle stream: streaming vs interval")


@pytest.mark.slow
def test_repeated_kill_9_of_a_live_job_racing_the_lander(spark, staged, expected, seed_query, tmp_path):
    """The job runs as its own OS process (spark-submit, 1-s processingTime trigger) while a lander lands in
    real time; it is killed with SIGKILL (whole process tree) at random moments three times, each time
    restarted at once; an in-process availableNow run finishes the backlog. No loss, no duplicate.

    Each round's job races the lander: the lander lands the round's share of the cycles only once that job's
    query runs (so a job that starts slowly on a loaded machine still finds cycles arriving, and never waits
    for data that already all landed), the job commits a batch of its own, and is killed while the lander
    goes on landing (the next job restarts on that backlog)."""
    from mjoin.engine.control import JobControl

    stage, info, arrivals = staged
    lake = Lake(str(tmp_path / "lake"))
    rounds = 3
    gates = [threading.Event() for _ in range(rounds)]
    share = len(arrivals) // (rounds + 1)
    # two cycles land before the first job starts (a backlog), then a share of the cycles per round, the rest after
    lander = Lander(stage, lake, arrivals, seed=8, pause=0.5, gates={2 + k * share: g for k, g in enumerate(gates)})
    lander.start()
    control = JobControl(lake, seed_query.name)
    rng = random.Random(8)
    args = ["--stream", "--query", seed_query.name, "--buckets", "4", "--trigger", "processingTime", "--interval", "1"]
    kills = []
    try:
        for k in range(rounds):
            log = tmp_path / f"job{k}.log"
            before = control.status()
            job = start_job(lake, log, *args)
            try:
                deadline = time.monotonic() + 300
                st = control.status()
                while not (st.get("run_id") != before.get("run_id") and st["running"] and st["state"] == "running"):
                    assert job.poll() is None, log.read_text()[-3000:]
                    assert time.monotonic() < deadline, f"round {k}: the job's query did not start within 300 s"
                    time.sleep(0.2)
                    st = control.status()
                gates[k].set()  # this job runs: land its share of the cycles while it runs
                while st.get("last_batch_id") is None or st.get("last_batch_id") == before.get("last_batch_id"):
                    assert job.poll() is None, log.read_text()[-3000:]
                    assert time.monotonic() < deadline, f"round {k}: the job committed no batch of its own within 300 s"
                    assert lander.error is None, lander.error
                    time.sleep(0.2)
                    st = control.status()
                time.sleep(rng.uniform(0, 1.5))
                kills.append(control.status().get("batch_in_progress"))
                kill_tree(job)
            finally:
                if job.poll() is None:
                    job.kill()
    finally:
        for g in gates:  # a failed round must not leave the lander waiting
            g.set()
    lander.join(300)
    assert lander.error is None and not lander.is_alive()
    s = run_stream(spark, seed_query, lake, config=EngineConfig(buckets=4))
    assert sum(v.get("late", 0) for v in s.quarantined.values()) == 0
    res = read_results(lake, seed_query.name)
    assert max(multiset(res).values()) == 1
    assert_same_results(res, expected, f"three kill -9 (in batches {kills}) and restarts")
