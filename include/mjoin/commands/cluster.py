"""python -m mjoin cluster: a Spark standalone cluster and Airflow's PostgreSQL on this machine (make cluster-up)."""
from __future__ import annotations

import json
import shlex

from mjoin.commands import UserError
from mjoin.runtime import cluster
from mjoin.runtime.cluster import DEFAULT_DIR, ClusterConfig

NAME = "cluster"
HELP = "start, stop or check a native cluster: Spark standalone master + workers, PostgreSQL for Airflow"
DESCRIPTION = """The topology of docker-compose.yml without Docker, on 127.0.0.1: a Spark standalone
master and workers from the pip pyspark, and PostgreSQL (Debian's postgresql package) as Airflow's
metadata database. Processes, logs and the generated database password live in --dir (default
<project>/.cluster); `down` stops exactly the processes `up` started, by pid.

  python -m mjoin cluster up                 # make cluster-up
  eval "$(python -m mjoin cluster env)"      # point mjoin and Airflow at it (LocalExecutor)
  python -m mjoin cluster status
  python -m mjoin cluster down               # make cluster-down

Exit codes: 0 ok (status: the cluster is up), 1 status: not up, 2 a component could not start."""


def add_arguments(p):
    d = ClusterConfig()
    p.add_argument("action", choices=("up", "down", "status", "env"))
    p.add_argument("--dir", default=str(DEFAULT_DIR), help=f"state, logs and data (default {DEFAULT_DIR})")
    p.add_argument("--workers", type=int, default=d.workers, help=f"Spark workers (default {d.workers})")
    p.add_argument("--worker-cores", type=int, default=d.worker_cores, help=f"cores per worker (default {d.worker_cores})")
    p.add_argument("--worker-memory", default=d.worker_memory, help=f"memory per worker (default {d.worker_memory})")
    p.add_argument("--executor-memory", default=d.executor_memory,
                   help=f"spark.executor.memory of jobs (cluster env; default {d.executor_memory})")
    p.add_argument("--master-port", type=int, default=d.master_port, help=f"default {d.master_port}")
    p.add_argument("--master-ui-port", type=int, default=d.master_ui_port, help=f"default {d.master_ui_port}")
    p.add_argument("--pg-port", type=int, default=d.pg_port, help=f"PostgreSQL port (default {d.pg_port})")
    p.add_argument("--no-postgres", dest="postgres", action="store_false", help="Spark only")
    p.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args) -> int:
    try:
        if args.action == "up":
            cfg = cluster.ClusterConfig(master_port=args.master_port, master_ui_port=args.master_ui_port,
                                        workers=args.workers, worker_cores=args.worker_cores,
                                        worker_memory=args.worker_memory, executor_memory=args.executor_memory,
                                        pg_port=args.pg_port, postgres=args.postgres)
            info = cluster.up(args.dir, cfg)
        elif args.action == "down":
            stopped = cluster.down(args.dir)
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
            return 0
        elif args.action == "env":
            for k, v in cluster.env(args.dir).items():
                print(f"export {k}={shlex.quote(v)}")
            return 0
        else:
            info = cluster.status(args.dir)
    except cluster.ClusterError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        if info["up"]:
            print(f"cluster up: {info['master_url']} ({info['alive_workers']} workers, {info['cores']} cores; "
                  f"UI {info['master_ui']})" + (f", Airflow DB {info['db_url']}" if info.get("db_url") else ""))
        else:
            print(f"cluster not up: {info['problem']}")
    return 0 if info["up"] else 1
