"""spark-submit entry point of the historical evaluation; same arguments as ``python -m mjoin evaluate``."""
import os
import sys

if __name__ == "__main__":
    # spark-submit has set the master; get_spark must not override it.
    os.environ.setdefault("SPARK_SUBMIT_ARGS_SET_MASTER", "1")
    from mjoin.cli import main

    sys.exit(main(["evaluate", *sys.argv[1:]]))
