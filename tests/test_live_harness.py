"""The live harness (bench/live/harness.py): interrupted, it stops every process it started (the join job's JVM and
Python workers, the Airflow services), by process group; its sustained verdict follows the lag's trend and the
latency; a short real run measures lag, latency and CPU and matches the interval run's results."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT / "bench" / "live"))

import harness  # noqa: E402


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    from mjoin.workloads.tpcds_replay import generate_tpcds

    return str(generate_tpcds(tmp_path_factory.mktemp("replay") / "tpcds", sf=0.1).root)


def _descendants(pid: int) -> dict:
    out = {}
    try:
        for p in psutil.Process(pid).children(recursive=True):
            try:
                out[(p.pid, p.create_time())] = " ".join(p.cmdline())
            except psutil.Error:
                continue
    except psutil.NoSuchProcess:
        pass
    return out


def _alive(key) -> bool:
    pid, created = key
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - created) < 1e-3 and p.status() != psutil.STATUS_ZOMBIE  # a zombie runs nothing
    except psutil.NoSuchProcess:
        return False


def _interrupt(args: list, tmp_path: Path, until, sig=signal.SIGINT, timeout: float = 240) -> tuple[int, dict]:
    harness_proc = subprocess.Popen([sys.executable, str(PROJECT / "bench" / "live" / "harness.py"), *args,
                                     "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")],
                                    stdout=open(tmp_path / "harness.log", "w"), stderr=subprocess.STDOUT,
                                    start_new_session=True)
    seen: dict = {}
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and harness_proc.poll() is None:
            seen.update(_descendants(harness_proc.pid))
            if until(seen):
                break
            time.sleep(0.3)
        assert until(seen), (seen, (tmp_path / "harness.log").read_text()[-3000:])
        seen.update(_descendants(harness_proc.pid))
        os.kill(harness_proc.pid, sig)  # the harness alone: it must stop what it started
        rc = harness_proc.wait(120)
        time.sleep(1.0)
        return rc, seen
    finally:
        if harness_proc.poll() is None:
            os.killpg(harness_proc.pid, signal.SIGKILL)
        for key in list(seen):  # never leave anything behind, even when the assertion below fails
            if _alive(key):
                with __import__("contextlib").suppress(psutil.Error):
                    psutil.Process(key[0]).kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_harness_stops_the_job_and_its_jvm(replay, tmp_path, sig):
    rc, seen = _interrupt(["run", "--system", "mjoin-fixed", "--rate", "1000", "--duration", "120",
                           "--replay", replay], tmp_path,
                          until=lambda s: any("java" in c.split(" ")[0] for c in s.values()), sig=sig, timeout=50)
    assert rc == 130, (tmp_path / "harness.log").read_text()[-3000:]
    assert any("mjoin run --stream" in c for c in seen.values())
    survivors = {k: c for k, c in seen.items() if _alive(k)}
    assert not survivors, survivors


@pytest.mark.slow
def test_interrupted_harness_stops_airflow_too(replay, tmp_path):
    rc, seen = _interrupt(["run", "--system", "mjoin-loop", "--rate", "1000", "--duration", "300",
                           "--replay", replay], tmp_path,
                          until=lambda s: any("scheduler" in c for c in s.values())
                          and any("java" in c.split(" ")[0] for c in s.values()), timeout=300)
    assert rc == 130
    survivors = {k: c for k, c in seen.items() if _alive(k)}
    assert not survivors, survivors


def test_verdict_follows_the_lag_trend_and_the_latency():
    flat = [{"t": t, "lag": 10 * (t % 2), "feeding": True} for t in range(100)]
    growing = [{"t": t, "lag": t, "feeding": True} for t in range(100)]
    fast = [{"latency": 5.0 + 0.01 * i} for i in range(50)]
    slow = [{"latency": 5.0} for _ in range(40)] + [{"latency": 25.0} for _ in range(10)]
    assert harness.verdict(flat, fast, trigger=10, cycle=10, caught_up_after=1.0)["sustained"]
    assert not harness.verdict(growing, fast, trigger=10, cycle=10, caught_up_after=1.0)["sustained"]
    assert not harness.verdict(flat, slow, trigger=10, cycle=10, caught_up_after=1.0)["sustained"]
    assert not harness.verdict(flat, fast, trigger=10, cycle=10, caught_up_after=None)["sustained"]


@pytest.mark.slow
def test_a_short_run_measures_lag_latency_cpu_and_matches_the_interval_run(replay, tmp_path):
    doc = harness.run_once(workload="tpcds_seed", system="mjoin-fixed", rate=2000, duration=40, work=tmp_path / "w",
                           out=tmp_path / "out", replay=replay, warmup=0)
    # replay pace lands the planned rows, about rate x length (the replay's own pace, not an exact count)
    assert doc["feed"]["rows"] == doc["feed_plan"]["rows"] and abs(doc["feed"]["rows"] - 80_000) < 1_600
    assert abs(doc["feed"]["rate"] - 2000) < 100
    assert doc["batches_with_input"] >= 2 and all(x["latency"] > 0 for x in doc["latency"])
    assert any(x["lag"] is not None for x in doc["lag"])
    assert doc["job_cpu_seconds"] > 1.0
    assert doc["identical_results"] is True, (doc.get("fingerprint"), doc.get("interval_fingerprint"))
    saved = list((tmp_path / "out").glob("*.json"))
    assert len(saved) == 1 and json.loads(saved[0].read_text())["system"] == "mjoin-fixed"
