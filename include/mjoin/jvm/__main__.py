"""``python -m mjoin.jvm``: build mjoin's JVM class (see :mod:`mjoin.jvm`)."""
import sys

from . import build

try:
    build()
except RuntimeError as exc:
    print(f"mjoin.jvm: {exc}", file=sys.stderr)
    sys.exit(1)
