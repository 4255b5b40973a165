"""Durable atomic file and directory writes (POSIX): a crash leaves the old or the new, whole.

A file is written to a temp file in the same folder, fsynced, renamed over the target, and the
folder is fsynced so the rename itself survives a power loss. A directory tree is written in a
temp directory by the caller, then :func:`commit_dir` fsyncs every file and folder of it,
renames it into place and fsyncs the parent. Temp names start with ``.`` so listings that skip
dot files never see a half-written one.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def fsync_dir(path: str | Path) -> None:
    """fsync a directory: makes the entries created, renamed or removed in it durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: str | Path) -> None:
    """fsync every file under ``path``, then every directory, deepest first, ``path`` last."""
    root = Path(path)
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(folder)


def atomic_write(path: str | Path, data: str | bytes) -> None:
    """Replace ``path`` with ``data`` (text is UTF-8) atomically and durably."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
    payload = data.encode() if isinstance(data, str) else data
    try:
        with tmp.open("wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def rename_durably(src: str | Path, dst: str | Path) -> None:
    """``os.rename(src, dst)``, then fsync ``dst``'s folder so the rename is durable."""
    os.rename(src, dst)
    fsync_dir(Path(dst).parent)


def commit_dir(tmp: str | Path, target: str | Path) -> None:
    """Make the finished tree ``tmp`` durable and rename it to ``target`` (same filesystem;
    ``target`` must not exist, or be an empty directory)."""
    fsync_tree(tmp)
    rename_durably(tmp, target)
