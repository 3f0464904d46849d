"""Bytecode for the copies of PySpark and py4j that Spark's Python workers import (a setup step, ``make setup``).

Spark starts its Python processes with ``PYTHONPATH=$SPARK_HOME/python/lib/pyspark.zip:...`` ahead of
site-packages, and ``PYTHONDONTWRITEBYTECODE=1``. The zip that pip's PySpark ships holds sources only, and
Python cannot cache bytecode in a zip, so every such process compiles every PySpark module it imports:
0.9 s to import the streaming source runner from the zip here, 0.3 s from site-packages. Spark starts one
of these processes at the start of every streaming query (the runner of a Python data source, which
the streaming join's file source is) and one daemon per session. This adds to every ``<module>.py`` of
the zip a ``<module>.pyc`` beside it, compiled from the same source by this interpreter, in the
unchecked hash-based format of PEP 552 (zipimport loads it without comparing timestamps). The sources
stay in the zip (tracebacks show them); an interpreter of another version finds a foreign magic number
and compiles the source as before. The rewrite is atomic (a new zip renamed over the old one) and
idempotent; run it at setup time, while no Spark process is running (a running zipimport keeps the old
zip's directory).

    python -m mjoin.runtime.sparkzip            # the installed PySpark's zip(s)
    python -m mjoin.runtime.sparkzip --check    # exit 1 if a zip has no bytecode
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # the writer py_compile uses for PEP 552 pycs

import pyspark


def pyspark_zips() -> list[str]:
    """The zips Spark puts on its Python workers' path: ``$SPARK_HOME/python/lib/*.zip`` (PySpark's and
    py4j's) of the installed PySpark (pip's layout), and of ``SPARK_HOME`` when that is set elsewhere."""
    homes = [os.path.dirname(pyspark.__file__)]
    if os.environ.get("SPARK_HOME"):
        homes.append(os.environ["SPARK_HOME"])
    found = []
    for home in homes:
        lib = os.path.join(home, "python", "lib")
        for name in sorted(os.listdir(lib)) if os.path.isdir(lib) else ():
            path = os.path.join(lib, name)
            if name.endswith(".zip") and os.path.realpath(path) not in map(os.path.realpath, found):
                found.append(path)
    return found


def has_bytecode(path: str) -> bool:
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
    return any(n.endswith(".py") and n + "c" in names for n in names)


def add_bytecode(path: str) -> int:
    """Add a ``.pyc`` beside every ``.py`` of the zip at ``path`` (atomically); the number added (0: it
    had them already). A source this interpreter cannot compile keeps no ``.pyc`` (it fails as before)."""
    if has_bytecode(path):
        return 0
    tmp = f"{path}.{os.getpid()}.tmp"
    added = 0
    try:
        with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w") as dst:
            names = set(src.namelist())
            for info in src.infolist():
                data = src.read(info)
                dst.writestr(info, data)
                if not info.filename.endswith(".py") or info.filename + "c" in names:
                    continue
                try:
                    code = compile(data, os.path.join(path, info.filename), "exec", dont_inherit=True)
                except (SyntaxError, ValueError):
                    continue
                pyc = zipfile.ZipInfo(info.filename + "c", date_time=info.date_time)
                pyc.compress_type = info.compress_type
                dst.writestr(pyc, bytes(_code_to_hash_pyc(code, importlib.util.source_hash(data), checked=False)))
                added += 1
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return added


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mjoin.runtime.sparkzip", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only report; exit 1 if a zip lacks bytecode")
    p.add_argument("zips", nargs="*", help="zips to compile (default: the installed PySpark's)")
    args = p.parse_args(argv)
    zips = args.zips or pyspark_zips()
    if not zips:
        print("no pyspark.zip found (nothing to do)")
        return 0
    missing = 0
    for path in zips:
        if args.check:
            ok = has_bytecode(path)
            missing += not ok
            print(f"{path}: {'has bytecode' if ok else 'sources only'}")
            continue
        n = add_bytecode(path)
        print(f"{path}: {n} modules compiled" if n else f"{path}: bytecode already present")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
