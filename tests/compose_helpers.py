"""The compose deployment (docker-compose.yml) brought up for real, for the tests marked `compose`.

:class:`Deployment` does what a user does, in a copy of the working tree (so a developer's own ``.env`` and
volumes are never touched): ``cp .env.example .env`` with every ``replace-me`` replaced by a fresh secret, then
``docker compose up -d --build``. Two things differ, both allowed by the deployment itself: the base images
(``MJOIN_BASE_IMAGE`` and ``MJOIN_POSTGRES_IMAGE``: the local Debian bases of docker/local-base.sh where Docker
Hub cannot be reached) and docker-compose.host.yml (every service on the host's loopback). The project name is
``mjoin-compose-test``, apart from a user's deployment; :meth:`Deployment.down` removes its containers and volumes
(``down -v``) and reports whatever of it is left.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
FILES = ("docker-compose.yml", "docker-compose.host.yml")
NAME = "mjoin-compose-test"
SCHEDULER = "airflow-scheduler"


def engine_problem() -> str | None:
    """Why the deployment cannot be brought up here (no Docker engine, no `docker compose` v2), or None."""
    why = os.environ.get("MJOIN_COMPOSE_UNAVAILABLE")
    if why:
        return why
    if not shutil.which("docker"):
        return "no docker client on PATH (CI: docker/engine.sh install)"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True)
    if info.returncode != 0:
        return f"no Docker engine answers ({(info.stderr or info.stdout).strip()[:200]}); CI: docker/engine.sh start"
    version = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True, text=True)
    if version.returncode != 0:
        return "`docker compose` (v2) is missing: docker/engine.sh install"
    return None


def base_images() -> dict:
    """``MJOIN_BASE_IMAGE`` and ``MJOIN_POSTGRES_IMAGE``: as set in the environment (e.g. the public
    python:3.11-slim-bookworm and postgres:16 where Docker Hub answers), else the local bases
    docker/local-base.sh makes (cached)."""
    if os.environ.get("MJOIN_BASE_IMAGE") and os.environ.get("MJOIN_POSTGRES_IMAGE"):
        return {k: os.environ[k] for k in ("MJOIN_BASE_IMAGE", "MJOIN_POSTGRES_IMAGE")}
    proc = subprocess.run(["bash", str(PROJECT / "docker" / "local-base.sh")], capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"docker/local-base.sh failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return dict(re.findall(r"^(MJOIN_[A-Z_]+_IMAGE)=(\S+)$", proc.stdout, re.M))


def working_tree_files() -> list[str]:
    """The working tree's files a clone would hold: tracked ones and new ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=PROJECT,
                         capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (PROJECT / p).is_file()]


class Deployment:
    """One compose project in ``workdir`` (a copy of the working tree)."""

    def __init__(self, workdir: Path, images: dict, log: Path):
        self.dir = Path(workdir)
        self.log = Path(log)
        for rel in working_tree_files():
            dst = self.dir / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(PROJECT / rel, dst)
        # what the user does: cp .env.example .env, then a secret of their own for every value
        shutil.copy(self.dir / ".env.example", self.dir / ".env")
        text = (self.dir / ".env").read_text()
        (self.dir / ".env").write_text(re.sub(r"=replace-me$", lambda _: "=" + secrets.token_urlsafe(24), text,
                                              flags=re.M))
        self.env = {**os.environ, **images, "COMPOSE_PROJECT_NAME": NAME}
        for k in ("POSTGRES_PASSWORD", "AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY"):
            self.env.pop(k, None)  # from .env only

    def compose(self, *args, check: bool = True, timeout: float = 900, capture: bool = True,
                input: str | None = None) -> subprocess.CompletedProcess:
        cmd = ["docker", "compose"] + [a for f in FILES for a in ("-f", f)] + list(args)
        proc = subprocess.run(cmd, cwd=self.dir, env=self.env, capture_output=capture, text=True, timeout=timeout,
                              input=input)
        with open(self.log, "a") as fh:
            fh.write(f"\n==== {' '.join(cmd)} (exit {proc.returncode})\n{proc.stdout or ''}{proc.stderr or ''}")
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[2 + 2 * len(FILES):])} failed (exit {proc.returncode}):\n"
                               f"{(proc.stdout or '')[-2000:]}{(proc.stderr or '')[-3000:]}")
        return proc

    def up(self) -> None:
        """``docker compose up -d --build``, what the user types; first the leftovers of an earlier test run that
        was killed before its ``down -v`` (its PostgreSQL volume holds another run's secrets: airflow-init could
        not log in). A failed ``up`` says why with the logs of the services that ended."""
        self.compose("down", "-v", "--remove-orphans", check=False, timeout=600)
        try:
            self.compose("up", "-d", "--build", timeout=3600)
        except RuntimeError as exc:
            ended = [s for s, v in self.services().items() if v["state"] == "exited" and v["exit"] != 0]
            raise RuntimeError(f"{exc}\nlogs of the services that ended: {ended}\n{self.logs(*ended)}") from None

    def services(self) -> dict:
        """Service -> its container's state, health and exit code (``docker compose ps -a``)."""
        out = self.compose("ps", "-a", "--format", "json").stdout.strip()
        rows = json.loads(out) if out.startswith("[") else [json.loads(x) for x in out.splitlines() if x.strip()]
        return {r["Service"]: {"state": r["State"], "health": r.get("Health") or "", "exit": r.get("ExitCode")}
                for r in rows}

    def wait_healthy(self, expected: set, timeout: float = 600) -> dict:
        """Until every service with a health check is healthy, every other one running, and airflow-init has
        exited 0; fails early if a service exited otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.services()
            bad = {s: v for s, v in got.items() if v["state"] == "exited" and (s != "airflow-init" or v["exit"] != 0)}
            if bad:
                raise RuntimeError(f"services exited: {bad}\n{self.logs(*bad)}")
            ready = {s for s, v in got.items() if v["health"] == "healthy" or (v["state"] == "running" and not v["health"])
                     or (s == "airflow-init" and v["state"] == "exited" and v["exit"] == 0)}
            if ready >= expected:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"not healthy within {timeout:.0f} s: {got}")
            time.sleep(3)

    def logs(self, *services, tail: int = 40) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), *services, check=False).stdout[-6000:]

    def exec(self, *cmd, service: str = SCHEDULER, env: dict | None = None, check: bool = True,
             timeout: float = 900) -> subprocess.CompletedProcess:
        opts = [a for k, v in (env or {}).items() for a in ("-e", f"{k}={v}")]
        return self.compose("exec", "-T", *opts, service, *cmd, check=check, timeout=timeout)

    def python_json(self, code: str, service: str = SCHEDULER):
        """Run ``code`` with the image's Python in ``service``; the JSON its last line prints."""
        out = self.exec("python", "-c", code, service=service).stdout
        return json.loads(out.strip().splitlines()[-1])

    def airflow_json(self, *args):
        """An ``airflow ... -o json`` command in the scheduler's container: the JSON it printed last."""
        out = self.exec("airflow", *args, "-o", "json").stdout
        for line in reversed(out.strip().splitlines()):
            if line.startswith(("[", "{")):
                return json.loads(line)
        raise ValueError(f"no JSON in: {out[-1000:]}")

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def container_pids(self, service: str) -> dict:
        """Host pid -> (the pid inside the container's namespace, command line) of ``service``'s processes."""
        cid = self.container(service)
        rows = subprocess.run(["docker", "top", cid, "-eo", "pid"], capture_output=True, text=True,
                              check=True).stdout.split()[1:]
        out = {}
        for pid in rows:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            ns = re.search(r"^NSpid:\s+(.*)$", status, re.M)
            out[int(pid)] = (int(ns.group(1).split()[-1]) if ns else int(pid), cmd)
        return out

    def down(self) -> list[str]:
        """``docker compose down -v``; then what of the project is left (containers, volumes, networks)."""
        self.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=600)
        left = []
        for kind in ("container", "volume", "network"):
            args = ["docker", kind, "ls", "-q"] + (["-a"] if kind == "container" else [])
            out = subprocess.run(args + ["--filter", f"label=com.docker.compose.project={NAME}"], capture_output=True,
                                 text=True).stdout.split()
            left += [f"{kind} {x}" for x in out]
        return left
