"""python -m mjoin spark-connect: a long-lived Spark Connect server for the statistics step."""
from __future__ import annotations

import json

from mjoin.commands import UserError
from mjoin.runtime.connect_server import DEFAULT_DIR, DEFAULT_PORT, ConnectServerError, start, status, stop

NAME = "spark-connect"
HELP = "start, stop or check a local Spark Connect server (a warm Spark session for the DAGs' statistics)"
DESCRIPTION = """A DAG run's statistics cost ~1-2 s of Spark work, but a fresh spark-submit adds ~10 s
of start-up. A Spark Connect server keeps one warm session; with
MJOIN_SPARK_REMOTE=sc://localhost:PORT set where Airflow (or `python -m mjoin stats`) runs,
the statistics job connects to it instead. Example:

  python -m mjoin spark-connect start            # prints the URL to export
  export MJOIN_SPARK_REMOTE=sc://localhost:15002
  python -m mjoin spark-connect stop

The server uses MJOIN_SPARK_MASTER (default local[*]) and this checkout's include/ for its
Python workers; its log is in <dir>/server.log."""


def add_arguments(p):
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"gRPC port (default {DEFAULT_PORT})")
    p.add_argument("--dir", default=str(DEFAULT_DIR), help=f"state and log folder (default {DEFAULT_DIR})")
    p.add_argument("--driver-memory", default="4g", help="the server's driver memory (default 4g)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args) -> int:
    try:
        if args.action == "start":
            info = start(args.dir, args.port, driver_memory=args.driver_memory)
        elif args.action == "stop":
            info = stop(args.dir)
            info = {**info, "stopped": info["state"] != "stopped"}
        else:
            info = status(args.dir)
    except ConnectServerError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps(info, indent=1))
    elif args.action == "start":
        print(f"Spark Connect server running (pid {info['pid']}, log {info['log']})\n"
              f"  export MJOIN_SPARK_REMOTE={info['url']}")
    elif args.action == "stop":
        print(f"stopped the server (pid {info['pid']})" if info["stopped"] else "no server was running")
    else:
        print(info["state"] + (f": pid {info['pid']}, {info['url']}, log {info['log']}" if "pid" in info else ""))
    return 0 if args.action != "status" or info["state"] in ("running", "stopped") else 1
