"""Preemption (issue: preemption-proof training): SIGTERM or SIGUSR1, to the
trainer alone or to the whole process group as SLURM and Kubernetes deliver
it, ends the run with one more row, at the signal's step, recorded and
complete; status 128 + the signal; the rerun ends bit-identical to an
uninterrupted run. Real `dvc exp run`, real DALI, the `dvc-dali init`
template (whose loop uses `ck.should_save`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.helpers.dvc_project import run, template_project
from tests.helpers.preempt import (ctrl_c_then, preemptible_project, start, trainer_ready,
                                   weights)
from tests.helpers.rows import exp_rows
from tests.helpers import child_env

@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    project = template_project(tmp_path_factory.mktemp("ref"))
    run(["dvc", "exp", "run", "-n", "ref", "-S", "train.checkpoint_every=1000"], project)
    return weights(project)


@pytest.mark.parametrize("target,sig", [("trainer", "SIGTERM"), ("group", "SIGTERM"),
                                        ("trainer", "SIGUSR1")])
def test_a_preempted_run_records_its_step_exits_and_resumes_exactly(
        tmp_path, uninterrupted, target, sig):
    project = preemptible_project(tmp_path)
    proc = start(project, "-n", "a", "-S", "train.checkpoint_every=1000",
                 env={"PREEMPT_AT": "13"})
    pid = trainer_ready(project, proc)
    signum = getattr(signal, sig)
    if target == "group":  # `dvc exp run` and the trainer, as SLURM and Kubernetes do
        os.killpg(proc.pid, signum)
    else:
        os.kill(pid, signum)
    out = proc.communicate()[0]  # the pipe closes when the trainer has ended too
    assert proc.returncode != 0, out
    if target == "trainer":  # DVC reports the trainer's status
        assert f"exited with {128 + signum}" in out or f"code {128 + signum}" in out, out
    assert f"dvc-dali: preempted ({sig}): step 13 is kept as row a-step13; `dvc exp run` " \
           "resumes from it" in out, out
    assert "Traceback" not in out, out
    rows = exp_rows(project)
    assert {name: r["step"] for name, r in rows.items()} == {"a-step13": 13}, rows
    # complete: the row applies, and its checkpoint is the step-13 one
    run(["dvc", "exp", "apply", "a-step13"], project)
    again = run(["dvc", "exp", "run", "-n", "b", "-S", "train.checkpoint_every=1000"], project)
    assert "resuming at step 13" in again.stdout + again.stderr
    assert weights(project) == uninterrupted


def test_the_application_s_own_handler_still_runs(tmp_path, uninterrupted):
    project = preemptible_project(tmp_path, user_handler=True)
    proc = start(project, "-n", "a", "-S", "train.checkpoint_every=1000",
                 env={"PREEMPT_AT": "7"})
    os.kill(trainer_ready(project, proc), signal.SIGUSR1)
    out = proc.communicate()[0]
    assert (project / "user-handler-ran").exists(), out
    assert "step 7 is kept as row a-step7" in out, out
    run(["dvc", "exp", "run", "-n", "b", "-S", "train.checkpoint_every=1000"], project)
    assert weights(project) == uninterrupted


def test_outside_dvc_the_signal_saves_and_exits(tmp_path, uninterrupted):
    """Plain `python train.py`: the checkpoint stays on disk, the next run resumes."""
    project = preemptible_project(tmp_path)
    (project / "params.yaml").write_text(
        (project / "params.yaml").read_text().replace("checkpoint_every: 10",
                                                      "checkpoint_every: 1000"))
    env = child_env({"PREEMPT_AT": "11"})
    proc = subprocess.Popen([sys.executable, "train.py"], cwd=project, text=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.kill(trainer_ready(project, proc), signal.SIGTERM)
    out = proc.communicate()[0]
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "preempted (SIGTERM): step 11 is saved in checkpoint" in out, out
    env.pop("PREEMPT_AT")
    again = subprocess.run([sys.executable, "train.py"], cwd=project, text=True, env=env,
                           capture_output=True, check=True)
    assert "resuming at step 11" in again.stdout, again.stdout + again.stderr
    assert weights(project) == uninterrupted


def test_ctrl_c_twice_stops_once_and_resumes_exactly(tmp_path, uninterrupted):
    """Ctrl-C, then Ctrl-C again while the run stops (a person pressing it
    twice): one line each, no traceback (it was a KeyboardInterrupt traceback
    from wherever the exit was); the rerun resumes the row kept, exactly."""
    project = preemptible_project(tmp_path, at_exit=True)
    code, out = ctrl_c_then(project, lambda dvc, _trainer: os.killpg(dvc, signal.SIGINT))
    assert code != 0, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert "dvc-dali: interrupted (Ctrl-C): step 10 is kept as row a-step10" in out, out
    assert out.count("dvc-dali: Ctrl-C again: ignored, the run is stopping") == 1, out
    assert {r["step"] for r in exp_rows(project).values()} == {5, 10}
    again = run(["dvc", "exp", "run", "-S", "train.checkpoint_every=5"], project)
    assert "resuming at step 10" in again.stdout + again.stderr
    assert weights(project) == uninterrupted
