"""Thread pools kept for the life of the process.

A streaming job runs its micro-batches back to back; a ``ThreadPoolExecutor`` per batch started its
threads again each time (a thread start waits for the new thread to run: milliseconds each under load,
tens of milliseconds per micro-batch). These pools start their threads once, on first use."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_POOLS: dict = {}
_LOCK = threading.Lock()


def shared_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """The process's pool ``name`` with ``workers`` threads (one pool per name and size). Callers must not
    submit to a pool from inside a task of the same pool (it could wait on itself)."""
    key = (name, workers)
    with _LOCK:
        pool = _POOLS.get(key)
        if pool is None:
            pool = _POOLS[key] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"mjoin-{name}")
        return pool
