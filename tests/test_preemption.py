"""Preemption (issue: preemption-proof training): SIGTERM or SIGUSR1, to the
trainer alone or to the whole process group as SLURM and Kubernetes deliver
it, ends the run with one more row, at the signal's step, recorded and
complete; status 128 + the signal; the rerun ends bit-identical to an
uninterrupted run. Real `dvc exp run`, real DALI, the `dvc-dali init`
template (whose loop uses `ck.should_save`)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dvc_project import REPO, exp_rows, run
from test_wrong_results import template_project

# The trainer, at step PREEMPT_AT, says it is ready and waits for the
# signal, so the test knows the step it lands on.
WAIT_FOR_SIGNAL = '''
    if step == int(os.environ.get("PREEMPT_AT", "0")):
        import time
        with open("preempt-ready.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace("preempt-ready.tmp", "preempt-ready")
        while ck.preempted is None:
            time.sleep(0.01)
'''
USER_HANDLER = '''
import signal
signal.signal(signal.SIGUSR1, lambda s, f: open("user-handler-ran", "w").close())
'''


def preemptible_project(tmp_path: Path, user_handler: bool = False) -> Path:
    project = template_project(tmp_path)
    train = project / "train.py"
    text = train.read_text()
    loop_body = "    x, y = (np.asarray(out.as_tensor()) for out in pipe.run())\n"
    text = text.replace(loop_body, loop_body + WAIT_FOR_SIGNAL.lstrip("\n"))
    if user_handler:
        text = text.replace("import dvc_dali\n", "import dvc_dali\n" + USER_HANDLER)
    train.write_text(text)
    (project / ".gitignore").write_text("preempt-ready*\nuser-handler-ran\n")
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "preemptible"], project)
    return project


def start(project: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.Popen(["dvc", "exp", "run", *args], cwd=project, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PATH": path, "PYTHONPATH": str(REPO),
                                 **(env or {})},
                            start_new_session=True)


def trainer_ready(project: Path, proc: subprocess.Popen) -> int:
    """The trainer's pid, once it waits at PREEMPT_AT (it wrote the file)."""
    ready = project / "preempt-ready"
    while not ready.exists():
        if proc.poll() is not None:
            raise AssertionError(f"dvc exp run ended before the trainer got ready:\n"
                                 f"{proc.stdout.read()}")
        time.sleep(0.02)
    return int(ready.read_text())


def weights(project: Path) -> str:
    return hashlib.sha256((project / "model/weights.npy").read_bytes()).hexdigest()


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
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREEMPT_AT": "11"}
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
