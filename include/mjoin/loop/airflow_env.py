"""The environment Airflow runs in for this project (no Airflow import here).

One definition used by ``make airflow``, ``make demo``, ``python -m mjoin airflow-cli``,
the DAG tests and the docs: a project-local ``AIRFLOW_HOME`` with SQLite, our ``dags/`` and
``plugins/``, no examples, DAGs not paused at creation, parallelism sized for 2 cores, task processes forked
from a scheduler forkserver that has the heavy libraries imported (:data:`PRELOAD`), the venv's ``bin/``
first on PATH (``spark-submit`` and ``airflow`` live there), and a default
``spark_default`` connection whose host is the Spark master (``local[*]``);
on a cluster, define the connection in Airflow instead (it wins over this
default only if you remove ``AIRFLOW_CONN_SPARK_DEFAULT`` from the environment).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

from mjoin.runtime.resources import PROJECT_DIR

DEFAULT_HOME = PROJECT_DIR / ".airflow"
#: SQLite connection arguments of the embedded profile (``[database] sql_alchemy_connect_args``): wait up to
#: 60 s for a lock instead of sqlite3's 5 s, so a CLI command or an API call made while the scheduler and the
#: dag-processor write does not fail with "database is locked" (a 500 from the api-server)
SQLITE_CONNECT_ARGS = {"timeout": 60}
SQLITE_CONNECT_ARGS_ASYNC = {"timeout": 60}
#: imported once by the scheduler's forkserver (``[scheduler] mp_forkserver_preload``), inherited by every task
#: process: Airflow's task runner and the Spark provider, what plugins/mjoin_plugin.py imports (every task loads the
#: plugins: ~1 s of CPU each for Airflow's FastAPI app), and the libraries the gate and forecast tasks import
#: (in this order: great-expectations imported before Airflow configures logging does not log ~150 INFO lines)
#: Python warnings Airflow's own imports emit at every start that no user can act on (Airflow's FastAPI test-client
#: import asks for ``httpx2``): filtered by message, so that the warnings left are ones to read
QUIET_WARNINGS = ("ignore:Using `httpx` with `starlette.testclient` is deprecated",)
#: the JWT signing secret's length: Airflow's generated one (16 random bytes, 24 characters) is below the 64 bytes
#: PyJWT asks of an HS512 key, which it says in a warning at every token
JWT_SECRET_BYTES = 64
#: other lakes the mjoin page shows beside MJOIN_LAKE (``{name: root}``, e.g. the demo's), in AIRFLOW_HOME
LAKES_FILE = "mjoin_lakes.json"
PRELOAD = ("pandas", "great_expectations", "statsmodels.tsa.holtwinters", "airflow.executors.local_executor",
           "airflow.sdk.execution_time.task_runner", "airflow.providers.apache.spark.operators.spark_submit",
           "airflow.api_fastapi.app", "fastapi")


def airflow_env(home: str | os.PathLike | None = None, lake: str | None = None, base: dict | None = None) -> dict:
    """Environment variables for running Airflow (and the Spark jobs it submits) on this project."""
    env = dict(os.environ if base is None else base)
    venv_bin = str(Path(sys.executable).parent)
    home = str(home or env.get("AIRFLOW_HOME") or DEFAULT_HOME)
    env.update({
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_DIR / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_DIR / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        # embedded profile: a new DAG is not paused, so mjoin_reoptimize runs on its schedule as soon as Airflow is up
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": env.get("AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION", "False"),
        "AIRFLOW__CORE__PARALLELISM": env.get("AIRFLOW__CORE__PARALLELISM", "4"),
        "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": env.get("AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG", "2"),
        "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": env.get("AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL", "10"),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": env.get("AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL", "10"),
        "AIRFLOW__API__PORT": env.get("AIRFLOW__API__PORT", "8080"),
        # the embedded profile serves this machine only (its simple auth manager keeps passwords in plain text):
        # listening on 0.0.0.0 also made the auth manager warn at every start that the setup "looks like production"
        "AIRFLOW__API__HOST": env.get("AIRFLOW__API__HOST", "127.0.0.1"),
        # the LocalExecutor's workers start from a forkserver that has imported the libraries the tasks use, and
        # each task is forked from a worker: a gate task no longer imports great-expectations itself (~3.6 s of
        # CPU each, four gates a run), nor a forecast statsmodels (PRELOAD; our own mjoin code is not preloaded,
        # so an edited include/mjoin takes effect at the next task without restarting the scheduler)
        "AIRFLOW__SCHEDULER__MP_START_METHOD": env.get("AIRFLOW__SCHEDULER__MP_START_METHOD", "forkserver"),
        "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD": env.get("AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD",
                                                             ",".join(PRELOAD)),
        # a task reports to the api-server's execution API; Airflow's 5 attempts (~6 s) failed the first scheduled
        # run of `make airflow` on a loaded machine, whose api-server was not listening yet: 10 attempts with
        # Airflow's random exponential back-off wait a few minutes
        "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": env.get("AIRFLOW__WORKERS__EXECUTION_API_RETRIES", "10"),
        "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONWARNINGS": ",".join(filter(None, [env.get("PYTHONWARNINGS", ""), *QUIET_WARNINGS])),
    })
    if env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite").startswith("sqlite"):  # the embedded SQLite database
        env.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS", "mjoin.loop.airflow_env.SQLITE_CONNECT_ARGS")
        env.setdefault("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC", "mjoin.loop.airflow_env.SQLITE_CONNECT_ARGS_ASYNC")
    env.setdefault("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": env.get("MJOIN_SPARK_MASTER", "local[*]")}))
    if lake:
        env["MJOIN_LAKE"] = str(lake)
    return env


def airflow_cmd(args: list[str], env: dict, check: bool = True, capture: bool = False, timeout: float | None = None):
    """Run ``airflow <args>`` with the project's environment."""
    exe = str(Path(sys.executable).parent / "airflow")
    return subprocess.run([exe, *args], env=env, check=check, text=True, timeout=timeout,
                          stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT if capture else None)


def ensure_db(env: dict) -> None:
    """Create or upgrade the SQLite metadata database (idempotent, ~3 s), with a JWT secret long enough."""
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    airflow_cmd(["db", "migrate"], env, capture=True)
    strengthen_jwt_secret(env)


def strengthen_jwt_secret(env: dict) -> bool:
    """Replace a ``[api_auth] jwt_secret`` shorter than :data:`JWT_SECRET_BYTES` in ``$AIRFLOW_HOME/airflow.cfg``
    (Airflow writes 24 characters there on its first start) by a random one of that length; True if replaced.
    In the config file, not the environment, so every Airflow process of the home signs and checks tokens with
    the same key, however it was started. Left alone when ``AIRFLOW__API_AUTH__JWT_SECRET`` is set (a cluster or
    compose setup brings its own). Run before the components start: they read the key once."""
    if env.get("AIRFLOW__API_AUTH__JWT_SECRET"):
        return False
    cfg = Path(env["AIRFLOW_HOME"]) / "airflow.cfg"
    if not cfg.exists():
        return False
    text = cfg.read_text()
    m = re.search(r"^jwt_secret = (.*)$", text, flags=re.M)
    if m is None or len(m.group(1).strip().encode()) >= JWT_SECRET_BYTES:
        return False
    new = secrets.token_urlsafe(JWT_SECRET_BYTES)  # 86 characters
    tmp = cfg.with_name(cfg.name + ".tmp")
    tmp.write_text(text[: m.start(1)] + new + text[m.end(1):])
    os.chmod(tmp, cfg.stat().st_mode)
    os.replace(tmp, cfg)
    return True


def register_lake(env: dict, name: str, root: str) -> None:
    """Show lake ``root`` as ``name`` on the mjoin page of this Airflow home (:data:`LAKES_FILE`)."""
    path = Path(env["AIRFLOW_HOME"]) / LAKES_FILE
    lakes = registered_lakes(env["AIRFLOW_HOME"])
    lakes[name] = str(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(lakes, indent=2))
    os.replace(tmp, path)


def registered_lakes(home) -> dict:
    """``{name: root}`` of the lakes registered with the Airflow home ``home`` (none: {})."""
    try:
        doc = json.loads((Path(home) / LAKES_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return {}
    return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


def admin_password(env: dict) -> str | None:
    """The simple auth manager's generated admin password (exists once the api-server has started)."""
    path = Path(env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("admin")
