"""The live harness: one system fed in real time at a chosen rate, measured the way it runs.

    flock /tmp/mjoin-bench.lock .venv/bin/python bench/live/harness.py run --system mjoin-fixed --rate 20000 --duration 180
    flock /tmp/mjoin-bench.lock .venv/bin/python bench/live/harness.py search --system spark-native --rate 1000 --duration 180
    .venv/bin/python bench/live/harness.py summarize     # bench/live/results/live.json and live.png from the runs

A run (:func:`run_once`), in a fresh lake under ``--work``:

1. **The feed**: the workload (TPC-DS sf 0.1 for ``tpcds_seed``, generated once and cached under ``--work``) staged
   by :mod:`mjoin.workloads.feeder` at ``--rate`` tuples/s for ``--duration`` seconds, in 10-s arrival folders,
   event times on the wall clock; staged before anything is measured, then renamed into place on schedule by a
   thread, its achieved-rate record in ``feed-record.jsonl``.
2. **The system**, started before the first folder is due: ``mjoin-fixed`` (``python -m mjoin run --stream
   --trigger processingTime --interval T``, the spec's order, nothing deployed), ``mjoin-loop`` (the same job with
   ``--stats-cycle 10`` plus the real Airflow services, api-server, scheduler and dag-processor, from
   ``bench/live/loop_cost.py``, with ``MJOIN_LAKE`` on this lake and ``MJOIN_PERIOD_MINUTES`` (default 1):
   the scheduled ``mjoin_reoptimize`` runs re-optimize the running job in continuous mode), ``spark-native``
   (the same command with ``--engine spark-native``: Spark's chained stream-stream joins), ``flink_multijoin``
   (Flink 2.3's MultiJoin in the Flink venv, ``flink_live_job.py``: continuously monitored CSV sources that
   :class:`flink_live.CsvMirror` fills on the feeder's schedule, a file sink committed on each checkpoint every
   trigger interval; its committed arrivals from the REST API, :class:`flink_live.FlinkProgress`).
3. **Per second**: the lag (newest landed arrival minus the newest arrival in a committed batch's input), and the
   CPU seconds of the join job's process tree and of the loop's processes (psutil, /proc).
4. **Per committed batch with input**: the end-to-end latency, the batch's commit (the mtime of Spark's
   ``commits/<id>`` in the job's checkpoint) minus the landing time of its newest input folder (from the feeder's
   record; mjoin's metrics name the batch's arrivals, spark-native's file-source log names its files).
5. **At the end**: the feed stops, the job may catch up for ``--catch-up`` seconds, is stopped, and (if it caught
   up) its results' fingerprint is compared with the interval run's over the same landed files.

Sustained: the lag's least-squares trend over the run's second half adds less than one arrival cycle over that
half, the job caught up within two trigger intervals of the feed's end, and the p99 latency is under twice the
trigger interval. ``search`` doubles the rate from ``--rate`` while sustained, then bisects ``--bisect`` times.

Everything the harness starts runs in its own process group and is stopped by pid (the group), in ``finally``
and on SIGINT/SIGTERM. Each run's figures go to ``--out/runs/<workload>-<system>-<rate>-<time>.json`` (with the
load average, the machine, the versions, the commit).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))
sys.path.insert(0, str(HERE))

import flink_live  # noqa: E402  (flink_multijoin: the CSV mirror, the job, its progress from the REST API)
from loop_cost import RunCpu, services  # noqa: E402  (the Airflow services and their CPU, as loop_cost runs them)

from mjoin.engine.metrics import git_commit, machine  # noqa: E402
from mjoin.lake.layout import Lake  # noqa: E402
from mjoin.model.timeutil import parse_time  # noqa: E402
from mjoin.workloads.feeder import achieved, prepare_feed, read_record, run_feed  # noqa: E402

SYSTEMS = ("mjoin-loop", "mjoin-fixed", "spark-native", "flink_multijoin")
WORKLOADS = {"tpcds_seed": "tpcds_returns_by_address"}
CYCLE = 10
ARRIVAL = re.compile(r"arrival=(\d+)")


class Interrupted(Exception):
    pass


def _on_signal(signum, frame):
    raise Interrupted(signal.Signals(signum).name)


# ---- processes ---------------------------------------------------------------------------------------------------

def start(args: list, log: Path, env: dict | None = None) -> subprocess.Popen:
    """A child in its own process group (stopped with :func:`stop_group`)."""
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": str(PROJECT / "include"), **(env or {})})


def _members(proc: subprocess.Popen) -> list:
    """The child and every process under it (psutil handles, for waiting on them)."""
    try:
        root = psutil.Process(proc.pid)
        return [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _gone(procs: list, timeout: float) -> list:
    """Wait until each process has exited (a zombie counts: it runs nothing); the ones still running."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def stop_services(ctx, procs: list) -> None:
    """Leave loop_cost's services() context (SIGTERM, SIGKILL after 30 s per group), then kill whatever the Airflow
    services started that is still running (a task process or a spark-submit that left their groups)."""
    members = [m for p in procs for m in _members(p)]
    with contextlib.suppress(Exception):
        ctx.__exit__(None, None, None)
    for p in _gone(members, 5):
        with contextlib.suppress(psutil.Error):
            p.kill()
    _gone(members, 30)


def stop_group(proc: subprocess.Popen | None, grace: float = 20.0) -> None:
    """SIGTERM to the child's process group, SIGKILL after ``grace`` seconds to the group and to every process that
    was under the child (one that left the group too); returns once all of them have exited."""
    if proc is None:
        return
    members = _members(proc)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace)
    members += [p for p in _members(proc) if p not in members]
    left = _gone(members, 0 if proc.poll() is None else 5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    _gone(members, 30)


class TreeCpu:
    """CPU seconds (user + system) of every process under some roots, sampled: each process's own CPU as last seen
    (a process that lives under a sample interval is missed; the job's JVM and Python workers live the run)."""

    def __init__(self, roots):
        self.roots = list(roots)
        self.seen: dict = {}  # (pid, create time) -> (own CPU, cmdline head)
        self.procs: dict = {}  # (pid, create time) -> psutil.Process
        self.calls = 0
        self.lock = threading.Lock()  # the sampler thread and the final sample

    def _refresh(self) -> None:
        for root in self.roots:
            try:
                for p in [psutil.Process(root)] + psutil.Process(root).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        key = (p.pid, p.create_time())
                        if key not in self.procs:
                            self.seen[key] = (0.0, os.path.basename((p.cmdline() or [p.name()])[0]))
                            self.procs[key] = p
            except psutil.NoSuchProcess:
                continue

    def sample(self) -> float:
        with self.lock:
            return self._sample()

    def _sample(self) -> float:
        if self.calls % 5 == 0:  # new processes: every 5th sample (a listing of the tree costs more than a read)
            self._refresh()
        self.calls += 1
        for key, p in list(self.procs.items()):
            try:
                t = p.cpu_times()
                self.seen[key] = (t.user + t.system, self.seen[key][1])
            except psutil.Error:
                del self.procs[key]  # gone: its last seen CPU stays
        return self.total()

    def total(self) -> float:
        return sum(v[0] for v in self.seen.values())

    def by_command(self) -> dict:
        out: dict = {}
        for cpu, name in self.seen.values():
            out[name] = round(out.get(name, 0.0) + cpu, 3)
        return out


# ---- what the job committed --------------------------------------------------------------------------------------

def _commit_times(checkpoint: Path) -> dict:
    """batch id -> commit time (mtime of Spark's commit log entry)."""
    out = {}
    d = checkpoint / "commits"
    if d.is_dir():
        for f in d.iterdir():
            if f.name.isdigit():
                with contextlib.suppress(FileNotFoundError):
                    out[int(f.name)] = f.stat().st_mtime
    return out


class Committed:
    """The job's committed batches, read incrementally: batch id -> (commit time, newest input arrival, rows in)."""

    def __init__(self, lake: Lake, query: str, engine: str):
        self.lake, self.query, self.engine = lake, query, engine
        self.checkpoint = Path(lake.checkpoints(query)) / ("native" if engine == "spark-native" else "")
        self.batches: dict = {}
        self._native_files: dict = {}  # batch id -> newest arrival among its files

    def _native_inputs(self) -> None:
        """spark-native: the file sources' logs (``sources/<i>/<batch>``, compacted every few batches) name each
        batch's files, so their arrival folders."""
        root = self.checkpoint / "sources"
        if not root.is_dir():
            return
        for src in root.iterdir():
            for f in src.iterdir():
                if f.name.startswith(".") or f.name.endswith(".tmp"):
                    continue
                try:
                    lines = f.read_text().splitlines()[1:]
                except (FileNotFoundError, UnicodeDecodeError):
                    continue
                for line in lines:
                    try:
                        e = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    m = ARRIVAL.search(e.get("path", ""))
                    if m and "batchId" in e:
                        b = int(e["batchId"])
                        self._native_files[b] = max(self._native_files.get(b, 0), int(m.group(1)))

    def update(self) -> dict:
        commits = _commit_times(self.checkpoint)
        new = [b for b in commits if b not in self.batches]
        if not new:
            return self.batches
        if self.engine == "spark-native":
            self._native_inputs()
        for b in sorted(new):
            if self.engine == "spark-native":
                newest = self._native_files.get(b)
                self.batches[b] = {"committed": commits[b], "newest_arrival": newest, "rows_in": None}
                continue
            path = Path(self.lake.metrics(self.query)) / f"batch={b}.json"
            try:
                rec = json.loads(path.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                continue  # the commit is visible before the record is read back: next time
            self.batches[b] = {"committed": commits[b], "newest_arrival": (rec.get("arrivals") or [None, None])[1],
                               "rows_in": sum((rec.get("rows_in") or {}).values()),
                               "plan_version": rec.get("plan_version"), "wall_seconds": rec.get("wall_seconds"),
                               "result_rows": rec.get("result_rows"),
                               # where a batch's time goes (the engine's own account; the lake is removed after a run)
                               "prepare_seconds": rec.get("prepare_seconds"), "task_seconds": rec.get("task_seconds"),
                               "task_cpu_seconds": rec.get("task_cpu_seconds"),
                               "state_write_seconds": rec.get("state_write_seconds"),
                               "state_load_seconds": rec.get("state_load_seconds"),
                               "stage_seconds": rec.get("stage_seconds"),
                               "state_tuples": sum((rec.get("state_tuples") or {}).values()),
                               "where": (rec.get("execution") or {}).get("where"),
                               "job_stats_task_cpu_seconds": (rec.get("job_stats") or {}).get("task_cpu_seconds")}
        return self.batches

    def newest_arrival(self):
        xs = [b["newest_arrival"] for b in self.batches.values() if b["newest_arrival"] is not None]
        return max(xs) if xs else None


# ---- the figures -------------------------------------------------------------------------------------------------

def latencies(batches: dict, record: list) -> list[dict]:
    """Per committed batch with input: commit time minus the landing of its newest input folder (the latest landing
    of that arrival over the sources; they land within milliseconds of each other)."""
    landed: dict = {}
    for x in record:
        landed[x["arrival"]] = max(landed.get(x["arrival"], 0.0), x["landed"])
    out = []
    for b, v in sorted(batches.items()):
        e = v.get("newest_arrival")
        if e is None or e not in landed:
            continue
        out.append({"batch_id": b, "arrival": e, "committed": v["committed"], "landed": landed[e],
                    "latency": v["committed"] - landed[e], "rows_in": v.get("rows_in")})
    return out


def percentile(xs, q: float):
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else None


def verdict(lag: list[dict], lat: list[dict], *, trigger: float, cycle: float, caught_up_after) -> dict:
    """Sustained or not: the lag's trend over the second half of the feed adds under one cycle over that half,
    the job caught up within two triggers of the feed's end, and p99 latency < 2 x trigger."""
    pts = [(x["t"], x["lag"]) for x in lag if x.get("lag") is not None and x.get("feeding")]
    half = pts[len(pts) // 2:]
    growth = None
    if len(half) >= 3:
        t = np.array([p[0] for p in half])
        y = np.array([p[1] for p in half])
        slope = float(np.polyfit(t - t[0], y, 1)[0]) if np.ptp(t) > 0 else 0.0
        growth = slope * float(np.ptp(t))
    p99 = percentile([x["latency"] for x in lat], 99)
    bounded = growth is not None and growth < cycle
    caught = caught_up_after is not None and caught_up_after <= 2 * trigger
    return {"lag_growth_second_half_s": growth, "lag_bounded": bounded, "caught_up_after_s": caught_up_after,
            "caught_up_in_time": caught, "latency_p50_s": percentile([x["latency"] for x in lat], 50),
            "latency_p99_s": p99, "latency_ok": p99 is not None and p99 < 2 * trigger,
            "sustained": bool(bounded and caught and p99 is not None and p99 < 2 * trigger)}


def versions() -> dict:
    import pyarrow
    import pyspark

    out = {"python": sys.version.split()[0], "pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__,
           "numpy": np.__version__, "psutil": psutil.__version__}
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        out["apache-airflow"] = version("apache-airflow")
    return out


def ensure_workload(name: str, work: Path) -> Path:
    """The replay a workload is fed from, generated once under ``work/workloads``."""
    from mjoin.workloads.manifest import load_manifest

    out = work / "workloads" / name
    with contextlib.suppress(Exception):
        load_manifest(out)
        return out
    if name == "tpcds_seed":
        from mjoin.workloads.tpcds_replay import generate_tpcds

        generate_tpcds(out, sf=0.1, overwrite=True)
        return out
    raise SystemExit(f"workload {name!r} is not wired yet (have: {', '.join(WORKLOADS)})")


# ---- one run -----------------------------------------------------------------------------------------------------

def run_once(*, workload: str, system: str, rate: float, duration: int, work: Path, out: Path, trigger: float = 10.0,
             catch_up: float = 60.0, period_minutes: int = 1, buckets: int = 16, fingerprint: bool = True,
             startup: float = 300.0, warmup: float = 30.0, replay=None, pace: str = "replay") -> dict:
    if system not in SYSTEMS:
        raise SystemExit(f"system {system!r}: one of {', '.join(SYSTEMS)}")
    flink = system == "flink_multijoin"
    if flink and not flink_live.available():
        raise SystemExit(f"flink_multijoin needs the Flink venv ({flink_live.FLINK_PY}): make flink-venv")
    query = WORKLOADS[workload]
    # the code the run ran: the commit and the files changed beside it (the working tree is shared)
    worktree = subprocess.run(["git", "-C", str(PROJECT), "status", "--porcelain", "--", "include", "jobs", "bench/live"],
                              capture_output=True, text=True).stdout.split("\n")
    worktree = [x.strip() for x in worktree if x.strip()]
    replay = Path(replay) if replay else ensure_workload(workload, work)
    from mjoin.workloads.manifest import load_manifest

    sources = load_manifest(replay).sources
    run_dir = work / f"{workload}-{system}-{int(rate)}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    lake = Lake(str(run_dir / "lake"))
    mirror = None
    record_path = run_dir / "feed-record.jsonl"
    doc: dict = {"benchmark": "live_harness", "workload": workload, "query": query, "system": system,
                 "rate": rate, "duration_s": duration, "trigger_s": trigger, "cycle_s": CYCLE,
                 "period_minutes": period_minutes if system == "mjoin-loop" else None,
                 "date": datetime.now(timezone.utc).isoformat(), "load_average_before": list(os.getloadavg())}
    job = interval = committed = None
    airflow_ctx, loop_procs = None, []
    feed_stop = threading.Event()
    feeder = None
    sampler_stop = threading.Event()
    lag: list = []
    landed_lines: list = []  # the feeder's record as it lands (the sampler reads it without re-reading the file)
    try:
        cmd = [sys.executable, "-m", "mjoin", "run", "--stream", "--query", query, "--lake", lake.root,
               "--trigger", "processingTime", "--interval", str(trigger), "--buckets", str(buckets)]
        if system == "spark-native":
            cmd += ["--engine", "spark-native"]
        if system == "mjoin-loop":
            cmd += ["--stats-cycle", str(CYCLE)]
        loop_cpu, loop_tree = None, None
        if system == "mjoin-loop":
            from mjoin.loop.airflow_env import airflow_cmd, airflow_env, ensure_db

            env = airflow_env(run_dir / "airflow", lake=lake.root)
            env.update({"MJOIN_PERIOD_MINUTES": str(period_minutes), "MJOIN_QUERY": query,
                        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                        "PYTHONPATH": os.pathsep.join([str(PROJECT / "include"), env.get("PYTHONPATH", "")])})
            env.pop("MJOIN_SPARK_REMOTE", None)
            ensure_db(env)
            airflow_cmd(["dags", "reserialize"], env, capture=True)
            airflow_ctx = services(env, run_dir)
            _, _, loop_procs = airflow_ctx.__enter__()
            loop_cpu = RunCpu([psutil.Process(p.pid) for p in loop_procs])
            loop_tree = TreeCpu([p.pid for p in loop_procs])
        for s in sources:  # the job lists them from its first trigger on
            os.makedirs(lake.streams(s), exist_ok=True)
        if flink:
            from mjoin.model.query import load_query

            qspec = load_query(query)
            mirror = flink_live.CsvMirror(qspec, run_dir / "flink")
            port = flink_live.free_port()
            fjob = flink_live.job_description(qspec, mirror, sink=run_dir / "flink" / "results",
                                              checkpoint_dir=run_dir / "flink" / "checkpoints",
                                              checkpoint_seconds=trigger, rest_port=port)
            (run_dir / "flink-job.json").write_text(json.dumps(fjob, indent=1))
            cmd = [str(flink_live.FLINK_PY), str(flink_live.JOB_SCRIPT), str(run_dir / "flink-job.json")]
        job = start(cmd, run_dir / "job.log")
        job_tree = TreeCpu([job.pid])
        if flink:
            committed = flink_live.FlinkProgress(port, run_dir / "job.log", mirror, {})
        else:
            committed = Committed(lake, query, "spark-native" if system == "spark-native" else "mjoin")
        t_ready = time.time()
        while not (committed.ready() if flink else (committed.checkpoint / "metadata").exists()):  # started
            if job.poll() is not None:
                raise RuntimeError(f"the job exited ({job.returncode}): " + (run_dir / "job.log").read_text()[-3000:])
            if time.time() - t_ready > startup:
                raise RuntimeError(f"the job did not start its query within {startup:g} s")
            time.sleep(0.5)
        doc["job_startup_s"] = round(time.time() - t_ready, 1)
        # stage the feed for a start after the staging's estimated time (event times are written into the files)
        # (flink: and the CSV copies of the staged folders, ~0.7 M rows/s measured, half assumed)
        t0 = math.ceil((time.time() + 15 + rate * duration / (1.5e5 if flink else 3e5)) / CYCLE) * CYCLE
        plan = prepare_feed(replay, lake, rate=rate, duration=duration, start=t0, cycle=CYCLE, pace=pace)
        if flink:
            doc["flink_csv_staging_seconds"] = round(mirror.stage(plan), 2)
            for f in plan.folders:
                committed.folders_per_arrival[f.arrival] = committed.folders_per_arrival.get(f.arrival, 0) + 1
            committed.start_polling()
        doc["feed_plan"] = {"rows": plan.rows, "folders": len(plan.folders), "pace": pace, "lanes_or_passes": plan.passes,
                            "key_span": plan.key_span, "prepare_seconds": round(plan.prepare_seconds, 2),
                            "start": plan.start}
        if time.time() > t0:
            doc["late_start_s"] = time.time() - t0  # staging or start-up overran: the first folders land at once

        def feed():
            try:
                run_feed(plan, record_path, stop=feed_stop.is_set,
                         on_folder=(lambda line: landed_lines.append(mirror.land(line))) if flink
                         else landed_lines.append)
            except Exception as exc:  # recorded
                doc["feed_error"] = repr(exc)

        feeder = threading.Thread(target=feed, name="feeder", daemon=True)
        feeder.start()
        cpu0 = None

        def sample():
            nonlocal cpu0
            tick = math.floor(time.time()) + 1.0
            while not sampler_stop.wait(max(tick - time.time(), 0.0)):
                tick = max(tick + 1.0, math.floor(time.time()))
                now = time.time()
                rec = landed_lines
                committed.update()
                landed = max((x["arrival"] for x in rec), default=None)
                done = committed.newest_arrival()
                cpu = job_tree.sample()
                lcpu = loop_tree.sample() if loop_tree else None
                if cpu0 is None and rec:
                    cpu0 = cpu
                lag.append({"t": round(now, 3), "landed_arrival": landed, "committed_arrival": done,
                            "lag": None if landed is None else (landed - (done if done is not None else plan.start - CYCLE)),
                            "feeding": feeder.is_alive(), "job_cpu": round(cpu, 3),
                            "loop_cpu": None if lcpu is None else round(lcpu, 3),
                            "load1": os.getloadavg()[0]})

        sampler = threading.Thread(target=sample, name="sampler", daemon=True)
        sampler.start()
        while feeder.is_alive():
            if job.poll() is not None:
                raise RuntimeError(f"the job exited ({job.returncode}): " + (run_dir / "job.log").read_text()[-3000:])
            feeder.join(1.0)
        feed_end = time.time()
        last = max((x["arrival"] for x in read_record(record_path)), default=None)
        caught_up_after = None
        while time.time() - feed_end < catch_up and job.poll() is None:
            committed.update()
            if last is not None and committed.newest_arrival() == last:
                caught_up_after = time.time() - feed_end
                break
            time.sleep(0.5)
        time.sleep(1.5)
        sampler_stop.set()
        sampler.join(10)
        job_cpu = job_tree.sample()
        doc["load_average_after"] = list(os.getloadavg())
        if loop_cpu is not None:
            doc["loop_cpu"] = {**loop_cpu.finish(time.time()), "sampled_tree_cpu_seconds": round(loop_tree.sample(), 3),
                               "by_command": loop_tree.by_command()}
        # stop the job: mjoin through its control file first (a clean stop), then its process group
        if system in ("mjoin-fixed", "mjoin-loop") and job.poll() is None:
            with contextlib.suppress(Exception):
                from mjoin.engine.control import JobControl

                ctl = JobControl(lake, query)
                ctl.request_stop(by="live-harness", reason="run over")
                ctl.wait_stopped(60)
        if flink:
            committed.stop_polling()
        stop_group(job)
        if airflow_ctx is not None:
            stop_services(airflow_ctx, loop_procs)
            airflow_ctx = None
        record = read_record(record_path)
        batches = committed.update()
        if flink:  # the latency from the CSV copies' landing (a few ms after the Parquet folder's)
            doc["flink"] = {**committed.summary(), "mirror_errors": mirror.errors[:5],
                            "versions": committed.started.get("versions")}
            feed_record, record = record, list(mirror.record)
        lat = latencies(batches, record)
        for x in lat:  # batches whose newest input landed in the first `warmup` seconds of the feed: not in the verdict
            x["warmup"] = x["landed"] < plan.start + CYCLE + warmup
        v = verdict(lag, [x for x in lat if not x["warmup"]], trigger=trigger, cycle=CYCLE,
                    caught_up_after=caught_up_after)
        v["warmup_s"] = warmup
        if flink:  # beside the committed latency: when the join had read all of the arrival's rows (a lower bound)
            for x in lat:
                x["processed_latency"] = batches[x["batch_id"]]["processed"] - x["landed"]
            kept = [x["processed_latency"] for x in lat if not x["warmup"]]
            v["processed_latency_p50_s"], v["processed_latency_p99_s"] = percentile(kept, 50), percentile(kept, 99)
        doc.update(feed=achieved(feed_record if flink else record, CYCLE), verdict=v, sustained=v["sustained"],
                   job_cpu_seconds=round(job_cpu, 3), job_cpu_by_command=job_tree.by_command(),
                   job_cpu_seconds_while_feeding=round(job_cpu - (cpu0 or 0.0), 3),
                   batches=len(batches), batches_with_input=len(lat), latency=lat, lag=lag,
                   batch_records={str(b): v for b, v in sorted(batches.items())},
                   plan_versions=sorted({b.get("plan_version") for b in batches.values()
                                         if b.get("plan_version") is not None}))
        if system == "mjoin-loop":
            runs = Path(lake.reports(query)) / "runs"
            doc["loop_runs"] = [json.loads((r / "outcome.json").read_text()).get("status")
                                for r in sorted(runs.glob("*")) if (r / "outcome.json").exists()] if runs.is_dir() else []
        if fingerprint and caught_up_after is not None and record:
            from mjoin.engine.results import result_fingerprint

            first = min(x["arrival"] for x in record)
            out_dir = run_dir / "interval"
            interval = start([sys.executable, "-m", "mjoin", "run", "--query", query, "--lake", lake.root,
                              "--from", str(first), "--to", str(last + CYCLE), "--cycle", str(CYCLE),
                              "--out", str(out_dir), "--buckets", str(buckets)], run_dir / "interval.log")
            rc = interval.wait(1800)
            interval = None
            if rc == 0:
                ref = result_fingerprint(str(out_dir), query)
                got = (flink_live.fingerprint(qspec, run_dir / "flink" / "results", run_dir / "flink-fp") if flink
                       else result_fingerprint(lake.root, query))
                doc.update(fingerprint=got, interval_fingerprint=ref, identical_results=ref == got)
            else:
                doc["fingerprint_error"] = (run_dir / "interval.log").read_text()[-2000:]
        elif fingerprint:
            doc["identical_results"] = None
            doc["fingerprint_skipped"] = "the job did not catch up with the feed: its results are a prefix"
    finally:
        feed_stop.set()
        sampler_stop.set()
        if flink and committed is not None:
            committed.stop_polling()
        stop_group(job)
        stop_group(interval)
        if airflow_ctx is not None:
            stop_services(airflow_ctx, loop_procs)
        if feeder is not None:
            feeder.join(5)
    doc.update(machine=machine(), versions=versions(), commit=git_commit(PROJECT), worktree_changes=worktree)
    if flink and (doc.get("flink") or {}).get("versions"):
        doc["versions"].update({"apache-flink": doc["flink"]["versions"].get("apache-flink"),
                                "flink_venv_python": doc["flink"]["versions"].get("python")})
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"{workload}-{system}-{int(rate)}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    shutil.rmtree(lake.root, ignore_errors=True)  # the landed feed can be gigabytes
    shutil.rmtree(run_dir / "flink", ignore_errors=True)  # and Flink's CSV copies, checkpoints and results
    v = doc["verdict"]
    print(f"{system} {rate:,.0f}/s {duration}s: sustained={v['sustained']} p50={v['latency_p50_s']} "
          f"p99={v['latency_p99_s']} lag growth={v['lag_growth_second_half_s']} caught up after "
          f"{v['caught_up_after_s']} job cpu {doc['job_cpu_seconds']} s identical={doc.get('identical_results')} "
          f"load {doc['load_average_before'][0]:.1f}->{doc['load_average_after'][0]:.1f} -> {path}", flush=True)
    return doc


def search(args) -> list[dict]:
    """Double the rate while sustained, then bisect between the last sustained and the first unsustained rate."""
    docs = []
    good, bad, rate = None, None, float(args.rate)
    while bad is None and rate <= args.max_rate:
        d = run_once(**_run_kwargs(args, rate))
        docs.append(d)
        if d["sustained"]:
            good, rate = rate, rate * 2
        else:
            bad = rate
    for _ in range(args.bisect if good is not None and bad is not None else 0):
        rate = round((good + bad) / 2, -2)
        if rate in (good, bad):
            break
        d = run_once(**_run_kwargs(args, rate))
        docs.append(d)
        good, bad = (rate, bad) if d["sustained"] else (good, rate)
    print(json.dumps({"system": args.system, "workload": args.workload, "sustained": good, "not_sustained": bad}))
    return docs


def _run_kwargs(args, rate: float) -> dict:
    return dict(workload=args.workload, system=args.system, rate=rate, duration=args.duration, work=Path(args.work),
                out=Path(args.out) / "runs", trigger=args.trigger, catch_up=args.catch_up,
                period_minutes=args.period_minutes, buckets=args.buckets, fingerprint=not args.no_fingerprint,
                warmup=args.warmup, replay=args.replay, pace=args.pace)


# ---- live.json and the plot ----------------------------------------------------------------------------------------

SYSTEM_KEYS = {"mjoin-loop": "mjoin", "mjoin-fixed": "mjoin_fixed_plan", "spark-native": "spark_native",
               "flink_multijoin": "flink_multijoin"}


def summarize(runs_dir: Path, out: Path) -> dict:
    """``live.json`` from every run file: per workload and system the highest sustained rate (0 when the lowest rate
    tried was not sustained), the latency at that rate, the runs behind each figure (rate, length, load), and the
    list of what was not measured."""
    docs = []
    for f in sorted(runs_dir.glob("*.json")):
        d = json.loads(f.read_text())
        d["_file"] = f.name
        docs.append(d)
    sustainable, p50, p99, evidence, brackets, failed_below, rounds_by = {}, {}, {}, {}, {}, {}, {}
    for d in docs:
        w, k = d["workload"], SYSTEM_KEYS[d["system"]]
        evidence.setdefault(w, {}).setdefault(k, []).append(
            {"rate": d["rate"], "sustained": d["sustained"], "duration_s": d["duration_s"],
             "latency_p50_s": d["verdict"]["latency_p50_s"], "latency_p99_s": d["verdict"]["latency_p99_s"],
             "lag_growth_second_half_s": d["verdict"]["lag_growth_second_half_s"],
             "caught_up_after_s": d["verdict"]["caught_up_after_s"],
             **({"processed_latency_p50_s": d["verdict"].get("processed_latency_p50_s"),
                 "processed_latency_p99_s": d["verdict"].get("processed_latency_p99_s")}
                if d["system"] == "flink_multijoin" else {}),
             "job_cpu_seconds_while_feeding": d.get("job_cpu_seconds_while_feeding"),
             "identical_results": d.get("identical_results"),
             "load_average": [round(d["load_average_before"][0], 1), round(d["load_average_after"][0], 1)],
             "file": f"runs/{d['_file']}"})
    for w, systems in evidence.items():
        for k, rs in systems.items():
            rs.sort(key=lambda r: r["rate"])
            # a rate counts as sustained when most rounds at it were (the goal's protocol: the median of 3 rounds;
            # a tie is not sustained): rounds at one rate disagree when the load moves under them
            rounds: dict = {}
            for r in rs:
                rounds.setdefault(r["rate"], []).append(bool(r["sustained"]))
            failed_at = {x for x, v in rounds.items() if 2 * sum(v) <= len(v)}
            ok = [r for r in rs if r["rate"] not in failed_at and r["sustained"]]
            if any(len(v) > 1 for v in rounds.values()):
                rounds_by.setdefault(w, {})[k] = {str(int(x)): f"{sum(v)} of {len(v)} sustained"
                                                  for x, v in sorted(rounds.items()) if len(v) > 1}
            best = max(ok, key=lambda r: (r["rate"], r["duration_s"])) if ok else None  # the longest run at the rate
            sustainable.setdefault(w, {})[k] = best["rate"] if best else 0
            above = [x for x in failed_at if best is None or x > best["rate"]]
            brackets.setdefault(w, {})[k] = [best["rate"] if best else 0, min(above) if above else None]
            below = sorted(x for x in failed_at if best is not None and x < best["rate"])
            if below:  # not monotone in the rate: the load moved under the runs
                failed_below.setdefault(w, {})[k] = below
            p50.setdefault(w, {})[k] = round(best["latency_p50_s"], 2) if best else None
            p99.setdefault(w, {})[k] = round(best["latency_p99_s"], 2) if best else None
    total_cpu, cpu_detail = {}, {}
    for d in docs:  # the loop's net gain, as far as measured: loop on and the fixed plan at one rate and length
        if d["system"] not in ("mjoin-loop", "mjoin-fixed"):
            continue
        job, loop, span = feed_window_cpu(d)
        key = "loop_on" if d["system"] == "mjoin-loop" else "fixed"
        pair = cpu_detail.setdefault(d["workload"], {}).setdefault(f"{int(d['rate'])}/s x {d['duration_s']} s", {})
        pair[key] = {"job_cpu_seconds": round(job, 2), "loop_cpu_seconds": None if loop is None else round(loop, 2),
                     "feed_window_s": round(span, 1), "load_average": [round(d["load_average_before"][0], 1),
                                                                      round(d["load_average_after"][0], 1)],
                     "loop_runs": d.get("loop_runs"), "file": f"runs/{d['_file']}"}
    for w, pairs in cpu_detail.items():
        for label, pair in pairs.items():
            if "loop_on" in pair and "fixed" in pair:
                total_cpu[w] = {"loop_on": round(pair["loop_on"]["job_cpu_seconds"] + pair["loop_on"]["loop_cpu_seconds"], 2),
                                "fixed": pair["fixed"]["job_cpu_seconds"], "fixed_worst": None, "oracle": None,
                                "runs": label}
    checked = [d.get("identical_results") for d in docs if d.get("identical_results") is not None]
    by_system: dict = {}
    for d in docs:
        if d.get("identical_results") is not None:
            by_system.setdefault(SYSTEM_KEYS[d["system"]], {})[str(int(d["rate"]))] = (
                True if d["identical_results"] else
                f"false: {d['fingerprint']['rows']} result rows vs the interval run's {d['interval_fingerprint']['rows']}")
    loads = [x for d in docs for x in (d["load_average_before"][0], d["load_average_after"][0])]
    doc = {
        "sustainable_tuples_per_s": sustainable, "latency_p50_s": p50, "latency_p99_s": p99,
        "sustainable_bracket": {"what": "[highest rate sustained, lowest rate above it not sustained (null: none "
                                        "tried, so the figure is a lower bound)]", **brackets},
        "not_sustained_below_the_sustained_rate": failed_below,
        "rounds_at_one_rate": {"what": "rates run more than once: rounds sustained (a rate counts when most were)",
                               **rounds_by},
        "total_cpu_seconds": total_cpu,
        "total_cpu_detail": {"what": "CPU seconds over the feed's window (first to last sample while folders "
                                     "landed), from /proc every second: the join job's process tree and the "
                                     "Airflow services' tree (their own CPU and their children's, a child seen "
                                     "alive at a sample; loop_cost's RunCpu over the whole run is in each run file)",
                             **cpu_detail},
        "identical_results": all(checked) if checked else None,
        "identical_results_checked": f"{sum(1 for c in checked if c)} of {len(checked)} runs that caught up "
                                     f"(the others are a prefix of the feed)",
        "identical_results_by_system_and_rate": by_system,
        "runs": evidence,
        "method": {"run_length_s": sorted({d["duration_s"] for d in docs}), "rounds": 1,
                   "trigger_s": sorted({d["trigger_s"] for d in docs}), "arrival_cycle_s": CYCLE,
                   "sustained": "lag trend over the feed's second half adds < one arrival cycle, caught up within two "
                                "triggers of the feed's end, p99 latency < 2 x trigger (batches of the first cycle "
                                "+ warm-up excluded)",
                   "search": "doubling from the first rate, then bisection; a bracket is [highest sustained, lowest "
                             "not sustained] in runs",
                   "flink_multijoin": "Flink 2.3 (its own venv), table.optimizer.multi-join.enabled (one MultiJoin "
                                      "operator), parallelism 2, local mini-cluster, heap state; CSV copies of the "
                                      "landed folders renamed into continuously monitored sources (1 s) on the "
                                      "feeder's schedule; a batch is a completed checkpoint (every trigger interval) "
                                      "that committed a newer arrival (the file sink commits per checkpoint); "
                                      "processed_latency: when the MultiJoin had read the arrival's rows (REST API "
                                      "record counts), a lower bound"},
        "machine": docs[-1]["machine"] if docs else machine(),
        "versions": {**(docs[-1]["versions"] if docs else versions()),
                     **{k: v for d in docs for k, v in d["versions"].items() if k in ("apache-flink", "flink_venv_python")}},
        "commit": sorted({d["commit"] for d in docs}),
        "dates": [min(d["date"] for d in docs), max(d["date"] for d in docs)] if docs else None,
        "load": {"min": round(min(loads), 1), "max": round(max(loads), 1)} if loads else None,
    }
    doc["not_measured"] = [f"{w}/{k}" for w in ("tpcds_seed", "selective", "hot-rotate", "hot-ramp", "hot-burst")
                           for k in ("mjoin", "flink_multijoin", "spark_native") if k not in sustainable.get(w, {})]
    doc["not_measured"] += ["total_cpu_seconds fixed_worst and oracle; loop on vs fixed in 30-minute runs (the goal's "
                            "protocol), on the selective workload and the hot drift presets"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "live.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(docs, out / "live.png")
    return doc


def feed_window_cpu(d: dict) -> tuple:
    """(job CPU, loop CPU or None, seconds) between the first and the last per-second sample taken while folders
    landed."""
    f = [x for x in d["lag"] if x.get("landed_arrival") is not None and x.get("feeding")]
    if len(f) < 2:
        return 0.0, None, 0.0
    loop = None if f[0].get("loop_cpu") is None else f[-1]["loop_cpu"] - f[0]["loop_cpu"]
    return f[-1]["job_cpu"] - f[0]["job_cpu"], loop, f[-1]["t"] - f[0]["t"]


def plot(docs: list, path: Path) -> None:
    """Lag per second and latency per batch over the run, for each system's highest sustained run and its lowest
    unsustained one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pick = []
    for sysname in SYSTEM_KEYS:
        rs = [d for d in docs if d["system"] == sysname]
        ok = [d for d in rs if d["sustained"]]
        bad = [d for d in rs if not d["sustained"]]
        best = max(ok, key=lambda d: d["rate"]) if ok else None
        if best:
            pick.append(best)
        above = [d for d in bad if best is None or d["rate"] > best["rate"]]
        if above or bad:
            pick.append(min(above or bad, key=lambda d: (d["rate"], d["date"])))
        if sysname == "mjoin-fixed":  # the fixed plan beside the loop on at the loop's rate (loop on vs off)
            loop_rates = {d["rate"] for d in docs if d["system"] == "mjoin-loop"}
            pick += [d for d in rs if d["rate"] in loop_rates and d not in pick]
    if not pick:
        return
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for d in pick:
        t0 = d["feed_plan"]["start"]
        label = (f"{d['system']} {d['rate']:,.0f}/s, {d['duration_s']} s ({'sustained' if d['sustained'] else 'not sustained'}"
                 f", load {d['load_average_before'][0]:.1f})")
        xs = [(x["t"] - t0, x["lag"]) for x in d["lag"] if x.get("lag") is not None]
        line, = a1.plot([x for x, _ in xs], [y for _, y in xs], label=label)
        a2.plot([x["committed"] - t0 for x in d["latency"]], [x["latency"] for x in d["latency"]], "o-",
                color=line.get_color(), label=label, markersize=3)
    trig = pick[0]["trigger_s"]
    a2.axhline(2 * trig, color="grey", linestyle="--", linewidth=1, label=f"2 x trigger ({2 * trig:g} s)")
    a1.set_ylabel("lag (s): newest landed arrival -\nnewest committed input")
    a2.set_ylabel("end-to-end latency (s) per batch")
    a2.set_xlabel("seconds since the feed's first cycle")
    a1.legend(fontsize=7)
    a2.legend(fontsize=7)
    loads = [x for d in pick for x in (d["load_average_before"][0], d["load_average_after"][0])]
    lengths = sorted({d["duration_s"] for d in pick})
    fig.suptitle(f"{pick[0]['workload']}: live feed, {'/'.join(map(str, lengths))}-s runs, one round each, "
                 f"1-min load {min(loads):.1f}-{max(loads):.1f} on 2 cores")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("run", "search", "summarize"))
    p.add_argument("--workload", default="tpcds_seed", choices=sorted(WORKLOADS))
    p.add_argument("--system", default="mjoin-fixed", choices=SYSTEMS)
    p.add_argument("--rate", type=float, default=10_000, help="tuples/s (search: the first rate tried)")
    p.add_argument("--max-rate", type=float, default=640_000)
    p.add_argument("--bisect", type=int, default=2, help="bisection steps after doubling (search)")
    p.add_argument("--duration", type=int, default=600, help="feed length, seconds (the goal: at least 600)")
    p.add_argument("--trigger", type=float, default=10.0)
    p.add_argument("--catch-up", type=float, default=60.0, help="seconds the job may catch up after the feed ends")
    p.add_argument("--warmup", type=float, default=30.0,
                   help="batches whose newest input landed in the feed's first cycle plus this many seconds are "
                        "kept in the file but not in the verdict (the JVM's warm-up)")
    p.add_argument("--pace", choices=("replay", "compressed"), default="replay",
                   help="the feeder's pace (mjoin.workloads.feeder): replay (default) keeps every key's pace")
    p.add_argument("--replay", help="a generated workload to feed from (default: generated under --work)")
    p.add_argument("--period-minutes", type=int, default=1, help="mjoin-loop: the re-optimization period")
    p.add_argument("--buckets", type=int, default=16)
    p.add_argument("--no-fingerprint", action="store_true")
    p.add_argument("--work", default="/tmp/mjoin-live")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        if args.action == "summarize":
            doc = summarize(Path(args.out) / "runs", Path(args.out))
            print(json.dumps({k: doc[k] for k in ("sustainable_tuples_per_s", "latency_p99_s", "identical_results")}))
        elif args.action == "run":
            run_once(**_run_kwargs(args, args.rate))
        else:
            search(args)
    except Interrupted as exc:
        print(f"interrupted ({exc}): everything started was stopped", file=sys.stderr, flush=True)
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
