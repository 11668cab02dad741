"""The Keras example (train.framework=keras: examples/train_keras.py, a
Keras 3 fit on Checkpointer.tf_dataset) end to end under real `dvc exp run`
in temporary git repos. Keras epochs are 15 steps, checkpoints every 10:
the row at step 10 is in the middle of epoch 0, 20 in the middle of epoch 1."""

from __future__ import annotations

import pytest

from tests.helpers.dvc_project import model_sha, run, uninterrupted_run
from tests.helpers.rows import asynchronous_row_steps, exp_rows

pytest.importorskip("tensorflow")
pytest.importorskip("nvidia.dali.plugin.tf")

KILL = "DVC_DALI_EXAMPLE_KILL_AT_STEP"
KERAS = ["-S", "train.framework=keras"]  # params.yaml as shipped otherwise


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[str, dict]:
    """The final model and rows of one uninterrupted Keras `dvc exp run` (60 steps)."""
    ref = tmp_path_factory.mktemp("ref_keras")
    sha, out = uninterrupted_run(ref, tuple(KERAS))
    assert "starting (keras)" in out.stdout
    return sha, exp_rows(ref)


def test_keras_learns_with_the_shipped_params(uninterrupted):
    """The params.yaml a user gets (Adam at train.adam_lr, not the NumPy SGD's
    train.lr, at which Adam stayed at chance): well above chance (0.1, ten
    digits) after 60 steps."""
    _, rows = uninterrupted
    metrics = rows["ref-step60"]["metrics"]
    assert metrics["train"]["acc"] > 0.5, metrics


def test_keras_killed_mid_epoch_then_rerun_is_bit_identical(project, uninterrupted):
    sha, ref_rows = uninterrupted
    killed = run(["dvc", "exp", "run", "-n", "a", *KERAS], project, check=False,
                 env={KILL: "20"})  # step 20: 5 steps into the second 15-step epoch
    assert killed.returncode != 0
    rows = exp_rows(project)
    assert rows["a-step10"]["step"] == 10 and rows["a-step20"]["step"] == 20
    assert "a-step30" not in rows
    final = run(["dvc", "exp", "run", "-n", "b", *KERAS], project)
    assert "resuming from step 20 (keras)" in final.stdout
    assert model_sha(project) == sha
    rows = exp_rows(project)
    assert [rows[f"a-step{s}"]["step"] for s in range(30, 61, 10)] == [30, 40, 50, 60]
    # the steps after the resumed epoch log what the uninterrupted run logged
    for s in (40, 50, 60):
        assert rows[f"a-step{s}"]["metrics"] == ref_rows[f"ref-step{s}"]["metrics"]
    # evaluate scores the Keras model too (issue 29): the best row of run a;
    # the uninterrupted run's row of that step has the same weights and score
    scored, ref_scored = rows["b"]["metrics"], ref_rows["ref"]["metrics"]
    assert scored["row"].startswith("a-step") and 0.0 <= scored["acc"] <= 1.0, scored
    if scored["row"][1:] == ref_scored["row"][3:]:  # "-step50": the same best step
        assert scored["acc"] == ref_scored["acc"]


def test_keras_seed_change_on_resume_is_refused(project):
    run(["dvc", "exp", "run", "-n", "a", *KERAS], project, check=False, env={KILL: "10"})
    refused = run(["dvc", "exp", "run", *KERAS, "-S", "train.seed=1"], project, check=False)
    assert refused.returncode != 0
    err = refused.stderr + refused.stdout
    assert "seed: 0 -> 1" in err and "Traceback" not in err
    assert "step     20" not in refused.stdout


def test_switching_to_keras_mid_run_is_refused(project):
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={KILL: "20"})
    refused = run(["dvc", "exp", "run", *KERAS], project, check=False)
    assert refused.returncode != 0
    err = refused.stderr + refused.stdout
    assert "Checkpointer.pipeline()" in err and "tf_dataset()" in err
    assert "Traceback" not in err


def test_keras_model_change_on_resume_is_refused(project):
    """train.hidden is not part of the pipeline: the callback's restore
    refuses the other model, naming the variable and its shapes."""
    run(["dvc", "exp", "run", "-n", "a", *KERAS], project, check=False, env={KILL: "10"})
    refused = run(["dvc", "exp", "run", *KERAS, "-S", "train.hidden=32"], project, check=False)
    assert refused.returncode != 0
    err = refused.stderr + refused.stdout
    assert "sequential/dense/kernel" in err and "(256, 64)" in err and "(256, 32)" in err, err
    assert "Traceback" not in err and "step     20" not in refused.stdout


def test_asynchronous_rows_hold_their_own_steps_metrics(project):
    """DVC_DALI_ASYNC=1: the callback writes the next step's metrics only
    once the checkpoint in flight is recorded, so each row holds its own."""
    assert asynchronous_row_steps(project, KERAS) == [10, 20, 30]
