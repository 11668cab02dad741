"""Two DVC projects in one git repository (`dvc init --subdir` in sibling
folders), each with a checkpoint stage of the same name and a bare DVC 2
`make_checkpoint()` script: they share the repository's experiment refs, and
their stage addresses ("dvc.yaml:train") and outputs read alike. A run of
one resumes its own rows only. Real `dvc exp run`, one repository for the
module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import dvc_dali
from dvc_dali.reading.exp_refs import parse_lineage

from tests.helpers.dvc_project import commit_all, make_project, run
from tests.helpers.rows import row_refs

# Deterministic: both projects' checkpoints hold the same bytes at a step.
BARE = """\
import os
from dvc_dali import make_checkpoint
os.makedirs("checkpoint", exist_ok=True)
p = "checkpoint/state.txt"
step = int(open(p).read()) if os.path.exists(p) else 0
while step < 4:
    step += 1
    open(p, "w").write(str(step))
    if step % 2 == 0:
        make_checkpoint()
        if os.environ.get("KILL_AT") == str(step):
            os.kill(os.getpid(), 9)
"""

DVC_YAML = """\
stages:
  train:
    cmd: python train.py
    deps: [train.py]
    outs:
      - checkpoint:
          persist: true
          checkpoint: true
    always_changed: true
"""


def exp_run(project: Path, *args: str, env: dict | None = None, check: bool = True):
    return run([sys.executable, "-m", "dvc", "exp", "run", *args], project, env=env,
               check=check)


def lineage(repo: Path, ref: str) -> dict[str, str]:
    return parse_lineage(run(["git", "log", "-1", "--format=%B", ref], repo).stdout)


@pytest.fixture(scope="module")
def mono(tmp_path_factory) -> Path:
    files = {f"{p}/{name}": text for p in ("pa", "pb")
             for name, text in (("train.py", BARE), ("dvc.yaml", DVC_YAML))}
    repo = make_project(tmp_path_factory.mktemp("mono") / "repo", dvc_init=False, files=files,
                        message=None)
    for project in ("pa", "pb"):
        run([sys.executable, "-m", "dvc", "init", "-q", "--subdir"], repo / project)
    commit_all(repo, "two DVC projects")
    return repo


@pytest.fixture(scope="module")
def two_runs(mono) -> dict[str, tuple[str, str]]:
    """pb killed after its first row; pa then records rows of the same stage
    address and the same outputs; pb resumed. The row refs, by name."""
    pa, pb = mono / "pa", mono / "pb"
    assert exp_run(pb, "-n", "b", env={"KILL_AT": "2"}, check=False).returncode != 0
    exp_run(pa, "-n", "a")
    exp_run(pb)
    return row_refs(mono)


def test_a_resumed_run_continues_its_own_projects_row_not_a_siblings(mono, two_runs):
    """pb resumed continued pa's run (its row named a-step2-<sha>, parent
    pa's row)."""
    refs = two_runs
    assert {"a-step1", "a-step2", "b-step1", "b-step2"} <= set(refs), sorted(refs)
    resumed = lineage(mono, refs["b-step2"][0])
    assert resumed["exp"] == "b" and resumed["parent"] == refs["b-step1"][1]
    assert resumed["root"] == "pb" and lineage(mono, refs["a-step2"][0])["root"] == "pa"
    assert not [name for name in refs if name.startswith("a-step2-")]


def test_show_and_rows_list_only_their_own_projects_runs(mono, two_runs):
    """`dvc-dali show` in pa listed pb's run b too (and `rows`, `show b`,
    `show --best` with it): the projects share the repository's refs."""
    shown = {p: run([sys.executable, "-m", "dvc_dali", "show"], mono / p).stdout
             for p in ("pa", "pb")}
    assert "a-step2" in shown["pa"] and "b-step" not in shown["pa"], shown["pa"]
    assert "b-step2" in shown["pb"] and "a-step" not in shown["pb"], shown["pb"]
    assert {r["exp"] for r in dvc_dali.rows(repo=str(mono / "pa"))} == {"a"}
    other = run([sys.executable, "-m", "dvc_dali", "show", "b"], mono / "pa", check=False)
    assert other.returncode == 1 and "no checkpoints recorded" in other.stderr
