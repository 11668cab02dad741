"""Which tracked files may have changed since the run's first row, without
a stat of every tracked file at every checkpoint (10^5 files: ~0.2 s).

Linux inotify on every directory that holds tracked files, set up before
the work tree is compared with the index once, and on each directory under
the stage's paths, added before it is listed (row_tree.py); from then on, the files
named by its events are the only ones that can differ. Anything the events
cannot vouch for (queue overflow, a watched directory removed or moved, no
inotify, too many directories) makes the watcher unusable: the caller then
compares the whole work tree again, as git would. Changes that inotify
does not see (another machine writing a network filesystem, writes through
a shared mapping) are not seen; git's fsmonitor has the same limits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from typing import Iterable, Optional

_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_MOVED_FROM, _IN_MOVED_TO, _IN_CREATE, _IN_DELETE = 0x40, 0x80, 0x100, 0x200
_IN_DELETE_SELF, _IN_MOVE_SELF = 0x400, 0x800
_IN_Q_OVERFLOW, _IN_IGNORED, _IN_ONLYDIR, _IN_DONT_FOLLOW = 0x4000, 0x8000, 0x01000000, 0x02000000
_MASK = (_IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE | _IN_MOVED_FROM | _IN_MOVED_TO
         | _IN_CREATE | _IN_DELETE | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR)
# Events after which a name is no longer known to match the index.
_BROKEN = _IN_Q_OVERFLOW | _IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF
_HEADER = struct.Struct("iIII")
MAX_DIRS = 50_000  # more: compare the whole work tree (each watch costs ~1 KB of kernel memory)

_libc: Optional[ctypes.CDLL] = None


def _lib() -> Optional[ctypes.CDLL]:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            _libc.inotify_init1  # noqa: B018 - absent off Linux
        except (OSError, AttributeError):
            return None
    return _libc


def dirs_of(paths: Iterable[str]) -> set[str]:
    """The directories (relative, "" for the top) that hold these files."""
    return {p.rpartition("/")[0] for p in paths}


def parse_events(buf: bytes) -> tuple[list[tuple[int, int, str]], bool]:
    """(wd, mask, name) of each inotify event in buf, and whether any says
    the watch can no longer vouch for its directory."""
    events, broken, at = [], False, 0
    while at + _HEADER.size <= len(buf):
        wd, mask, _cookie, size = _HEADER.unpack_from(buf, at)
        name = buf[at + _HEADER.size:at + _HEADER.size + size].split(b"\0", 1)[0]
        at += _HEADER.size + size
        broken = broken or bool(mask & _BROKEN)
        events.append((wd, mask, os.fsdecode(name)))
    return events, broken


class Watcher:
    """inotify watches on directories of a work tree; ``changed()`` is the
    set of relative paths named since the last call, or None when the
    watcher cannot tell (then close it and compare everything)."""

    def __init__(self, toplevel: str, dirs: set[str]) -> None:
        self.fd = -1
        self.toplevel = toplevel
        self._dirs: dict[int, str] = {}
        self._watched: set[str] = set()
        lib = _lib()
        if lib is None or len(dirs) > MAX_DIRS:
            return
        fd = lib.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return
        self.fd = fd
        for rel in dirs:
            wd = lib.inotify_add_watch(fd, os.fsencode(os.path.join(toplevel, rel)), _MASK)
            if wd < 0:  # the user's watch limit, or a directory already gone
                self.close()
                return
            self._dirs[wd] = rel
            self._watched.add(rel)

    def add(self, rel: str) -> bool:
        """Watch one more directory (relative); False when it cannot be (gone,
        not a directory, the watch limit): the caller then cannot count on
        events for it. Watch before listing, so nothing falls in between."""
        if self.fd < 0:
            return False
        if rel in self._watched:
            return True
        if len(self._dirs) >= MAX_DIRS:
            return False
        lib = _lib()
        wd = lib.inotify_add_watch(self.fd, os.fsencode(os.path.join(self.toplevel, rel)),
                                   _MASK | _IN_DONT_FOLLOW) if lib is not None else -1
        if wd < 0:
            return False
        self._dirs[wd] = rel
        self._watched.add(rel)
        return True

    @property
    def usable(self) -> bool:
        return self.fd >= 0

    def changed(self) -> Optional[set[str]]:
        if self.fd < 0:
            return None
        names: set[str] = set()
        while True:
            try:
                buf = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                return names
            events, broken = parse_events(buf)
            if broken:
                self.close()
                return None
            for wd, _mask, name in events:
                rel = self._dirs.get(wd)
                if rel is not None and name:
                    names.add(f"{rel}/{name}" if rel else name)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1
        self._dirs.clear()
        self._watched.clear()
