"""One worker process of an A/B benchmark, run against one code tree: the benchmarks that compare two
checkouts side by side (``engine/ab_files.py``, ``scale/ab_seed.py``, ``scale/ab_input.py``) start their own
script again with ``--worker`` for each tree, so the driver and Spark's Python workers both import ``mjoin``
from that tree, and read back the JSON lines it prints (one per timed run)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def tree_env(root: str | Path, extra: dict | None = None) -> dict:
    """This process's environment with ``root``'s ``include/`` first on ``PYTHONPATH`` (the venv's editable
    install of another checkout must not win) and ``extra`` settings."""
    path = [str(Path(root) / "include")] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return {**os.environ, **(extra or {}), "PYTHONPATH": os.pathsep.join(path)}


def run_worker(script: str | Path, argv: list, root: str | Path, *, env: dict | None = None, label: str = "",
               stderr_tail: int = 4000) -> list[dict]:
    """``python script --worker *argv`` with ``root``'s code (:func:`tree_env`); the JSON lines it printed.
    A failed worker ends the benchmark with the end of its stderr."""
    proc = subprocess.run([sys.executable, str(script), "--worker", *map(str, argv)], capture_output=True,
                          text=True, env=tree_env(root, env))
    if proc.returncode:
        print(proc.stderr[-stderr_tail:], file=sys.stderr)
        raise SystemExit(f"worker {label or root} failed (exit {proc.returncode})")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
