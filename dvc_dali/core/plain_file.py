"""Opening a file dvc-dali reads but does not own (a held note, a companion
file of batch digests) as a regular file only: never blocking on a FIFO, never
following a link, never reading a device or a directory."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

LINK = "a symbolic link"
NOT_REGULAR = "not a regular file"


class Unreadable(Exception):
    """The path is there but is not a regular file dvc-dali reads; ``why``
    is :data:`LINK`, :data:`NOT_REGULAR` or the system's reason."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` opened for reading in binary.

    Raises:
        FileNotFoundError: nothing is there.
        Unreadable: something other than a regular file, or it cannot be opened.
    """
    try:  # a FIFO does not block the open; a link is not followed
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise Unreadable(LINK if os.path.islink(path) else exc.strerror or str(exc)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unreadable(NOT_REGULAR)
    return os.fdopen(fd, "rb")
