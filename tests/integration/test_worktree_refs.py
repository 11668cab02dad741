"""A linked git worktree (`git worktree add`) keeps its refs in the main
repository's git dir (its own git dir, .git/worktrees/<name>, holds HEAD and
the index): a row publish cut short by a kill there was never completed, so
the row stayed unlisted and the resumed rows became a run of their own, and
`dvc-dali doctor` there said nothing (found by a sweep). Real git, a real
worktree; the lock is what a kill inside git's ref write leaves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from dvc_dali.reading.exp_refs import git_dirs
from dvc_dali.recording import cut_short, rows

from tests.helpers import child_env


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_cut_short_row_publish_in_a_linked_worktree_is_found_and_completed(tmp_path):
    main, linked = tmp_path / "main", tmp_path / "linked"
    main.mkdir()
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@e.invalid"],
                 ["config", "user.name", "t"], ["commit", "-q", "--allow-empty", "-m", "base"]):
        git(*args, cwd=main)
    subprocess.run(["dvc", "init", "-q"], cwd=main, check=True, env=child_env())
    git("add", "-A", cwd=main)
    git("commit", "-q", "-m", "dvc", cwd=main)
    git("worktree", "add", "-q", str(linked), "-b", "wt", cwd=main)
    base = git("rev-parse", "HEAD", cwd=linked)
    git("commit", "-q", "--allow-empty", "-m", "row\n\ndvc-dali-checkpoint: exp=a step=4",
        cwd=linked)
    sha = git("rev-parse", "HEAD", cwd=linked)
    ref = f"refs/exps/{base[:2]}/{base[2:]}/a-step4"
    lock = main / ".git" / f"{ref}.lock"  # the common dir: refs are shared
    lock.parent.mkdir(parents=True)
    lock.write_text(sha + "\n")
    os.utime(lock, (time.time() - 3600,) * 2)
    own = git_dirs(str(linked))[0]
    assert Path(own) != main / ".git"  # .git/worktrees/linked

    doctor = subprocess.run([sys.executable, "-m", "dvc_dali.cli", "doctor"], cwd=linked,
                            capture_output=True, text=True, env=child_env(), timeout=120)
    assert f"{lock}: a row a killed run recorded but did not publish" in doctor.stdout, (
        doctor.stdout + doctor.stderr)
    assert cut_short.locks(own) == [lock]
    done = cut_short.repair(own, time.time())
    assert done and "row a-step4 completed" in done[0]
    assert git("rev-parse", ref, cwd=linked) == sha and not lock.exists()

    applied = main / ".git" / "refs" / "exps" / "exec" / "EXEC_APPLY"  # `dvc exp apply`'s
    applied.parent.mkdir(parents=True)
    applied.write_text(sha + "\n")
    assert rows.applied_at(own) == applied.stat().st_mtime
