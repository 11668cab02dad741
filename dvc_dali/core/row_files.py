"""The files a row holds besides its checkpoint (metrics, plots, the stage's
other outputs), as they were when an asynchronous checkpoint was taken.

An asynchronous checkpoint is recorded from the workspace while training
goes on: a file the loop writes in between (the next step's metrics, logged
before ``ck.wait()``) would make the row hold another step's. Their stamps
(size and modification time) are taken at the call, on the training thread,
and compared once the row's commit is built (recording/pipeline.py); any
difference refuses the row. Directories are walked up to ``LIMIT`` files;
when a walk stops there, only the files it stamped are compared.

Plain file metadata, importing nothing above core: the training side stamps,
the recorder compares.
"""

from __future__ import annotations

import os
import stat
from typing import Iterable, NamedTuple

LIMIT = 256  # ~7 us a file on the training thread (2 busy cores)


class Stamps(NamedTuple):
    files: dict[str, tuple[int, int]]  # absolute path -> (size, mtime in ns)
    complete: bool  # every file under the paths was stamped (no walk stopped at LIMIT)


def stamp(paths: Iterable[str], limit: int = LIMIT) -> Stamps:
    """Each regular file at or under ``paths`` (links followed), as now."""
    found: dict[str, tuple[int, int]] = {}
    todo = list(paths)
    while todo:
        path = todo.pop()
        try:
            st = os.stat(path)
        except OSError:
            continue  # absent now: a file that appears later is a difference
        if stat.S_ISREG(st.st_mode):
            if len(found) >= limit:
                return Stamps(found, False)
            found[path] = (st.st_size, st.st_mtime_ns)
        elif stat.S_ISDIR(st.st_mode) and not _scan(path, found, todo, limit):
            return Stamps(found, False)
    return Stamps(found, True)


def _scan(directory: str, found: dict[str, tuple[int, int]], todo: list[str],
          limit: int) -> bool:
    """The files of ``directory`` into ``found``, its directories onto
    ``todo`` (scandir: no path joined or looked up twice); False when
    ``limit`` files were reached first."""
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                try:
                    if entry.is_dir():
                        todo.append(entry.path)
                        continue
                    st = entry.stat()
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    if len(found) >= limit:
                        return False
                    found[entry.path] = (st.st_size, st.st_mtime_ns)
    except OSError:
        pass
    return True


def restamp(before: Stamps, roots: Iterable[str]) -> Stamps:
    """The same files now: the whole of ``roots`` again where ``before`` was
    complete, else only the files ``before`` stamped."""
    if before.complete:
        return stamp(roots)
    return stamp(before.files, limit=len(before.files) + 1)


def changed(before: Stamps, after: Stamps) -> list[str]:
    """The files written, added or removed from ``before`` to ``after``,
    sorted. Pure. Where either was cut short, only ``before``'s files (an
    added one is not seen)."""
    names = (before.files.keys() | after.files.keys() if before.complete and after.complete
             else before.files.keys())
    return sorted(p for p in names if before.files.get(p) != after.files.get(p))
