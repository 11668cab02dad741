"""The dvc-dali command against real DVC projects."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from dvc_project import clone_project, commit_all, exp_rows, git_init, run

DVC_DALI = [sys.executable, "-m", "dvc_dali.cli"]
KILL = "DVC_DALI_EXAMPLE_KILL_AT_STEP"


@pytest.mark.parametrize("sub", ["init", "show", "run", "reset", "doctor"])
def test_every_subcommand_has_help(tmp_path, sub):
    out = run([*DVC_DALI, sub, "--help"], tmp_path)
    assert out.stdout.startswith("usage: dvc-dali " + sub)


def test_init_writes_a_project_that_runs_and_refuses_to_overwrite(tmp_path):
    from PIL import Image

    git_init(tmp_path)
    run(["dvc", "init", "-q"], tmp_path)
    run([*DVC_DALI, "init"], tmp_path)
    refused = run([*DVC_DALI, "init"], tmp_path, check=False)
    assert refused.returncode == 1 and "--force" in refused.stderr
    (tmp_path / "train.py").write_text("# edited\n" + (tmp_path / "train.py").read_text())
    run([*DVC_DALI, "init", "--force"], tmp_path)
    assert not (tmp_path / "train.py").read_text().startswith("# edited")
    rng = np.random.default_rng(0)
    for c in range(3):
        (tmp_path / "data/images" / str(c)).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 255, (20, 20), dtype=np.uint8)).save(
                tmp_path / "data/images" / str(c) / f"{i}.png")
    params = tmp_path / "params.yaml"
    params.write_text(params.read_text().replace("steps: 100", "steps: 30"))
    commit_all(tmp_path)
    run(["dvc", "exp", "run", "-n", "tpl"], tmp_path)
    rows = exp_rows(tmp_path)
    assert [rows[f"tpl-step{s}"]["step"] for s in (10, 20, 30)] == [10, 20, 30]


@pytest.fixture
def project(tmp_path) -> Path:
    return clone_project(tmp_path)


def test_show_draws_the_checkpoints_by_step_with_a_branch(project):
    run(["dvc", "exp", "run", "-n", "a"], project)
    run(["dvc", "exp", "apply", "a-step30"], project)
    run(["dvc", "exp", "run", "-n", "b", "-S", "train.lr=0.05"], project)
    rows = json.loads(run([*DVC_DALI, "show", "--json"], project).stdout)
    a = [r for r in rows if r["exp"] == "a"]
    assert [r["step"] for r in a] == [10, 20, 30, 40, 50, 60]
    assert all("train/acc" in r["metrics"] for r in rows)
    b40 = next(r for r in rows if r["name"] == "b-step40")
    assert b40["parent"] == next(r for r in a if r["step"] == 30)["sha"]  # resumed from a-step30
    text = run([*DVC_DALI, "show"], project).stdout
    assert "a  (baseline" in text and "b  (baseline" in text
    assert text.index("a-step10") < text.index("a-step20") < text.index("a-step60")
    assert "b  (baseline" in text and "3 checkpoints, resumed from a-step30)" in text
    assert "train/acc=" in text


def test_reset_starts_over(project):
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={KILL: "30"})
    out = run([*DVC_DALI, "reset"], project)
    assert "removed checkpoint" in out.stdout and "dvc.lock:train" in out.stdout
    again = run(["dvc", "exp", "run", "-n", "fresh"], project)
    assert "train: starting on " in again.stdout and "resuming" not in again.stdout
    assert "a-step30" in exp_rows(project)  # recorded rows are kept


def test_doctor_finds_stale_signal_and_bad_stage(project):
    run(["dvc", "exp", "run", "-n", "a"], project)
    good = run([*DVC_DALI, "doctor"], project)
    assert "ok   stage train: checkpoint output checkpoint is persisted" in good.stdout
    assert (project / ".dvc/tmp/rwlock").is_file() and "rwlock" not in good.stdout
    (project / ".dvc/tmp/DVC_CHECKPOINT").write_text("")
    (project / ".dvc/tmp/rwlock").write_text("")  # as a kill mid-write leaves it
    (project / ".git/refs/exps/exec").mkdir(parents=True, exist_ok=True)
    (project / ".git/refs/exps/exec/EXEC_BRANCH.lock").write_text("")
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("always_changed: true", "always_changed: false"))
    bad = run([*DVC_DALI, "doctor"], project, check=False)
    assert bad.returncode == 1
    assert "BAD  " in bad.stdout and "stale checkpoint signal" in bad.stdout
    assert "always_changed: true" in bad.stdout
    assert "EXEC_BRANCH.lock: a git lock left by a killed `dvc exp run`" in bad.stdout
    assert "rwlock: unreadable (JSONDecodeError), left by a killed DVC command" in bad.stdout


def test_retention_keeps_last_n_and_the_best(project):
    run(["dvc", "exp", "run", "-n", "r"], project,
        env={"DVC_DALI_KEEP_LAST": "2", "DVC_DALI_KEEP_BEST": "train/loss:max"})
    names = {n for n in exp_rows(project) if n.startswith("r-")}
    # loss falls as training goes on: the max-loss row is the first one
    assert names == {"r-step10", "r-step50", "r-step60"}


SHELL_TRAINER = """#!/bin/sh
# A non-Python trainer following DVC 2's protocol.
set -e
mkdir -p checkpoint
for step in 1 2 3; do
  echo "state at step $step" > checkpoint/state.txt
  echo "{\\"step\\": $step}" > metrics.json
  touch "$DVC_ROOT/.dvc/tmp/DVC_CHECKPOINT"
  while [ -e "$DVC_ROOT/.dvc/tmp/DVC_CHECKPOINT" ]; do sleep 0.01; done
done
"""


def test_run_wrapper_records_a_non_python_trainer(tmp_path):
    git_init(tmp_path)
    run(["dvc", "init", "-q"], tmp_path)
    (tmp_path / "train.sh").write_text(SHELL_TRAINER)
    (tmp_path / "train.sh").chmod(0o755)
    (tmp_path / "dvc.yaml").write_text(
        f"stages:\n  train:\n    cmd: {sys.executable} -m dvc_dali.cli run -- ./train.sh\n"
        "    outs:\n      - checkpoint:\n          persist: true\n"
        "    metrics:\n      - metrics.json:\n          cache: false\n"
        "    always_changed: true\n")
    commit_all(tmp_path)
    out = run(["dvc", "exp", "run", "-n", "sh"], tmp_path)
    assert out.stderr.count("dvc-dali: recorded sh-step") == 3
    rows = exp_rows(tmp_path)
    assert [rows[f"sh-step{s}"]["step"] for s in (1, 2, 3)] == [1, 2, 3]
    run(["dvc", "exp", "apply", "sh-step2"], tmp_path)
    assert (tmp_path / "checkpoint/state.txt").read_text() == "state at step 2\n"
    assert not (tmp_path / ".dvc/tmp/DVC_CHECKPOINT").exists()
