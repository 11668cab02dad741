"""A later row's tree from the previous row's, changing only what changed.

The first row of a run is built from the user's git index (commit.py):
`git add -u` plus `git add -A -- <the stage's paths>`. For the next rows,
reading that index and writing its tree again costs O(tracked files) (0.1 s
at 10^5); instead the previous row's tree gets new entries for the tracked
files inotify saw change (watch.py), the files under the stage's paths and
the pinned files: O(changes). When the user's index changed on disk (a
`git add` during the run) or the watcher cannot vouch for the work tree,
the caller builds from the index again.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import Optional

import pygit2

from . import watch

Entry = Optional[tuple[pygit2.Oid, int]]  # (blob or tree, file mode), None: removed


@dataclasses.dataclass
class Seen:
    """One git work tree, as this process's rows have seen it."""

    watcher: watch.Watcher
    paths: set[str]  # tracked paths changed at the first row or named by an event since
    tracked: frozenset[str] = frozenset()  # the user's index entries when last read
    index_stamp: tuple = ()  # the user's index file then (inode, mtime, size)
    tree: Optional[pygit2.Oid] = None  # the last row's tree
    stage_files: frozenset[str] = frozenset()  # what the last row took from the stage's paths


def index_stamp(repo: pygit2.Repository) -> tuple:
    try:
        st = os.stat(os.path.join(repo.path, "index"))
    except OSError:
        return ()
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def workdir_entry(repo: pygit2.Repository, rel: str) -> Entry:
    """The blob and mode git would record for work tree file ``rel``, or
    None when it is gone (or is a directory now)."""
    full = os.path.join(repo.workdir, rel)
    try:
        st = os.lstat(full)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return repo.create_blob(os.fsencode(os.readlink(full))), pygit2.GIT_FILEMODE_LINK
    if not stat.S_ISREG(st.st_mode):
        return None
    mode = (pygit2.GIT_FILEMODE_BLOB_EXECUTABLE if st.st_mode & stat.S_IXUSR
            else pygit2.GIT_FILEMODE_BLOB)
    return repo.create_blob_fromworkdir(rel), mode


def updated(repo: pygit2.Repository, tree: Optional[pygit2.Tree],
            updates: dict[str, Entry]) -> pygit2.Oid:
    """``tree`` with each path of ``updates`` set (or removed); emptied
    directories are dropped, as git has no empty trees."""
    builder = repo.TreeBuilder(tree) if tree is not None else repo.TreeBuilder()
    nested: dict[str, dict[str, Entry]] = {}
    for path, value in updates.items():
        head, sep, rest = path.partition("/")
        if sep:
            nested.setdefault(head, {})[rest] = value
        elif value is None:
            if builder.get(head) is not None:
                builder.remove(head)
        else:
            builder.insert(head, *value)
    for head, sub in nested.items():
        old = tree[head] if tree is not None and head in tree else None
        subtree = repo[old.id] if old is not None and old.filemode == pygit2.GIT_FILEMODE_TREE \
            else None
        oid = updated(repo, subtree, sub)
        if len(repo[oid]) == 0:
            if builder.get(head) is not None:
                builder.remove(head)
        else:
            builder.insert(head, oid, pygit2.GIT_FILEMODE_TREE)
    return builder.write()


def next_tree(repo: pygit2.Repository, seen: Seen, stage_files: list[str],
              pinned: dict[str, bytes]) -> Optional[pygit2.Oid]:
    """The next row's tree from the last one's, or None when it must be
    built from the index (see the module's doc)."""
    if seen.tree is None or not seen.watcher.usable or index_stamp(repo) != seen.index_stamp:
        return None
    named = seen.watcher.changed()
    if named is None:
        return None
    seen.paths |= named
    updates: dict[str, Entry] = {p: workdir_entry(repo, p) for p in seen.paths
                                 if p in seen.tracked}
    files = frozenset(stage_files)
    for gone in seen.stage_files - files - seen.tracked:  # added by a row, since deleted
        updates[gone] = None
    updates.update((f, workdir_entry(repo, f)) for f in files)
    updates.update((rel, (repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB))
                   for rel, data in pinned.items())
    seen.tree, seen.stage_files = updated(repo, repo[seen.tree], updates), files
    return seen.tree
