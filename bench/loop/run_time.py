"""Where a re-optimization run's wall time goes: `make airflow` as a user runs it, each task's share, versions side by side.

    flock /tmp/mjoin-bench.lock .venv/bin/python bench/loop/run_time.py --versions HEAD,<ref> [--runs 3] \
        [--period-minutes 5] [--spark-connect] [--tag quick]

For each version (``HEAD``: this checkout; any other git ref: checked out in a temporary worktree), in turn:
``python -m mjoin airflow --live`` (what ``make airflow`` runs: Airflow standalone on SQLite, the live TPC-DS feed
into a fresh lake, ``mjoin_reoptimize`` unpaused with the default params and ``MJOIN_PERIOD_MINUTES``), then
``--runs`` runs of ``mjoin_reoptimize`` back to back: whenever none is active, one is triggered with the default
params over the REST API (the same run as a scheduled one: it judges the period that just ended); scheduled runs
that come in between are measured alike. The first run of each version (a fresh lake: no statistics history,
no plan) is reported apart and left out of the medians.

Per run: its wall time (the DAG run's start to end), every task's duration (its task instance's start to end) and
share of the wall time, and the time between tasks (Airflow's scheduling and task start-up). A version's summary:
the median wall time, per task the median seconds and share, and the wall time against half the period (the goal:
a default run in under half of the default 5-minute period). ``--spark-connect`` also starts a Spark Connect server
(``python -m mjoin airflow --spark-connect``) for every version. Results: ``results/run_time[_<tag>].json`` (machine,
load before and after, versions, commits, parameters).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkout(ref: str, where: Path) -> tuple[Path, str]:
    """The project tree of ``ref`` (``HEAD``: this checkout) and its commit."""
    if ref == "HEAD":
        tree = PROJECT
    else:
        subprocess.run(["git", "-C", str(PROJECT), "worktree", "add", "--detach", str(where), ref], check=True,
                       capture_output=True)
        tree = where
        jar = PROJECT / "include" / "mjoin" / "runtime" / "jvm" / "mjoin-jvm.jar"  # git ignores the built jar
        if jar.exists():
            (where / "include" / "mjoin" / "runtime" / "jvm").mkdir(parents=True, exist_ok=True)
            (where / "include" / "mjoin" / "runtime" / "jvm" / "mjoin-jvm.jar").write_bytes(jar.read_bytes())
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return tree, commit + ("+dirty" if dirty else "")


class Api:
    def __init__(self, port: int, home: Path):
        self.base = f"http://127.0.0.1:{port}"
        self.home = home
        self.token = None

    def _login(self) -> None:
        pw = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        req = urllib.request.Request(f"{self.base}/auth/token", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"username": "admin", "password": pw}).encode())
        with urllib.request.urlopen(req, timeout=60) as r:
            self.token = json.loads(r.read())["access_token"]

    def __call__(self, path: str, method: str = "GET", body: dict | None = None):
        if self.token is None:
            self._login()
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read() or b"{}")


def wait_up(port: int, home: Path, timeout: float = 300) -> Api:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5) as r:
                if r.status == 200 and (home / "simple_auth_manager_passwords.json.generated").exists():
                    return Api(port, home)
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    raise TimeoutError(f"Airflow not up on port {port} within {timeout:.0f} s")


def _t(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")) if s else None


def measure_run(api: Api, run: dict) -> dict:
    tis = api(f"/api/v2/dags/mjoin_reoptimize/dagRuns/{urllib.request.quote(run['dag_run_id'], safe='')}"
              "/taskInstances?limit=100")["task_instances"]
    start, end = _t(run["start_date"]), _t(run["end_date"])
    tasks, spans = {}, []
    for ti in tis:
        a, b = _t(ti.get("start_date")), _t(ti.get("end_date"))
        if a and b:
            tasks[ti["task_id"]] = {"seconds": (b - a).total_seconds(), "state": ti["state"]}
            spans.append((a, b))
    wall = (end - start).total_seconds()
    busy, last = 0.0, None  # the union of the task spans: time some task ran
    for a, b in sorted(spans):
        if last is None or a > last:
            busy += (b - a).total_seconds()
            last = b
        elif b > last:
            busy += (b - last).total_seconds()
            last = b
    for t in tasks.values():
        t["share"] = t["seconds"] / wall if wall else None
    return {"run_id": run["dag_run_id"], "run_type": run["run_type"], "state": run["state"],
            "logical_date": run.get("logical_date"), "wall_seconds": wall, "tasks": tasks,
            "between_tasks_seconds": wall - busy}


def one_version(label: str, tree: Path, commit: str, args, work: Path) -> dict:
    home, lake = work / f"airflow-{label}", work / f"lake-{label}"
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tree / "include"), "MJOIN_PERIOD_MINUTES": str(args.period_minutes),
           "AIRFLOW_HOME": str(home)}
    cmd = [sys.executable, "-m", "mjoin", "airflow", "--live", "--home", str(home), "--lake", str(lake), "--port",
           str(port)] + (["--spark-connect"] if args.spark_connect else [])
    log = open(work / f"airflow-{label}.log", "w")
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    runs, started = [], time.monotonic()
    try:
        api = wait_up(port, home)
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            listed = api("/api/v2/dags/mjoin_reoptimize/dagRuns?order_by=run_after&limit=100")["dag_runs"]
            done = [r for r in listed if r["state"] in ("success", "failed")]
            if len(done) >= args.runs + 1:
                runs = [measure_run(api, r) for r in done[: args.runs + 1]]
                break
            if not any(r["state"] in ("queued", "running") for r in listed):
                api("/api/v2/dags/mjoin_reoptimize/dagRuns", "POST", {"logical_date": None, "conf": {}})
            time.sleep(5)
        else:
            raise TimeoutError(f"{label}: {args.runs + 1} runs did not finish within {args.timeout} s")
    finally:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        _kill_leftovers(home)
    first, rest = runs[0], runs[1:]
    walls = [r["wall_seconds"] for r in rest]
    names = sorted({t for r in rest for t in r["tasks"]}, key=lambda t: min(
        (list(r["tasks"]).index(t) for r in rest if t in r["tasks"]), default=0))
    per_task = {}
    for t in names:
        secs = [r["tasks"][t]["seconds"] for r in rest if t in r["tasks"]]
        per_task[t] = {"median_seconds": statistics.median(secs), "min": min(secs), "max": max(secs),
                       "median_share": statistics.median(r["tasks"][t]["share"] for r in rest if t in r["tasks"])}
    between = [r["between_tasks_seconds"] for r in rest]
    return {"label": label, "commit": commit, "first_run": first, "runs": rest,
            "summary": {"median_wall_seconds": statistics.median(walls), "min_wall_seconds": min(walls),
                        "max_wall_seconds": max(walls), "half_period_seconds": args.period_minutes * 30,
                        "under_half_the_period": statistics.median(walls) < args.period_minutes * 30,
                        "median_between_tasks_seconds": statistics.median(between),
                        "states": [r["state"] for r in rest], "tasks": per_task},
            "setup_seconds": time.monotonic() - started}


def _kill_leftovers(home: Path) -> None:
    """Processes of this version's Airflow home still alive after its stop (an older version's `make airflow` left
    components of `airflow standalone`, in a session of their own, running): killed by their environment."""
    mine = f"AIRFLOW_HOME={home}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mine in f.read().split(b"\0"):
                    os.kill(int(pid), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def machine() -> dict:
    import platform

    return {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--versions", default="HEAD", help="comma list of git refs (HEAD: this checkout); run in this order")
    p.add_argument("--runs", type=int, default=3, help="measured runs per version (after a first, fresh-lake run)")
    p.add_argument("--period-minutes", type=int, default=5, help="MJOIN_PERIOD_MINUTES (default 5, the default)")
    p.add_argument("--spark-connect", action="store_true", help="also run a Spark Connect server (statistics step)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per version")
    p.add_argument("--tag", default="", help="results/run_time_<tag>.json")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mjoin-run-time-"))
    result = {"benchmark": "loop run time", "machine": machine(), "load_average_before": list(os.getloadavg()),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "parameters": {k: v for k, v in vars(args).items() if k != "tag"}, "versions": []}
    worktrees = []
    try:
        for i, ref in enumerate(args.versions.split(",")):
            tree, commit = checkout(ref, work / f"tree{i}")
            if tree != PROJECT:
                worktrees.append(tree)
            print(f"{ref} ({commit}): make airflow, {args.runs + 1} runs (load {os.getloadavg()[0]:.1f})", flush=True)
            v = one_version(f"{i}-{ref.replace('/', '_')}", tree, commit, args, work)
            v["ref"] = ref
            result["versions"].append(v)
            s = v["summary"]
            print(f"  median wall {s['median_wall_seconds']:.0f} s (min {s['min_wall_seconds']:.0f}, max "
                  f"{s['max_wall_seconds']:.0f}); between tasks {s['median_between_tasks_seconds']:.0f} s; " +
                  ", ".join(f"{t} {x['median_seconds']:.0f} s" for t, x in s["tasks"].items()), flush=True)
    finally:
        for tree in worktrees:
            subprocess.run(["git", "-C", str(PROJECT), "worktree", "remove", "--force", str(tree)], capture_output=True)
    result["load_average_after"] = list(os.getloadavg())
    out = HERE / "results" / f"run_time{'_' + args.tag if args.tag else ''}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
