"""The PyTorch example on 2 processes (torchrun, gloo) under `dvc exp run`:
killed and resumed, it ends with the uninterrupted run's model."""

from __future__ import annotations

import re

import pytest

from tests.helpers.dvc_project import example_on_two_ranks, model_sha, run
from tests.helpers.rows import exp_rows

pytest.importorskip("torch", reason="install the test extra's torch==2.13.0 (CPU)")

TORCH = ["-S", "train.framework=torch", "-S", "train.lr=0.01"]
KILL = "DVC_DALI_EXAMPLE_KILL_AT_STEP"


def two_ranks(path):
    return example_on_two_ranks(path, "examples/train.py", "train on 2 processes")


def test_two_ranks_killed_and_resumed_equal_one_run(tmp_path):
    ref = two_ranks(tmp_path / "ref")
    out = run(["dvc", "exp", "run", "-n", "ref", *TORCH], ref)
    assert out.stderr.count("dvc-dali: rank 1/2 saved step 60") == 1
    work = two_ranks(tmp_path / "work")
    # killed between two checkpoints: each rank compares the batches after step
    # 20 with those its own stream produced before the kill
    killed = run(["dvc", "exp", "run", "-n", "k", *TORCH], work, check=False, env={KILL: "25"})
    assert killed.returncode != 0
    # replayed without training, rank by rank (it was refused with the resume's
    # advice: torchrun, or `dvc-dali reset` of a healthy checkpoint)
    verified = run(["dvc-dali", "doctor", "--verify"], work, check=False)
    for rank in (0, 1):
        assert re.search(rf"ok   checkpoint \(workspace\) rank {rank}/2, pipeline 'train': the "
                         r"[45] batches recorded after step 20 are reproduced exactly",
                         verified.stdout), verified.stdout + verified.stderr
    resumed = run(["dvc", "exp", "run", "-n", "r", *TORCH], work)
    assert resumed.stdout.count("resuming from step 20") == 2  # both ranks
    said = resumed.stdout + resumed.stderr
    assert len(re.findall(r"the [45] batches after the checkpoint at step 20 are those "
                          r"the run it resumes "
                          r"produced", said)) == 2, said[-3000:]
    assert model_sha(work) == model_sha(ref)
    rows = exp_rows(work)
    assert rows["k-step20"]["step"] == 20 and rows["k-step60"]["step"] == 60  # run k goes on
    # --temp after `dvc exp apply`: DVC does not carry the applied checkpoint into
    # its temporary repo; dvc-dali does, once, for both ranks (not step 0 silently)
    run(["dvc", "exp", "apply", "k-step40"], work)
    temp = run(["dvc", "exp", "run", "--temp", "-n", "t", *TORCH, "-S", "train.adam_lr=0.02"],
               work)
    assert temp.stdout.count("resuming from step 40") == 2, temp.stdout[-3000:]
    assert (temp.stdout + temp.stderr).count(
        "the 10 batches after the checkpoint at step 40 are those the run it resumes produced") == 2
    assert exp_rows(work)["t-step50"]["step"] == 50
