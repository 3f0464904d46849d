"""The shared setup of the real-Airflow DAG tests (test_dags.py, test_dags_join_job.py): a tiny TPC-DS workload,
1-minute periods, 5-s statistics cycles, a project-local Airflow home on SQLite."""
from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

from mjoin.lake.layout import Lake
from mjoin.model.timeutil import iso, parse_time

from airflow_helpers import make_env

PROJECT = Path(__file__).resolve().parent.parent
QUERY = "tpcds_returns_by_address"
START = parse_time("2026-01-01T00:00:00Z")
PERIOD = 60  # seconds (MJOIN_PERIOD_MINUTES=1)
CYCLE = 5


def logical(k: int) -> str:
    return iso(START + timedelta(seconds=k * PERIOD))


def make_world(root: Path) -> dict:
    """The workload, the lake, the Airflow home (DAGs parsed into its metadata DB) and the runs' conf."""
    from mjoin.loop.airflow_env import airflow_cmd
    from mjoin.workloads.tpcds_replay import generate_tpcds

    workload = root / "workload"
    generate_tpcds(workload, sf=0.01, duration=f"{8 * PERIOD}s", cycle=CYCLE, start=iso(START))
    lake = root / "lake"
    env = make_env(root / "airflow", lake, period_minutes=PERIOD // 60)
    # 5 s cycles of a tiny workload hold 5-20 rows per stream (one NULL key is 5-20 %): the default gates judge
    # them with statistical bounds (docs/gates.md), no threshold is raised for these runs
    conf = {"query": QUERY, "lake": str(lake), "workload": str(workload), "cycle": CYCLE, "strategy": "exact",
            "gates": {}}
    airflow_cmd(["dags", "reserialize"], env, capture=True)  # parse dags/ into the metadata DB
    return {"root": root, "workload": workload, "lake": lake, "env": env, "conf": conf, "log": root / "airflow.log"}


class Lander(threading.Thread):
    """Lands the workload's arrival cycles following the simulated clock, until stopped (a live feed; the
    continuous-mode scheduler tests)."""

    class Stop(Exception):
        pass

    def __init__(self, workload, lake, since: str, until: str, speed: float):
        super().__init__(name="lander", daemon=True)
        self.args = (workload, lake, since, until, speed)
        self.halt = threading.Event()
        self.error = None

    def _sleep(self, seconds: float) -> None:
        if self.halt.wait(seconds):
            raise Lander.Stop()

    def run(self):
        from mjoin.workloads.lander import land

        workload, lake, since, until, speed = self.args
        try:
            land(workload, Lake(str(lake)), until=until, since=since, speed=speed, sleep=self._sleep)
        except Lander.Stop:
            pass
        except Exception as exc:  # reported by the test
            self.error = exc

    def stop(self):
        self.halt.set()
        self.join(timeout=60)
