"""Benchmark: the loop's cost per re-optimization in continuous mode against the feed rate, with the statistics
the join job computes itself and, side by side in the same run, with the previous statistics step (the statistics
job reading the streams).

    flock /tmp/mjoin-bench.lock .venv/bin/python bench/live/loop_cost.py          # ~25, 500, 4,600 tuples/s (185x)
    .venv/bin/python bench/live/loop_cost.py --quick    # ~5, 50, 500 tuples/s, one round (~45 min)

Per rate (a fresh lake each): a real-time TPC-DS replay (mjoin.workloads.live: the seed query's four tables at
``rows(sf) / chunk`` tuples/s, a window and a period of backlog first). The rate grows with the scale factor, the
chunk stays 20 minutes: more customers and addresses, each as busy as before, so a window's matches per tuple stay
what they are at the lowest rate (compressing one scale factor into a shorter chunk instead multiplies the matches
per tuple: sf 1 over 2 minutes put 275 M results into the first micro-batch and ran out of memory); the streaming join job
(``python -m mjoin run --stream --trigger processingTime --interval 10 --stats-cycle 10``, as mjoin_join_job starts
it), and the real Airflow services (api-server, scheduler, dag-processor; LocalExecutor, spark-submit for the Spark
steps, as the embedded profile runs them). Once the job has caught up, ``--rounds`` pairs of mjoin_reoptimize runs in
continuous mode are triggered through the REST API, one with ``job_statistics=true`` (the statistics step reads and
validates what the job emitted) and one with ``job_statistics=false`` (the statistics job over the period and its
window lead-in, the step as it was), in alternating order, each over the latest complete period.

Measured per run, from /proc (psutil), **the CPU seconds of every process Airflow starts for the run** (the task
processes and what they start: spark-submit, its JVM and Python workers): the children times the long-lived Airflow
processes reaped during the run plus the whole CPU of processes created during it and still alive at its end (the
scheduler's, api-server's and dag-processor's own loops are not counted: they run whatever runs), and the run's wall
time (start to end, from the API); the statistics step's processes alone (those of ``jobs/stats.py``, sampled every
0.5 s). From the join job's own metrics over the measured span: its task CPU per period (the operator's work,
without the statistics) and the in-job statistics' task CPU (and its driver CPU, reported beside).

Writes ``bench/live/results/loop-cost[-quick].json`` in the shape the goal names (rates with the four measures, and
the same four for the previous step; machine, commit) and ``loop-cost[-quick]-runs.json`` (every run, the
parameters, the load before and after each rate).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
sys.path.insert(0, str(PROJECT / "include"))

from mjoin.engine.control import JobControl  # noqa: E402
from mjoin.engine.metrics import git_commit, machine, read_metrics  # noqa: E402
from mjoin.lake.layout import Lake  # noqa: E402
from mjoin.loop.airflow_env import admin_password, airflow_cmd, airflow_env, ensure_db  # noqa: E402
from mjoin.model.timeutil import iso, parse_time  # noqa: E402
from mjoin.runtime import fsutil  # noqa: E402
from mjoin.workloads.live import run_live  # noqa: E402

QUERY = "tpcds_returns_by_address"
CYCLE = 10
PERIOD_MINUTES = 1
#: (scale factor, chunk seconds) per point: the replay of sf's rows over the chunk, chunk after chunk; the same chunk
#: at every point, so that the rate grows with the keys and a key's tuples per window stay the same
FULL = [(0.05, 1200), (1.0, 1200), (10.0, 1200)]
QUICK = [(0.01, 1200), (0.1, 1200), (1.0, 1200)]


# ---- Airflow services and its REST API ----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def services(env: dict, log_dir: Path):
    """api-server, scheduler and dag-processor on a free port (the execution API is what tasks talk to)."""
    port = free_port()
    env = dict(env, AIRFLOW__API__PORT=str(port),
               AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://localhost:{port}/execution/")
    exe = str(Path(sys.executable).parent / "airflow")
    procs = []
    try:
        for comp in ("api-server", "scheduler", "dag-processor"):
            args = [exe, comp] + (["--port", str(port)] if comp == "api-server" else [])
            procs.append(subprocess.Popen(args, env=env, stdout=open(log_dir / f"{comp}.log", "w"),
                                          stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/api/v2/monitor/health", timeout=5):
                    break
            except Exception:  # not up yet
                time.sleep(1)
        yield env, port, procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)


def api(port: int, path: str, env: dict, method: str = "GET", body: dict | None = None) -> dict:
    req = urllib.request.Request(f"http://localhost:{port}/auth/token", method="POST",
                                 data=json.dumps({"username": "admin", "password": admin_password(env)}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        token = json.loads(r.read())["access_token"]
    req = urllib.request.Request(f"http://localhost:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"{}")


# ---- CPU of the processes Airflow starts ----------------------------------------------------------------------

def _tree(roots) -> dict:
    """pid -> (create time, own CPU, reaped children's CPU, cmdline) of every process under ``roots``."""
    out = {}
    for root in roots:
        try:
            procs = [psutil.Process(root.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    out[p.pid] = (p.create_time(), t.user + t.system, t.children_user + t.children_system,
                                  " ".join(p.cmdline()))
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
    return out


class RunCpu:
    """CPU of the processes started during a window under the Airflow services (sampled every 0.5 s for the
    statistics step's processes, which come and go within it)."""

    def __init__(self, roots):
        self.roots = roots
        self.before = _tree(roots)
        self.t0 = time.time()
        self.stats_cpu: dict = {}  # pid -> last seen own + children CPU of a jobs/stats.py process
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self):
        while not self.halt.wait(0.5):
            for pid, (_, own, kids, cmd) in _tree(self.roots).items():
                if "jobs/stats.py" in cmd or " stats " in cmd and "mjoin" in cmd:
                    self.stats_cpu[pid] = own + kids

    def finish(self, end_time: float) -> dict:
        self.halt.set()
        self.thread.join()
        after = _tree(self.roots)
        total = 0.0
        for pid, (created, own, kids, _) in after.items():
            old = self.before.get(pid)
            if old is not None and abs(old[0] - created) < 1e-3:  # long-lived: what it reaped during the window
                total += kids - old[2]
            elif created <= end_time:  # started during the window and still alive
                total += own + kids
        # nested jobs/stats.py processes (launcher, JVM, Python driver): the outermost holds the reaped inner ones
        stats = sorted(self.stats_cpu.items())
        return {"cpu_seconds": round(total, 3),
                "statistics_step_cpu_seconds": round(max([v for _, v in stats], default=0.0), 3)}


# ---- one rate --------------------------------------------------------------------------------------------------

class Feed(threading.Thread):
    def __init__(self, lake: Lake, work: Path, sf: float, chunk: int, backlog: int):
        super().__init__(name="feed", daemon=True)
        self.lake, self.work, self.sf, self.chunk, self.backlog = lake, work, sf, chunk, backlog
        self.halt = threading.Event()
        self.error = None
        self.cycles = 0

    class Stop(Exception):
        pass

    def _sleep(self, s):
        if self.halt.wait(s):
            raise Feed.Stop()

    def run(self):
        try:
            run_live(self.lake, sf=self.sf, cycle=CYCLE, chunk=f"{self.chunk}s", backlog=f"{self.backlog}s",
                     workdir=self.work, sleep=self._sleep, on_cycle=lambda e, c: setattr(self, "cycles", self.cycles + 1))
        except Feed.Stop:
            pass
        except Exception as exc:  # reported
            self.error = repr(exc)

    def stop(self):
        self.halt.set()
        self.join(120)


def _rows(sf: float) -> int:
    from mjoin.workloads import tpcds_cache

    import pyarrow.parquet as pq

    cache = tpcds_cache.ensure_tables(sf, None)
    return sum(pq.read_metadata(os.path.join(cache, f"{t}.parquet")).num_rows for t in tpcds_cache.STREAM_TABLES)


def _metrics(lake: Lake) -> list:
    try:
        return read_metrics(lake, QUERY)
    except FileNotFoundError:  # no batch yet
        return []


def _caught_up(lake: Lake, lag: float) -> bool:
    recs = _metrics(lake)
    if not recs:
        return False
    last = recs[-1]
    js = last.get("job_stats") or {}
    return js.get("next") is not None and js["next"] >= time.time() - lag


def _trigger(port, env, lake: Lake, ld, conf) -> dict:
    runs = "/api/v2/dags/mjoin_reoptimize/dagRuns"
    run = api(port, runs, env, "POST", {"logical_date": iso(ld), "conf": conf})
    while True:
        doc = api(port, f"{runs}/{run['dag_run_id']}", env)
        if doc["state"] in ("success", "failed"):
            return doc
        time.sleep(1)


def _wait_idle(port, env):
    """No run of mjoin_reoptimize running or queued (the scheduled no-op runs finish in seconds)."""
    for _ in range(300):
        runs = api(port, "/api/v2/dags/mjoin_reoptimize/dagRuns?state=running&state=queued", env)
        if not runs.get("total_entries"):
            return
        time.sleep(1)


def measure_rate(args, env, port, procs, sf: float, chunk: int, work: Path, out: dict) -> dict:
    """One rate's runs, into ``out`` as they are measured (a point that fails keeps what it measured)."""
    lake = Lake(str(work / "lake"))
    rate = _rows(sf) / chunk
    print(f"== {rate:.0f} tuples/s (sf {sf:g}, {chunk} s chunks)", flush=True)
    load_before = list(os.getloadavg())
    backlog = 300 + 60 * PERIOD_MINUTES + 60
    feed = Feed(lake, work / "feed", sf, chunk, backlog)
    feed.start()
    while feed.cycles < backlog // CYCLE and feed.is_alive():
        time.sleep(2)
    log = open(work / "join_job.log", "w")
    job = subprocess.Popen([sys.executable, "-m", "mjoin", "run", "--stream", "--query", QUERY, "--lake", lake.root,
                            "--trigger", "processingTime", "--interval", str(CYCLE), "--stats-cycle", str(CYCLE),
                            "--buckets", str(args.buckets)],
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(PROJECT / "include")})
    control = JobControl(lake, QUERY)
    out.update(tuples_per_s=round(rate, 1), sf=sf, chunk_seconds=chunk, runs=[], load_average_before=load_before)
    try:
        deadline = time.monotonic() + args.catch_up_timeout
        while not _caught_up(lake, 3 * CYCLE + 15) and time.monotonic() < deadline:
            assert job.poll() is None, (work / "join_job.log").read_text()[-3000:]
            time.sleep(5)
        out["caught_up"] = _caught_up(lake, 3 * CYCLE + 15)
        t_span = time.time()
        conf = {"query": QUERY, "lake": lake.root, "cycle": CYCLE, "mode": "continuous", "strategy": "exact",
                "dry_run": args.dry_run, "calibrate": False, "gates": {"min_history": 5}, "deploy_timeout": 120}
        for k in range(args.rounds):
            for mode in (("job", "previous") if k % 2 == 0 else ("previous", "job")):
                _wait_idle(port, env)
                now = time.time()
                ld = parse_time(math.floor(now / CYCLE) * CYCLE - CYCLE)  # the latest complete period
                cpu = RunCpu(procs)
                doc = _trigger(port, env, lake, ld, {**conf, "job_statistics": mode == "job"})
                end = parse_time(doc["end_date"]).timestamp() if doc.get("end_date") else time.time()
                time.sleep(1.5)  # let the last task processes be reaped
                used = cpu.finish(end)
                start = parse_time(doc["start_date"]).timestamp() if doc.get("start_date") else cpu.t0
                folder = fsutil.join(lake.reports(QUERY), "runs", ld.strftime("%Y%m%dT%H%M%SZ"))
                outcome = json.loads(fsutil.read_text(fsutil.join(folder, "outcome.json"))) \
                    if fsutil.exists(fsutil.join(folder, "outcome.json")) else {}
                run = {"mode": mode, "logical_date": iso(ld), "state": doc["state"], "wall_seconds": round(end - start, 3),
                       **used, "statistics": outcome.get("statistics"), "status": outcome.get("status"),
                       "load_average": list(os.getloadavg())}
                out["runs"].append(run)
                print(f"   {mode:<8} {run['state']:<7} cpu {run['cpu_seconds']:7.1f} s  wall {run['wall_seconds']:6.1f} s  "
                      f"statistics step {run['statistics_step_cpu_seconds']:6.1f} s  {run['statistics']}", flush=True)
        t_end = time.time()
        span_batches = [r for r in _metrics(lake)
                        if r.get("started_at") and t_span <= parse_time(r["started_at"]).timestamp() <= t_end]
        periods = max((t_end - t_span) / (60 * PERIOD_MINUTES), 1e-9)
        # the join's own task CPU: its stage-1 tasks' whole CPU without the statistics (operator, state and result
        # writes); the operator alone (the record's task_cpu_seconds) beside it
        join_cpu = sum((r.get("job_stats") or {}).get("join_task_cpu_seconds") or 0.0 for r in span_batches)
        operator_cpu = sum(r.get("task_cpu_seconds") or 0.0 for r in span_batches)
        stats_cpu = sum((r.get("job_stats") or {}).get("task_cpu_seconds") or 0.0 for r in span_batches)
        stats_driver = sum((r.get("job_stats") or {}).get("driver_cpu_seconds") or 0.0 for r in span_batches)
        out.update(span_seconds=round(t_end - t_span, 1), batches=len(span_batches),
                   join_task_cpu_seconds_per_period=round(join_cpu / periods, 4),
                   operator_cpu_seconds_per_period=round(operator_cpu / periods, 4),
                   stats_task_cpu_seconds_per_period=round(stats_cpu / periods, 4),
                   stats_driver_cpu_seconds_per_period=round(stats_driver / periods, 4),
                   rows_in=sum(sum(r["rows_in"].values()) for r in span_batches),
                   batch_wall_seconds_median=round(statistics.median([r["wall_seconds"] for r in span_batches]), 3)
                   if span_batches else None)
    finally:
        with contextlib.suppress(Exception):
            control.request_stop(by="bench", reason="done")
            control.wait_stopped(300)
        if job.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGTERM)
            job.wait(60)
        feed.stop()
        out["load_average_after"] = list(os.getloadavg())
        out["feed_error"] = feed.error
    return out


def summarize(points: list) -> list:
    """The goal's shape: per rate the four measures with the job's statistics, and the same four for the previous
    step (medians over the rounds)."""
    rows = []
    for p in points:
        def med(mode, key):
            xs = [r[key] for r in p["runs"] if r["mode"] == mode and r["state"] == "success"]
            return round(statistics.median(xs), 3) if xs else None

        join = p.get("join_task_cpu_seconds_per_period")
        prev_step = med("previous", "statistics_step_cpu_seconds")
        rows.append({
            "tuples_per_s": p["tuples_per_s"],
            "loop_cpu_seconds_per_run": med("job", "cpu_seconds"),
            "loop_wall_seconds_per_run": med("job", "wall_seconds"),
            "join_task_cpu_seconds_per_period": join,
            "stats_share_of_join_cpu": round(p["stats_task_cpu_seconds_per_period"] / join, 4) if join else None,
            "previous": {
                "loop_cpu_seconds_per_run": med("previous", "cpu_seconds"),
                "loop_wall_seconds_per_run": med("previous", "wall_seconds"),
                "join_task_cpu_seconds_per_period": join,
                "stats_share_of_join_cpu": round(prev_step / join, 4) if join and prev_step is not None else None,
            },
        })
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="~5, 50, 500 tuples/s, one round")
    p.add_argument("--rounds", type=int, help="pairs of runs per rate (default 3; --quick 1)")
    p.add_argument("--points", help="sf:chunk,... instead of the defaults (e.g. 0.05:1200,1:1200,10:1200)")
    p.add_argument("--buckets", type=int, default=16)
    p.add_argument("--dry-run", action="store_true", help="runs optimize and gate, deploy nothing")
    p.add_argument("--catch-up-timeout", type=float, default=1200.0)
    p.add_argument("--work", default="/tmp/mjoin-loop-cost")
    p.add_argument("--out", default=str(HERE / "results"))
    args = p.parse_args(argv)
    args.rounds = args.rounds or (1 if args.quick else 3)
    points = [tuple(float(x) if i == 0 else int(x) for i, x in enumerate(s.split(":"))) for s in args.points.split(",")] \
        if args.points else (QUICK if args.quick else FULL)
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    empty = Lake(str(work / "empty_lake"))  # the scheduled runs (cycle mode, default params) find nothing here
    env = airflow_env(work / "airflow", lake=empty.root)
    env.update({"MJOIN_PERIOD_MINUTES": str(PERIOD_MINUTES), "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
                "PYTHONPATH": os.pathsep.join([str(PROJECT / "include"), env.get("PYTHONPATH", "")])})
    env.pop("MJOIN_SPARK_REMOTE", None)
    ensure_db(env)
    airflow_cmd(["dags", "reserialize"], env, capture=True)
    started = datetime.now(timezone.utc)
    results = []
    tag = "-quick" if args.quick else ""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def write() -> dict:
        """Both files, after every point: a point that fails (the job dies, memory runs out) keeps the others."""
        done = [r for r in results if not r.get("error")]
        summary = {"rates": summarize(done),
                   "failed_points": [{k: r.get(k) for k in ("tuples_per_s", "sf", "chunk_seconds", "error")}
                                     for r in results if r.get("error")],
                   "machine": {**machine(), "date": started.isoformat(),
                               "load_average_during": [r["load_average_before"][0] for r in results]
                               + [r["load_average_after"][0] for r in results if r.get("load_average_after")]},
                   "commit": git_commit(PROJECT)}
        (out / f"loop-cost{tag}.json").write_text(json.dumps(summary, indent=1) + "\n")
        (out / f"loop-cost{tag}-runs.json").write_text(json.dumps(
            {"benchmark": "loop_cost", "date": started.isoformat(), "command": " ".join([sys.executable] + sys.argv),
             "parameters": {"query": QUERY, "cycle": CYCLE, "period_seconds": 60 * PERIOD_MINUTES, "rounds": args.rounds,
                            "points": points, "buckets": args.buckets, "dry_run": args.dry_run},
             "machine": machine(), "commit": git_commit(PROJECT), "points": results}, indent=1, default=str) + "\n")
        return summary

    with services(env, work) as (senv, port, procs):
        for i, (sf, chunk) in enumerate(points):
            point = {"tuples_per_s": round(_rows(sf) / chunk, 1), "sf": sf, "chunk_seconds": chunk,
                     "load_average_before": list(os.getloadavg())}
            try:
                measure_rate(args, senv, port, [psutil.Process(x.pid) for x in procs], sf, chunk, work / f"point{i}",
                             point)
            except Exception as exc:  # recorded with the point; the next rate still runs
                point["error"] = f"{type(exc).__name__}: {str(exc)[-2000:]}"
                print(f"   point failed: {point['error'][-500:]}", flush=True)
            results.append(point)
            summary = write()
    for r in summary["rates"]:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
