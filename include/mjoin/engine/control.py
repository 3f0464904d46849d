"""Control of the streaming join job: is it running, stop it cleanly, restart it, recover from a crash.

Files beside the checkpoint, ``<lake>/checkpoints/<query>/_control/``:

- ``lock``: the job's claim. A starting job takes an exclusive ``flock`` on it and
  holds it for its whole life; the kernel releases it when the process ends, however
  it ends (``kill -9`` included), so two starts can never both pass and a restart right
  after a crash never waits. On a URL lake (no locks) the claim falls back to
  write-then-verify on ``status.json`` (best effort: see :meth:`JobControl.claim`).
- ``status.json``: written by the job: ``starting`` (claimed, query not started yet),
  then ``running`` with a heartbeat every :data:`HEARTBEAT_SECONDS` (pid, host, run id,
  trigger, last batch, batch in progress, plan version), then ``stopped`` or ``failed``
  with the reason.
- ``STOP``: written by whoever wants the job to stop (``python -m mjoin job stop``, the
  ``mjoin_join_job`` DAG). The job stops its query at the next batch boundary; a restart
  continues from the checkpoint and the committed state.

Whether the job runs (:meth:`JobControl.status`): a ``starting``/``running`` status
whose process is alive. On the job's own host that is the process itself (pid, checked
against its start time so a recycled pid does not count); a dead process is ``dead``
(killed or crashed). From another host only the heartbeat tells: older than
``stale_after`` seconds is ``lost``.
"""
from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone

from mjoin.engine.config import EngineError
from mjoin.model.timeutil import iso, parse_time
from mjoin.runtime import fsutil

log = logging.getLogger(__name__)
HEARTBEAT_SECONDS = 2.0
POLL_SECONDS = 0.5  # how often the job looks for a stop request between heartbeats
STALE_AFTER = 30.0
#: a stop waits at most this long for Spark to record the last batch in its checkpoint (if it
#: does not, the batch is re-run after the restart: outputs are idempotent)
COMMIT_GRACE_SECONDS = 10.0
URL_CLAIM_SETTLE_SECONDS = 2.0
LIVE_STATES = ("starting", "running")


class JobRunning(EngineError):
    """A start refused: the join job of this query is already running (or starting)."""


def _now() -> str:
    return iso(datetime.now(timezone.utc))


def _process_started(pid: int) -> float | None:
    """Start time (epoch seconds) of process ``pid``, or None when it cannot be told."""
    try:
        import psutil
    except ImportError:  # psutil comes with Airflow; a bare Spark driver may not have it
        return None
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError):
        return None


def pid_state(pid: int, started: float | None = None) -> str:
    """``alive``, ``gone`` (no such process, or a zombie) or ``reused`` (another process got the pid)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            p = psutil.Process(pid)
            if p.status() == psutil.STATUS_ZOMBIE:
                return "gone"
            if started is not None and abs(p.create_time() - started) > 1.0:
                return "reused"
            return "alive"
        except psutil.NoSuchProcess:
            return "gone"
        except psutil.AccessDenied:
            return "alive"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:  # exists, owned by someone else
        return "alive"
    return "alive"


def identity() -> dict:
    """This process as the status file records it."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "pid_started": _process_started(pid)}


class Claim:
    """A job's hold on its query (see :meth:`JobControl.claim`); :meth:`release` when the job ends."""

    def __init__(self, control: "JobControl", info: dict, fd: int | None):
        self.control = control
        self.info = info  # run_id, pid, host, pid_started, started_at, and what the starter passed
        self.run_id = info["run_id"]
        self._fd = fd
        self.released = False

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        self.released = True
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def abandon(self, error: str) -> None:
        """End a claim whose job never ran its query (Spark did not start, a bad argument): record ``failed``
        with ``error`` (best effort: never raises) and release it. Nothing when it was released already (the
        job recorded its own end)."""
        if self.released:
            return
        try:
            self.control.write("failed", **self.info, stopped_at=_now(), error=error)
        except Exception as exc:  # noqa: BLE001 - reported; the caller's error is the one that matters
            log.error("cannot record the job's end in %s: %s", self.control.status_path, exc)
        finally:
            self.release()


class JobControl:
    """Status, stop and start claims of the streaming join job of one query in one lake."""

    def __init__(self, lake, query_name: str):
        self.root = fsutil.join(lake.checkpoints(query_name), "_control")
        self.query = query_name
        self.lake_root = lake.root
        self.namespace = lake.namespace

    @property
    def status_path(self) -> str:
        return fsutil.join(self.root, "status.json")

    @property
    def stop_path(self) -> str:
        return fsutil.join(self.root, "STOP")

    @property
    def lock_path(self) -> str:
        return fsutil.join(self.root, "lock")

    # ---- read ----------------------------------------------------------------------------
    def status(self, stale_after: float = STALE_AFTER) -> dict:
        """The last status the job wrote, judged now. Adds ``running`` (bool: the job's process
        holds the job, state ``starting`` or ``running``), ``recorded_state`` (what the file says),
        ``note`` (one line explaining the state), ``heartbeat_age_seconds`` and ``stop_requested``.
        ``state`` becomes ``dead`` (this host: the process is gone) or ``lost`` (another host: no
        heartbeat for ``stale_after`` seconds) when a live state was recorded by a job that is gone."""
        try:
            doc = json.loads(fsutil.read_text(self.status_path))
        except FileNotFoundError:
            return {"query": self.query, "state": "never started", "recorded_state": None, "running": False,
                    "note": "no join job has run for this query in this lake", "stop_requested": None}
        except ValueError as exc:  # written atomically, so only a foreign hand can garble it
            return {"query": self.query, "state": "unknown", "recorded_state": None, "running": False,
                    "note": f"unreadable status file {self.status_path}: {exc}", "stop_requested": None}
        age = time.time() - parse_time(doc["heartbeat_at"]).timestamp()
        doc["heartbeat_age_seconds"] = round(age, 1)
        doc["recorded_state"] = state = doc.get("state")
        running, note = False, None
        if state in LIVE_STATES:
            pid, host = doc.get("pid"), doc.get("host")
            if host == socket.gethostname() and pid:
                ps = pid_state(int(pid), doc.get("pid_started"))
                running = ps == "alive"
                if running:
                    note = f"process {pid} on this host is alive"
                    if age >= stale_after:
                        note += f", but its last heartbeat is {age:.0f}s old (hung or starved?)"
                else:
                    doc["state"] = "dead"
                    note = (f"process {pid} on this host is {'gone' if ps == 'gone' else 'gone (pid reused)'} "
                            f"without recording a stop: killed or crashed"
                            + (f" in batch {doc['batch_in_progress']}" if doc.get("batch_in_progress") is not None
                               else "") + "; a restart continues from the checkpoint")
            else:
                running = age < stale_after
                if running:
                    note = f"heartbeat from {host} {age:.0f}s ago (liveness from the heartbeat: another host)"
                else:
                    doc["state"] = "lost"
                    note = (f"no heartbeat from {host} for {age:.0f}s (> {stale_after:.0f}s): killed, crashed or "
                            "cut off; a restart continues from the checkpoint")
        elif state == "stopped":
            note = f"stopped at {doc.get('stopped_at')}: {doc.get('reason')}"
        elif state == "failed":
            note = f"failed at {doc.get('stopped_at')}: {doc.get('error')}"
        doc["running"] = running
        doc["note"] = note
        doc["stop_requested"] = self.stop_requested()
        return doc

    def stop_requested(self) -> dict | None:
        try:
            return json.loads(fsutil.read_text(self.stop_path))
        except FileNotFoundError:
            return None

    # ---- operator side ---------------------------------------------------------------------
    def request_stop(self, by: str = "manual", reason: str = "stop requested") -> dict:
        """Ask the job to stop at its next batch boundary (it consumes the request when it stops)."""
        doc = {"requested_at": _now(), "by": by, "reason": reason}
        fsutil.atomic_write_text(self.stop_path, json.dumps(doc))
        return doc

    def wait_stopped(self, timeout: float, poll: float = 1.0) -> dict:
        """Wait until the job is not running (or the timeout passes); returns the last status."""
        deadline = time.monotonic() + timeout
        st = self.status()
        while st["running"] and time.monotonic() < deadline:
            time.sleep(poll)
            st = self.status()
        return st

    def wait_running(self, timeout: float, poll: float = 1.0, since: float | None = None) -> dict:
        """Wait until the job's query runs (state ``running``, not just ``starting``) or the timeout
        passes; returns the last status. ``since`` (epoch seconds, e.g. when you launched the job):
        also return as soon as a run started at or after it has already ended (stopped or failed)."""
        deadline = time.monotonic() + timeout
        st = self.status()
        while not (st["running"] and st["state"] == "running") and time.monotonic() < deadline:
            if since is not None and st["recorded_state"] in ("stopped", "failed") and \
                    parse_time(st["started_at"]).timestamp() >= since - 1.0:
                break
            time.sleep(poll)
            st = self.status()
        return st

    # ---- job side ----------------------------------------------------------------------------
    def claim(self, info: dict | None = None) -> Claim:
        """Take the job for this process, or raise :class:`JobRunning`.

        Local lake: an exclusive non-blocking ``flock`` on ``_control/lock``, held until
        :meth:`Claim.release` or the process ends (so a crashed job never blocks a restart).
        URL lake: refuse if the status says running, write ``starting`` with a fresh run id,
        wait :data:`URL_CLAIM_SETTLE_SECONDS`, and refuse if another run id replaced it (two
        starts closer together than the store's write latency could still both pass).
        On success the status is ``starting`` and any old stop request is cleared."""
        ident = identity()
        claim_info = {"query": self.query, "run_id": uuid.uuid4().hex[:12], **ident, "started_at": _now(),
                      **(info or {})}
        fd = None
        if not fsutil.is_url(self.root):
            fd = self._lock()
        try:
            st = self.status()
            if st["running"] and not (st.get("host") == ident["host"] and st.get("pid") == ident["pid"]
                                      and fd is not None):
                # lock taken but a live job recorded: its lock file was removed under it; refuse
                raise JobRunning(self._refusal(st))
            self.clear_stop()  # a new start supersedes an old stop request
            self.write("starting", **claim_info)
            if fd is None:
                time.sleep(URL_CLAIM_SETTLE_SECONDS)
                st = self.status()
                if st.get("run_id") != claim_info["run_id"]:
                    raise JobRunning(self._refusal(st, "another start claimed the job at the same time: "))
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        return Claim(self, claim_info, fd)

    def _lock(self) -> int | None:
        fsutil.makedirs(self.root)
        path = fsutil.resolve(self.lock_path)[1]
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JobRunning(self._refusal(self.status())) from None
        except OSError as exc:  # e.g. a network filesystem without locks: fall back
            os.close(fd)
            log.warning("cannot lock %s (%s): falling back to the status file alone", path, exc)
            return None
        return fd

    def _refusal(self, st: dict, prefix: str = "") -> str:
        ns = f" --namespace {self.namespace}" if self.namespace else ""
        return (f"{prefix}the join job of {self.query} is already {st.get('state', 'running')} (pid {st.get('pid')} "
                f"on {st.get('host')} since {st.get('started_at')}, run {st.get('run_id')}); stop it first "
                f"(python -m mjoin job stop --query {self.query} --lake {self.lake_root}{ns})")

    def write(self, state: str, **info) -> None:
        """Replace the status file (atomically: a new file renamed over it). On a full disk, where a new file
        cannot be made, it is rewritten in place (a local lake): a status is a few hundred bytes, the blocks of
        the one it replaces hold it, so a failure is still recorded when a batch could not write."""
        doc = json.dumps({"query": self.query, **info, "state": state, "heartbeat_at": _now()}, default=str)
        try:
            fsutil.atomic_write_text(self.status_path, doc)
        except OSError as exc:
            if fsutil.is_url(self.status_path) or getattr(exc, "errno", None) not in (errno.ENOSPC, errno.EDQUOT):
                raise
            local = fsutil.resolve(self.status_path)[1]
            fd = os.open(local, os.O_WRONLY)  # (no O_TRUNC: keep the blocks, overwrite, then cut the rest)
            try:
                data = doc.encode()
                os.write(fd, data)
                os.ftruncate(fd, len(data))
            finally:
                os.close(fd)

    def clear_stop(self) -> None:
        fsutil.remove(self.stop_path)


class Watcher:
    """The job's side while it runs: the heartbeat, and a requested stop at a batch boundary.

    The job gives three callbacks: ``progress()`` (what the status reports about batches),
    ``recorded()`` (Spark's checkpoint has committed the last batch of ours, or none ran) and
    ``hold()`` (atomically: if no batch of ours runs, refuse every later one and return True).
    It calls :meth:`batch_ended` at the end of every batch, so a pending stop is acted on at
    once: wait (at most :data:`COMMIT_GRACE_SECONDS`) for Spark to record the batch, hold
    further batches, stop the query. A stop thus never cuts a batch: Spark is stopped while it
    plans the next one, and a batch that began in the meantime is refused before doing any
    work (Spark runs it after the restart)."""

    def __init__(self, claim: Claim, progress, recorded, hold):
        self.claim = claim
        self.control = claim.control
        self.progress = progress
        self.recorded = recorded
        self.hold = hold
        self.query = None
        self.reason = None
        self._wake = threading.Event()
        self._done = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._loop, name="mjoin-job-watcher", daemon=True)

    def start(self, streaming_query) -> None:
        self.query = streaming_query
        self._beat()
        self._thread.start()

    def batch_ended(self) -> None:
        self._wake.set()

    def _beat(self, state: str = "running", **extra) -> None:
        self.control.write(state, **self.claim.info, **self.progress(), **extra)

    def _loop(self) -> None:
        last_beat = time.monotonic()
        while not self._done.is_set():
            self._wake.wait(POLL_SECONDS)
            self._wake.clear()
            if self._done.is_set():
                break
            try:
                if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                    self._beat()
                    last_beat = time.monotonic()
                ask = self.control.stop_requested()
                if ask and self.query is not None and self.query.isActive and self._hold_at_boundary():
                    log.info("stop requested by %s (%s): stopping at the batch boundary", ask.get("by"),
                             ask.get("reason"))
                    self.reason = f"stop requested by {ask.get('by')}: {ask.get('reason')}"
                    self.query.stop()
                    break
            except Exception as exc:  # the heartbeat must never kill the job
                log.warning("job watcher: %s", exc)

    def _hold_at_boundary(self) -> bool:
        """Let Spark record the last batch, then hold further batches; False while a batch runs
        (its end wakes us again)."""
        deadline = time.monotonic() + COMMIT_GRACE_SECONDS
        while not self.recorded() and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.hold()

    def finish(self, state: str, reason: str | None = None, error: str | None = None) -> bool:
        """Record how the run ended and release the claim (idempotent). Never raises: a status that cannot be
        written (the folder read-only too) is logged, and the claim is released all the same; returns whether
        the status was recorded."""
        if self._finished:
            return True
        self._finished = True
        self._done.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        try:
            if self.reason:
                try:
                    self.control.clear_stop()
                except OSError as exc:
                    log.warning("cannot remove the stop request %s: %s", self.control.stop_path, exc)
            try:
                self._beat(state, stopped_at=_now(), reason=self.reason or reason, **({"error": error} if error else {}))
            except Exception as exc:  # noqa: BLE001 - reported, never masking the job's own error
                log.error("cannot record the job's end (%s) in %s: %s", state, self.control.status_path, exc)
                return False
            return True
        finally:
            self.claim.release()
