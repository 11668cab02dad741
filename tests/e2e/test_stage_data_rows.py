"""Rows of a stage whose dep directory is committed to git (a data set
under `git add .`, as in the Quickstart): a file there changed between two
checkpoints is in the later row, every other file keeps its blob. Real DVC
repo, the recorder called in-process as the stage command would."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from dvc_dali.core.process_state import reset
from dvc_dali.recording import pipeline as rec

from tests.helpers.dvc_project import make_project

DVC_YAML = textwrap.dedent("""\
    stages:
      train:
        cmd: python train.py
        deps: [train.py, data]
        outs:
          - ckpt:
              persist: true
        always_changed: true
    """)


def run(repo: Path, *args: str) -> str:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    return subprocess.run(list(args), cwd=repo, check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    images = {f"data/class{i % 4}/{i:03d}.png": bytes([i]) * 64 for i in range(40)}
    r = make_project(tmp_path / "repo", env={"DVC_NO_ANALYTICS": "1"},
                     files={"train.py": "print('trains')\n", "dvc.yaml": DVC_YAML, **images},
                     message="data committed to git")
    monkeypatch.setenv("DVC_ROOT", str(r))
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", run(r, "git", "rev-parse", "HEAD"))
    monkeypatch.setenv("DVC_EXP_NAME", "direct")
    monkeypatch.setenv("DVC_STAGE", "train")
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    monkeypatch.chdir(r)
    (r / "ckpt").mkdir()
    reset()
    yield r
    reset()


def test_a_changed_file_under_the_stage_dep_directory_is_in_the_next_row(repo):
    def blob(sha: str, rel: str) -> str:
        return run(repo, "git", "rev-parse", f"{sha}:{rel}")

    base = os.environ["DVC_EXP_BASELINE_REV"]
    (repo / "ckpt" / "state.txt").write_text("1")
    first = rec.record(1)
    changed, kept = "data/class1/005.png", "data/class2/006.png"
    assert blob(first.sha, changed) == blob(base, changed)
    (repo / "data" / "class1" / "005.png").write_bytes(b"rewritten between checkpoints")
    (repo / "data" / "class3" / "new.png").write_bytes(b"added: git add -A takes it")
    (repo / "ckpt" / "state.txt").write_text("2")
    second = rec.record(2)
    assert run(repo, "git", "show", f"{second.sha}:{changed}") == "rewritten between checkpoints"
    assert run(repo, "git", "show", f"{second.sha}:data/class3/new.png").startswith("added")
    assert blob(second.sha, kept) == blob(base, kept)
    names = run(repo, "git", "ls-tree", "-r", "--name-only", second.sha, "data").split()
    assert len(names) == 41
    (repo / "data" / "class1" / "005.png").write_bytes(b"again")
    (repo / "ckpt" / "state.txt").write_text("3")
    third = rec.record(3)
    assert run(repo, "git", "show", f"{third.sha}:{changed}") == "again"
    assert blob(third.sha, kept) == blob(base, kept)
