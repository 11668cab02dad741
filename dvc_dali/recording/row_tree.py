"""A later row's tree from the previous row's, changing only what changed.

The first row of a run is built from the user's git index (commit.py):
`git add -u` plus `git add -A -- <the stage's paths>`. For the next rows,
reading that index and writing its tree again costs O(tracked files) (0.1 s
at 10^5); instead the previous row's tree gets new entries for the tracked
files inotify saw change (watch.py), the files under the stage's paths that
inotify named or that are new there, and the pinned files: O(changes).

The stage's paths (its git-tracked deps such as a data directory committed
to git, its uncached outputs, dvc.yaml, dvc.lock, metrics and plots) are
walked once, each directory watched before it is listed; from then on the
watcher names every file that may differ from the previous row (a new
directory is walked and watched when it is named), so an unchanged file is
never read again. A path the watcher cannot vouch for (its watch could not
be added) is walked again at every row, and its untracked files hashed, as
git would. When the user's index changed on disk (a `git add` during the
run), a `.gitignore` or `.gitattributes` changed (which files a path holds,
or how git stores them), or the watcher cannot vouch for the work tree, the
caller builds from the index again. Ignore rules outside the work tree
(.git/info/exclude, core.excludesFile) changed during a run are not seen
for files that do not change themselves.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from typing import Callable, Iterable, Optional

import pygit2

from . import watch

Entry = Optional[tuple[pygit2.Oid, int]]  # (blob or tree, file mode), None: removed
_RULE_FILES = (".gitignore", ".gitattributes")


@dataclasses.dataclass
class Seen:
    """One git work tree, as this process's rows have seen it."""

    watcher: watch.Watcher
    paths: set[str]  # tracked paths changed at the first row or named by an event since
    tracked: frozenset[str] = frozenset()  # the user's index entries when last read
    index_stamp: tuple = ()  # the user's index file then (inode, mtime, size)
    tree: Optional[pygit2.Oid] = None  # the last row's tree
    # each stage path -> the files the last row took under it
    stage: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    # the stage paths whose every directory the watcher watched before listing it
    covered: set[str] = dataclasses.field(default_factory=set)


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


def _is_dir(full: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(full).st_mode)
    except OSError:
        return False


def files_under(repo: pygit2.Repository, tracked: frozenset[str], rel: str,
                watcher: Optional[watch.Watcher]) -> tuple[set[str], bool]:
    """What `git add -A -- rel` adds: the files at or under rel, but not
    ignored ones unless already tracked (those, in ignored directories too,
    are `git add -u`'s); and whether ``watcher`` watched every directory
    they are in before it was listed (then it names whatever changes there
    from now on). Walked here: libgit2's add_all walks the whole work tree
    (0.4 s at 10^5 files) to match a pathspec."""
    top = repo.workdir
    if not _is_dir(os.path.join(top, rel)):
        vouched = watcher is not None and watcher.add(rel.rpartition("/")[0])
        wanted = rel in tracked or not repo.path_is_ignored(rel)
        return ({rel} if wanted and os.path.lexists(os.path.join(top, rel)) else set()), vouched
    if repo.path_is_ignored(rel + "/"):  # a data directory: nothing to add
        return set(), True
    out: set[str] = set()
    vouched, todo = True, [rel]
    while todo:
        at = todo.pop()
        vouched = watcher is not None and watcher.add(at) and vouched  # before listing
        try:
            entries = list(os.scandir(os.path.join(top, at)))
        except OSError:  # gone meanwhile
            vouched = False
            continue
        for entry in entries:
            sub = f"{at}/{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                if not repo.path_is_ignored(sub + "/"):
                    todo.append(sub)
            elif sub in tracked or not repo.path_is_ignored(sub):
                out.add(sub)
    return out, vouched


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


def _under(name: str, path: str) -> bool:
    return name == path or name.startswith(path + "/")


@dataclasses.dataclass
class _StageWalk:
    """The stage's files for the next row, and which of them to read."""

    repo: pygit2.Repository
    seen: Seen
    named: set[str]
    stage: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    covered: set[str] = dataclasses.field(default_factory=set)
    fresh: set[str] = dataclasses.field(default_factory=set)  # untracked files to hash
    dropped: set[str] = dataclasses.field(default_factory=set)  # files left the stage's paths

    def vouched(self, path: str, rel: str) -> bool:
        """Whether the last row's entry for rel still stands."""
        return (path in self.seen.covered and rel not in self.named
                and rel in self.seen.stage.get(path, ()))

    def walk(self, path: str, at: str, files: set[str]) -> bool:
        """Walk ``at`` (path or a directory under it) into files; read the
        untracked files whose last entry does not stand."""
        found, ok = files_under(self.repo, self.seen.tracked, at, self.seen.watcher)
        self.fresh.update(f for f in found - files if f not in self.seen.tracked
                          and not self.vouched(path, f))
        files |= found
        return ok

    def follow_events(self, path: str) -> bool:
        """A path the watcher vouched for: its last files, changed only where
        events named them. False when a new directory could not be watched."""
        files, ok = self.seen.stage[path], True
        for name in sorted(n for n in self.named if _under(n, path)):
            if name in self.seen.tracked:
                continue  # git add -u's (the tracked paths)
            if _is_dir(os.path.join(self.repo.workdir, name)):
                ok = self.walk(path, name, files) and ok
            elif (os.path.lexists(os.path.join(self.repo.workdir, name))
                  and not self.repo.path_is_ignored(name)):
                files.add(name)
                self.fresh.add(name)
            elif name in files:
                files.discard(name)
                self.dropped.add(name)
        return ok

    def run(self, paths: Iterable[str]) -> None:
        for path in paths:
            files: set[str] = set()
            if path in self.seen.covered:
                files = self.stage[path] = self.seen.stage[path]  # updated in place
                ok = self.follow_events(path)
            else:
                ok = self.walk(path, path, files)
                self.stage[path] = files
                self.dropped |= self.seen.stage.get(path, set()) - files
            if ok:
                self.covered.add(path)
        for path, files in self.seen.stage.items():
            if path not in self.stage:
                self.dropped |= files


def next_tree(repo: pygit2.Repository, seen: Seen, paths: list[str], pinned: dict[str, bytes],
              filtered: Callable[[list[str]], bool]) -> Optional[pygit2.Oid]:
    """The next row's tree from the last one's, or None when it must be
    built from the index (see the module's doc). ``filtered``: whether git
    would run a clean filter on any of these files."""
    if seen.tree is None or not seen.watcher.usable or index_stamp(repo) != seen.index_stamp:
        return None
    named = seen.watcher.changed()
    if named is None:
        return None
    seen.paths |= named
    if any(n.rpartition("/")[2] in _RULE_FILES for n in named):
        return None
    try:
        return _next_tree(repo, seen, paths, pinned, filtered, named)
    except BaseException:
        seen.tree = None  # the stage's files half updated: from the index next time
        raise


def _next_tree(repo: pygit2.Repository, seen: Seen, paths: list[str], pinned: dict[str, bytes],
               filtered: Callable[[list[str]], bool], named: set[str]) -> Optional[pygit2.Oid]:
    tracked = [p for p in seen.paths if p in seen.tracked]
    walk = _StageWalk(repo, seen, named)
    walk.run(paths)
    if filtered([*tracked, *walk.fresh]):
        seen.tree = None
        return None
    updates: dict[str, Entry] = {p: workdir_entry(repo, p) for p in tracked}
    updates.update((gone, None) for gone in walk.dropped - seen.tracked
                   if not any(gone in files for files in walk.stage.values()))
    updates.update((f, workdir_entry(repo, f)) for f in walk.fresh)
    updates.update((rel, (repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB))
                   for rel, data in pinned.items())
    seen.tree = updated(repo, repo[seen.tree], updates)
    seen.stage, seen.covered = walk.stage, walk.covered
    return seen.tree
