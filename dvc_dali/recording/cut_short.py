"""Row refs whose publish a kill cut short.

git (and libgit2) create a ref by writing ``<ref>.lock`` and renaming it to
``<ref>``. A run killed between the two leaves the lock: its row's commit
is built and its outputs cached, but `dvc exp show` lists no row, and the
lock stays for ever (a row ref is written once). At the start of the next
run the row is completed from the lock, or a lock without a whole commit id
is removed; DVC's own locks are left to the user (`dvc-dali doctor` names
them)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from ..reading import gitcmd
from ..core.context import RunContext
from ..reading.exp_refs import baseline_and_name, common_dir, git_dirs, parse_lineage
from ..core.log import logger

_SHA = re.compile(r"[0-9a-f]{40}")
#: rows.row_name, and _publish's suffixed name when that ref existed
_ROW_NAME = re.compile(r".+-step\d+(-[0-9a-f]{7})?")

COMPLETE, REMOVE, LEAVE = "complete", "remove", "leave"


def fate(name: str, content: str, ref_exists: bool, commit_is_a_row: bool,
         older_than_run: bool) -> str:
    """What the next run does with ``<ref>.lock`` of an experiment ref named
    ``name``. Pure.

    ``content``: the lock's text; ``commit_is_a_row``: it names a commit
    carrying dvc-dali's lineage line; ``older_than_run``: the lock was there
    before this process started (a live writer holds its lock for
    milliseconds: one younger may be another run's publish under way)."""
    if not older_than_run:
        return LEAVE
    if _SHA.fullmatch(content.strip()) and commit_is_a_row:
        return REMOVE if ref_exists else COMPLETE
    return REMOVE if _ROW_NAME.fullmatch(name) else LEAVE


def locks(git_dir: str) -> list[Path]:
    """Every lock on an experiment ref (refs/exps/<b[:2]>/<b[2:]>/<name>.lock),
    in the repository's common dir (a linked worktree's git dir has no refs)."""
    return sorted(Path(common_dir(git_dir), "refs", "exps").glob("??/*/*.lock"))


def _ref_of(git_dir: str, lock: Path) -> str:
    return Path(os.path.relpath(lock, common_dir(git_dir))).as_posix()[:-len(".lock")]


def _is_row(git_dir: str, sha: str) -> bool:
    proc = gitcmd.run(["--git-dir", git_dir, "cat-file", "commit", sha], git_dir, check=False)
    return proc.returncode == 0 and parse_lineage(proc.stdout) is not None


def _ref_exists(git_dir: str, ref: str) -> bool:
    return gitcmd.run(["--git-dir", git_dir, "rev-parse", "--verify", "--quiet", ref],
                      git_dir, check=False).returncode == 0


def judge(git_dir: str, lock: Path, since: Optional[float]) -> tuple[str, str, str]:
    """(fate, ref, sha or "") of one lock; ``since``: this process's start
    (None: any age counts as old, for `dvc-dali doctor`)."""
    ref = _ref_of(git_dir, lock)
    try:
        content = lock.read_text(encoding="utf-8", errors="replace")
        older = since is None or lock.stat().st_mtime < since
    except OSError:  # gone meanwhile: its writer finished
        return LEAVE, ref, ""
    sha = content.strip()
    is_row = bool(_SHA.fullmatch(sha)) and _is_row(git_dir, sha)
    name = baseline_and_name(ref)[1]
    return fate(name, content, _ref_exists(git_dir, ref), is_row, older), ref, sha


def at_run_start(ctx: RunContext) -> None:
    """:func:`repair` in the main repo, once a run (run_start.capture)."""
    if not ctx.under_exp_run:
        return
    from ..core.ancestry import started_at

    try:
        since = started_at(os.getpid())
        if since is None:  # no /proc: psutil's, up to a second early
            import psutil

            since = psutil.Process().create_time()
        repair(git_dirs(ctx.dvc_root)[0], since)
    except OSError as exc:  # a repair, never a reason to stop training
        logger.debug("cannot look for cut-short row publishes: %s", exc)


def repair(git_dir: str, since: float) -> list[str]:
    """Complete or remove the cut-short row publishes in the repo at
    ``git_dir``; returns what was done, one line each (also logged)."""
    done = []
    for lock in locks(git_dir):
        what, ref, sha = judge(git_dir, lock, since)
        if what == LEAVE:
            continue
        try:
            lock.unlink()
        except FileNotFoundError:  # another process of this run (a rank) took it first
            continue
        if what == COMPLETE:
            # create only: zeros as the old value refuse an existing ref
            proc = gitcmd.run(["--git-dir", git_dir, "update-ref", ref, sha, "0" * 40],
                              git_dir, check=False)
            line = (f"row {ref.rsplit('/', 1)[1]} completed: a killed run had recorded it "
                    f"({sha[:7]}) but not published it" if proc.returncode == 0 else
                    f"{lock}: removed; its row could not be completed: {proc.stderr.strip()}")
        else:
            line = f"{lock}: removed, a lock left by a killed run without a row to publish"
        logger.warning("%s", line)
        done.append(line)
    return done
