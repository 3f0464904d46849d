"""A long-lived Spark Connect server on this machine: start, status, stop.

The statistics step costs ~1-2 s of Spark work per interval, but a fresh spark-submit
per DAG run adds ~10 s of JVM and Python start-up (bench/stats/results/cost.json).
A Spark Connect server keeps one warm driver and warm Python workers; jobs that
need only the DataFrame API (the statistics job) connect to it when
``MJOIN_SPARK_REMOTE=sc://host:port`` is set (:func:`mjoin.runtime.spark.get_spark`).

The server is Spark's own (``org.apache.spark.sql.connect.service.SparkConnectServer``,
the class ``sbin/start-connect-server.sh`` runs), started with ``spark-submit`` in its
own process group, the settings of :data:`mjoin.runtime.spark.BASE_CONF`, and this
checkout's ``include/`` on the Python workers' path (the kernels the jobs ship by
reference live there). Its pid, port and log are in ``<dir>/server.json`` (default
``<project>/.spark-connect``). On a cluster, run the server where the executors have
mjoin installed and point ``MJOIN_SPARK_REMOTE`` at it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from mjoin.runtime.resources import PROJECT_DIR, Resources, spark_bin
from mjoin.runtime.spark import BASE_CONF, tcp_problem

CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002
DEFAULT_DIR = PROJECT_DIR / ".spark-connect"


class ConnectServerError(RuntimeError):
    """The server could not be started (the message names why, with its log's last lines)."""


def _state_file(folder) -> Path:
    return Path(folder) / "server.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def _port_open(port: int) -> bool:
    return tcp_problem("127.0.0.1", port, timeout=1.0) is None


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def status(folder=DEFAULT_DIR) -> dict:
    """``{"state": "running" | "starting" | "stopped" | "dead", "pid", "port", "url", "log"}`` of the server in ``folder``."""
    path = _state_file(folder)
    if not path.exists():
        return {"state": "stopped"}
    info = json.loads(path.read_text())
    if not _alive(int(info["pid"])):
        return {**info, "state": "dead"}
    return {**info, "state": "running" if _port_open(int(info["port"])) else "starting"}


def _spark_submit() -> str:
    return str(Path(spark_bin()) / "spark-submit")


def start(folder=DEFAULT_DIR, port: int = DEFAULT_PORT, resources: Resources | None = None,
          driver_memory: str = "4g", timeout: float = 180.0) -> dict:
    """Start a server (or return the running one) and wait until it accepts connections. ``port=0``: any
    free port (the running server's, if there is one)."""
    folder = Path(folder)
    cur = status(folder)
    if cur["state"] in ("running", "starting"):
        if port and int(cur["port"]) != int(port):
            raise ConnectServerError(f"a server already runs from {folder} on port {cur['port']} (pid {cur['pid']}); "
                                     "stop it first")
        return _wait(folder, cur, timeout)
    port = int(port) or free_port()
    if _port_open(port):
        raise ConnectServerError(f"port {port} is already taken by another process; choose another with --port")
    resources = resources or Resources.from_env()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "server.log"
    conf = dict(BASE_CONF)
    conf["spark.driver.memory"] = driver_memory
    conf["spark.sql.shuffle.partitions"] = str(resources.shuffle_partitions)
    conf["spark.ui.enabled"] = os.environ.get("MJOIN_SPARK_UI", "false")
    conf["spark.connect.grpc.binding.port"] = str(port)
    # the jobs of a kind share one session (warm Python workers, mjoin.runtime.spark.session_url): keep it
    # between DAG runs hours apart (default 60 min idle)
    conf["spark.connect.session.manager.defaultSessionTimeout"] = "7d"
    conf.update(resources.spark_conf)
    cmd = [_spark_submit(), "--master", resources.spark_master, "--name", "mjoin-spark-connect", "--class", CLASS]
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    cmd.append("spark-internal")
    include = str(PROJECT_DIR / "include")
    env = dict(os.environ, PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
               PYTHONPATH=os.pathsep.join(p for p in (include, os.environ.get("PYTHONPATH", "")) if p))
    env.pop("SPARK_SUBMIT_ARGS_SET_MASTER", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, cwd=str(folder))
    info = {"pid": proc.pid, "port": int(port), "url": f"sc://localhost:{port}", "log": str(log),
            "master": resources.spark_master, "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _state_file(folder).write_text(json.dumps(info, indent=1))
    return _wait(folder, info, timeout, proc)


def _wait(folder: Path, info: dict, timeout: float, proc=None) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _port_open(int(info["port"])):
            return {**info, "state": "running"}
        dead = (proc.poll() is not None) if proc is not None else not _alive(int(info["pid"]))
        if dead:
            _state_file(folder).unlink(missing_ok=True)
            raise ConnectServerError(f"the Spark Connect server exited during start-up; last lines of {info['log']}:\n"
                                     + _tail(info["log"]))
        time.sleep(0.5)
    stop(folder)
    raise ConnectServerError(f"the Spark Connect server did not listen on port {info['port']} within {timeout:.0f} s; "
                             f"last lines of {info['log']}:\n" + _tail(info["log"]))


def _tail(path, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(folder=DEFAULT_DIR, timeout: float = 30.0) -> dict:
    """Stop the server (SIGTERM to its process group, SIGKILL after ``timeout``); the status before."""
    cur = status(folder)
    if cur["state"] == "stopped":
        return cur
    pid = int(cur["pid"])
    if cur["state"] != "dead":
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _state_file(folder).unlink(missing_ok=True)
    return cur
