"""Proof at runtime for DALI dynamic mode: each batch a reader registered on
``Checkpointer.dynamic()`` yields is digested (stream "dynamic/reader"), and
a resume whose reader yields another batch after the same checkpoint is
refused before the step that would train on it. A real ndd.readers.File
over real JPEG files (encoded, so ragged: each file its own length) and a
registered RNG; the runs are killed with SIGKILL between two checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dvc_dali.proof import batch_digests
from tests.helpers.proof import (companion, manifest, outputs, perturb_same_size_and_mtime,
                                 refused_then_inexact)
from tests.helpers.proof import run as proof_run

pytest.importorskip("nvidia.dali.experimental.dynamic", reason="DALI without dynamic mode")

STREAM = "dynamic/reader"  # Checkpointer.dynamic()'s default name / the reader's
# No content digest: dynamic mode has none anyway, and with it off only the
# batches can tell a file rewritten with its size and mtime kept.
OFF = {"DVC_DALI_CONTENT_DIGEST_MAX": "0"}


def perturb_all(images: Path) -> None:
    """Every file the reader reads (so those of steps 3-4 too), one bit of
    its JPEG scan flipped, size and mtime kept."""
    for path in (images / "images").rglob("*.jpg"):
        perturb_same_size_and_mtime(path)


def killed_after_4(images: Path, ckpt: Path, out: Path, **env: str) -> None:
    """Saved at step 2, killed (SIGKILL) after step 4."""
    proc = proof_run("dynamic", images, ckpt, out, 6, save_at=[2], kill_after=4, **env)
    assert proc.returncode == -9, proc.stderr[-3000:]


def test_a_rewritten_file_the_readers_next_batches_read_is_refused(tmp_path, images):
    ckpt = tmp_path / "ckpt"
    killed_after_4(images, ckpt, tmp_path / "first.npz", **OFF)
    log_id = batch_digests.log_id_of(manifest(ckpt))
    assert log_id is not None  # found in the manifest's dynamic part
    kept = batch_digests.read_companion(companion(ckpt), log_id)
    # steps 3 and 4, each digested before the loop got it
    assert len(kept[STREAM]) == 2, kept
    perturb_all(images)

    text = refused_then_inexact("dynamic", images, ckpt, tmp_path / "resumed.npz",
                                f"dynamic-mode reader {STREAM!r}", **OFF)
    assert "not described in the checkpoint" in text, text
    assert outputs(tmp_path / "resumed.npz")["restored_step"] == 2


def test_unchanged_data_resumes_to_the_batches_of_an_uninterrupted_run(tmp_path, images):
    ckpt = tmp_path / "ckpt"
    killed_after_4(images, ckpt, tmp_path / "first.npz")
    proc = proof_run("dynamic", images, ckpt, tmp_path / "resumed.npz", 6)
    assert proc.returncode == 0, proc.stderr[-3000:]  # steps 3-4 compared, equal
    whole = proof_run("dynamic", images, tmp_path / "whole", tmp_path / "whole.npz", 6)
    assert whole.returncode == 0, whole.stderr[-3000:]
    resumed, reference = outputs(tmp_path / "resumed.npz"), outputs(tmp_path / "whole.npz")
    keys = [k for k in resumed if k[:4].isdigit()]
    assert {k[:4] for k in keys} == {"0002", "0003", "0004", "0005"}
    assert all(np.array_equal(resumed[k], reference[k]) for k in keys)
    assert any("_files_" in k for k in keys) and any(k.endswith("_angle") for k in keys)
    # the resume recorded what came after the batches it compared
    log_id = batch_digests.log_id_of(manifest(ckpt))
    assert len(batch_digests.read_companion(companion(ckpt), log_id)[STREAM]) == 4


def test_the_next_checkpoint_holds_the_readers_digests(tmp_path, images):
    # under its dynamic-mode Checkpoint's entry, by reader name; the RNG has none
    ckpt = tmp_path / "ckpt"
    proc = proof_run("dynamic", images, ckpt, tmp_path / "first.npz", 6, save_at=[2, 4],
                     kill_after=5)
    assert proc.returncode == -9, proc.stderr[-3000:]
    doc = manifest(ckpt)
    records = doc["dynamic"]["dynamic"]["batches"]
    assert set(records) == {"reader"}, records
    record = records["reader"]
    assert len(record["digests"]) == 2 and record["previous"] and record["log"]
    assert batch_digests.log_id_of(doc) == record["log"]
    assert batch_digests.from_manifest(doc, record["previous"]) == {STREAM: record["digests"]}
    # a forged digest names its field
    from dvc_dali.format import manifest_schema

    doc["dynamic"]["dynamic"]["batches"]["reader"]["digests"][0][0] = "../etc"
    with pytest.raises(Exception) as err:
        manifest_schema.validate(doc, "manifest.json")
    assert "dynamic.dynamic.batches.reader.digests[0]" in str(err.value), err.value


def test_verification_off_leaves_dynamic_mode_alone(tmp_path, images):
    off = {"DVC_DALI_VERIFY_BATCHES": "0", **OFF}
    # recorded with it off: no digests kept, so a changed file is not seen
    ckpt = tmp_path / "ckpt"
    killed_after_4(images, ckpt, tmp_path / "first.npz", **off)
    assert "batches" not in manifest(ckpt)["dynamic"]["dynamic"]
    assert batch_digests.log_id_of(manifest(ckpt)) is None
    # recorded with it on, resumed with it off: not compared
    other = tmp_path / "other"
    killed_after_4(images, other, tmp_path / "other.npz", **OFF)
    perturb_all(images)
    proc = proof_run("dynamic", images, other, tmp_path / "resumed.npz", 6, save_at=[5], **off)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BatchMismatchError" not in proc.stderr
    assert "batches" not in json.dumps(manifest(other)["dynamic"])  # nor in its next checkpoint


def test_a_yielded_batch_on_the_host_digests_as_its_arrays():
    """Ragged (encoded files) and dense outputs, a dict's, and a sample
    (iterating samples yields Tensors): each as digest_arrays takes them."""
    import nvidia.dali.experimental.dynamic as ndd

    from dvc_dali.dali import dali_dynamic

    ragged = [np.arange(3, dtype=np.uint8), np.arange(5, dtype=np.uint8)]
    dense = np.arange(12, dtype=np.int32).reshape(3, 4)
    b_ragged = ndd.as_batch([ndd.tensor(a) for a in ragged])
    b_dense = ndd.as_batch(dense)

    def digest(batch):
        return batch_digests.digest_arrays(dali_dynamic.host_outputs(batch))

    assert digest((b_ragged, b_dense)) == batch_digests.digest_arrays([ragged, dense])
    assert digest({"a": b_dense, "b": b_ragged}) == batch_digests.digest_arrays([dense, ragged])
    assert digest((ndd.tensor(dense[0]),)) == batch_digests.digest_arrays([dense[:1]])
    assert digest((b_dense,)) != digest((ndd.as_batch(dense + 1),))


def test_two_readers_whose_streams_would_be_one_are_refused(tmp_path, images):
    """Reader "b/c" of dynamic "a" and reader "c" of dynamic "a/b" would both
    be stream "a/b/c": their digests would mix; the second is refused."""
    import nvidia.dali.experimental.dynamic as ndd

    import dvc_dali

    ck = dvc_dali.Checkpointer(tmp_path / "ck", rng=False)
    ck.dynamic("a").register(ndd.readers.File(file_root=f"{images}/images", seed=1), "b/c")
    with pytest.raises(ValueError, match=r"reader 'c' of 'a/b' and reader 'b/c' of 'a' would "
                                         r"be one stream, 'a/b/c'"):
        ck.dynamic("a/b").register(ndd.readers.File(file_root=f"{images}/images", seed=2), "c")
    ck.close()


def test_registrations_dali_refuses_are_one_line_naming_the_saved_names(tmp_path, images):
    """A reader registered under another name on resume, one registered twice,
    or none registered before the next save: DALI's KeyError and
    RuntimeError tracebacks (found by a sweep)."""
    import nvidia.dali.experimental.dynamic as ndd

    import dvc_dali

    def reader():
        return ndd.readers.File(file_root=str(images / "images"), random_shuffle=True, seed=5)

    ck = dvc_dali.Checkpointer(tmp_path / "ck", rng=False)
    first = reader()
    ck.dynamic().register(first, "reader")
    with pytest.raises(dvc_dali.ConfigError, match="Cannot register the operator with a new "
                       "key 'again' when it's already been added with the key 'reader'"):
        ck.dynamic().register(first, "again")
    with pytest.raises(dvc_dali.ConfigError, match="dynamic-mode checkpoint 'dynamic': Cannot "
                       "get the reader's state before its first iteration"):
        ck.make_checkpoint(1)
    next(iter(first.next_epoch(batch_size=2)))
    ck.make_checkpoint(1)
    ck.close()
    again = dvc_dali.Checkpointer(tmp_path / "ck", rng=False)
    with pytest.raises(dvc_dali.ConfigError, match=r"does not contain a state for 'other' \(the "
                       r"checkpoint holds \['reader'\]\)\. Register each reader and RNG once"):
        again.dynamic().register(reader(), "other")
    with pytest.raises(dvc_dali.ConfigError, match=r"dynamic-mode checkpoint 'dynamic': "
                       r"Checkpoint state has entries with no corresponding registered ops: "
                       r"\['reader'\]\. Register each reader and RNG under the name"):
        again.make_checkpoint(2)
    again.close()


def test_a_second_object_under_a_registered_name_is_refused_not_replacing_it(tmp_path, images):
    """A validation reader registered under the train reader's name replaced
    it in DALI's Checkpoint, silently: its position was not saved, and a
    resume gave the saved (validation) state to the train reader (found by a
    sweep)."""
    import nvidia.dali.experimental.dynamic as ndd

    import dvc_dali

    def reader(seed):
        return ndd.readers.File(file_root=str(images / "images"), random_shuffle=True, seed=seed)

    ck = dvc_dali.Checkpointer(tmp_path / "ck", rng=False)
    train = reader(5)
    ck.dynamic().register(train, "reader")
    ck.dynamic().register(train, "reader")  # the same one again: nothing changes
    with pytest.raises(dvc_dali.ConfigError, match=r"dynamic-mode checkpoint 'dynamic': "
                       r"'reader' is registered already, with another reader; a second one"):
        ck.dynamic().register(reader(6), "reader")
    rng = ndd.random.RNG(seed=1)
    ck.dynamic().register(rng, "rng")
    with pytest.raises(dvc_dali.ConfigError, match="'rng' is registered already, with "
                       "another RNG"):
        ck.dynamic().register(ndd.random.RNG(seed=2), "rng")
    ck.close()
