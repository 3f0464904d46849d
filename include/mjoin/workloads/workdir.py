"""Stage a workload folder and swap it in atomically, so a lander never reads half a workload."""
from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path

from mjoin.workloads.errors import WorkloadError

MANIFEST = "manifest.json"


@contextlib.contextmanager
def staged_output(out, overwrite: bool = False):
    """Yield a hidden sibling folder of ``out`` to write into; on success rename it to ``out``.

    ``out`` may not exist, may be an empty folder, or (with ``overwrite``) a previous
    workload (it must hold a ``manifest.json``: we never delete an unrelated folder).
    On an exception the staged folder is removed and ``out`` is left as it was.
    """
    out = Path(out).expanduser().resolve()
    if out.exists():
        if not out.is_dir():
            raise WorkloadError(f"{out} exists and is not a folder", "--out")
        if any(out.iterdir()):
            if not (out / MANIFEST).exists():
                raise WorkloadError(f"{out} is a non-empty folder that is not a workload; choose another --out", "--out")
            if not overwrite:
                raise WorkloadError(f"{out} already holds a workload; pass --overwrite to replace it", "--out")
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:12]
    stage = out.parent / f".{out.name}.{tag}.tmp"
    stage.mkdir()
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.{tag}.old"
        os.replace(out, old)
    os.replace(stage, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
