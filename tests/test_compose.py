"""The compose deployment (docker-compose.yml, docker/Dockerfile): first checked against the code (service names,
the Spark connection, the environment the code reads, the shared lake, ports, the native cluster's sizes, the
test-only host-network override, no secret in the files), then brought up for real by the test marked `compose`
(`make test-compose`, where a Docker engine runs; skipped with the reason elsewhere): tests/compose_helpers.py."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from compose_helpers import NAME, Deployment, base_images, engine_problem
from mjoin.engine.metrics import git_commit, machine
from mjoin.lake.layout import Lake
from mjoin.model.timeutil import parse_time
from mjoin.runtime import cluster
from mjoin.runtime.cluster import ClusterConfig
from mjoin.runtime.resources import Resources

PROJECT = Path(__file__).resolve().parent.parent


class _ComposeLoader(yaml.SafeLoader):
    """YAML with compose's ``!reset`` tag (an override's way to drop a value): loaded as RESET."""


RESET = "!reset"
_ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)
COMPOSE = yaml.load((PROJECT / "docker-compose.yml").read_text(), Loader=_ComposeLoader)
HOST = yaml.load((PROJECT / "docker-compose.host.yml").read_text(), Loader=_ComposeLoader)
SERVICES = COMPOSE["services"]
MJOIN_IMAGE = [n for n, s in SERVICES.items() if s.get("image") == "mjoin:latest"]
AIRFLOW = [n for n in SERVICES if n.startswith("airflow-")]
WORKERS = sorted(n for n in SERVICES if n.startswith("spark-worker"))
VAR = re.compile(r"\$\{([A-Z0-9_]+)(:?[?-][^}]*)?\}")


def _env(name: str) -> dict:
    env = SERVICES[name].get("environment") or {}
    return {k: str(v) for k, v in env.items()}


def _arg(cmd: list, flag: str, default=None):
    return cmd[cmd.index(flag) + 1] if flag in cmd else default


def test_services_match_the_topology():
    assert set(SERVICES) == {"postgres", "spark-master", *WORKERS, "airflow-init", "airflow-api", "airflow-scheduler",
                             "airflow-dag-processor", "airflow-triggerer"}
    assert len(WORKERS) == ClusterConfig().workers == 2  # the native cluster's two workers
    assert SERVICES["spark-master"]["command"][:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    for w in WORKERS:
        env = _env(w)
        assert SERVICES[w]["command"][:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]
        assert (int(env["SPARK_WORKER_CORES"]), env["SPARK_WORKER_MEMORY"]) == \
            (ClusterConfig().worker_cores, ClusterConfig().worker_memory)
    for a in AIRFLOW:
        assert SERVICES[a]["command"][0] == "airflow" and _env(a) == _env("airflow-api")  # one environment
    assert {"api-server", "scheduler", "dag-processor", "triggerer"} == \
        {SERVICES[a]["command"][1] for a in AIRFLOW if a != "airflow-init"}


def test_spark_connection_points_at_the_master():
    cmd = SERVICES["spark-master"]["command"]
    host, port = _arg(cmd, "--host"), int(_arg(cmd, "--port", 7077))
    url = f"spark://{host}:{port}"
    assert host == "spark-master" and port == ClusterConfig().master_port
    env = _env("airflow-api")
    assert env["MJOIN_SPARK_MASTER"] == url
    conn = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])  # what SparkSubmitOperator(conn_id="spark_default") uses
    assert conn["conn_type"] == "spark" and f"{conn['host']}:{conn['port']}" == url
    for w in WORKERS:
        assert SERVICES[w]["command"][2] == url
    assert f"{port}:{port}" in SERVICES["spark-master"]["ports"]
    ui = _arg(cmd, "--webui-port", "8080")
    assert f"{ClusterConfig().master_ui_port}:{ui}" in SERVICES["spark-master"]["ports"]  # same UI port as native


def test_environment_is_what_the_code_reads():
    env = _env("airflow-api")
    read = set(re.findall(r'"(MJOIN_[A-Z_]+)"', (PROJECT / "include/mjoin/runtime/resources.py").read_text()))
    assert {k for k in env if k.startswith("MJOIN_")} <= read, "compose sets a variable mjoin never reads"
    res = Resources.from_env(env)
    assert (res.profile, res.lake, res.spark_master) == ("cluster", "/lake", env["MJOIN_SPARK_MASTER"])
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    db = re.match(r"postgresql\+psycopg2://([^:]+):(.+)@([^:/]+):(\d+)/(\w+)$", env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    pg = _env("postgres")
    assert db and (db.group(1), db.group(3), db.group(5)) == (pg["POSTGRES_USER"], "postgres", pg["POSTGRES_DB"])
    assert VAR.fullmatch(db.group(2)) and VAR.fullmatch(db.group(2)).group(1) == VAR.fullmatch(
        pg["POSTGRES_PASSWORD"]).group(1)
    # the folders the image holds (docker/Dockerfile: WORKDIR /opt/mjoin, COPY dags, plugins)
    docker = (PROJECT / "docker/Dockerfile").read_text()
    assert "WORKDIR /opt/mjoin" in docker and "COPY dags dags" in docker and "COPY plugins plugins" in docker
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/mjoin/dags"
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == "/opt/mjoin/plugins"
    assert "docker/requirements-cluster.txt" in docker  # the PostgreSQL drivers `make cluster-up` installs too


def test_every_mjoin_process_sees_the_lake_where_mjoin_lake_says():
    lake = _env("airflow-api")["MJOIN_LAKE"]
    assert set(MJOIN_IMAGE) == set(SERVICES) - {"postgres"}
    for name in MJOIN_IMAGE:  # workers too: their executors write state and results into it
        assert f"lake:{lake}" in SERVICES[name]["volumes"], name
    assert "lake" in COMPOSE["volumes"] and "pgdata:/var/lib/postgresql/data" in SERVICES["postgres"]["volumes"]


def test_api_port_and_execution_api_agree():
    env = _env("airflow-api")
    port = _arg(SERVICES["airflow-api"]["command"], "--port")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"http://airflow-api:{port}/execution/"
    assert f"8080:{port}" in SERVICES["airflow-api"]["ports"]


def test_no_secrets_in_the_file_and_every_variable_in_env_example():
    secretish = re.compile(r"PASSWORD|SECRET|FERNET|TOKEN|KEY", re.I)
    used = set()
    for name, svc in [*SERVICES.items(), *HOST["services"].items()]:  # the test-only override too
        for k, v in (svc.get("environment") or {}).items():
            v = str(v)
            used |= {m.group(1) for m in VAR.finditer(v)}
            if secretish.search(k) and k not in ("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",):
                assert VAR.fullmatch(v), f"{name}: {k} holds a literal value, not a ${{VAR}} from .env"
    assert {"POSTGRES_PASSWORD", "AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY"} <= used
    example = dict(line.split("=", 1) for line in (PROJECT / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert used <= set(example), f"missing from .env.example: {used - set(example)}"
    assert all(v == "replace-me" for v in example.values())
    ignored = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=PROJECT)
    assert ignored.returncode == 0, ".env must be git-ignored"


def test_one_image_built_once_from_a_base_chosen_by_an_argument():
    built = [n for n, svc in SERVICES.items() if "build" in svc]
    assert built == ["spark-master"]  # one build; every other mjoin service runs that image, never pulls it
    assert all(SERVICES[n].get("pull_policy") == "never" for n in MJOIN_IMAGE)
    build = SERVICES["spark-master"]["build"]
    assert (build["context"], build["dockerfile"]) == (".", "docker/Dockerfile")
    assert build["args"]["BASE_IMAGE"] == "${MJOIN_BASE_IMAGE:-python:3.11-slim-bookworm}"
    assert SERVICES["postgres"]["image"] == "${MJOIN_POSTGRES_IMAGE:-postgres:16}"
    docker = (PROJECT / "docker/Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim-bookworm" in docker and "FROM ${BASE_IMAGE} AS deps" in docker
    assert "# syntax" not in docker  # a syntax directive pulls a frontend image from Docker Hub
    # the test tools left out of the image are test tools: nothing the image runs imports them
    left_out = set(re.search(r"grep -vE '\^\(([^)]*)\)==' requirements.txt", docker).group(1).split("|"))
    pinned = {line.split("==")[0] for line in (PROJECT / "requirements.txt").read_text().splitlines() if "==" in line}
    assert left_out == {"pytest", "pytest-xdist", "hypothesis", "import-linter", "selenium"} and left_out <= pinned
    shipped = [p for d in ("include", "dags", "plugins", "jobs") for p in (PROJECT / d).rglob("*.py")]
    imports = re.compile(r"^\s*(?:import|from)\s+(pytest|xdist|hypothesis|importlinter|selenium)\b", re.M)
    assert not [str(p) for p in shipped if imports.search(p.read_text())]


def test_environment_is_the_native_clusters():
    """The Spark settings and Airflow's task timeout are those `python -m mjoin cluster env` gives the native
    cluster of the same sizes."""
    env = _env("airflow-api")
    conf = cluster.spark_conf({"config": vars(ClusterConfig())})
    assert env["MJOIN_SPARK_CONF"] == ",".join(f"{k}={v}" for k, v in conf.items())
    assert int(env["MJOIN_SHUFFLE_PARTITIONS"]) == 2 * ClusterConfig().workers * ClusterConfig().worker_cores
    assert env["AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"] == "30"
    for name, svc in SERVICES.items():
        long_running = name != "airflow-init"
        assert (svc.get("restart") == "unless-stopped") == long_running, name
        assert ("healthcheck" in svc) == long_running, name


def test_host_override_keeps_every_service_on_the_loopback():
    """docker-compose.host.yml: every service on the host network, every address a loopback one, every port
    distinct and away from the native cluster's and Airflow's defaults, no published port, and the environment it
    changes only what the host network changes."""
    over = HOST["services"]
    assert set(over) == set(SERVICES)
    assert all(svc["network_mode"] == "host" for svc in over.values())
    assert over["spark-master"]["build"] == {"network": "host"}
    assert all(over[n].get("ports") == RESET for n, svc in SERVICES.items() if "ports" in svc)
    text = (PROJECT / "docker-compose.host.yml").read_text()
    body = text[text.index("x-env:"):]
    hosts = set(re.findall(r"\b(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3})\b", body))
    assert hosts and all(h.startswith("127.") for h in hosts), hosts
    assert not re.search(r"\b(spark-master|postgres|airflow-api):\d", body)  # no service name resolves there
    ports = [int(p) for p in re.findall(r"(?<![\d.])(1\d{4})(?!\d)", body)]
    native = {ClusterConfig().master_port, ClusterConfig().master_ui_port, ClusterConfig().pg_port, 8080, 5432}
    assert len(set(ports)) >= 11 and not set(ports) & native
    workers = {w: _arg(over[w]["command"], "--host") for w in WORKERS}
    assert len(set(workers.values())) == len(WORKERS) and "127.0.0.1" not in workers.values()  # one address each
    for w in WORKERS:
        assert over[w]["environment"]["SPARK_LOCAL_IP"] == workers[w]
        assert workers[w] in over[w]["healthcheck"]["test"][-1]
    changed = {k for n in AIRFLOW for k in over[n]["environment"]}
    assert changed - set(_env("airflow-api")) <= {"SPARK_LOCAL_IP", "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST",
                                                  "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT",
                                                  "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT",
                                                  "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"}
    env = over["airflow-api"]["environment"]
    master = _arg(over["spark-master"]["command"], "--host"), int(_arg(over["spark-master"]["command"], "--port"))
    assert env["MJOIN_SPARK_MASTER"] == "spark://%s:%d" % master
    conn = json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])
    assert f"{conn['host']}:{conn['port']}" == env["MJOIN_SPARK_MASTER"]
    assert all(w_cmd[2] == env["MJOIN_SPARK_MASTER"] for w_cmd in (over[w]["command"] for w in WORKERS))
    pg = over["postgres"]["command"]
    assert f"port={env['AIRFLOW__DATABASE__SQL_ALCHEMY_CONN'].rsplit(':', 1)[1].split('/')[0]}" in pg
    api = over["airflow-api"]["command"]
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == f"http://{_arg(api, '--host')}:{_arg(api, '--port')}/execution/"

# ---- the deployment brought up for real (marked `compose`: `make test-compose`) ------------------------------

QUERY = "tpcds_returns_by_address"
START = "2026-01-01T00:00:00Z"  # the replay's clock
LANDED_MINUTES = 16  # arrival cycles landed: 16 simulated minutes of a 20-minute sf 0.1 replay, 10-s cycles
BACKFILL = ("2026-01-01T00:10:00+00:00", "2026-01-01T00:15:00+00:00")  # two 5-minute periods: [5, 10), [10, 15)
FILES_PER_BATCH = 48  # ~384 landed files: batches 0..7
STREAM_NS, INTERVAL_OUT = "compose/stream", "/lake/compose/interval"
MASTER_UI = "http://127.0.0.1:18081/json/"  # docker-compose.host.yml's ports
API = "http://127.0.0.1:18080"


def _http_json(url: str, method: str = "GET", body=None, token: str | None = None, timeout: float = 30):
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"{}")


def _alive_workers() -> list[dict]:
    return [w for w in _http_json(MASTER_UI)["workers"] if w["state"] == "ALIVE"]


def _wait(what: str, check, timeout: float, every: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:.0f} s")
        time.sleep(every)


@pytest.fixture(scope="module")
def compose_engine():
    if not os.environ.get("MJOIN_COMPOSE_TEST"):
        pytest.skip("the compose deployment is brought up by `make test-compose` (MJOIN_COMPOSE_TEST=1): it builds "
                    "the image and runs the cluster in containers, minutes")
    why = engine_problem()
    if why:
        pytest.skip(f"compose deployment not brought up: {why}")


@pytest.mark.compose
@pytest.mark.slow
def test_compose_deployment_reoptimizes_streams_through_a_worker_kill_and_goes_down(compose_engine, tmp_path):
    """What a user does, for real: `cp .env.example .env` (fresh secrets), `docker compose up -d --build` (the
    local Debian bases and every service on the loopback: docker-compose.host.yml), every service healthy. Then,
    in the containers: a TPC-DS sf 0.1 replay landed into the lake volume; mjoin_reoptimize backfilled over two
    5-minute periods, run by the scheduler (LocalExecutor on PostgreSQL), each run's join and statistics
    spark-submitted to the master, each run deployed or reporting no change; the streaming join job on the master
    with both workers, every batch on the executors, the worker container running batch 1's task killed
    (SIGKILL) while the task runs, started again; its results equal the interval run's (count and fingerprint).
    Then `docker compose down -v` and nothing of the project is left."""
    timings = {}
    load_before = os.getloadavg()
    t = time.monotonic()
    images = base_images()
    timings["base images (cached when made before)"] = time.monotonic() - t
    dep = Deployment(tmp_path / "mjoin", images, tmp_path / "compose.log")
    stream_job, checked = None, False
    try:
        # ---- up, as the user types it, and healthy
        t = time.monotonic()
        dep.up()
        timings["up --build"] = time.monotonic() - t
        t = time.monotonic()
        dep.wait_healthy(set(SERVICES), timeout=900)
        timings["up to healthy"] = time.monotonic() - t
        health = _http_json(f"{API}/api/v2/monitor/health")
        assert {k: v["status"] for k, v in health.items() if isinstance(v, dict) and "status" in v} == {
            "metadatabase": "healthy", "scheduler": "healthy", "triggerer": "healthy", "dag_processor": "healthy"}
        assert len(_alive_workers()) == 2
        image = json.loads(subprocess.run(["docker", "image", "inspect", "mjoin:latest"], capture_output=True,
                                          text=True, check=True).stdout)[0]
        timings["image size (MB)"] = image["Size"] / 1e6
        # no secret of .env in the image: not in its configuration, not among its files, and it runs as a user
        env_values = [line.split("=", 1)[1] for line in (dep.dir / ".env").read_text().splitlines()
                      if line and not line.startswith("#")]
        history = subprocess.run(["docker", "image", "history", "--no-trunc", "mjoin:latest"], capture_output=True,
                                 text=True, check=True).stdout
        assert not [v for v in env_values if v in json.dumps(image) or v in history]
        assert dep.exec("sh", "-c", "id -u; ls -A /opt/mjoin").stdout.split()[0] == "50000"
        assert ".env" not in dep.exec("ls", "-A", "/opt/mjoin").stdout.split()
        t = time.monotonic()
        dep.exec("python", "-m", "mjoin", "--help")
        timings["exec python -m mjoin --help"] = time.monotonic() - t

        # ---- a landed TPC-DS sf 0.1 lake in the lake volume
        t = time.monotonic()
        dep.exec("python", "-m", "mjoin", "generate", "tpcds", "--sf", "0.1", "--duration", "20m", "--start", START,
                 "--out", "/lake/workloads/tpcds")
        dep.exec("python", "-m", "mjoin", "land", "--workload", "/lake/workloads/tpcds", "--lake", "/lake",
                 "--until", f"+{LANDED_MINUTES}m")
        timings["generate + land"] = time.monotonic() - t

        # ---- mjoin_reoptimize on the scheduler: a backfill of two periods over the landed lake
        token = _http_json(f"{API}/auth/token", "POST", {
            "username": "admin", "password": json.loads(dep.exec(
                "cat", "/opt/airflow/simple_auth_manager_passwords.json.generated", service="airflow-api").stdout)[
                "admin"]})["access_token"]
        _wait("mjoin_reoptimize parsed", lambda: _try(lambda: _http_json(
            f"{API}/api/v2/dags/mjoin_reoptimize", token=token)), timeout=300)
        apps_before = {a["id"] for a in _http_json(MASTER_UI)["completedapps"]}
        conf = {"query": QUERY, "cycle": 10, "strategy": "exact"}
        created = dep.exec("airflow", "backfill", "create", "--dag-id", "mjoin_reoptimize", "--from-date", BACKFILL[0],
                           "--to-date", BACKFILL[1], "--dag-run-conf", json.dumps(conf)).stdout
        assert created.count("Created backfill Dag run") == 2, created[-2000:]
        # runs of a paused DAG do not start: unpaused for the backfill (its scheduled runs, on a live interval
        # with no landed data, fail their input gate), paused again after it
        dep.exec("airflow", "dags", "unpause", "mjoin_reoptimize")
        t = time.monotonic()
        runs_url = f"{API}/api/v2/dags/mjoin_reoptimize/dagRuns?limit=100"

        def backfill_done():
            runs = [r for r in _http_json(runs_url, token=token)["dag_runs"] if r["run_type"] == "backfill"]
            return len(runs) == 2 and all(r["state"] in ("success", "failed") for r in runs) and runs

        runs = _wait("the backfill's two runs finished", backfill_done, timeout=2400, every=15)
        timings["backfill, 2 periods"] = time.monotonic() - t
        dep.exec("airflow", "dags", "pause", "mjoin_reoptimize")
        assert [r["state"] for r in runs] == ["success", "success"], runs
        latencies, durations = [], []
        for r in runs:
            tis = {ti["task_id"]: ti for ti in _http_json(
                f"{API}/api/v2/dags/mjoin_reoptimize/dagRuns/{r['dag_run_id']}/taskInstances", token=token)[
                "task_instances"]}
            # cycle mode: one spark-submit joins the interval and then computes its statistics (jobs/join_stats.py)
            assert (tis["join"]["state"], tis["collect_statistics"]["state"]) == ("success", "skipped"), \
                {k: v["state"] for k, v in tis.items()}
            latencies += [(parse_time(ti["start_date"]) - parse_time(ti["queued_when"])).total_seconds()
                          for ti in tis.values() if ti.get("queued_when") and ti.get("start_date")]
            light = tis["join_mode"]  # a branch that only reads its input: the cost of running any task
            durations.append((parse_time(light["end_date"]) - parse_time(light["start_date"])).total_seconds())
        timings["task queued -> running, median"] = sorted(latencies)[len(latencies) // 2]
        timings["a light task (join_mode), running -> done, min"] = min(durations)
        outcomes = dep.python_json(
            "import json; from mjoin.lake.layout import Lake; from mjoin.loop.ui import read_outcomes; "
            "from mjoin.lake.registry import PlanRegistry; ns = Lake('/lake', 'eval/backfill'); "
            f"print(json.dumps({{'outcomes': read_outcomes(ns, {QUERY!r}), "
            f"'active': PlanRegistry(ns, {QUERY!r}).active_version()}}, default=str))")
        done = [o for o in outcomes["outcomes"] if o["run_type"] == "backfill"]
        assert sorted(o["status"] in ("deployed", "no_change") for o in done) == [True, True], done
        assert sorted(parse_time(o["interval_end"]) for o in done) == [parse_time(d) for d in BACKFILL]
        assert outcomes["active"] is not None
        apps = [a["name"] for a in _http_json(MASTER_UI)["completedapps"] if a["id"] not in apps_before]
        assert len(apps) >= 2, apps  # each run's join and statistics (one application) ran on the standalone master

        # ---- the streaming job on the master with both workers; the worker running batch 1's task killed
        lake = Lake("/lake", STREAM_NS)
        marker = f"{lake.checkpoints(QUERY)}/_control/fault_in_task-1.json"
        log, summary_file = open(tmp_path / "stream.log", "w"), open(tmp_path / "stream.json", "w")
        t = time.monotonic()
        stream_job = subprocess.Popen(
            ["docker", "compose", "-f", "docker-compose.yml", "-f", "docker-compose.host.yml", "exec", "-T",
             "airflow-scheduler", "python", "-m", "mjoin", "run", "--stream", "--query", QUERY, "--lake", "/lake",
             "--namespace", STREAM_NS, "--max-files-per-trigger", str(FILES_PER_BATCH), "--driver-rows", "0",
             "--inject-fault", "pause_in_task:1:900", "--json"],
            cwd=dep.dir, env=dep.env, stdout=summary_file, stderr=log)  # the summary alone on stdout, the logs apart

        def paused_task():
            if stream_job.poll() is not None:
                raise AssertionError(f"the job ended (exit {stream_job.returncode}) before batch 1's task paused:\n"
                                     f"{(tmp_path / 'stream.log').read_text()[-3000:]}")
            got = dep.exec("cat", marker, check=False)
            return got.returncode == 0 and json.loads(got.stdout)

        doc = _wait("batch 1's task paused on an executor", paused_task, timeout=900, every=3)
        committed = dep.python_json("import json; from mjoin.engine.results import committed_batches; "
                                    "from mjoin.lake.layout import Lake; "
                                    f"print(json.dumps(committed_batches(Lake('/lake', {STREAM_NS!r}), {QUERY!r})))")
        assert committed == [0]  # mid-run: batch 1 is not committed
        victims = [w for w in WORKERS if any(ns == doc["pid"] and "python" in cmd
                                             for ns, cmd in dep.container_pids(w).values())]
        assert len(victims) == 1, f"the task's process {doc['pid']} is in {victims}"
        dep.compose("kill", "-s", "SIGKILL", victims[0])
        assert dep.services()[victims[0]]["state"] == "exited"
        dep.compose("start", victims[0])  # the machine comes back: a new worker registers, a new executor there
        _wait("both workers alive again", lambda: len(_alive_workers()) == 2, timeout=300)
        assert stream_job.wait(timeout=1800) == 0, (tmp_path / "stream.log").read_text()[-3000:]
        timings["streaming job (with the kill)"] = time.monotonic() - t
        text = (tmp_path / "stream.json").read_text()
        summary = json.JSONDecoder().raw_decode(text[text.index("{"):])[0]
        files = dep.python_json("import json; from mjoin.lake.layout import Lake; from mjoin.model.query import "
                                f"load_query; q = load_query({QUERY!r}); print(sum(len(Lake('/lake').stream_files("
                                "s.source)) for s in q.streams))")
        assert summary["batches"] == list(range(-(-files // FILES_PER_BATCH))) and files > 2 * FILES_PER_BATCH, \
            (files, summary["batches"])
        assert not any(v.get("late") for v in summary["quarantined"].values()), summary["quarantined"]

        # ---- the interval run over the same landed files, and the comparison
        start = int(parse_time(START).timestamp())
        end = start + LANDED_MINUTES * 60 + 60
        t = time.monotonic()
        out = dep.exec("python", "-m", "mjoin", "run", "--query", QUERY, "--lake", "/lake", "--from", str(start - 3600),
                       "--to", str(end), "--cycle", str(end - start + 3600), "--out", INTERVAL_OUT, "--json").stdout
        timings["interval run"] = time.monotonic() - t
        interval = json.JSONDecoder().raw_decode(out[out.index("\n{") + 1 if "\n{" in out else out.index("{"):])[0]
        # the same rows rejected (NULL keys) by both, none lost to lateness by the stream
        assert sum(sum(v.values()) for v in summary["quarantined"].values()) == \
            sum(sum(v.values()) for v in interval["quarantined"].values()), (summary["quarantined"],
                                                                             interval["quarantined"])
        got = dep.python_json(
            "import json; from mjoin.engine.results import result_fingerprint; from mjoin.engine.metrics import "
            "read_metrics; from mjoin.lake.layout import Lake; ns = Lake('/lake', %r); "
            "print(json.dumps({'stream': result_fingerprint(ns, %r), 'interval': result_fingerprint(%r), "
            "'where': sorted({r['execution']['where'] for r in read_metrics(ns, %r)})}))"
            % (STREAM_NS, QUERY, f"{INTERVAL_OUT}/results/{QUERY}", QUERY))
        assert got["where"] == ["executors"]
        assert got["interval"]["rows"] > 1000 and got["stream"] == got["interval"], got
        checked = True  # every check above held (the results file says so)
    finally:
        if stream_job is not None and stream_job.poll() is None:
            stream_job.kill()
        t = time.monotonic()
        left = dep.down()
        timings["down -v"] = time.monotonic() - t
        print("compose timings: " + json.dumps({k: round(v, 1) for k, v in timings.items()}))
        if os.environ.get("MJOIN_COMPOSE_RESULTS"):  # `make test-compose COMPOSE_RESULTS=...`: kept as a benchmark
            _write_results(os.environ["MJOIN_COMPOSE_RESULTS"], timings, images, load_before,
                           passed=checked and left == [], left=left)
    assert left == [], f"left by `docker compose down -v` of {NAME}: {left}"


def _write_results(path: str, timings: dict, images: dict, load_before, passed: bool = False,
                   left: list | None = None) -> None:
    """The test's timings with the machine, its load, the versions, the commit and the date (a results file)."""
    def out(*cmd):
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()

    doc = {"benchmark": "compose deployment brought up (tests/test_compose.py)", "date":
           datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": git_commit(PROJECT),
           "machine": machine(), "load_before": list(load_before), "load_after": list(os.getloadavg()),
           "versions": {"docker_engine": out("docker", "version", "--format", "{{.Server.Version}}"),
                        "docker_compose": out("docker", "compose", "version", "--short")},
           "images": images, "seconds": {k: round(v, 1) for k, v in timings.items() if "MB" not in k},
           "image_size_mb": round(timings.get("image size (MB)", 0)),
           # written also when a check failed (the timings up to it): whether every check held and nothing was left
           "passed": passed, "left_after_down": left}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def _try(fn):
    try:
        return fn()
    except Exception:
        return None
