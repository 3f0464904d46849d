"""A small cluster on this machine, natively: a Spark standalone master and workers, and PostgreSQL as
Airflow's metadata database (the topology of ``docker-compose.yml``, without Docker).

Everything listens on 127.0.0.1 and lives in one project-local folder (default ``<project>/.cluster``):

    cluster.json              what runs: per component its pid, process start time, ports, log
    secrets.json              the generated PostgreSQL password (mode 0600; never in git)
    logs/<component>.log      master, worker-<i>, postgres
    work/worker-<i>/          each worker's executors (their cwd, stdout/stderr)
    postgres/data, postgres/run   the database cluster and its socket folder

- Spark: ``spark-class org.apache.spark.deploy.master.Master`` and ``...worker.Worker`` of the pip
  pyspark (the same Spark the jobs submit with), each in its own process group, so a worker, its
  executors and their Python workers go together (:func:`kill_worker`).
- PostgreSQL: Debian's ``postgresql`` binaries (``/usr/lib/postgresql/<v>/bin``), ``initdb`` once, the
  postmaster run directly (its pid is the one recorded). PostgreSQL refuses to run as root: as root it
  runs as the ``postgres`` user (the Debian package creates it), which then owns ``postgres/``.
  Airflow connects over TCP as role ``airflow`` (password in ``secrets.json``), which may create
  databases (the tests make a fresh one each).

:func:`up` starts what is not running and waits until the master lists every worker alive and the
database answers; :func:`down` stops exactly the processes ``cluster.json`` records, by pid (checked
against the process start time, so a recycled pid is never signalled). Nothing here imports Spark or
Airflow.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from mjoin.runtime.resources import PROJECT_DIR

DEFAULT_DIR = PROJECT_DIR / ".cluster"
HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DB_NAME = "airflow"
DB_USER = "airflow"


class ClusterError(RuntimeError):
    """A component could not be started or reached (the message says which and why)."""


@dataclass(frozen=True)
class ClusterConfig:
    """Ports and sizes of the native cluster (``python -m mjoin cluster up --help``)."""

    master_port: int = 7077
    master_ui_port: int = 8081
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "3g"
    executor_memory: str = "2g"
    pg_port: int = 55432
    postgres: bool = True


# ---- processes --------------------------------------------------------------------------------

def _started(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except Exception:
        return None


def alive(proc: dict | None) -> bool:
    """Does the recorded process still run (same pid, same start time, not a zombie)?"""
    if not proc or not proc.get("pid"):
        return False
    try:
        p = psutil.Process(int(proc["pid"]))
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        return proc.get("started") is None or abs(p.create_time() - float(proc["started"])) < 1.0
    except Exception:
        return False


def _signal_group(proc: dict, sig: int) -> None:
    """``sig`` to the recorded process's group (it leads one: started in a new session), else to it alone."""
    pid = int(proc["pid"])
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _stop(proc: dict, sig: int = signal.SIGTERM, timeout: float = 30.0, last: int = signal.SIGKILL) -> bool:
    """Stop a recorded process (and its group) if it is still the one we started; True if it was running."""
    if not alive(proc):
        return False
    _signal_group(proc, sig)
    deadline = time.monotonic() + timeout
    while alive(proc) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(proc):
        _signal_group(proc, last)
        deadline = time.monotonic() + 10
        while alive(proc) and time.monotonic() < deadline:
            time.sleep(0.2)
    return True


def _spawn(cmd: list[str], log: Path, env: dict | None = None, cwd: Path | None = None, user: str | None = None) -> dict:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=str(cwd) if cwd else None, start_new_session=True,
                                **({"user": user, "group": user, "extra_groups": []} if user else {}))
    time.sleep(0.05)
    return {"pid": proc.pid, "started": _started(proc.pid), "log": str(log), "cmd": cmd}


def _tail(path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((HOST, port)) == 0


# ---- state --------------------------------------------------------------------------------------

def _state_path(folder) -> Path:
    return Path(folder) / "cluster.json"


def load(folder=DEFAULT_DIR) -> dict:
    path = _state_path(folder)
    return json.loads(path.read_text()) if path.exists() else {}


def _save(folder, state: dict) -> None:
    path = _state_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)


def master_url(state: dict) -> str:
    return f"spark://{HOST}:{state['config']['master_port']}"


def master_json(state: dict, timeout: float = 3.0) -> dict | None:
    """The master's own view (its web UI's ``/json/``: workers with their state, applications), or None."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{state['config']['master_ui_port']}/json/", timeout=timeout) as r:
            return json.loads(r.read())
    except Exception:
        return None


def alive_workers(state: dict) -> list[dict]:
    doc = master_json(state) or {}
    return [w for w in doc.get("workers", []) if w.get("state") == "ALIVE"]


# ---- Spark --------------------------------------------------------------------------------------

def _spark_class() -> str:
    exe = Path(sys.executable).parent / "spark-class"
    if not exe.exists():
        raise ClusterError(f"{exe} not found: run make setup (the pip pyspark provides spark-class)")
    return str(exe)


def _spark_env() -> dict:
    env = dict(os.environ)
    env.update({
        "SPARK_LOCAL_IP": HOST, "SPARK_DAEMON_MEMORY": env.get("SPARK_DAEMON_MEMORY", "512m"),
        "PYSPARK_PYTHON": env.get("PYSPARK_PYTHON", sys.executable),
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        # finished applications' folders go after a day; executors' logs stay readable meanwhile
        "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.appDataTtl=86400",
    })
    env.pop("SPARK_SUBMIT_ARGS_SET_MASTER", None)
    return env


def start_master(folder, state: dict) -> dict:
    cfg = state["config"]
    cur = state.get("master")
    if alive(cur):
        return cur
    for port in (cfg["master_port"], cfg["master_ui_port"]):
        if not port_free(port):
            raise ClusterError(f"port {port} on {HOST} is taken by another process: choose another "
                               "(python -m mjoin cluster up --master-port/--master-ui-port)")
    folder = Path(folder)
    cmd = [_spark_class(), MASTER_CLASS, "--host", HOST, "--port", str(cfg["master_port"]),
           "--webui-port", str(cfg["master_ui_port"])]
    state["master"] = _spawn(cmd, folder / "logs" / "master.log", env=_spark_env(), cwd=folder)
    _save(folder, state)
    deadline = time.monotonic() + 90
    while master_json(state) is None:
        if not alive(state["master"]):
            raise ClusterError("the Spark master exited during start-up:\n" + _tail(state["master"]["log"]))
        if time.monotonic() > deadline:
            raise ClusterError("the Spark master did not answer within 90 s:\n" + _tail(state["master"]["log"]))
        time.sleep(0.5)
    return state["master"]


def start_worker(folder, state: dict, index: int) -> dict:
    """Start worker ``index`` (0-based) unless it runs; returns its record."""
    cfg = state["config"]
    workers = state.setdefault("workers", {})
    cur = workers.get(str(index))
    if alive(cur):
        return cur
    folder = Path(folder)
    work = folder / "work" / f"worker-{index}"
    work.mkdir(parents=True, exist_ok=True)
    cmd = [_spark_class(), WORKER_CLASS, master_url(state), "--host", HOST, "--cores", str(cfg["worker_cores"]),
           "--memory", cfg["worker_memory"], "--work-dir", str(work), "--webui-port", "0"]
    workers[str(index)] = _spawn(cmd, folder / "logs" / f"worker-{index}.log", env=_spark_env(), cwd=work)
    _save(folder, state)
    return workers[str(index)]


def wait_workers(state: dict, count: int, timeout: float = 90.0) -> list[dict]:
    """Wait until the master lists ``count`` workers alive; returns them."""
    deadline = time.monotonic() + timeout
    while True:
        got = alive_workers(state)
        if len(got) >= count:
            return got
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- worker {i}:\n{_tail(w['log'], 8)}" for i, w in state.get("workers", {}).items())
            raise ClusterError(f"{len(got)} of {count} Spark workers registered with the master within "
                               f"{timeout:.0f} s\n{logs}")
        time.sleep(0.5)


def _tree(rec: dict) -> list:
    """The recorded process and all its descendants (executors, PySpark's daemon, which runs in a process
    group of its own, and its Python workers)."""
    try:
        root = psutil.Process(int(rec["pid"]))
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_worker(folder, index: int, sig: int = signal.SIGKILL) -> dict:
    """Kill worker ``index`` with its executors and their Python workers (its whole process tree), as if
    its machine died; returns its record. :func:`start_worker` brings it back."""
    state = load(folder)
    rec = state.get("workers", {}).get(str(index))
    if not alive(rec):
        raise ClusterError(f"worker {index} is not running")
    for p in _tree(rec):
        with contextlib.suppress(Exception):
            p.send_signal(sig)
    deadline = time.monotonic() + 30
    while alive(rec) and time.monotonic() < deadline:
        time.sleep(0.1)
    return rec


def worker_of(state: dict, pid: int) -> int | None:
    """The index of the worker whose process tree holds process ``pid`` (an executor or a Python worker
    of it), or None (the driver, or no worker of this cluster)."""
    try:
        chain = {pid} | {p.pid for p in psutil.Process(pid).parents()}
    except psutil.NoSuchProcess:
        return None
    for i, rec in state.get("workers", {}).items():
        if alive(rec) and int(rec["pid"]) in chain:
            return int(i)
    return None


def executors(state: dict) -> dict:
    """Worker index -> pids of the executor processes it runs now (``CoarseGrainedExecutorBackend``)."""
    out = {}
    for i, rec in state.get("workers", {}).items():
        if alive(rec):
            out[int(i)] = [p.pid for p in _tree(rec)[1:] if "CoarseGrainedExecutorBackend" in " ".join(_cmdline(p))]
    return out


def _cmdline(p) -> list:
    try:
        return p.cmdline()
    except Exception:
        return []


# ---- PostgreSQL ---------------------------------------------------------------------------------

def pg_bin(name: str) -> str | None:
    """A PostgreSQL server binary: Debian's newest ``/usr/lib/postgresql/<v>/bin``, else the PATH."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                   key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parts[4].split(".")])
    return found[-1] if found else shutil.which(name)


def _pg_user() -> str | None:
    """The OS user the server runs as: ourselves, or ``postgres`` when we are root (it refuses root)."""
    if os.geteuid() != 0:
        return None

    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ClusterError("running as root, PostgreSQL needs an unprivileged user: no 'postgres' user "
                           "(apt-get install -y postgresql creates it)") from None
    return "postgres"


def _chown(path: Path, user: str | None) -> None:
    if user:
        pw = pwd.getpwnam(user)
        for root, dirs, files in os.walk(path):
            for n in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
                os.chown(n, pw.pw_uid, pw.pw_gid)


def _pg_base(folder: Path, user: str | None) -> Path:
    """Where the database lives: ``<folder>/postgres``, unless the server's user (``postgres``, when we are
    root) cannot reach it (a checkout under /root): then a folder of its own in the system's temp folder."""
    base = folder.resolve() / "postgres"
    if user is None:
        return base

    reachable = all(p.stat().st_mode & stat.S_IXOTH for p in (folder.resolve(), *folder.resolve().parents) if p.exists())
    if reachable:
        return base
    return Path(tempfile.gettempdir()) / f"mjoin-postgres-{hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:10]}"


def _secrets(folder) -> dict:
    path = Path(folder) / "secrets.json"
    if path.exists():
        return json.loads(path.read_text())
    doc = {"postgres_password": secrets.token_urlsafe(18)}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return doc


def _psql(state: dict, sql: str, db: str = "postgres") -> str:
    """Run SQL as the database superuser over the server's own socket (trust, local only)."""
    pg = state["postgres"]
    cmd = [pg_bin("psql") or "psql", "-h", pg["socket_dir"], "-p", str(state["config"]["pg_port"]), "-U", "postgres",
           "-d", db, "-v", "ON_ERROR_STOP=1", "-tAc", sql]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise ClusterError(f"psql failed ({sql[:60]}...): {proc.stderr.strip()}")
    return proc.stdout.strip()


def start_postgres(folder, state: dict) -> dict:
    cfg = state["config"]
    cur = state.get("postgres")
    if alive(cur):
        return cur
    for b in ("initdb", "postgres", "pg_isready", "psql"):
        if not pg_bin(b):
            raise ClusterError(f"PostgreSQL's {b} not found: apt-get install -y postgresql")
    if not port_free(cfg["pg_port"]):
        raise ClusterError(f"port {cfg['pg_port']} on {HOST} is taken: choose another (--pg-port)")
    user = _pg_user()
    folder = Path(folder)
    base = _pg_base(folder, user)
    data, run = base / "data", base / "run"
    run.mkdir(parents=True, exist_ok=True)
    log = folder / "logs" / "postgres.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.touch()
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True)
        _chown(base, user)
        _chown(log, user)
        os.chmod(data, 0o700)
        init = subprocess.run([pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
                               "--auth-host=scram-sha-256", "-E", "UTF8", "--no-instructions"],
                              capture_output=True, text=True,
                              **({"user": user, "group": user, "extra_groups": []} if user else {}))
        if init.returncode != 0:
            raise ClusterError(f"initdb failed: {init.stderr.strip() or init.stdout.strip()}")
    _chown(run, user)
    _chown(log, user)
    cmd = [pg_bin("postgres"), "-D", str(data), "-p", str(cfg["pg_port"]), "-k", str(run),
           "-c", f"listen_addresses={HOST}", "-c", "max_connections=200", "-c", "shared_buffers=128MB",
           "-c", "fsync=off", "-c", "synchronous_commit=off"]
    state["postgres"] = dict(_spawn(cmd, log, cwd=base, user=user), socket_dir=str(run))
    _save(folder, state)
    deadline = time.monotonic() + 60
    while True:
        ready = subprocess.run([pg_bin("pg_isready"), "-h", HOST, "-p", str(cfg["pg_port"])], capture_output=True)
        if ready.returncode == 0:
            break
        if not alive(state["postgres"]) or time.monotonic() > deadline:
            raise ClusterError("PostgreSQL did not start:\n" + _tail(log))
        time.sleep(0.3)
    pw = _secrets(folder)["postgres_password"]
    if _psql(state, f"SELECT 1 FROM pg_roles WHERE rolname = '{DB_USER}'") != "1":
        _psql(state, f"CREATE ROLE {DB_USER} LOGIN CREATEDB PASSWORD '{pw}'")
    else:
        _psql(state, f"ALTER ROLE {DB_USER} PASSWORD '{pw}'")
    if _psql(state, f"SELECT 1 FROM pg_database WHERE datname = '{DB_NAME}'") != "1":
        _psql(state, f"CREATE DATABASE {DB_NAME} OWNER {DB_USER}")
    return state["postgres"]


def db_url(folder=DEFAULT_DIR, database: str = DB_NAME, state: dict | None = None) -> str:
    """SQLAlchemy URL of a database of the cluster's PostgreSQL, as Airflow's ``sql_alchemy_conn``."""
    state = state or load(folder)
    pw = _secrets(folder)["postgres_password"]
    return f"postgresql+psycopg2://{DB_USER}:{pw}@{HOST}:{state['config']['pg_port']}/{database}"


def _admin_connect(folder, state: dict):
    import psycopg2

    pw = _secrets(folder)["postgres_password"]
    conn = psycopg2.connect(host=HOST, port=state["config"]["pg_port"], user=DB_USER, password=pw, dbname=DB_NAME)
    conn.autocommit = True
    return conn


def create_database(folder, name: str) -> str:
    """A fresh, empty database ``name`` owned by the Airflow role (dropped first if it exists); its URL."""
    if not name.replace("_", "").isalnum():
        raise ValueError(f"database name {name!r}: letters, digits and _ only")
    state = load(folder)
    with contextlib.closing(_admin_connect(folder, state)) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        cur.execute(f"CREATE DATABASE {name}")
    return db_url(folder, name, state)


def drop_database(folder, name: str) -> None:
    state = load(folder)
    with contextlib.closing(_admin_connect(folder, state)) as conn, conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# ---- the whole -----------------------------------------------------------------------------------

def up(folder=DEFAULT_DIR, config: ClusterConfig | None = None) -> dict:
    """Start what is not running (master, ``config.workers`` workers, PostgreSQL) and wait until they answer."""
    folder = Path(folder)
    state = load(folder)
    if config is None:
        config = ClusterConfig(**state["config"]) if state.get("config") else ClusterConfig()
    running = state.get("config") and (alive(state.get("master")) or alive(state.get("postgres")))
    if running and state["config"] != asdict(config):
        raise ClusterError(f"a cluster with other settings runs from {folder}: {state['config']}; "
                           "make cluster-down first")
    state["config"] = asdict(config)
    folder.mkdir(parents=True, exist_ok=True)
    _save(folder, state)
    start_master(folder, state)
    for i in range(config.workers):
        start_worker(folder, state, i)
    if config.postgres:
        start_postgres(folder, state)
    wait_workers(state, config.workers)
    state["master_url"] = master_url(state)
    _save(folder, state)
    return status(folder)


def down(folder=DEFAULT_DIR) -> list[str]:
    """Stop every process ``cluster.json`` records (workers, master, PostgreSQL), by pid; returns what ran."""
    folder = Path(folder)
    state = load(folder)
    stopped = []
    for i, rec in sorted(state.get("workers", {}).items()):
        if _stop(rec):
            stopped.append(f"worker-{i}")
    if _stop(state.get("master")):
        stopped.append("master")
    # PostgreSQL: SIGINT is its "fast" shutdown (roll back, disconnect, checkpoint); SIGQUIT if it hangs
    if _stop(state.get("postgres"), sig=signal.SIGINT, timeout=60, last=signal.SIGQUIT):
        stopped.append("postgres")
    for k in ("master", "postgres"):
        state.pop(k, None)
    state.pop("workers", None)
    if state:
        _save(folder, state)
    return stopped


def status(folder=DEFAULT_DIR) -> dict:
    """What runs: ``{"up": bool, "master_url", "components": {name: "running" | "stopped"}, "alive_workers",
    "db_url" (password masked), "problem"}``; ``up`` when the master lists every worker and the database answers."""
    folder = Path(folder)
    state = load(folder)
    if not state.get("config"):
        return {"up": False, "folder": str(folder), "problem": f"no cluster started from {folder} (make cluster-up)"}
    cfg = state["config"]
    comps = {"master": "running" if alive(state.get("master")) else "stopped"}
    for i in range(cfg["workers"]):
        comps[f"worker-{i}"] = "running" if alive(state.get("workers", {}).get(str(i))) else "stopped"
    if cfg.get("postgres", True):
        comps["postgres"] = "running" if alive(state.get("postgres")) else "stopped"
    workers = alive_workers(state) if comps["master"] == "running" else []
    problem = None
    down_ = [k for k, v in comps.items() if v != "running"]
    if down_:
        problem = f"not running: {', '.join(down_)} (make cluster-up)"
    elif len(workers) < cfg["workers"]:
        problem = f"the master lists {len(workers)} of {cfg['workers']} workers alive"
    elif cfg.get("postgres", True) and not _listening(cfg["pg_port"]):
        problem = f"PostgreSQL does not listen on {HOST}:{cfg['pg_port']}"
    out = {"up": problem is None, "folder": str(folder), "master_url": master_url(state),
           "master_ui": f"http://{HOST}:{cfg['master_ui_port']}", "components": comps,
           "alive_workers": len(workers), "cores": sum(int(w.get("cores", 0)) for w in workers),
           "config": cfg, "problem": problem}
    if cfg.get("postgres", True) and (folder / "secrets.json").exists():
        out["db_url"] = db_url(folder, state=state).replace(_secrets(folder)["postgres_password"], "***")
    return out


def spark_conf(state: dict) -> dict:
    """Spark settings of a job on this cluster: every worker's core, executors of the configured size."""
    cfg = state["config"]
    return {"spark.executor.memory": cfg["executor_memory"], "spark.executor.cores": str(cfg["worker_cores"]),
            "spark.cores.max": str(cfg["workers"] * cfg["worker_cores"])}


def env(folder=DEFAULT_DIR, database: str = DB_NAME) -> dict:
    """Environment variables that point mjoin and Airflow at this cluster (the cluster profile's resources)."""
    state = load(folder)
    if not state.get("config"):
        raise ClusterError(f"no cluster started from {folder} (make cluster-up)")
    conf = spark_conf(state)
    out = {
        "MJOIN_SPARK_MASTER": master_url(state),
        "MJOIN_SPARK_CONF": ",".join(f"{k}={v}" for k, v in conf.items()),
        "MJOIN_SHUFFLE_PARTITIONS": str(2 * state["config"]["workers"] * state["config"]["worker_cores"]),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": f"spark://{HOST}",
                                                  "port": state["config"]["master_port"]}),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        # a task's supervisor waits this long for the api-server (default 5 s: timed out on 2 busy cores)
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "30",
        # drivers bind the loopback too (else Spark picks the host's first interface address)
        "SPARK_LOCAL_IP": HOST,
    }
    if state["config"].get("postgres", True):
        out["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = db_url(folder, database, state)
    return out
