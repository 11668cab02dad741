"""Everything one process keeps between calls, in one object: ``STATE``.

Caches and pools only: what belongs to the run the process trains (its
params, its lineage tips, the row it kept) is run.py's. Lookups reused
between checkpoints, handles, the background pusher and
thread pools, what was said once, which hooks are installed. ``reset()``
puts every field back to its initial value, as in a new process (tests call
it); in a child made by ``os.fork()`` the fields that do not survive a fork
(threads, locks, library handles: marked ``fork: reset``) start afresh,
while what the child inherits as fact (hooks installed, the run started,
lines already said, the dir locks whose descriptors it shares) stays.

The rule for the lookups read from files (the stage from dvc.yaml and
params.yaml, the dvc.lock data this process wrote): an entry stands while
those files' stamps (inode, mtime, size) are unchanged; a recording that
fails drops them all (``forget_files``), so the next one looks everything up
afresh. Handles (DVC repos, git dirs) and the lineage tips this process
published are kept for its lifetime.

Plain data: this module imports no other dvc_dali module but run.py (in
``reset``), not even for types (the recorder's types are named in comments).
"""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    import pygit2

#: A field a forked child must not reuse: it starts afresh there.
_FORK_RESET = {"fork": "reset"}


def stamp(paths: list[str]) -> tuple:
    """What changes when any of paths is rewritten."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


@dataclass
class _Stamped:
    paths: list[str]
    stamp: tuple
    value: Any


@dataclass
class ProcessState:
    # -- the recorder's lookups (recording/) --------------------------------
    dvc_repos: dict[str, Any] = field(default_factory=dict, metadata=_FORK_RESET)  # root -> Repo
    git_dirs: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> (git dir, top)
    main_cache_dirs: dict[str, str] = field(default_factory=dict)  # DVC_ROOT -> cache dir
    untracked_outs: set[str] = field(default_factory=set)  # outputs found not tracked by git
    # git work tree -> row_tree.Seen: the tracked paths that may differ from the
    # index (changed at the first row, or named by inotify since); its watcher's
    # inotify descriptor is closed on reset
    start_changes: dict[str, Any] = field(default_factory=dict,  # -> recording.row_tree.Seen
                                          metadata=_FORK_RESET)
    files_cache: dict[Any, _Stamped] = field(default_factory=dict)  # see from_files
    record_lock: threading.Lock = field(default_factory=threading.Lock,
                                        metadata=_FORK_RESET)  # one recording at a time
    written_lock_entries: dict[tuple[str, str], str] = field(
        default_factory=dict)  # (dvc.lock, stage) -> the entry this process wrote there last
    # -- the rows' commits (recording/commit.py) ----------------------------
    git_repos: dict[str, pygit2.Repository] = field(default_factory=dict,
                                                    metadata=_FORK_RESET)
    git_idents: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    swept: set[str] = field(default_factory=set)  # leftover patterns swept once
    last_row_time: int = 0  # commit time of this process's last row (seconds)
    # -- threads ---------------------------------------------------------------
    pusher: Optional[Any] = field(default=None,  # recording.auto_push.Pusher
                                  metadata=_FORK_RESET)
    write_pool: Optional[ThreadPoolExecutor] = field(default=None,
                                                     metadata=_FORK_RESET)  # store.py's writers
    background_pool: Optional[ThreadPoolExecutor] = field(
        default=None, metadata=_FORK_RESET)  # the Checkpointers' one asynchronous save
    # the asynchronous saves no wait() has read yet (checkpointer._Background):
    # one that failed is said at exit, which then fails (exit_hooks)
    unread_saves: list[Any] = field(default_factory=list, metadata=_FORK_RESET)
    digest_pool: Optional[Any] = field(  # batch_digests._DigestThread: a batch hashed
        default=None, metadata=_FORK_RESET)  # while it trains
    device_digests: Optional[Any] = field(  # device_digest._Pool: streams, kernels and
        default=None, metadata=_FORK_RESET)  # buffers of the GPU batch digests
    # -- the checkpoint directory's lock (dirlock.py) --------------------------
    # path -> [fd, holders, the newest holder's id]; a forked child holds none (its copy of the
    # descriptor closed, the parent's lock stays): its own Checkpointer on the
    # parent's directory is refused, not let in by the parent's lock
    held_dir_locks: dict[Any, list[int]] = field(default_factory=dict, metadata=_FORK_RESET)
    # -- exit hooks, and what was said once -----------------------------------
    excepthook_installed: bool = False  # exit_hooks: in every mode
    exit_lines_installed: bool = False  # exit_hooks: Ctrl-C and SIGTERM lines, `dvc exp run`
    exit_lines_pid: int = 0  # exit_hooks: the process they were installed in (the run)
    # and its starter then (ancestry.Starter: `dvc exp run`): gone, the run stops
    exit_lines_parent: Any = None
    unread_hook_installed: bool = False  # exit_hooks: a failed save no wait() read, at exit
    ranks_exit_hook_installed: bool = False  # async_ranks: each rank says it exited
    # async_ranks.AsyncRanks of this process, told at its exit; a forked child
    # holds none (it must not say that its parent's ranks exited)
    live_ranks: weakref.WeakSet = field(default_factory=weakref.WeakSet, metadata=_FORK_RESET)
    # batch_digests.Recorder of a resume, told at exit to say what it compared
    # (their digests not run out); a forked child holds none
    resumed_recorders: weakref.WeakSet = field(default_factory=weakref.WeakSet,
                                               metadata=_FORK_RESET)
    resumed_hook_installed: bool = False
    preemption_signal: Optional[int] = None  # preemption.Flag got it: a checkpoint comes
    said_not_recording: bool = False  # signal_file
    said_stopping: bool = False  # exit_hooks: a Ctrl-C or SIGTERM while the run stops
    # signal_file: the process that answers DVC 2's signal (ancestry.Starter),
    # taken at the first signal, before any wait: taken at a later one, a
    # watcher that died meanwhile would be unseen (this process reparented)
    signal_watcher: Any = None
    said_digest_limit: set[tuple[str, str]] = field(default_factory=set)  # data_contents
    said_no_best: set[str] = field(default_factory=set)  # retention: keep_best specs unmet
    said_ignored: set[str] = field(default_factory=set)  # pipeline: stages with ignored outputs
    said_best_alone: bool = False  # pipeline: keep_best without keep_last, said once
    meta_checked: str = ""  # store: the last metadata text found shallow enough
    # store: the last snapshots this process wrote into each directory (its path
    # -> snapshot name -> files and subdirectories), so a superseded one is
    # removed by name, not by a scan
    snapshot_members: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = (
        field(default_factory=dict))

    def from_files(self, key: Any, load: Callable[[], tuple[list[str], Any]]) -> Any:
        """The value cached under key while its files are unchanged, else
        ``load()`` -> (files it was read from, value)."""
        hit = self.files_cache.get(key)
        if hit is not None and stamp(hit.paths) == hit.stamp:
            return hit.value
        paths, value = load()
        self.files_cache[key] = _Stamped(paths, stamp(paths), value)
        return value

    def remember(self, key: Any, paths: list[str], value: Any) -> None:
        """Cache value as read from paths as they are now."""
        self.files_cache[key] = _Stamped(paths, stamp(paths), value)

    def forget_files(self) -> None:
        """After a failed recording: look everything up afresh next time."""
        self.files_cache.clear()
        self.untracked_outs.clear()


STATE = ProcessState()


def _restart(names: list[str]) -> None:
    """The fields ``names`` back to their initial values, closing what they
    hold open (inotify watchers; with ``held_dir_locks``, the locks)."""
    fresh = ProcessState()
    if "start_changes" in names:
        for seen in STATE.start_changes.values():
            seen.watcher.close()
    if "held_dir_locks" in names:
        for fd, *_holders in STATE.held_dir_locks.values():
            try:
                os.close(fd)  # as at a process's end: the lock goes
            except OSError:
                pass
    for name in names:
        setattr(STATE, name, getattr(fresh, name))


def reset() -> None:
    """Every field back to its initial value, as in a new process: caches,
    the pusher (its thread is left to finish), thread pools, hooks flags,
    what was said once; held checkpoint-directory locks are released; and
    the run this process trained (run.py) is forgotten."""
    from . import run

    _restart([f.name for f in fields(ProcessState)])
    run.forget()


def _after_fork_in_child() -> None:
    """A forked child: no thread of the parent runs here, a lock may be held
    by one that does not exist, and library handles are the parent's."""
    _restart([f.name for f in fields(ProcessState) if f.metadata.get("fork") == "reset"])


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
