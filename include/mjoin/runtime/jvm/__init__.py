"""mjoin's JVM part: one class, built at setup when a JDK is present (``python -m mjoin.runtime.jvm``).

:class:`mjoin.spark.LocalCheckpointFileManager` (``src/``): Spark's checkpoint file manager for a local
checkpoint without a process fork per log write. Spark writes an offset and a commit log entry per
micro-batch; through Hadoop's local file system without its native library (pip's PySpark has none) each
write forks ``chmod`` twice (the file and its checksum file), about 8 ms each here: ~30 ms of every
micro-batch (bench/streaming). There is no library that fixes it (Hadoop's native library is not on PyPI
or in Debian), so the class is written here; it overrides only how the temporary file is created and
leaves the rename into place and every read to Spark (docs/engine.md, "Streaming: catch-up, per-micro-batch
cost, sustained throughput").

Built into ``mjoin-jvm.jar`` beside this file (ignored by git) with the JDK's ``javac`` against the
installed PySpark's jars. Without a JDK (a JRE only, as in the cluster image) nothing is built and the
streaming job uses Spark's Hadoop-based manager, as before: the same results, slower micro-batches.
:func:`mjoin.runtime.spark.get_spark` puts the jar on the driver's class path when it exists.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import zipfile

from mjoin.runtime.resources import pyspark_dir

HERE = os.path.dirname(os.path.abspath(__file__))
JAR = os.path.join(HERE, "mjoin-jvm.jar")
SOURCES = os.path.join(HERE, "src")
#: the checkpoint file manager class the jar holds
CHECKPOINT_MANAGER = "mjoin.spark.LocalCheckpointFileManager"


def jar_path() -> str | None:
    """The built jar, if it is there and not older than its sources."""
    if not os.path.isfile(JAR):
        return None
    newest = max((os.path.getmtime(p) for p in _sources()), default=0.0)
    return JAR if os.path.getmtime(JAR) >= newest else None


def _sources() -> list[str]:
    return sorted(glob.glob(os.path.join(SOURCES, "**", "*.java"), recursive=True))


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "javac"), os.X_OK):
        return os.path.join(home, "bin", "javac")
    found = shutil.which("javac")
    return os.path.realpath(found) if found else None


def build(quiet: bool = False) -> str | None:
    """Compile the sources against the installed PySpark's jars into :data:`JAR`; None (with a message)
    when there is no ``javac``. Raises ``RuntimeError`` when compilation fails."""
    javac = _javac()
    if javac is None:
        if not quiet:
            print("mjoin.runtime.jvm: no javac (a JDK is not installed): not built; the streaming job uses Spark's own "
                  "checkpoint file manager (the same results; ~30 ms more per micro-batch)")
        return None
    jars = os.path.join(str(pyspark_dir()), "jars", "*")
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", jars, "-d", out] + _sources(),
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed:\n{done.stdout}{done.stderr}")
        tmp = f"{JAR}.{os.getpid()}.tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:  # a jar is a zip; no manifest needed
            for path in sorted(glob.glob(os.path.join(out, "**", "*.class"), recursive=True)):
                z.write(path, os.path.relpath(path, out))
        os.replace(tmp, JAR)
    if not quiet:
        print(f"mjoin.runtime.jvm: built {JAR}")
    return JAR

