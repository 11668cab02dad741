"""recording/commit.py builds a row's tree as git would: compared with real
git (`git add -u` + `git add -A -- paths` on a copy of the index, then
`git write-tree`) in a temporary repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dvc_dali.recording import commit
from dvc_dali.recording.cache import CACHE


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
    CACHE.clear()
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
    CACHE.clear()


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
