"""The Lightning example (train.framework=lightning: examples/train_lightning.py,
Trainer.fit with Checkpointer.lightning_callback) end to end under real
`dvc exp run` in temporary git repos. An epoch is 57 steps, checkpoints
every 10: the kill at step 20 is in the middle of epoch 0, and the resumed
run crosses into epoch 1. The model has dropout (torch's global generator,
restored by dvc-dali)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import child_env
from tests.helpers.dvc_project import model_sha, run, uninterrupted_run
from tests.helpers.fuzz_harness import trainer_below
from tests.helpers.rows import asynchronous_row_steps, exp_rows

pytest.importorskip("lightning")
pytest.importorskip("nvidia.dali.plugin.pytorch")

KILL = "DVC_DALI_EXAMPLE_KILL_AT_STEP"
LIGHTNING = ["-S", "train.framework=lightning"]
MID_EPOCH_WARNING = "resuming from a checkpoint that ended before the epoch ended"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    """The final model of one uninterrupted Lightning `dvc exp run` (60 steps)."""
    sha, out = uninterrupted_run(tmp_path_factory.mktemp("ref_lightning"), tuple(LIGHTNING))
    assert "starting (lightning)" in out.stdout
    return sha


def _killed_then_resumed(project: Path, env: dict | None = None):
    killed = run(["dvc", "exp", "run", "-n", "a", *LIGHTNING], project, check=False,
                 env={KILL: "20", **(env or {})})
    assert killed.returncode != 0
    rows = exp_rows(project)
    assert rows["a-step10"]["step"] == 10 and rows["a-step20"]["step"] == 20
    assert "a-step30" not in rows
    return run(["dvc", "exp", "run", "-n", "b", *LIGHTNING], project, env=env)


def test_lightning_killed_mid_epoch_then_rerun_is_bit_identical(project, uninterrupted):
    final = _killed_then_resumed(project)
    assert "resuming from step 20 (lightning)" in final.stdout
    assert MID_EPOCH_WARNING not in final.stdout + final.stderr
    assert model_sha(project) == uninterrupted
    rows = exp_rows(project)
    assert [rows[f"a-step{s}"]["step"] for s in range(30, 61, 10)] == [30, 40, 50, 60]


def test_without_the_generators_the_resumed_model_differs(project, uninterrupted):
    """The comparison can fail: dropout's draws not restored (DVC_DALI_RNG=0)."""
    _killed_then_resumed(project, {"DVC_DALI_RNG": "0"})
    assert model_sha(project) != uninterrupted


def test_lightning_preempted_saves_at_once_and_resumes_exactly(project, uninterrupted):
    """SIGTERM (outside `dvc exp run`): a checkpoint at the next step, exit
    143, and a rerun ends with the uninterrupted run's model."""
    run([sys.executable, "examples/prepare.py", "data/digits"], project)
    (project / "lightning.yaml").write_text("train:\n  framework: lightning\n")
    cmd = [sys.executable, "examples/train.py", "--params", "lightning.yaml"]
    env = child_env()
    proc = subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:  # waits on the trainer's own output, not on time
        seen.append(line)
        if line.startswith("step     10/60"):
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == 143, "".join(seen)
    assert any("preempted (SIGTERM)" in line for line in seen), "".join(seen)
    resumed = run(cmd, project)
    step = int(resumed.stdout.split("resuming from step ")[1].split()[0])
    assert 10 <= step < 60  # the save of step 10 under way, or the next step
    assert model_sha(project) == uninterrupted


def test_asynchronous_rows_hold_their_own_steps_metrics(project):
    """DVC_DALI_ASYNC=1: the callback writes the next step's metrics only
    once the checkpoint in flight is recorded, so each row holds its own."""
    assert asynchronous_row_steps(project, LIGHTNING) == [10, 20, 30]


def test_lightning_preempted_under_dvc_exp_run_records_the_next_step(project):
    """SIGTERM to the trainer under `dvc exp run`, where dvc-dali's own exit
    line handler is installed before Lightning wraps it into its own: one
    more checkpoint, recorded as a row, then one "preempted" line."""
    proc = subprocess.Popen(["dvc", "exp", "run", "-n", "pre", *LIGHTNING], cwd=project,
                            env=child_env(this_python=True), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:  # waits on the trainer's own output, not on time
        seen.append(line)
        if line.startswith("step     10/60"):
            trainer = trainer_below(proc.pid)
            trainer.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    said = "".join(seen)
    assert "terminated (SIGTERM)" not in said, said[-3000:]
    kept = said.split("preempted (SIGTERM): step ")[1].split()[0]
    # the step whose checkpoint was under way (its line printed first), or the next
    assert f"step {kept} is kept as row pre-step{kept}" in said and int(kept) >= 10, said[-3000:]
    assert exp_rows(project)[f"pre-step{kept}"]["step"] == int(kept)
