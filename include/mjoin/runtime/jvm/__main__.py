"""``python -m mjoin.runtime.jvm``: build mjoin's JVM class (see :mod:`mjoin.runtime.jvm`). A failed build warns and exits 0:
the class is an optimisation (Spark's own checkpoint manager is used without it), so setup goes on; the
tests fail if a JDK is present and the jar is missing (tests/test_engine_throughput.py)."""
import sys

from mjoin.runtime.jvm import build

try:
    build()
except (RuntimeError, OSError) as exc:
    print(f"mjoin.runtime.jvm: WARNING: not built, Spark's own checkpoint file manager will be used: {exc}", file=sys.stderr)
