"""Why a join job failed, in one line a user can act on: the cause and the path of a filesystem error.

A full disk or a read-only folder fails a job deep inside a write: in the driver (a state manifest, a
metrics record), in a Python worker (a batch's results, its state pieces) whose traceback Spark relays
as the text of a JVM error, or in Spark's own checkpoint log. What reaches the job's top is often a
secondary error (a ``FileNotFoundError`` on the ``.tmp`` file a failed atomic write could not remove)
wrapped in a ``StreamingQueryException`` of hundreds of lines. :func:`filesystem_failure` finds the
cause: an ``OSError`` with a filesystem errno anywhere in the exception's chain (``__cause__``,
``__context__``), else the first line of its text (or its chain's) that names one of those causes, with
the path on that line. :class:`JobFailed` carries the one line; the commands print it, exit 1 and leave
the traceback in the log (docs/engine.md, "Errors a user can read").
"""
from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass

#: errors of the filesystem a user fixes outside mjoin (space, a mount, permissions), by errno
FS_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EIO, errno.EMFILE,
             errno.ENFILE)
#: the same causes as their messages appear in relayed text (Python's strerror, Java's, pyarrow's)
_CAUSES = tuple(os.strerror(e) for e in FS_ERRNOS) + ("Quota exceeded", "AccessDeniedException",
                                                       "ReadOnlyFileSystemException")
_CAUSE = re.compile("|".join(re.escape(c) for c in _CAUSES))
#: a path on a line: quoted ('/a/b', "/a/b"), or a bare absolute path or file: URL
_QUOTED = re.compile(r"""['"]((?:file:)?/[^'"]+)['"]""")
_BARE = re.compile(r"""((?:file:)?/[^\s'"():,;]+)""")


class JobFailed(RuntimeError):
    """A job ended by an error of its environment (a full disk, a read-only folder): ``str()`` is the one line
    naming the cause and the path; the original error is its ``__cause__``."""

    def __init__(self, line: str, failure: "Failure | None" = None):
        super().__init__(line)
        self.failure = failure


@dataclass(frozen=True)
class Failure:
    cause: str  # e.g. "No space left on device"
    path: str | None = None

    def line(self, what: str = "the join job") -> str:
        where = _where(self.path)
        return f"{what} failed: {self.cause}" + (f" ({where})" if where else "") + _hint(self.cause)


def _where(path: str | None) -> str | None:
    """The path to name: a temporary file (``.<name>.<id>.tmp``, written and renamed) by its folder."""
    if not path:
        return None
    if path.startswith("file:"):
        path = re.sub(r"^file:/*", "/", path)
    base = os.path.basename(path.rstrip("/"))
    if base.startswith(".") and base.endswith(".tmp"):
        return f"writing into {os.path.dirname(path.rstrip('/'))}"
    return f"at {path}"


def _hint(cause: str) -> str:
    if cause == os.strerror(errno.ENOSPC) or "Quota" in cause:
        return "; free space there, then restart the job (it continues from its checkpoint)"
    if cause in (os.strerror(errno.EROFS), "ReadOnlyFileSystemException"):
        return "; make it writable, then restart the job (it continues from its checkpoint)"
    if cause in (os.strerror(errno.EACCES), os.strerror(errno.EPERM), "AccessDeniedException"):
        return "; give the job's user write access, then restart the job"
    return ""


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def filesystem_failure(*errors) -> Failure | None:
    """The filesystem cause of a failure (see the module docstring) among ``errors`` (exceptions, in order of
    preference; None entries are skipped), or None when it is not a filesystem error."""
    for exc in errors:
        for e in _chain(exc) if exc is not None else ():
            if isinstance(e, OSError) and e.errno in FS_ERRNOS:
                path = e.filename if isinstance(e.filename, str) else None
                if path is None:  # pyarrow names the path in its message only
                    found = _QUOTED.search(str(e))
                    path = found.group(1) if found else None
                return Failure(os.strerror(e.errno), path)
    for exc in errors:
        for e in _chain(exc) if exc is not None else ():
            found = _from_text(str(e))
            if found is not None:
                return found
    return None


def _from_text(text: str) -> Failure | None:
    """The first line of ``text`` naming a filesystem cause and a path (on it, or on the line before that is not
    a traceback's frame), else the first naming a cause."""
    lines = text.splitlines()
    first = None
    for i, line in enumerate(lines):
        m = _CAUSE.search(line)
        if m is None:
            continue
        cause = {"AccessDeniedException": os.strerror(errno.EACCES),
                 "ReadOnlyFileSystemException": os.strerror(errno.EROFS)}.get(m.group(0), m.group(0))
        before = lines[i - 1] if i and not lines[i - 1].lstrip().startswith('File "') else ""
        for candidate in (line, before):
            for p in (*_QUOTED.finditer(candidate), *_BARE.finditer(candidate)):
                if not p.group(1).endswith(".py"):  # a traceback's source file is not where it failed
                    return Failure(cause, p.group(1))
        first = first or Failure(cause, None)
    return first
