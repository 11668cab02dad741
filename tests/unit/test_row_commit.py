"""recording/commit.py builds a row's tree as git would: compared with real
git (`git add -u` + `git add -A -- paths` on a copy of the index, then
`git write-tree`) in a temporary repository."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from dvc_dali.recording import commit
from dvc_dali.core.process_state import reset


def git(repo: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}).stdout.strip()


def git_tree(repo: Path, paths: list[str]) -> str:
    index = repo / ".git" / "test-index"
    index.write_bytes((repo / ".git" / "index").read_bytes())
    env = {"GIT_INDEX_FILE": str(index)}
    git(repo, "add", "-u", env=env)
    for path in paths:  # git refuses an ignored path named on its own: skipped, as rows do
        proc = subprocess.run(["git", "add", "-A", "--", path], cwd=repo, capture_output=True,
                              text=True, env={**os.environ, **env})
        assert proc.returncode == 0 or "ignored" in proc.stderr, proc.stderr
    return git(repo, "write-tree", env=env)


@pytest.fixture
def repo(tmp_path) -> Path:
    reset()
    git(tmp_path, "init", "-q", "-b", "main")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / ".gitignore").write_text("*.log\n/out\ntmp/\n")
    for rel, text in {"a.txt": "a", "src/m.py": "m", "src/deep/n.py": "n",
                      "plots/old.tsv": "o"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "plots" / "kept.log").write_text("tracked though ignored")
    git(tmp_path, "add", "-A")
    git(tmp_path, "add", "-f", "plots/kept.log")
    git(tmp_path, "commit", "-qm", "base")
    yield tmp_path
    reset()


def test_rows_are_the_trees_git_would_write(repo):
    base = git(repo, "rev-parse", "HEAD")
    paths = ["plots", "metrics.json", "out"]

    def check() -> None:
        existing = [p for p in paths if (repo / p).exists()]
        sha = commit.build_commit(str(repo), existing, base, "row")
        assert git(repo, "rev-parse", f"{sha}^{{tree}}") == git_tree(repo, existing)

    (repo / "a.txt").write_text("a changed before the first row")
    (repo / "metrics.json").write_text("{}")
    (repo / "plots" / "new" / "x.tsv").parent.mkdir(parents=True)
    (repo / "plots" / "new" / "x.tsv").write_text("x")
    (repo / "plots" / "skip.log").write_text("ignored, untracked: left out")
    (repo / "plots" / "tmp").mkdir()
    (repo / "plots" / "tmp" / "z.tsv").write_text("in an ignored directory: left out")
    (repo / "out").mkdir()
    (repo / "out" / "model.bin").write_text("ignored directory")
    check()
    # later rows: inotify names what changed
    (repo / "src" / "deep" / "n.py").write_text("n2")
    (repo / "plots" / "kept.log").write_text("tracked, ignored, changed")
    (repo / "plots" / "new" / "y.tsv").write_text("y")
    (repo / "src" / "m.py").unlink()
    (repo / "src" / "untracked.py").write_text("left out by add -u")
    os.symlink("a.txt", repo / "plots" / "link")
    check()
    (repo / "metrics.json").write_text('{"acc": 1}')
    (repo / "plots" / "old.tsv").unlink()  # tracked: add -u removes it
    check()


def test_a_stage_directory_committed_to_git_is_read_only_where_it_changed(repo, monkeypatch):
    """A stage's dep directory committed to git (a data set): later rows read
    only the files inotify named there or that are new, keep every other
    file's blob, and still hold what git would write."""
    from dvc_dali.recording import row_tree

    data = repo / "data"
    for i in range(30):
        (data / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (data / f"c{i % 3}" / f"{i:02d}.txt").write_text(f"{i}")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "data")
    base = git(repo, "rev-parse", "HEAD")
    paths = ["data", "metrics.json"]
    read: list[str] = []
    real = row_tree.workdir_entry
    monkeypatch.setattr(row_tree, "workdir_entry",
                        lambda r, rel: read.append(rel) or real(r, rel))

    def row() -> str:
        read.clear()
        existing = [p for p in paths if (repo / p).exists()]
        sha = commit.build_commit(str(repo), existing, base, "row")
        assert git(repo, "rev-parse", f"{sha}^{{tree}}") == git_tree(repo, existing)
        return sha

    (repo / "metrics.json").write_text("{}")
    row()
    (data / "c0" / "00.txt").write_text("changed")  # tracked, under the stage's path
    (data / "c1" / "new.txt").write_text("untracked: git add -A takes it")
    (data / "c1" / "skip.log").write_text("ignored: left out")
    (data / "c2" / "02.txt").unlink()
    (data / "new" / "deep").mkdir(parents=True)  # a new directory: walked, then watched
    (data / "new" / "deep" / "x.txt").write_text("x")
    sha = row()
    assert set(read) == {"data/c0/00.txt", "data/c1/new.txt", "data/new/deep/x.txt",
                         "data/c2/02.txt"}
    assert git(repo, "show", f"{sha}:data/c0/00.txt") == "changed"
    for kept in ("data/c0/03.txt", "data/c1/01.txt", "data/c2/29.txt"):
        assert git(repo, "rev-parse", f"{sha}:{kept}") == git(repo, "rev-parse", f"{base}:{kept}")
    (data / "new" / "deep" / "x.txt").write_text("x2")  # in the directory watched since
    (data / "c1" / "new.txt").unlink()  # added by a row, gone: out of the next
    (repo / "metrics.json").write_text('{"acc": 1}')
    row()
    assert set(read) <= {"data/new/deep/x.txt", "metrics.json", "data/c0/00.txt",
                         "data/c2/02.txt"}  # tracked paths changed once are read again
    assert "data/c0/03.txt" not in read
    row()  # nothing changed: only the tracked paths changed once are read again
    assert set(read) <= {"data/c0/00.txt", "data/c2/02.txt"}
    (data / "c1" / "a.tmp").write_text("untracked, taken")
    row()
    (data / ".gitignore").write_text("*.tmp\n")  # ignore rules changed: built from the index
    row()
    assert "data/c1/a.tmp" not in git(repo, "ls-tree", "-r", "--name-only", row(), "data")


@pytest.mark.parametrize("with_git", [False, True])
def test_a_row_is_dated_after_its_parent_even_one_dated_ahead(repo, monkeypatch, with_git):
    """A run recording several rows a second dates them ahead (one second
    each, for `dvc exp show`'s order); the run resuming it right after, in a
    new process, dated its rows now, before their parent, so `show` marked
    the parent the latest row and `doctor` offered to put it back (found by
    a sweep). In-process and through git itself (a clean filter)."""
    ahead = int(time.time()) + 30
    parent = git(repo, "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "row ahead",
                 env={"GIT_COMMITTER_DATE": f"{ahead} +0000", "GIT_AUTHOR_DATE": f"{ahead} +0000"})
    if with_git:  # a filter libgit2 cannot run: the row is built by git
        git(repo, "config", "filter.x.clean", "cat")
        (repo / ".gitattributes").write_text("*.txt filter=x\n")
    reset()  # a new process: no row of its own yet
    sha = commit.build_commit(str(repo), [], parent, "row")
    assert int(git(repo, "log", "-1", "--format=%ct", sha)) == ahead + 1
