"""What one training process looks up once and reuses between checkpoints.

The rule: an entry read from files (the stage from dvc.yaml and params.yaml,
the dvc.lock data this process wrote) stands while those files' stamps
(inode, mtime, size) are unchanged; a recording that fails drops them all,
so the next one looks everything up afresh. Handles (DVC repos, git dirs)
and the lineage tips this process published are kept for its lifetime.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


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
class ProcessCache:
    repos: dict[str, Any] = field(default_factory=dict)  # DVC root -> dvc Repo
    git_dirs: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> (git dir, top)
    main_cache_dirs: dict[str, str] = field(default_factory=dict)  # DVC_ROOT -> cache dir
    # lineage tip per (main git dir, experiment, stage): (commit sha, step)
    tips: dict[tuple, tuple[Optional[str], int]] = field(default_factory=dict)
    run_start: Any = None  # run_start.RunStart: the params this run trains with
    # the run started (before its first row, once per process): start_bare_run's
    # answer, whether its rows branch off; False after a Checkpointer's start_run
    run_started: Optional[bool] = None
    untracked_outs: set = field(default_factory=set)  # outputs found not tracked by git
    # git work tree -> row_tree.Seen: the tracked paths that may differ from
    # the index (changed at the first row, or named by inotify since)
    start_changes: dict = field(default_factory=dict)
    _from_files: dict[Any, _Stamped] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one recording at a time

    def from_files(self, key: Any, load: Callable[[], tuple[list[str], Any]]) -> Any:
        """The value cached under key while its files are unchanged, else
        ``load()`` -> (files it was read from, value)."""
        hit = self._from_files.get(key)
        if hit is not None and stamp(hit.paths) == hit.stamp:
            return hit.value
        paths, value = load()
        self._from_files[key] = _Stamped(paths, stamp(paths), value)
        return value

    def remember(self, key: Any, paths: list[str], value: Any) -> None:
        """Cache value as read from paths as they are now."""
        self._from_files[key] = _Stamped(paths, stamp(paths), value)

    def forget_files(self) -> None:
        """After a failed recording: look everything up afresh next time."""
        self._from_files.clear()
        self.untracked_outs.clear()

    def clear(self) -> None:
        """Everything, lineage tips included (a new process, for tests)."""
        self.forget_files()
        self.repos.clear()
        self.git_dirs.clear()
        self.main_cache_dirs.clear()
        self.tips.clear()
        self.run_start = None
        self.run_started = None
        self.untracked_outs.clear()
        for seen in self.start_changes.values():
            seen.watcher.close()
        self.start_changes.clear()


CACHE = ProcessCache()
