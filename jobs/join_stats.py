"""spark-submit entry point of a cycle-mode re-optimization run's Spark work, in one driver: the join (``jobs/join.py``'s
arguments), then the statistics job of the run's interval (``jobs/stats.py``'s arguments, after ``--stats``).

    spark-submit jobs/join_stats.py --query Q --lake L --stream --trigger availableNow \\
        --stats --query Q --lake L --from T0 --to T1 --cycle 10

One JVM, Spark and Python start per run instead of two (measured in bench/loop/README.md). Exit code: the join's
when it failed (the statistics job does not run then), else the statistics job's.
"""
import os
import sys


def main(argv) -> int:
    if "--stats" not in argv:
        print("error: give the join's arguments, then --stats and the statistics job's", file=sys.stderr)
        return 2
    at = argv.index("--stats")
    # spark-submit has set the master; get_spark must not override it (the same session serves both jobs)
    os.environ.setdefault("SPARK_SUBMIT_ARGS_SET_MASTER", "1")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from join import main as join_main  # jobs/join.py, beside this file

    from mjoin.cli import main as cli_main

    rc = join_main(argv[:at])
    if rc:
        return rc
    return cli_main(["stats", *argv[at + 1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
