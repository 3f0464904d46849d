"""docker-compose.yml against the code (no Docker engine runs here: the file is checked, not a running compose):
service names, the Spark connection, the environment the code reads, the shared lake, ports, the native
cluster's sizes, and no secret in the file."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from mjoin.runtime.cluster import ClusterConfig
from mjoin.runtime.resources import Resources

PROJECT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((PROJECT / "docker-compose.yml").read_text())
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
    for name, svc in SERVICES.items():
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
