"""spark-submit entry point of the join engine (thin: parse args, call mjoin.engine).

    spark-submit jobs/join.py --stream --query tpcds_returns_by_address --lake /data/lake
    spark-submit jobs/join.py --query Q --plan plan.json --lake L --from T0 --to T1 --cycle 60 --out O

Same arguments as ``python -m mjoin run`` (see ``--help``). Exit 2 for errors the
user can fix (bad spec, plan, arguments; the job already running, refused before Spark
starts), 1 for anything else (a full disk or a read-only folder: one line naming the
cause and the path, the traceback in the log above it).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys


def main(argv=None) -> int:
    from mjoin.commands import UserError
    from mjoin.commands import run as run_command
    from mjoin.engine.failure import JobFailed
    from mjoin.model.plan import PlanError
    from mjoin.model.query import QuerySpecError

    parser = argparse.ArgumentParser(prog="jobs/join.py", description=run_command.DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    run_command.add_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # under spark-submit (its JVM is already up) the master comes from --master, not MJOIN_SPARK_MASTER
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        os.environ.setdefault("SPARK_SUBMIT_ARGS_SET_MASTER", "1")
    try:  # the streaming job is claimed before Spark starts: a second start is refused at once
        summary = run_command.launch(args, f"mjoin-join-{'stream' if args.stream else 'interval'}")
    except JobFailed as exc:  # a full disk, a read-only folder: one line, exit 1, the traceback in the log
        return run_command.failed(exc)
    except (UserError, QuerySpecError, PlanError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary.to_json(), default=str) if args.json else summary.describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
