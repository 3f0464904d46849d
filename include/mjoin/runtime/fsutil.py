"""File I/O for the lake: a local path or any URL pyarrow.fs understands (file://, hdfs://, s3://, gs://, abfs://).

A URL keeps its scheme everywhere: every path built from it (:func:`join`) is a URL, handed to Spark
as such (Hadoop's filesystem of that scheme reads it) and opened here through
``pyarrow.fs.FileSystem.from_uri``. ``file:///abs/path`` is a URL like the others: it takes the code
path of a remote lake (no ``flock``; the job's claim by its status file), which is what a test of
the URL path runs and what a shared mount without reliable locks needs. A plain path is local.

Writes that other processes read (plans, the ACTIVE pointer, state manifests,
statistics snapshots) are atomic: written to a temporary name in the same
folder, then renamed over the target. Renames are atomic on POSIX and HDFS; on
object stores they are not (docs/cluster.md, "The lake on a Hadoop filesystem").
"""
from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path

from pyarrow import fs as pafs


def is_url(path) -> bool:
    """A URL (``scheme://...``, ``file://`` included) rather than a plain local path."""
    return "://" in str(path)


def resolve(path):
    """``(filesystem, path_within_it)`` for a local path or URL."""
    if is_url(path):
        return pafs.FileSystem.from_uri(str(path))
    return pafs.LocalFileSystem(), os.path.abspath(str(path))


def join(base, *parts) -> str:
    base = str(base)
    if is_url(base):
        return "/".join([base.rstrip("/")] + [str(p).strip("/") for p in parts])
    return str(Path(base, *map(str, parts)))


def absolute(path) -> str:
    """A plain path made absolute (executors and Python workers run in other folders: a relative lake
    would be another folder for each of them); a URL as it is."""
    return str(path) if is_url(path) else os.path.abspath(str(path))


def makedirs(path) -> None:
    fs, p = resolve(path)
    fs.create_dir(p, recursive=True)


def exists(path) -> bool:
    fs, p = resolve(path)
    return fs.get_file_info(p).type != pafs.FileType.NotFound


def is_dir(path) -> bool:
    fs, p = resolve(path)
    return fs.get_file_info(p).type == pafs.FileType.Directory


def listdir(path) -> list[str]:
    """Names (not paths) in a folder, sorted; [] if it does not exist."""
    fs, p = resolve(path)
    if fs.get_file_info(p).type != pafs.FileType.Directory:
        return []
    return sorted(os.path.basename(i.path) for i in fs.get_file_info(pafs.FileSelector(p)))


def read_bytes(path) -> bytes:
    fs, p = resolve(path)
    if fs.get_file_info(p).type == pafs.FileType.NotFound:
        raise FileNotFoundError(str(path))
    with fs.open_input_stream(p) as f:
        return f.read()


def read_range(path, offset: int, length: int):
    """``length`` bytes of a file from ``offset`` (a pyarrow Buffer): one ranged read, also on object stores."""
    fs, p = resolve(path)
    with fs.open_input_file(p) as f:
        return f.read_at(length, offset)


def write_buffers(path, buffers) -> None:
    """A new file of the buffers one after the other, written in place (not atomic: for files under unique
    names that nothing reads before a later commit names them, e.g. state pieces)."""
    fs, p = resolve(path)
    with _open_output(fs, p) as f:
        for b in buffers:
            f.write(b)


def _open_output(fs, p: str):
    """``fs.open_output_stream(p)``, its folder made only when it does not exist yet (tried first: most
    writes go to a folder that exists, and a ``create_dir`` per file was a stat per file)."""
    try:
        return fs.open_output_stream(p)
    except FileNotFoundError:
        fs.create_dir(os.path.dirname(p), recursive=True)
        return fs.open_output_stream(p)


def read_text(path) -> str:
    return read_bytes(path).decode()


@contextmanager
def atomic_output(path):
    """An output stream for ``path`` that replaces it only when the block ends without an error: written
    to a temporary name in the same folder, then renamed over the target (a failed write leaves no file)."""
    fs, p = resolve(path)
    parent = os.path.dirname(p)
    tmp = f"{parent}/.{os.path.basename(p)}.{uuid.uuid4().hex}.tmp"
    out = _open_output(fs, tmp)
    try:
        with out as f:
            yield f
    except BaseException as exc:
        try:
            fs.delete_file(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.errno and not exc.filename:
            # pyarrow's errors name no file ("Error writing bytes to file"): name the target (same errno, so the
            # same OSError subclass), so that a full disk says where
            raise OSError(exc.errno, os.strerror(exc.errno), p) from exc
        raise
    if isinstance(fs, pafs.LocalFileSystem):
        os.replace(tmp, p)  # atomic, and replaces an existing target
    else:
        fs.move(tmp, p)


def atomic_write_bytes(path, data: bytes) -> None:
    with atomic_output(path) as f:
        f.write(data)


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def remove(path) -> None:
    """Delete a file or a whole folder; missing is fine."""
    fs, p = resolve(path)
    info = fs.get_file_info(p)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(p)
    elif info.type == pafs.FileType.File:
        fs.delete_file(p)
