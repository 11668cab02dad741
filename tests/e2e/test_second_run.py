"""A second command in the workspace while a `dvc exp run` trains there.

The example trains (40 steps, a row every 10) and is held at a gate right
after its row at step 20, while a second command runs in the same
workspace: a second `dvc exp run -S train.lr=0.2`, a plain second `dvc exp
run`, a `dvc checkout` (with params.yaml edited meanwhile), a `dvc exp
apply` of one of its earlier rows. The first run must end well, every row
and DVC's own experiment of it holding its own params and its own training
(its final model is an uninterrupted run's), nothing cached lost; where it
cannot go on safely (`dvc exp apply`: DVCLive's files are another row's) it
stops with one line saying so, recording nothing wrong.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from dvc_dali.reading.exp_refs import list_rows as list_checkpoint_rows

from tests.helpers.dvc_project import leave_stashed_entry, make_project, run
from tests.helpers.fuzz_harness import (ExpRun, cached_checkpoint_step, check_row_data, git,
                                        reset, show)
from tests.helpers.fuzz_kill import model_md5_in_row

STEPS, EVERY, GATE_AT = 40, 10, 20
LR, OTHER_LR = 0.05, 0.2  # the first run's (HEAD has 0.1), the second command's

# The example's trainer, held after its checkpoint at step GATE ("<step>:<path>"):
# it writes <path>.reached once that row is recorded, then waits for <path>.
GATED_TRAIN = '''\
import os
import sys
import time

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"
sys.path.insert(0, "examples")
import runpy

import common

step_at, _, gate = os.environ.get("GATE", "").partition(":")
plain = common.checkpoint_interval


def gated(ck, live, step, *args, **kwargs):
    plain(ck, live, step, *args, **kwargs)
    if gate and str(step) == step_at:
        open(gate + ".reached", "w").close()
        while not os.path.exists(gate):
            time.sleep(0.05)  # the test runs its second command here


common.checkpoint_interval = gated
sys.argv = ["examples/train.py"]
runpy.run_path("examples/train.py", run_name="__main__")
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("second_run")
    (root / "logs").mkdir()
    project = make_project(root / "project", example=True, prepared=True)
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("steps: 60", f"steps: {STEPS}"))
    (project / "gated_train.py").write_text(GATED_TRAIN)
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("cmd: python examples/train.py",
                                                     "cmd: python gated_train.py"))
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "gated trainer"], project)
    return project


@pytest.fixture(scope="module")
def reference(project) -> str:
    """md5 of the final model of an uninterrupted run with the first run's params."""
    run(["dvc", "exp", "run", "-n", "ref", "-S", f"train.lr={LR}"], project)
    return final_model(project, "ref")


def baseline(project: Path) -> str:
    return git(project, "rev-parse", "HEAD").strip()


def exp_sha(project: Path, name: str) -> str:
    base = baseline(project)
    return git(project, "rev-parse", f"refs/exps/{base[:2]}/{base[2:]}/{name}").strip()


def lr_of(project: Path, sha: str) -> tuple[float, float]:
    """train.lr in params.yaml and in dvc.lock of commit sha."""
    params = yaml.safe_load(show(project, sha, "params.yaml"))["train"]["lr"]
    lock = yaml.safe_load(show(project, sha, "dvc.lock"))
    return params, lock["stages"]["train"]["params"]["params.yaml"]["train"]["lr"]


def final_model(project: Path, name: str) -> str:
    """md5 of model.npz in DVC's own experiment ``name`` (its last commit)."""
    sha = exp_sha(project, name)
    check_row_data(project, sha)
    return model_md5_in_row(project, yaml.safe_load(show(project, sha, "dvc.lock")))


def start_first(project: Path, name: str) -> tuple[ExpRun, Path]:
    """The first run, from step 0, held at its gate once its row at step
    GATE_AT is recorded."""
    reset(project)
    logs = project.parent / "logs"
    gate = logs / f"{name}.gate"
    first = ExpRun(project, ["-n", name, "-S", f"train.lr={LR}"], logs / f"{name}.log",
                   env={"GATE": f"{GATE_AT}:{gate}"})
    reached = Path(f"{gate}.reached")
    deadline = time.monotonic() + 300  # a cap for a stuck run, not a timing
    while not reached.exists():
        assert first.poll() is None, f"the first run ended early:\n{first.output()[-3000:]}"
        assert time.monotonic() < deadline, first.output()[-3000:]
        time.sleep(0.05)
    return first, gate


def finish(run_: ExpRun, gate: Path | None = None) -> tuple[int, str]:
    if gate is not None:
        gate.touch()
    try:
        return run_.wait(400), run_.output()
    finally:
        run_.close()


def check_rows(project: Path, name: str, steps: list[int], lr: float = LR) -> None:
    """The rows of run ``name``: one per checkpoint, its params, its
    checkpoint, everything in the cache."""
    rows = list_checkpoint_rows(str(project), name)
    assert [r["step"] for r in rows] == steps, [r["name"] for r in rows]
    for row in rows:
        assert lr_of(project, row["sha"]) == (lr, lr), row["name"]
        outs = check_row_data(project, row["sha"])
        assert cached_checkpoint_step(project, outs["checkpoint"]) == row["step"], row["name"]


def check_first(project: Path, name: str, rc: int, out: str, reference: str) -> None:
    assert rc == 0, out[-4000:]
    check_rows(project, name, list(range(EVERY, STEPS + 1, EVERY)))
    # DVC's own experiment of the run: its params, its final model.
    assert lr_of(project, exp_sha(project, name)) == (LR, LR)
    assert final_model(project, name) == reference


@pytest.mark.parametrize("second_args", [["-S", f"train.lr={OTHER_LR}"], []],
                         ids=["with_S", "plain"])
def test_a_second_dvc_exp_run_is_refused_before_it_touches_anything(project, reference,
                                                                    second_args):
    """DVC's second workspace run used to stash the workspace, write its -S
    into params.yaml, take over refs/exps/exec and check the outputs dvc.lock
    named out over the first's before refusing ("'data/digits' is busy"):
    the first then failed to record ("not in the DVC cache after caching
    it") or DVC's own final commit of it failed ("'NoneType' object is not
    subscriptable"). Now DVC refuses it at once, naming the training."""
    name = f"first-{'s' if second_args else 'plain'}"
    first, gate = start_first(project, name)
    try:
        before = (project / "params.yaml").read_bytes(), git(project, "status", "--porcelain")
        second = run(["dvc", "exp", "run", "-n", f"{name}-2nd", *second_args], project,
                     check=False)
        said = second.stdout + second.stderr
        assert second.returncode != 0, said
        assert "is busy" in said and "training in this workspace" in said, said
        assert "Traceback" not in said
        assert ((project / "params.yaml").read_bytes(),
                git(project, "status", "--porcelain")) == before
    finally:
        rc, out = finish(first, gate)
    check_first(project, name, rc, out, reference)
    assert "changed by another command" not in out
    # Once the first ended, the workspace is free again: the same command runs
    # (without -S it is refused by dvc-dali instead: nothing is left to train).
    again = run(["dvc", "exp", "run", "-n", f"{name}-2nd", *second_args], project,
                check=False)
    said = again.stdout + again.stderr
    assert "is busy" not in said and "had been killed" not in said, said
    if second_args:
        assert again.returncode == 0, said
        assert lr_of(project, exp_sha(project, f"{name}-2nd")) == (OTHER_LR, OTHER_LR)
    else:
        assert "nothing to train" in said, said


def test_dvc_checkout_and_a_params_edit_meanwhile(project, reference):
    """`dvc checkout` puts back the outputs dvc.lock names (the row just
    recorded): the run goes on. params.yaml edited meanwhile: rows and DVC's
    own experiment keep the run's params, one line says so, and the file
    gets them back."""
    name = "first-checkout"
    first, gate = start_first(project, name)
    params = project / "params.yaml"
    started = params.read_text()
    params.write_text(started.replace(f"lr: {LR}", f"lr: {OTHER_LR}"))
    run(["dvc", "checkout"], project)
    rc, out = finish(first, gate)
    check_first(project, name, rc, out, reference)
    said = [ln for ln in out.splitlines() if "changed by another command" in ln]
    assert len(said) == 1 and "params.yaml" in said[0], out[-3000:]
    assert params.read_text() == started


def test_dvc_exp_apply_meanwhile_stops_the_run_cleanly(project):
    """`dvc exp apply` of an earlier row checks that row's dvc.lock, outputs
    and DVCLive files out (DVCLive then appends to another row's history):
    the run records nothing more and says so in one line; its rows stand."""
    name = "first-apply"
    first, gate = start_first(project, name)
    run(["dvc", "exp", "apply", f"{name}-step10"], project)
    rc, out = finish(first, gate)
    assert rc != 0
    said = [ln for ln in out.splitlines() if "was changed by another command" in ln]
    assert len(said) == 1 and f"dvc exp apply {name}-step20" in said[0], out[-3000:]
    assert "Traceback" not in out
    check_rows(project, name, [10, 20])


def test_an_entry_a_killed_run_left_stashed_runs_after_this_one(project, reference):
    """DVC's next workspace `dvc exp run` runs its own entry, then the one a
    killed run left stashed. Our hold on the workspace (the refusal above)
    used to last until the `dvc exp run` process ended, so DVC waited on it
    for 3 minutes to take that entry and failed ("'refs/exps/stash' is busy
    ... training in this workspace"), after training (kill fuzz, CI). Now the
    hold ends with DVC's final commit of the run: both experiments are
    recorded, each with the params it trained with, and nothing is held."""
    name = "before-leftover"
    reset(project)
    leave_stashed_entry(project, "leftover", f"train.lr={LR}", f"train.steps={STEPS + EVERY}")
    done = run(["dvc", "exp", "run", "-n", name, "-S", f"train.lr={LR}"], project,
               check=False)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    assert "is busy" not in said and "Traceback" not in said, said[-4000:]
    # the left entry resumed this run's last checkpoint and trained on to its
    # steps: one more row in the same lineage, with its own steps
    assert f"train: resuming from step {STEPS}" in said, said[-4000:]
    check_rows(project, name, list(range(EVERY, STEPS + EVERY + 1, EVERY)))
    assert lr_of(project, exp_sha(project, name)) == (LR, LR)
    assert final_model(project, name) == reference
    for row, steps in ((f"{name}-step{STEPS}", STEPS), (f"{name}-step{STEPS + EVERY}",
                                                         STEPS + EVERY),
                       ("leftover", STEPS + EVERY)):
        got = yaml.safe_load(show(project, exp_sha(project, row), "params.yaml"))
        assert got["train"]["steps"] == steps, (row, got)
    assert git(project, "for-each-ref", "refs/exps/stash").strip() == ""
    held = json.loads((project / ".dvc" / "tmp" / "exps" / "rwlock").read_text())
    assert not held.get("read"), held
