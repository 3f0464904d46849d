"""Flink 2.3's MultiJoin in the live harness (``--system flink_multijoin``): a short real run plans one MultiJoin,
commits the arrivals it was fed, returns exactly the interval run's result rows and leaves no process behind;
interrupted, the harness stops Flink's JVM with the rest. Skipped only without the Flink venv (make flink-venv)."""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import psutil
import pytest

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT / "bench" / "live"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import flink_live  # noqa: E402
import harness  # noqa: E402
from test_live_harness import _alive, _interrupt, replay  # noqa: E402,F401  (the replay fixture, the helpers)

pytestmark = pytest.mark.skipif(not flink_live.available(),
                                reason=f"no Flink venv ({flink_live.FLINK_PY}): make flink-venv")


def _flink_processes() -> list:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if p.status() != psutil.STATUS_ZOMBIE and ("flink_live_job" in cmd or "java" in cmd.split(" ")[0]):
            out.append((p.pid, cmd[:200]))
    return out


@pytest.mark.slow
def test_a_short_flink_run_commits_the_interval_runs_rows_and_stops_everything(replay, tmp_path):
    doc = harness.run_once(workload="tpcds_seed", system="flink_multijoin", rate=2000, duration=30,
                           work=tmp_path / "w", out=tmp_path / "out", replay=replay, warmup=0, catch_up=60)
    assert doc["flink"]["operators"] == {"MultiJoin": 1, "Join": 0, "IntervalJoin": 0}, doc["flink"]["plan"]
    assert doc["feed"]["rows"] == doc["feed_plan"]["rows"]
    assert not doc["flink"]["mirror_errors"]
    assert doc["batches_with_input"] >= 2 and all(x["latency"] > 0 for x in doc["latency"])
    assert all(0 < x["processed_latency"] <= x["latency"] for x in doc["latency"])
    assert doc["verdict"]["caught_up_after_s"] is not None
    assert doc["job_cpu_by_command"].get("java", 0) > 1.0
    assert doc["identical_results"] is True, (doc.get("fingerprint"), doc.get("interval_fingerprint"))
    assert doc["fingerprint"]["rows"] == doc["interval_fingerprint"]["rows"] > 0
    assert doc["versions"]["apache-flink"] == "2.3.0"
    assert not _flink_processes()  # the job's Python process and its JVM (the mini-cluster) are gone
    with pytest.raises(OSError):
        port = json.loads((tmp_path / "w" / "tpcds_seed-flink_multijoin-2000" / "flink-job.json").read_text())["rest_port"]
        flink_live._get(port, "/jobs", timeout=2)


@pytest.mark.slow
def test_interrupted_harness_stops_flinks_jvm(replay, tmp_path):
    rc, seen = _interrupt(["run", "--system", "flink_multijoin", "--rate", "1000", "--duration", "120",
                           "--replay", replay], tmp_path,
                          until=lambda s: any("java" in c.split(" ")[0] for c in s.values())
                          and any("flink_live_job" in c for c in s.values()), sig=signal.SIGINT, timeout=120)
    assert rc == 130, (tmp_path / "harness.log").read_text()[-3000:]
    survivors = {k: c for k, c in seen.items() if _alive(k)}
    assert not survivors, survivors
