"""The PyTorch example (train.framework=torch: examples/train_torch.py) end
to end under real `dvc exp run` in temporary git repos."""

from __future__ import annotations

import pytest

from tests.helpers.dvc_project import make_project, model_sha, run, uninterrupted_run
from tests.helpers.rows import exp_rows

pytest.importorskip("torch")
pytest.importorskip("nvidia.dali.plugin.pytorch")

KILL = "DVC_DALI_EXAMPLE_KILL_AT_STEP"
TORCH = ["-S", "train.framework=torch"]
# One epoch is 57 steps (1797 images, batch 32, the last batch partial):
# checkpoints at 57 and 114 land right after an epoch's last batch.
EPOCHS = [*TORCH, "-S", "train.steps=120", "-S", "train.checkpoint_every=57"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    """The final model of one uninterrupted torch `dvc exp run` (60 steps)."""
    sha, out = uninterrupted_run(tmp_path_factory.mktemp("ref_torch"), tuple(TORCH))
    assert "starting on cpu (torch)" in out.stdout or "starting on gpu (torch)" in out.stdout
    return sha


def test_torch_sigkill_then_rerun_is_bit_identical(project, uninterrupted):
    killed = run(["dvc", "exp", "run", "-n", "a", *TORCH], project, check=False,
                 env={KILL: "20"})
    assert killed.returncode != 0
    rows = exp_rows(project)
    assert rows["a-step10"]["step"] == 10 and rows["a-step20"]["step"] == 20
    assert "a-step30" not in rows
    final = run(["dvc", "exp", "run", "-n", "b", *TORCH], project)
    assert "resuming from step 20" in final.stdout and "(torch)" in final.stdout
    assert model_sha(project) == uninterrupted
    rows = exp_rows(project)
    assert {rows[f"a-step{s}"]["step"] for s in range(30, 61, 10)} == set(range(30, 61, 10))
    # evaluate scores the torch model too (issue 29): the best row of run a
    scored = rows["b"]["metrics"]
    assert scored["row"].startswith("a-step") and 0.0 <= scored["acc"] <= 1.0, scored


def test_torch_killed_at_epoch_boundaries_resumes_exactly(project, tmp_path_factory):
    ref = make_project(tmp_path_factory.mktemp("ref_epochs"), example=True)
    run(["dvc", "exp", "run", "-n", "ref", *EPOCHS], ref)
    assert {exp_rows(ref)[f"ref-step{s}"]["step"] for s in (57, 114, 120)} == {57, 114, 120}

    # Killed right after the last batch of epoch 1, then of epoch 2.
    first = run(["dvc", "exp", "run", "-n", "a", *EPOCHS], project, check=False,
                env={KILL: "57"})
    assert first.returncode != 0
    second = run(["dvc", "exp", "run", "-n", "b", *EPOCHS], project, check=False,
                 env={KILL: "114"})
    assert second.returncode != 0 and "resuming from step 57" in second.stdout
    final = run(["dvc", "exp", "run", "-n", "c", *EPOCHS], project)
    assert "resuming from step 114" in final.stdout
    assert model_sha(project) == model_sha(ref)
    rows = exp_rows(project)
    assert (rows["a-step57"]["step"], rows["a-step114"]["step"], rows["a-step120"]["step"]) \
        == (57, 114, 120)
    assert rows["a-step120"]["metrics"] == exp_rows(ref)["ref-step120"]["metrics"]


def test_switching_framework_mid_run_is_refused(project):
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={KILL: "20"})
    refused = run(["dvc", "exp", "run", *TORCH], project, check=False)
    assert refused.returncode != 0
    err = refused.stderr + refused.stdout
    assert "holds no PyTorch model" in err and "framework" in err
    assert "step     30" not in refused.stdout
