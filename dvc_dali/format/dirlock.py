"""One writer per checkpoint directory (per rank).

`kill -9` of `dvc exp run` leaves its training process running; a rerun
would then have two trainers writing one checkpoint. The Checkpointer holds
an exclusive lock for its lifetime (released by the OS when the process
ends, however it ends), and a second one is refused, naming the holder.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..core.errors import CheckpointLockedError, CheckpointWriteError
from ..core.process_state import STATE


def short_name(name: str, most: int = 200) -> str:
    """``name``'s first ``most`` bytes, for a file named after a checkpoint
    directory with more around it: a name near the file system's 255 bytes
    (a long CJK name) made the lock's name too long, refused as a directory
    that cannot be written (found by a sweep)."""
    raw = os.fsencode(name)
    return name if len(raw) <= most else os.fsdecode(raw[:most])


def _lock_path(path: Path, rank: int) -> Path:
    from ..core.context import repo_root

    real = os.path.realpath(path)
    key = hashlib.sha1(os.fsencode(f"{real}\0{rank}")).hexdigest()[:12]  # any name's bytes
    root = repo_root(Path(real).parent)
    if root is not None:  # in DVC's scratch space, out of git's and DVC's way
        return root / ".dvc" / "tmp" / "dvc-dali" / f"{short_name(Path(real).name)}-{key}.lock"
    return Path(real).parent / f".{short_name(Path(real).name)}-{key}.lock"


_IDS = itertools.count(1)


class DirLock:
    """Held while a Checkpointer lives (or until the process ends)."""

    def __init__(self, lock: Path) -> None:
        self._lock = lock
        self._id = next(_IDS)
        STATE.held_dir_locks[lock][2] = self._id  # the newest holder here writes

    @property
    def superseded(self) -> bool:
        """A later Checkpointer of this process took the directory over: this
        one's saves would remove that one's save in flight (a leftover to it)
        and take the steps back."""
        held = STATE.held_dir_locks.get(self._lock) if self._lock is not None else None
        return held is not None and held[2] != self._id

    def release(self) -> None:
        if STATE is None:  # interpreter teardown (module globals cleared): the OS releases it
            return
        held = STATE.held_dir_locks.get(self._lock)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del STATE.held_dir_locks[self._lock]
            os.close(held[0])  # closing the descriptor releases the flock
        self._lock = None


def acquire(path: Path, rank: int = 0) -> DirLock:
    """Lock ``path`` for this process; several Checkpointers here share it
    (training in phases without close()), the newest one writing."""
    lock = _lock_path(path, rank)
    if lock in STATE.held_dir_locks:
        STATE.held_dir_locks[lock][1] += 1
        return DirLock(lock)
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # /proc, /sys, a read-only place
        raise CheckpointWriteError(f"{path}: cannot make its lock file {lock} "
                                   f"({exc.strerror or exc}); checkpoint into a directory "
                                   "you can write") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        try:
            cmd = Path(f"/proc/{holder}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            what = f"pid {holder}: {cmd.strip()[:120]}"
        except (OSError, ValueError):
            what = f"pid {holder}"
        raise CheckpointLockedError(
            f"{path}: another process ({what}) is still writing this checkpoint "
            f"(lock {lock}). A `dvc exp run` killed earlier leaves its training process "
            f"running: wait for it to end or stop it (kill {holder}), then run again.") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    STATE.held_dir_locks[lock] = [fd, 1, 0]
    return DirLock(lock)


def holder(path: Path, rank: int = 0) -> str | None:
    """The pid of another live process writing ``path``, or None. Asks the
    lock without keeping it (a --temp run looking at the workspace's)."""
    lock = _lock_path(path, rank)
    if lock in STATE.held_dir_locks or not lock.exists():
        return None
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)  # closing releases a shared lock just taken
    return None


@contextmanager
def exclusive(lock_file: str) -> Iterator[None]:
    """Wait for, then hold, an exclusive lock on ``lock_file`` for a short
    step that the processes of one run must take one at a time."""
    os.makedirs(os.path.dirname(lock_file), exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
