"""Checkpoint commits built in-process with pygit2 (libgit2, a dependency of
DVC through scmrepo): no git subprocess per checkpoint, except where git
would store other bytes than libgit2 (clean filters such as git-lfs).

The commit holds what ``git add -u`` plus ``git add -A -- <paths>`` would
stage, on top of a given parent. The user's index is read into memory and
never written, and neither HEAD nor any branch moves.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import time
import uuid
from typing import Optional

import pygit2

from .errors import RecorderError

_INDEX_LOCK_WAIT_S = 5.0
_IGNORED_MSG = "The following paths are ignored"  # git add -A of an ignored path
_REPOS: dict[str, pygit2.Repository] = {}
_IDENTS: dict[tuple[str, str], tuple[str, str]] = {}
_SWEPT: set[str] = set()


def _repo(toplevel: str) -> pygit2.Repository:
    repo = _REPOS.get(toplevel)
    if repo is None:
        try:
            repo = _REPOS[toplevel] = pygit2.Repository(toplevel)
        except pygit2.GitError as exc:
            raise RecorderError(
                f"dvc_dali: cannot open the git repo at '{toplevel}' ({exc}); run "
                "training inside the git work tree of a DVC project."
            ) from exc
    return repo


def _signature(toplevel: str, who: str) -> pygit2.Signature:
    """The identity git itself would use (env, config includes, EMAIL...),
    asked of git once per process; a fallback when git has none, so a bare
    CI machine still records."""
    key = (toplevel, who)
    if key not in _IDENTS:
        proc = git(["var", f"GIT_{who}_IDENT"], toplevel, check=False)
        m = re.match(r"(.*) <(.*)> \d+ [+-]\d{4}$", proc.stdout.strip())
        _IDENTS[key] = m.groups() if proc.returncode == 0 and m else (
            "dvc-dali", "dvc-dali@localhost")
    name, email = _IDENTS[key]
    return pygit2.Signature(name, email)


def _wait_index_lock(git_dir: str) -> None:
    """Let a running git command finish writing the index before reading it."""
    lock = os.path.join(git_dir, "index.lock")
    deadline = time.monotonic() + _INDEX_LOCK_WAIT_S
    while os.path.exists(lock):
        if time.monotonic() > deadline:
            raise RecorderError(
                f"dvc_dali: git index lock '{lock}' has been held for "
                f"{_INDEX_LOCK_WAIT_S:.0f} s. Another git process is running or "
                "crashed; if none is running, delete that file. The checkpoint "
                "files are intact; the next checkpoint will retry."
            )
        time.sleep(0.05)


def build_commit(toplevel: str, paths: list[str], parent: str, message: str) -> str:
    """Sha of a new commit (tracked changes + paths, relative to toplevel)
    whose parent is `parent`; nothing on disk but the new objects changes.

    In-process with libgit2, except where git would store other bytes: a
    path with a clean filter (git-lfs...), which libgit2 cannot run, or an
    index libgit2 cannot read (split index). Then with git, as before."""
    repo = _repo(toplevel)
    _wait_index_lock(repo.path)
    try:
        index = repo.index
        index.read(True)  # the index on disk now; changed in memory only
        changed = list(index.diff_to_workdir().deltas)  # what git add -u would stage
        if _filtered(repo, toplevel, [d.new_file.path for d in changed] + paths):
            return _build_with_git(repo.path, toplevel, paths, parent, message)
        for delta in changed:
            if delta.status_char() == "D":
                index.remove(delta.new_file.path)
            else:
                index.add(delta.new_file.path)
        if paths:
            index.add_all(paths)  # new files too; ignored ones are skipped
        tree = index.write_tree()
        oid = repo.create_commit(None, _signature(toplevel, "AUTHOR"),
                                 _signature(toplevel, "COMMITTER"), message, tree,
                                 [pygit2.Oid(hex=parent)])
    except pygit2.GitError:
        return _build_with_git(repo.path, toplevel, paths, parent, message)
    return str(oid)


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


def git(
    args: list[str],
    cwd: str,
    env: Optional[dict[str, str]] = None,
    check: bool = True,
    input: Optional[str] = None,  # noqa: A002
) -> subprocess.CompletedProcess:
    proc = subprocess.run(  # noqa: S603
        ["git", *args],
        cwd=cwd,
        env=env,
        input=input,
        capture_output=True,
        text=True,
        check=False,
    )
    if check and proc.returncode != 0:
        raise RecorderError(
            f"dvc_dali: `git {' '.join(args)}` failed in '{cwd}' "
            f"(exit {proc.returncode}): {proc.stderr.strip()}"
        )
    return proc


def _pid_alive(pid: int) -> bool:
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
    if pattern in _SWEPT:
        return
    _SWEPT.add(pattern)
    for path in glob.glob(pattern):
        m = re.search(r"dvc-dali(?:-index)?-(\d+)", os.path.basename(path))
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            try:
                os.unlink(path)
            except OSError:
                pass


def _build_with_git(git_dir: str, toplevel: str, paths: list[str], parent: str,
                    message: str) -> str:
    """build_commit through git itself, on a private copy of the index."""
    sweep_leftovers(os.path.join(git_dir, "dvc-dali-index-*"))
    private = os.path.join(git_dir, f"dvc-dali-index-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    env = dict(os.environ, GIT_INDEX_FILE=private)
    for who in ("AUTHOR", "COMMITTER"):
        sig = _signature(toplevel, who)
        env[f"GIT_{who}_NAME"], env[f"GIT_{who}_EMAIL"] = sig.name, sig.email
    try:
        index = os.path.join(git_dir, "index")
        if os.path.exists(index):
            shutil.copy2(index, private)  # keep mtime: racy-clean detection
        git(["add", "-u", "--", ":/"], toplevel, env)
        if paths:
            proc = git(["-c", "advice.addIgnoredFile=false", "add", "-A", "--", *paths],
                       toplevel, env, check=False)
            if proc.returncode != 0 and not proc.stderr.lstrip().startswith(_IGNORED_MSG):
                raise RecorderError(f"dvc_dali: `git add` of {paths} into a private index "
                                    f"failed in '{toplevel}': {proc.stderr.strip()}")
        tree = git(["write-tree"], toplevel, env).stdout.strip()
        return git(["commit-tree", tree, "-p", parent, "-F", "-"], toplevel, env,
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
    raise RecorderError(
        f"dvc_dali: could not create experiment ref '{ref}' in '{repo.path}': {err}. "
        f"Check that the repo is writable and no '{ref}.lock' file is left in it."
    )
