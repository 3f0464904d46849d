"""File I/O for the lake: a local path or any URL pyarrow.fs understands (hdfs://, s3://, gs://).

Writes that other processes read (plans, the ACTIVE pointer, state manifests,
statistics snapshots) are atomic: written to a temporary name in the same
folder, then renamed over the target. Renames are atomic on POSIX and HDFS; on
object stores they are not, which the README's deployment notes say.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

from pyarrow import fs as pafs


def is_url(path) -> bool:
    return "://" in str(path) and not str(path).startswith("file://")


def _local(path) -> str:
    p = str(path)
    return p[len("file://"):] if p.startswith("file://") else p


def resolve(path):
    """``(filesystem, path_within_it)`` for a local path or URL."""
    if is_url(path):
        return pafs.FileSystem.from_uri(str(path))
    return pafs.LocalFileSystem(), os.path.abspath(_local(path))


def join(base, *parts) -> str:
    base = str(base)
    if is_url(base):
        return "/".join([base.rstrip("/")] + [str(p).strip("/") for p in parts])
    return str(Path(_local(base), *map(str, parts)))


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


def read_text(path) -> str:
    return read_bytes(path).decode()


def atomic_write_bytes(path, data: bytes) -> None:
    fs, p = resolve(path)
    parent = os.path.dirname(p)
    fs.create_dir(parent, recursive=True)
    tmp = f"{parent}/.{os.path.basename(p)}.{uuid.uuid4().hex}.tmp"
    with fs.open_output_stream(tmp) as f:
        f.write(data)
    if isinstance(fs, pafs.LocalFileSystem):
        os.replace(tmp, p)  # atomic, and replaces an existing target
    else:
        fs.move(tmp, p)


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
