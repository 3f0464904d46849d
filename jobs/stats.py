"""spark-submit entry point of the statistics job; same arguments as ``python -m mjoin stats``.

    spark-submit --master spark://host:7077 jobs/stats.py --query tpcds_returns_by_address \\
        --lake hdfs://nn:8020/mjoin --from 2026-01-01T00:00:00Z --to 2026-01-01T00:10:00Z --cycle 10
"""
import os
import sys

if __name__ == "__main__":
    # spark-submit has set the master; get_spark must not override it.
    os.environ.setdefault("SPARK_SUBMIT_ARGS_SET_MASTER", "1")
    from mjoin.cli import main

    sys.exit(main(["stats", *sys.argv[1:]]))
