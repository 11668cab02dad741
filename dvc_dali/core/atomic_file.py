"""Files replaced whole: written beside the target, then renamed over it, so
a reader sees the old file or the new one, never part of either. Three
guarantees, one function each:

    replace_whole(path, data)        readers never see half a file
    replace_durable(path, data)      and, after a crash or power loss, the old
                                     or the new content (fsynced before the rename)
    replace_published(path, data)    and the new name itself survives a crash
                                     (the directory fsynced too): store's LATEST

The temporary file is removed when the write fails; a killed process leaves
``<path>.dvc-dali-<pid>-<random>.tmp`` (recording/commit.sweep_leftovers
finds those by the pid).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Optional


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or a new entry in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(path: str | os.PathLike) -> str:
    """Where a replacement of ``path`` is written first: beside it, named for
    this process."""
    return f"{os.fspath(path)}.dvc-dali-{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"


def _replace(path: str | os.PathLike, data: bytes | str, *, sync: bool, sync_dir: bool,
             tmp: Optional[str | os.PathLike] = None, mode: int = 0o666,
             edit: bool = False) -> None:
    target = os.path.realpath(path) if edit else os.fspath(path)
    tmp = os.fspath(tmp) if tmp is not None else temp_name(target)
    blob = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if edit:
            os.chmod(tmp, os.stat(target).st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(os.path.abspath(target)))


def replace_whole(path: str | os.PathLike, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` (str: UTF-8): a reader sees the old file
    or the new one, never half. Not fsynced: a crash of the machine may
    leave either, or an empty file."""
    _replace(path, data, sync=False, sync_dir=False)


def replace_durable(path: str | os.PathLike, data: bytes | str, *, edit: bool = False) -> None:
    """:func:`replace_whole`, with the data on disk before the rename: after
    a crash or power loss, the old content or the new. ``edit``: a file of
    the user's, edited in place: a symlink is written through, and the file
    keeps its permission bits."""
    _replace(path, data, sync=True, sync_dir=False, edit=edit)


def replace_published(path: str | os.PathLike, data: bytes | str, *,
                      tmp: Optional[str | os.PathLike] = None, mode: int = 0o666) -> None:
    """:func:`replace_durable`, and the directory fsynced after the rename, so
    the new file is the one found after a crash. ``tmp``: where to write it
    first (default :func:`temp_name`); ``mode``: its permission bits (less
    the umask)."""
    _replace(path, data, sync=True, sync_dir=True, tmp=tmp, mode=mode)
