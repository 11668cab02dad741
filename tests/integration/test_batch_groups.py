"""A GPU pipeline's batches are recorded in groups (batch_digests: one
launch and one companion write for a group, on the digest thread): each
batch still gets its own digest, in order, into the companion file and the
next manifest; a save, a wait and a close hand the group waiting over; a
group whose digest fails marks each of its batches failed, said once; a
run killed while a group waits loses only the digests of the batches at its
end, and its resume proves the ones recorded. Run here on a CPU pipeline's
batches through the same path (batch_digests.GROUP_ON_CPU); the GPU's own
launch is held to the model in test_device_digest.py."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dvc_dali.proof import batch_digests
from tests.helpers import pipelines
from tests.helpers.proof import companion, manifest, same_as_uninterrupted
from tests.helpers.proof import run as proof_run


@pytest.fixture
def grouped(monkeypatch):
    monkeypatch.setattr(batch_digests, "GROUP_ON_CPU", True)
    monkeypatch.setattr(batch_digests, "GROUP_WINDOW_S", 3600.0)  # however slowly they come


def _checkpointer(tmp_path, name="ckpt"):
    import dvc_dali

    ck = dvc_dali.Checkpointer(tmp_path / name)
    fn, kwargs = pipelines.make("source", str(tmp_path))["train"]
    return ck, ck.pipeline("train", fn, **kwargs)


def test_each_batch_of_a_group_gets_its_own_digest_in_order(tmp_path, grouped):
    ck, pipe = _checkpointer(tmp_path)
    ck.save(0)
    log_id = batch_digests.log_id_of(manifest(tmp_path / "ckpt"))
    kept = [pipe.run() for _ in range(10)]  # the executor keeps them while referenced
    ck._batches.wait()  # noqa: SLF001 (the group waiting, handed over and appended)
    want = [batch_digests.digest(batch) for batch in kept]
    costs = ck._batches.costs  # noqa: SLF001
    # the first alone (its bytes unknown; the second too where it came before
    # the first's bytes were known), the others in one group
    assert costs.background == 10 and costs.groups in (2, 3), costs
    assert batch_digests.read_companion(companion(tmp_path / "ckpt"), log_id)["train"] == want
    more = [pipe.run() for _ in range(3)]
    ck.save(13)  # hands the three waiting over before the manifest is written
    record = manifest(tmp_path / "ckpt")["pipelines"]["train"]["batches"]
    assert record["previous"] == log_id
    assert record["digests"] == want + [batch_digests.digest(b) for b in more]
    ck.close()


def test_a_group_whose_digest_fails_marks_each_batch_said_once(tmp_path, grouped, monkeypatch,
                                                               capsys):
    ck, pipe = _checkpointer(tmp_path)
    ck.save(0)

    def fails(batches):
        raise MemoryError("out of pinned memory")

    monkeypatch.setattr(batch_digests, "begin_group", fails)
    for _ in range(5):
        pipe.run()
    ck.close()
    record = batch_digests.read_companion(companion(tmp_path / "ckpt"),
                                          batch_digests.log_id_of(manifest(tmp_path / "ckpt")))
    assert record["train"] == [["failed:MemoryError"]] * 5  # marked, none dropped
    assert capsys.readouterr().err.count("out of pinned memory") == 1


def test_a_run_killed_while_a_group_waits_resumes_proven_on_what_was_recorded(tmp_path):
    ckpt = tmp_path / "ckpt"
    killed = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 9, save_at=[2],
                       kill_after=7, PROOF_GROUPED="1")
    assert killed.returncode == -9, killed.stderr[-3000:]
    kept = batch_digests.read_companion(companion(ckpt), batch_digests.log_id_of(manifest(ckpt)))
    # step 3's went alone; those after it waited in a group (or went with it)
    assert 1 <= len(kept["train"]) <= 5, kept
    resumed = proof_run("source", tmp_path, ckpt, tmp_path / "resumed.npz", 9,
                        PROOF_GROUPED="1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    n = len(kept["train"])
    these = "the batch" if n == 1 else f"the {n} batches"
    assert re.search(rf"pipeline 'train': {these} after the checkpoint at step 2 (is the one|"
                     rf"are those) the run it resumes produced", resumed.stderr), resumed.stderr
    same_as_uninterrupted("source", tmp_path, tmp_path, tmp_path / "resumed.npz", 9)


def test_a_run_that_exits_without_close_keeps_each_batchs_digest(tmp_path):
    """The runner ends without ck.close(): the group waiting at the
    interpreter's exit is digested and written, not lost."""
    ckpt = tmp_path / "ckpt"
    proc = proof_run("source", tmp_path, ckpt, tmp_path / "first.npz", 7, save_at=[2],
                     PROOF_GROUPED="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = batch_digests.read_companion(companion(ckpt), batch_digests.log_id_of(manifest(ckpt)))
    assert len(kept["train"]) == 5, kept  # steps 3-7


@pytest.mark.parametrize("grouped_too", [False, True])
def test_a_host_batch_is_hashed_before_the_step_can_write_into_it(tmp_path, monkeypatch,
                                                                 grouped_too):
    """A step may write into the outputs DALI handed out (PyTorch's iterators
    share their memory): a host batch, or a grouped batch's host outputs, is
    hashed before it is handed out, its line written then, so what the step
    writes is never what was recorded (found by a sweep: the digest thread
    hashed a batch the step had zeroed, and the exact resume was refused)."""
    if grouped_too:
        monkeypatch.setattr(batch_digests, "GROUP_ON_CPU", True)
        monkeypatch.setattr(batch_digests, "GROUP_WINDOW_S", 3600.0)
    ck, pipe = _checkpointer(tmp_path)
    ck.save(0)
    log_id = batch_digests.log_id_of(manifest(tmp_path / "ckpt"))
    want = []
    for _ in range(5):
        batch = pipe.run()
        want.append(batch_digests.digest(batch))  # as DALI produced it
        for output in batch:
            np.asarray(output.as_tensor())[...] = 0  # the step's write, in DALI's memory
    costs = ck._batches.costs  # noqa: SLF001
    ck._batches.wait()  # noqa: SLF001 (a group waiting, handed over and appended)
    assert costs.background == (5 if grouped_too else 0), costs
    assert batch_digests.read_companion(companion(tmp_path / "ckpt"), log_id)["train"] == want
    ck.save(5)
    assert manifest(tmp_path / "ckpt")["pipelines"]["train"]["batches"]["digests"] == want
    ck.close()
