"""Random hostile lakes: streaming = the interval run over the accepted rows, every time.

Each seed makes a random good lake (three streams, 10-s arrival cycles, 1-3 part files per folder spanning
their cycle, sparse cycles) and plants random bad input: files ten years ahead (quarantined whole as
``future``), a few future rows in good files, rows from the past (``late`` once the watermark has passed
them), truncated files, byte copies of earlier files, files with extra columns. The folders land atomically
between micro-batches, in the middle of a micro-batch, while a processing-time job runs, and while a job of its
own process runs and is killed with SIGKILL; each run has a random file cap. Then:

- the streaming results equal the interval run over the rows the job accepted (count and fingerprint), which
  equals DuckDB's reference over them;
- every landed row is accepted or quarantined (none silently dropped), no row is accepted twice, no accepted
  row is future, and the only late rows are planted past rows (no legitimate row is ever late).

Two seeds run in the suite (about two minutes each on a loaded 2-core machine); ``MJOIN_HOSTILE_SEEDS=N`` runs
seeds 1..N (e.g. 20 for a soak).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from engine_helpers import T0, assert_same_results, job_env, kill_tree, no_leaked_queries, reference
from hostile_helpers import accepted_lake, local_path, rejected_files, rejected_row_keys, same_results
from mjoin.engine.config import EngineConfig
from mjoin.engine.control import JobControl
from mjoin.engine.metrics import read_metrics
from mjoin.engine.quarantine import rejected_rows
from mjoin.engine.results import read_results
from mjoin.engine.runs import run_interval, run_stream
from mjoin.lake import contract
from mjoin.lake.layout import Lake
from mjoin.model.query import load_query

pytestmark = [pytest.mark.spark, pytest.mark.slow]
_ = no_leaked_queries
US = 1_000_000
CYCLE = 10
TEN_YEARS = 10 * 365 * 86400
SEEDS = list(range(1, int(os.environ.get("MJOIN_HOSTILE_SEEDS", "2")) + 1))


def spec(rng: random.Random) -> dict:
    return {"spec_version": 1, "name": "hostile3", "lateness": f"{rng.choice([0, 0, 5])}s",
            "streams": [{"name": n, "source": f"h{n}", "event_time": "ts", "window": f"{rng.choice([30, 40, 60])}s",
                         "columns": {"ts": "timestamp", "k": "long", "id": "long"}, "keys": ["k"]} for n in "abc"],
            "predicates": ["a.k = b.k", "b.k = c.k"], "output": ["a.id AS aid", "b.id AS bid", "c.id AS cid", "a.k"]}


class Plan:
    """What lands, cycle by cycle (deterministic by seed): ``cycles[i]`` is a list of (source, arrival, [(name,
    table or bytes)]); ``past``: stream -> ids of rows planted in the past and of rows in byte copies (the only
    rows that may be late)."""

    def __init__(self, rng: random.Random, n_cycles: int):
        self.rng = rng
        self.cycles = []
        self.past = {n: set() for n in "abc"}
        self.planted = {"future_file": 0, "future_rows": 0, "past": 0, "truncated": 0, "duplicate": 0, "extra": 0}
        self.next_id = 0
        landed = []  # (source, arrival, name, content) of good files, for byte copies
        for i in range(n_cycles):
            a = T0 + i * CYCLE
            cycle = []
            for n in "abc":
                if i > 0 and rng.random() < 0.12:  # a sparse cycle: no folder
                    continue
                files = []
                for p in range(rng.choice([1, 1, 2, 3])):
                    t = self.table(n, a, rng.randint(3, 8))
                    if rng.random() < 0.10:  # a few future rows in a good file
                        t = self.move(t, rng.sample(range(t.num_rows), 1), TEN_YEARS if rng.random() < 0.5
                                      else 3 * CYCLE + rng.random() * 5)
                        self.planted["future_rows"] += 1
                    if i >= 3 and rng.random() < 0.10:  # a row from the past
                        row = rng.randrange(t.num_rows)
                        t = self.move(t, [row], -rng.uniform(3, 6) * CYCLE)
                        self.past[n].add(t.column("id")[row].as_py())
                        self.planted["past"] += 1
                    if rng.random() < 0.08:  # an extra column (allowed: not declared, not read)
                        t = t.append_column("note", pa.array([f"x{j}" for j in range(t.num_rows)]))
                        self.planted["extra"] += 1
                    files.append((f"part-{p:05d}.parquet", t))
                if rng.random() < 0.07:  # a file ten years ahead
                    files.append((f"part-{len(files):05d}.parquet", self.move(self.table(n, a, 5), None, TEN_YEARS)))
                    self.planted["future_file"] += 1
                if rng.random() < 0.06:  # a truncated file
                    raw = _bytes(self.table(n, a, 6))
                    files.append((f"part-{len(files):05d}.parquet", raw[: len(raw) // 2]))
                    self.planted["truncated"] += 1
                if landed and rng.random() < 0.08:  # a byte copy of an earlier good file of this source
                    src = [x for x in landed if x[0] == f"h{n}"]
                    if src:
                        _, _, name, content = rng.choice(src)
                        files.append((f"resent-{uuid.uuid4().hex[:6]}.parquet", content))
                        self.planted["duplicate"] += 1
                        # its rows: a duplicate file while the job remembers the first, late row by row after
                        self.past[n] |= set(pq.read_table(pa.BufferReader(content)).column("id").to_pylist())
                rng.shuffle(files)
                for name, content in files:
                    if name.startswith("part-") and not isinstance(content, bytes):
                        landed.append((f"h{n}", a, name, _bytes(content)))
                cycle.append((f"h{n}", a, files))
            self.cycles.append(cycle)

    def table(self, stream: str, arrival: int, rows: int) -> pa.Table:
        ts = np.sort(np.array([arrival + self.rng.random() * (CYCLE - 0.001) for _ in range(rows)]))
        ids = np.arange(self.next_id, self.next_id + rows) + {"a": 0, "b": 10**6, "c": 2 * 10**6}[stream]
        self.next_id += rows
        return pa.table({"ts": pa.array((ts * US).astype(np.int64), pa.int64()).cast(pa.timestamp("us")),
                         "k": pa.array([self.rng.randint(0, 5) for _ in range(rows)], pa.int64()),
                         "id": pa.array(ids, pa.int64())})

    @staticmethod
    def move(t: pa.Table, rows, seconds: float) -> pa.Table:
        us = t.column("ts").cast(pa.int64()).to_numpy().copy()
        us[np.arange(len(us)) if rows is None else np.asarray(rows)] += int(seconds * US)
        return t.set_column(0, "ts", pa.array(us, pa.int64()).cast(pa.timestamp("us")))


def _bytes(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink)
    return sink.getvalue().to_pybytes()


def land_cycle(lake: Lake, cycle) -> None:
    """One cycle's folders, each landed atomically (a hidden folder renamed into place)."""
    for source, arrival, files in cycle:
        dst = lake.arrival_dir(source, arrival)
        tmp = os.path.join(os.path.dirname(dst), f".arrival={arrival}.{uuid.uuid4().hex[:8]}.tmp")
        os.makedirs(tmp)
        for name, content in files:
            path = os.path.join(tmp, name)
            if isinstance(content, bytes):
                open(path, "wb").write(content)
            else:
                pq.write_table(content, path)
        os.rename(tmp, dst)


class Lander(threading.Thread):
    def __init__(self, lake, cycles, rng, pause=0.4):
        super().__init__(daemon=True)
        self.lake, self.cycles, self.rng, self.pause, self.error = lake, cycles, rng, pause, None

    def run(self):
        try:
            for c in self.cycles:
                time.sleep(self.rng.uniform(0, self.pause))
                land_cycle(self.lake, c)
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.mark.parametrize("seed", SEEDS)
def test_streaming_equals_the_interval_over_the_accepted_rows(spark, tmp_path, monkeypatch, seed):
    from mjoin.engine import stream

    rng = random.Random(seed)
    spec_path = tmp_path / "hostile3.yaml"
    spec_path.write_text(yaml.safe_dump(spec(rng)))
    q = load_query(str(spec_path))
    plan = Plan(rng, n_cycles=rng.randint(14, 20))
    lake = Lake(str(tmp_path / "lake"))
    os.makedirs(lake.streams(), exist_ok=True)
    n = len(plan.cycles)
    cuts = sorted(rng.sample(range(3, n - 2), 3))  # [0, c1) then [c1, c2) during a live job, [c2, c3) with a kill
    caps = [rng.choice([None, 1, 2, 3, 5]) for _ in range(4)]

    def cfg(cap):
        return EngineConfig(buckets=2, max_files_per_trigger=cap)

    # 1. a backlog, with folders landing in the middle of micro-batches
    for c in plan.cycles[:cuts[0] - 2]:
        land_cycle(lake, c)
    pending = list(plan.cycles[cuts[0] - 2:cuts[0]])
    process = stream.StreamJob.process

    def land_mid_batch(self, df, batch_id):
        if pending and rng.random() < 0.7:
            land_cycle(lake, pending.pop(0))
        process(self, df, batch_id)

    monkeypatch.setattr(stream.StreamJob, "process", land_mid_batch)
    run_stream(spark, q, lake, config=cfg(caps[0]))
    monkeypatch.setattr(stream.StreamJob, "process", process)
    for c in pending:
        land_cycle(lake, c)

    # 2. a processing-time job while a lander lands, asked to stop once the lander is done
    lander = Lander(lake, plan.cycles[cuts[0]:cuts[1]], random.Random(rng.random()))  # (threads: their own rng)
    control = JobControl(lake, q.name)
    linger = rng.uniform(0, 2)

    def stop_after_lander():
        lander.join(300)
        time.sleep(linger)
        control.request_stop(by="test", reason="lander done")

    lander.start()
    stopper = threading.Thread(target=stop_after_lander, daemon=True)
    stopper.start()
    run_stream(spark, q, lake, trigger="processingTime", interval=0.5, config=cfg(caps[1]), timeout=600)
    stopper.join(60)
    assert lander.error is None

    # 3. a job of its own process, killed with SIGKILL while cycles land
    args = [sys.executable, "-m", "mjoin", "run", "--stream", "--query", str(spec_path), "--lake", lake.root,
            "--buckets", "2", "--trigger", "processingTime", "--interval", "1"]
    if caps[2]:
        args += ["--max-files-per-trigger", str(caps[2])]
    log = tmp_path / "job.log"
    before = control.status().get("run_id")
    with open(log, "w") as fh:
        job = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=job_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        st = control.status()
        while not (st.get("run_id") != before and st["state"] == "running"):
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the job's query did not start within 300 s"
            time.sleep(0.2)
            st = control.status()
        lander = Lander(lake, plan.cycles[cuts[1]:cuts[2]], random.Random(rng.random()), pause=0.6)
        lander.start()
        time.sleep(rng.uniform(1, 6))
        killed_in = control.status().get("batch_in_progress")
        kill_tree(job, started=False)
    finally:
        if job.poll() is None:
            job.kill()
    lander.join(300)
    assert lander.error is None and control.status()["state"] == "dead"

    # 4. the rest lands; a restart catches up
    for c in plan.cycles[cuts[2]:]:
        land_cycle(lake, c)
    run_stream(spark, q, lake, config=cfg(caps[3]))

    # ---- the checks --------------------------------------------------------------------------------------
    what = f"seed {seed}: caps {caps}, cuts {cuts}, killed in batch {killed_in}, planted {plan.planted}"
    records = read_metrics(lake, q.name)
    # two arrival cycles once the lake's cycle is known; the query's shortest window in a batch run while no source
    # had two folders yet (a young lake: contract.young_allowance)
    young = contract.young_allowance(q)
    allowance = {r["future_allowance"] for r in records if r["future_allowance"] is not None}
    assert allowance <= {2.0 * CYCLE, young}, (what, allowance)

    def allowed(a):  # the largest allowance of the batches that read arrival folder a
        return max((r["future_allowance"] for r in records if r["future_allowance"] is not None and r["arrivals"][0]
                    is not None and r["arrivals"][0] <= a <= r["arrivals"][1]), default=2.0 * CYCLE)
    accepted = accepted_lake(lake, q, tmp_path / "accepted")
    ids = {}
    for s in q.streams:
        got = [i for f in accepted.stream_files(s.source) for i in pq.read_table(f, columns=["id"]).column("id").to_pylist()]
        assert len(got) == len(set(got)), f"{what}: a row of {s.name} accepted twice"
        ids[s.name] = set(got)
        for a, f, kind in accepted.landed(s.source):  # no accepted row is future
            ts = pq.read_table(f, columns=["ts"]).column("ts").cast(pa.int64()).to_numpy()
            assert (ts < (a + allowed(a)) * US).all(), (what, f)
    # the only late rows are planted past rows; every landed row is accepted or quarantined
    for s in "abc":
        tab = rejected_rows(lake, q.name, s)
        late = {int(json.loads(row)["id"]) for reason, row in zip(tab.column("reason").to_pylist(),
                                                                  tab.column("row").to_pylist()) if reason == "late"}
        assert late <= plan.past[s], f"{what}: legitimate rows of {s} were late: {sorted(late - plan.past[s])}"
    rows, reasons = rejected_row_keys(lake, q)
    whole = rejected_files(lake, q)
    landed_rows = accepted_rows = 0
    for s in q.streams:
        for a, f, kind in lake.landed(s.source):
            if kind != "data":
                continue
            try:
                landed_rows += pq.read_metadata(f).num_rows
            except Exception:  # noqa: BLE001 - a truncated file: unreadable, quarantined whole without a count
                assert whole.get(local_path(f), (None, None))[1] == "unreadable", (what, f)
                continue
        accepted_rows += len(ids[s.name])
    quarantined_rows = sum(sum(c.values()) for c in rows.values()) + sum(
        pq.read_metadata(p).num_rows for p, (s, reason) in whole.items() if reason != "unreadable")
    assert landed_rows == accepted_rows + quarantined_rows, (what, landed_rows, accepted_rows, quarantined_rows)
    assert sum(r["rows_in"][s] for r in records for s in r["rows_in"]) == accepted_rows, what
    # the interval run over the accepted rows: the streaming results, exactly
    ts_all = [pq.read_table(f, columns=["ts"]).column("ts").cast(pa.int64()).to_numpy() for s in q.streams
              for f in accepted.stream_files(s.source)]
    ts_all = np.concatenate([x for x in ts_all if len(x)])
    start, end = int(ts_all.min() // US) - 1, int(ts_all.max() // US) + 2
    out = tmp_path / "interval"
    run_interval(spark, q, None, accepted, start, end, end - start, str(out),  # accepted: judged future by none
                 config=EngineConfig(buckets=2, future_allowance=float("inf")))
    fp = same_results(lake, str(out), q, what)
    assert fp["rows"] > 0, what
    assert_same_results(read_results(str(out), q.name), reference(q, accepted), f"{what}: interval vs DuckDB")
