"""Checkpoint commits built in-process with pygit2 (libgit2, a dependency of
DVC through scmrepo): no git subprocess per checkpoint, except where git
would store other bytes than libgit2 (clean filters such as git-lfs).

The commit holds what ``git add -u`` plus ``git add -A -- <paths>`` would
stage, on top of a given parent. The user's index is read into memory and
never written, and neither HEAD nor any branch moves.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import time
import uuid
from typing import Optional

import pygit2

from ..reading import gitcmd
from ..core.errors import RecordError
from ..core.process_state import STATE
from . import row_tree, watch

_IGNORED_MSG = "The following paths are ignored"  # git add -A of an ignored path


def _repo(toplevel: str) -> pygit2.Repository:
    repo = STATE.git_repos.get(toplevel)
    if repo is None:
        try:
            repo = STATE.git_repos[toplevel] = pygit2.Repository(toplevel)
        except pygit2.GitError as exc:
            raise RecordError(
                f"cannot open the git repo at '{toplevel}' ({exc}); run "
                "training inside the git work tree of a DVC project."
            ) from exc
    return repo


def _signature(toplevel: str, who: str, when: int) -> pygit2.Signature:
    """The identity git itself would use (env, config includes, EMAIL...),
    asked of git once per process; a fallback when git has none, so a bare
    CI machine still records."""
    key = (toplevel, who)
    if key not in STATE.git_idents:
        proc = gitcmd.run(["var", f"GIT_{who}_IDENT"], toplevel, check=False)
        m = re.match(r"(.*) <(.*)> \d+ [+-]\d{4}$", proc.stdout.strip())
        STATE.git_idents[key] = m.groups() if proc.returncode == 0 and m else (
            "dvc-dali", "dvc-dali@localhost")
    name, email = STATE.git_idents[key]
    return pygit2.Signature(name, email, when, _utc_offset_minutes())


def _next_row_time(repo: pygit2.Repository, parent: str) -> int:
    """Now, in whole seconds as git stores it, but one second after this
    process's previous row and after the parent commit at least: `dvc exp
    show` orders rows by commit time, and rows recorded within one second
    would list out of step order; so a run recording several rows a second
    dates them ahead, and the run resuming it right after must date its
    rows after them, or its newest row reads as older than its parent
    (found by a sweep: `show` marked the resumed row's parent latest)."""
    try:
        after = repo[parent].peel(pygit2.Commit).commit_time + 1
    except (KeyError, ValueError, pygit2.GitError):
        after = 0
    STATE.last_row_time = max(int(time.time()), STATE.last_row_time + 1, after)
    return STATE.last_row_time


def _utc_offset_minutes() -> int:
    return -(time.altzone if time.localtime().tm_isdst > 0 else time.timezone) // 60


def ignored(toplevel: str, paths: list[str], baseline: str) -> list[str]:
    """Those of ``paths`` (relative to toplevel) git ignores and the
    baseline commit does not hold: a row's commit leaves them out, as DVC's
    would (the index is not read: a row's build keeps its own in memory)."""
    repo = _repo(toplevel)
    tree = repo.revparse_single(baseline).peel(pygit2.Tree)

    def held(path: str) -> bool:
        try:
            tree[path]
        except KeyError:
            return False
        return True

    return [p for p in paths if not held(p) and repo.path_is_ignored(
        p + ("/" if os.path.isdir(os.path.join(toplevel, p)) else ""))]


def build_commit(toplevel: str, paths: list[str], parent: str, message: str,
                 pinned: Optional[dict[str, bytes]] = None) -> str:
    """Sha of a new commit (tracked changes + paths, relative to toplevel)
    whose parent is `parent`; nothing on disk but the new objects changes.
    ``pinned``: files committed with these bytes instead of the work tree's.

    In-process with libgit2, except where git would store other bytes: a
    path with a clean filter (git-lfs...), which libgit2 cannot run, or an
    index libgit2 cannot read (split index): there, with git itself (a private index)."""
    # Only reads the index: a git process holding index.lock (an editor's
    # `git status`) is no obstacle, since git replaces the index by rename.
    repo = _repo(toplevel)
    pinned = pinned or {}
    try:
        tree = _later_row_tree(repo, toplevel, paths, pinned)
        if tree is None:
            index = repo.index
            index.read(True)  # the index on disk now; changed in memory only
            stamp = row_tree.index_stamp(repo)
            tracked = frozenset(entry.path for entry in index)
            changed, full = _tracked_changes(index, toplevel)
            seen = STATE.start_changes[toplevel]
            seen.tree = None  # until this row's is written: a failure rebuilds from the index
            if _filtered(repo, toplevel, [path for path, _ in changed] + paths):
                return _build_with_git(repo.path, toplevel, paths, parent, message, pinned)
            seen.stage, seen.covered = _stage_in_memory(
                repo, index, _Changes(tracked, changed, full), paths, pinned, seen.watcher)
            tree = index.write_tree()
            seen.tracked, seen.index_stamp, seen.tree = tracked, stamp, tree
        when = _next_row_time(repo, parent)
        oid = repo.create_commit(None, _signature(toplevel, "AUTHOR", when),
                                 _signature(toplevel, "COMMITTER", when), message,
                                 tree, [pygit2.Oid(hex=parent)])
    except pygit2.GitError:
        _forget_changes(toplevel)
        return _build_with_git(repo.path, toplevel, paths, parent, message, pinned)
    except OSError as exc:  # libgit2 could not write an object: a full disk, a size limit
        _forget_changes(toplevel)
        raise RecordError(
            f"cannot write the row's commit into {repo.path}objects ({exc}); nothing was "
            "recorded for this checkpoint. Free disk space there or fix its permissions or "
            "mount, then `dvc exp run` again: it resumes from the last recorded row.") from exc
    return str(oid)


def _forget_changes(toplevel: str) -> None:
    """What the last rows' trees were built from, dropped: the next row's is
    built from the index afresh."""
    seen = STATE.start_changes.pop(toplevel, None)
    if seen is not None:
        seen.watcher.close()


def _later_row_tree(repo: pygit2.Repository, toplevel: str, paths: list[str],
                    pinned: dict[str, bytes]) -> Optional[pygit2.Oid]:
    """A row after the first: its tree from the last row's (row_tree.py), or
    None to build it from the index."""
    seen = STATE.start_changes.get(toplevel)
    rels = [p.replace(os.sep, "/") for p in paths]
    if seen is None or seen.tree is None or "." in rels:  # the whole work tree: from the index
        return None
    return row_tree.next_tree(repo, seen, rels, pinned,
                              lambda files: _filtered(repo, toplevel, files))


def _tracked_changes(index: pygit2.Index, toplevel: str
                     ) -> tuple[list[tuple[str, bool]], bool]:
    """[(path, deleted)]: what `git add -u` would stage; and whether the
    whole work tree was compared (every other tracked file equals its entry).

    The first row compares the whole work tree with the index (a stat of
    every tracked file: 0.2-0.4 s at 10^5), with inotify watching their
    directories from just before; later rows look only at the paths changed
    then or named by an event since. Without a usable watcher (no inotify,
    too many directories, a queue overflow) every row compares everything."""
    seen = STATE.start_changes.get(toplevel)
    if seen is not None and seen.watcher.usable:
        named = seen.watcher.changed()
        if named is not None:
            seen.paths |= named
            return [(path, not os.path.lexists(os.path.join(toplevel, path)))
                    for path in sorted(seen.paths) if path in index], False
    first = seen is None
    watcher = (watch.Watcher(toplevel, watch.dirs_of(entry.path for entry in index)) if first
               else seen.watcher)
    changed = [(d.new_file.path, d.status_char() == "D") for d in index.diff_to_workdir().deltas]
    if first:
        STATE.start_changes[toplevel] = row_tree.Seen(watcher, {path for path, _ in changed})
    return changed, True


@dataclasses.dataclass(frozen=True)
class _Changes:
    """The user's index as read for this row, and how the work tree differs."""

    tracked: frozenset[str]  # its entries
    changed: list[tuple[str, bool]]  # (path, deleted): what `git add -u` stages
    full: bool  # the whole work tree was compared: every other entry is unchanged


def _stage_in_memory(repo: pygit2.Repository, index: pygit2.Index, changes: _Changes,
                     paths: list[str], pinned: dict[str, bytes], watcher: watch.Watcher
                     ) -> tuple[dict[str, set[str]], set[str]]:
    """git add -u, git add -A -- paths, then the pinned blobs, in memory;
    the files taken under each path, and the paths whose directories the
    watcher watched before they were listed (row_tree.files_under)."""
    for path, deleted in changes.changed:
        if deleted:
            if path in index:
                index.remove(path)
        else:
            index.add(path)
    differ = {path for path, _ in changes.changed}
    stage: dict[str, set[str]] = {}
    covered: set[str] = set()
    for rel in (p.replace(os.sep, "/") for p in paths):
        stage[rel], vouched = row_tree.files_under(repo, changes.tracked, rel, watcher)
        if vouched:
            covered.add(rel)
        for file in stage[rel]:
            # An entry the whole comparison found unchanged is what add would write.
            if not (changes.full and file in changes.tracked and file not in differ):
                index.add(file)
    for rel, data in pinned.items():
        index.add(pygit2.IndexEntry(rel, repo.create_blob(data), pygit2.GIT_FILEMODE_BLOB))
    return stage, covered


def _filtered(repo: pygit2.Repository, toplevel: str, rels: list[str]) -> bool:
    """Whether a clean or process filter driver applies to any of rels
    (files, or directories: the files under them)."""
    drivers = set()
    for entry in repo.config:
        name = entry.name
        if name.startswith("filter.") and name.endswith((".clean", ".process")):
            drivers.add(name[len("filter."):].rsplit(".", 1)[0])
    if not drivers:
        return False
    for rel in rels:
        full = os.path.join(toplevel, rel)
        files = [rel]
        if os.path.isdir(full):
            files = [os.path.relpath(os.path.join(d, f), toplevel)
                     for d, _, names in os.walk(full) for f in names]
        if any(repo.get_attr(f, "filter") in drivers for f in files):
            return True
    return False


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def sweep_leftovers(pattern: str) -> None:
    """Remove files of ours left by killed processes (pid in the name:
    private git indexes, dvc.lock temporaries), once per pattern and process."""
    if pattern in STATE.swept:
        return
    STATE.swept.add(pattern)
    for path in glob.glob(pattern):
        m = re.search(r"dvc-dali(?:-index)?-(\d+)", os.path.basename(path))
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            try:
                os.unlink(path)
            except OSError:
                pass


def _build_with_git(git_dir: str, toplevel: str, paths: list[str], parent: str,
                    message: str, pinned: dict[str, bytes]) -> str:
    """build_commit through git itself, on a private copy of the index."""
    sweep_leftovers(os.path.join(git_dir, "dvc-dali-index-*"))
    private = os.path.join(git_dir, f"dvc-dali-index-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    env = dict(os.environ, GIT_INDEX_FILE=private)
    when = _next_row_time(_repo(toplevel), parent)
    for who in ("AUTHOR", "COMMITTER"):
        sig = _signature(toplevel, who, when)
        sign, off = "-" if sig.offset < 0 else "+", abs(sig.offset)
        env[f"GIT_{who}_DATE"] = f"{when} {sign}{off // 60:02d}{off % 60:02d}"
        env[f"GIT_{who}_NAME"], env[f"GIT_{who}_EMAIL"] = sig.name, sig.email
    try:
        index = os.path.join(git_dir, "index")
        if os.path.exists(index):
            shutil.copy2(index, private)  # keep mtime: racy-clean detection
        gitcmd.run(["add", "-u", "--", ":/"], toplevel, env)
        if paths:
            proc = gitcmd.run(["-c", "advice.addIgnoredFile=false", "add", "-A", "--", *paths],
                              toplevel, env, check=False)
            if proc.returncode != 0 and not proc.stderr.lstrip().startswith(_IGNORED_MSG):
                raise RecordError(f"`git add` of {paths} into a private index "
                                  f"failed in '{toplevel}': {proc.stderr.strip()}")
        for rel, data in pinned.items():
            blob = gitcmd.run(["hash-object", "-w", "--stdin"], toplevel, env,
                              input=data.decode("utf-8", "surrogateescape")).stdout.strip()
            gitcmd.run(["update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}"],
                       toplevel, env)
        tree = gitcmd.run(["write-tree"], toplevel, env).stdout.strip()
        return gitcmd.run(["commit-tree", tree, "-p", parent, "-F", "-"], toplevel, env,
                          input=message).stdout.strip()
    finally:
        for leftover in (private, private + ".lock"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


def create_ref(toplevel: str, ref: str, sha: str) -> bool:
    """Create ref -> sha; False when the ref already exists (never overwritten)."""
    repo = _repo(toplevel)
    err: Optional[Exception] = None
    for attempt in range(3):  # DVC (dulwich) may prune empty ref dirs meanwhile
        try:
            repo.references.create(ref, sha)
            return True
        except pygit2.AlreadyExistsError:
            return False
        except (pygit2.GitError, OSError) as exc:
            if ref in repo.references:
                return False
            err = exc
            time.sleep(0.1 * (attempt + 1))
    raise RecordError(
        f"could not create experiment ref '{ref}' in '{repo.path}': {err}. "
        f"Check that the repo is writable and no '{ref}.lock' file is left in it."
    )
