"""TensorFlow, continued from test_tf.py (split so that two pytest-xdist
workers share the TensorFlow processes): what cannot resume exactly is
refused (batches that differ, under Keras fit too), batch digests on or off,
damaged TF states, and ck.keras_callback resuming bit for bit. Real
TensorFlow, Keras 3 and DALI's TF plugin (the tf extra)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="install the tf extra (README: two pip commands)")
pytest.importorskip("nvidia.dali.plugin.tf", reason="install nvidia-dali-tf-plugin (README)")

from dvc_dali.dali import dali_tf  # noqa: E402
from dvc_dali.core.errors import CheckpointCorruptError  # noqa: E402

from tests.helpers import REPO, child_env
from tests.helpers.tf_cases import runner, same_from


# names, sizes and mtimes kept, no content digest (threshold 0): only the
# batch digests can tell
NO_CONTENT_DIGEST = {"DVC_DALI_CONTENT_DIGEST_MAX": "0"}


def perturbed_copy(data_dir, tmp_path):
    from tests.helpers.proof import perturb_same_size_and_mtime

    data = tmp_path / "data"
    shutil.copytree(data_dir / "images", data / "images")
    return data, lambda: [perturb_same_size_and_mtime(p) for p in data.rglob("*.jpg")]


def refused(proc, step: int, saved: int) -> str:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text[-3000:]
    assert "BatchMismatchError" in text and "Traceback" not in text, text[-3000:]
    assert f"pipeline 'train': batch {step - saved} after the checkpoint at step {saved} (" \
        in text, text[-3000:]
    assert f"; step {step} where it gives one batch a step)" in text, text[-3000:]
    assert "output 0: same dtype and shapes, other bytes" in text, text[-3000:]
    assert "DVC_DALI_INEXACT=1" in text, text[-3000:]
    return text


@pytest.mark.parametrize("transform", [False, True])
def test_tf_batches_that_differ_are_refused_before_their_step(data_dir, tmp_path, transform):
    """Eager iteration: saved at step 2, killed after step 4, a file rewritten
    in place: the resume is refused at step 3's batch; INEXACT goes on."""
    data, perturb = perturbed_copy(data_dir, tmp_path)
    cfg = {"mode": "stream", "until": 6, "transform": transform}
    _, proc = runner({**cfg, "save_at": [2], "kill_after": 4}, data, tmp_path / "ck",
                     tmp_path / "a.npz", ok=False, **NO_CONTENT_DIGEST)
    assert proc.returncode == -9, proc.stderr[-3000:]
    perturb()
    _, proc = runner(cfg, data, tmp_path / "ck", tmp_path / "b.npz", ok=False,
                     **NO_CONTENT_DIGEST)
    refused(proc, 3, 2)
    entry = json.loads(next((tmp_path / "ck").glob("step-*/manifest.json")).read_text())
    assert entry["pipelines"]["train"]["check_node"] is True
    assert not (tmp_path / "b.npz").exists()
    _, proc = runner(cfg, data, tmp_path / "ck", tmp_path / "b.npz",
                     DVC_DALI_INEXACT="1", **NO_CONTENT_DIGEST)
    assert proc.stderr.count("no longer exact") == 1, proc.stderr[-3000:]


def test_a_random_op_in_transform_is_named_among_the_causes(data_dir, tmp_path):
    """Refused on resume, rightly, but the causes named were data, code and
    in-place writes, never TensorFlow's own random state (found by a sweep)."""
    cfg = {"mode": "stream", "until": 6, "random_transform": True}
    # killed after step 4, as the tests above: step 3's digest is written by then
    _, proc = runner({**cfg, "save_at": [2], "kill_after": 4}, data_dir, tmp_path / "ck",
                     tmp_path / "a.npz", ok=False)
    assert proc.returncode == -9, proc.stderr[-3000:]
    _, proc = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "b.npz", ok=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, (proc.returncode, text[-3000:])
    assert "BatchMismatchError" in text and "Traceback" not in text, text[-3000:]
    assert "a random operation in tf_dataset(transform=) (tf.random.*" in text, text[-3000:]


def test_tf_batches_that_differ_are_refused_under_keras_fit(data_dir, tmp_path):
    """cb.fit and model.fit: the refusal comes out of fit typed, before the
    step trains on the batch."""
    data, perturb = perturbed_copy(data_dir, tmp_path)
    _, proc = runner({**KERAS, "fit": "cb", "kill_at": 7}, data, tmp_path / "ck",
                     tmp_path / "a.npz", ok=False, **NO_CONTENT_DIGEST)
    assert proc.returncode == -9, proc.stderr[-3000:]
    perturb()
    _, proc = runner({**KERAS, "fit": "cb"}, data, tmp_path / "ck", tmp_path / "b.npz",
                     ok=False, **NO_CONTENT_DIGEST)
    assert "trained to step" not in refused(proc, 6, 5)
    _, proc = runner({**KERAS, "fit": "cb"}, data, tmp_path / "ck", tmp_path / "b.npz",
                     DVC_DALI_INEXACT="1", **NO_CONTENT_DIGEST)
    assert "trained to step 30" in proc.stdout and "no longer exact" in proc.stderr


def test_keras_model_fit_refuses_batches_that_differ(data_dir, tmp_path):
    data, perturb = perturbed_copy(data_dir, tmp_path)
    _, proc = runner({**KERAS, "fit": "model", "kill_at": 12}, data, tmp_path / "ck",
                     tmp_path / "a.npz", ok=False, **NO_CONTENT_DIGEST)
    assert proc.returncode == -9, proc.stderr[-3000:]
    perturb()
    _, proc = runner({**KERAS, "fit": "model", "epochs": 2}, data, tmp_path / "ck",
                     tmp_path / "b.npz", ok=False, **NO_CONTENT_DIGEST)
    refused(proc, 11, 10)


@pytest.mark.parametrize("first,then", [("0", ""), ("", "0")])
def test_tf_state_restores_with_batch_digests_turned_on_or_off(data_dir, tmp_path, first,
                                                                then):
    """The check node is there either way, so the TF state restores."""
    cfg = {"mode": "stream", "until": 8}
    reference, _ = runner(cfg, data_dir, tmp_path / "ref", tmp_path / "ref.npz")
    runner({**cfg, "until": 3, "save_at": [3]}, data_dir, tmp_path / "ck", tmp_path / "a.npz",
           DVC_DALI_VERIFY_BATCHES=first)
    resumed, _ = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "b.npz",
                        DVC_DALI_VERIFY_BATCHES=then)
    same_from(reference, resumed, 3)


def test_a_tf_state_saved_without_the_check_node_resumes_undigested(data_dir, tmp_path):
    """As an earlier dvc-dali saved it: restored into a dataset without the node."""
    cfg = {"mode": "stream", "until": 8}
    reference, _ = runner(cfg, data_dir, tmp_path / "ref", tmp_path / "ref.npz")
    runner({**cfg, "until": 3, "save_at": [3], "old_layout": True}, data_dir, tmp_path / "ck",
           tmp_path / "a.npz")
    resumed, proc = runner({**cfg, "save_at": [5]}, data_dir, tmp_path / "ck",
                           tmp_path / "b.npz")
    same_from(reference, resumed, 3)
    assert "saved without dvc-dali's batch check" in proc.stderr, proc.stderr[-3000:]
    entry = json.loads(next((tmp_path / "ck").glob("step-*/manifest.json")).read_text())
    assert "check_node" not in entry["pipelines"]["train"]


def test_the_check_node_keeps_each_element_and_sees_it_when_taken():
    """Any element structure and shape passes unchanged; each element is
    checked once, as it is taken (no prefetch after the node); a refusal the
    check raises comes out of the iterator typed."""
    import tensorflow as tf

    from dvc_dali.proof.batch_digests import BatchMismatchError, digest_arrays

    kinds = [tf.data.Dataset.from_tensor_slices(([b"ab", b"c"],)),
             tf.data.Dataset.from_tensor_slices({"a": [1, 2], "s": ["x", "yz"]}),
             tf.data.Dataset.range(3).map(lambda x: tf.fill([x], x)),  # unknown shapes
             tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[1, 2], [3]])).batch(2),
             tf.data.Dataset.range(5).map(lambda x: (x, tf.cast(x, tf.float32)))]
    for plain in kinds:
        seen = []
        ds = dali_tf._checked(plain, lambda arrays: seen.append(digest_arrays(arrays)))
        assert ds.element_spec == plain.element_spec
        it = iter(ds)
        next(it)
        assert len(seen) == 1
        assert sum(1 for _ in it) + 1 == len(seen) == sum(1 for _ in plain)

    refusal = BatchMismatchError("pipeline 'x': the batch for step 2 differs")

    def check(arrays) -> None:
        if int(arrays[0]) == 1:
            raise refusal

    ds = dali_tf._tracked(dali_tf._checked(tf.data.Dataset.range(3), check),
                          lambda it: None, lambda: refusal)
    it = iter(ds)
    assert int(next(it)) == 0
    with pytest.raises(BatchMismatchError, match="the batch for step 2"):
        next(it)


def test_a_damaged_tf_state_is_a_typed_error(data_dir, tmp_path):
    """Bytes that pass the store's digests (rewritten with them) but are not a
    TensorFlow checkpoint: CheckpointCorruptError naming the file, no crash."""
    runner({"mode": "stream", "until": 3, "save_at": [3]}, data_dir, tmp_path / "ck",
           tmp_path / "a.npz")
    from dvc_dali.format import store

    snap = next(p for p in (tmp_path / "ck").iterdir() if p.name.startswith("step-"))
    member = next((snap / "pipelines").iterdir())
    files = dali_tf.unpack(member.read_bytes(), str(member))
    files[".index"] = files[".index"][:20] + bytes(len(files[".index"]) - 20)
    rewrite_member(snap, member, dali_tf.pack(files), store)
    _, proc = runner({"mode": "stream", "until": 6}, data_dir, tmp_path / "ck",
                     tmp_path / "b.npz", ok=False)
    assert proc.returncode != 0 and "CheckpointCorruptError" in proc.stderr, proc.stderr
    assert str(member.relative_to(tmp_path / "ck")) in proc.stderr
    assert "Segmentation" not in proc.stderr and proc.returncode > 0


def rewrite_member(snap, member, data: bytes, store) -> None:
    """Replace a member and fix its digest, the manifest's and LATEST's: what
    a hostile writer can do."""
    import hashlib
    import zlib

    member.write_bytes(data)
    manifest = json.loads((snap / store.MANIFEST).read_text())
    rel = member.relative_to(snap).as_posix()
    digest = ({"md5": hashlib.md5(data).hexdigest()} if "md5" in manifest["files"][rel]
              else {"crc32": f"{zlib.crc32(data):08x}"})
    manifest["files"][rel] = {"size": len(data), **digest}
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    (snap / store.MANIFEST).write_bytes(text)
    latest = snap.parent / store.LATEST
    latest.write_text(latest.read_text().replace(
        latest.read_text().split()[-1], hashlib.md5(text).hexdigest()))


def test_damaged_tf_bytes_past_the_digests_restore_or_are_typed_errors(data_dir, tmp_path):
    counts, proc = runner({"mode": "damaged", "seed": 1, "cases": 60}, data_dir, tmp_path / "ck",
                          tmp_path / "c.npz")
    assert int(counts["other"]) == 0, proc.stdout[-3000:]
    assert int(counts["typed"]) > 30  # TensorFlow's own checksums see most damage


@pytest.mark.parametrize("blob,why", [
    (b"", "header"),
    (b"garbage", "header"),
    (dali_tf.MAGIC + b"\x05\x00", "truncated"),
    (dali_tf.MAGIC + dali_tf._HEAD.pack(6, 1 << 40) + b".index", "runs past"),
    (dali_tf.pack({"/../../etc": b"x"}), "unexpected member"),
    (dali_tf.pack({".data-00000-of-00001": b"x"}), "no .index"),
    (dali_tf.MAGIC + dali_tf._HEAD.pack(200, 0) + b"a" * 200, "runs past"),
])
def test_unpack_refuses_what_it_did_not_write(blob, why):
    with pytest.raises(CheckpointCorruptError, match=why) as err:
        dali_tf.unpack(blob, "ck/x.dali")
    assert "ck/x.dali" in str(err.value)


def test_pack_unpack_round_trip():
    files = {".index": b"\x00" * 3, ".data-00000-of-00001": b"abc"}
    assert dali_tf.unpack(dali_tf.pack(files), "x") == files
    assert dali_tf.unpack(dali_tf.pack({}), "x") == {}


KERAS = {"mode": "keras", "epochs": 3, "steps_per_epoch": 10, "every": 5}


@pytest.fixture(scope="module")
def keras_reference(data_dir, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("keras_ref")
    weights, _ = runner({**KERAS, "fit": "cb"}, data_dir, tmp / "ck", tmp / "ref.npz")
    return weights


def same_weights(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert np.array_equal(a[key], b[key]), f"{key} differs from the uninterrupted fit"


def test_keras_preempted_mid_epoch_saves_exits_and_resumes_exactly(
        data_dir, tmp_path, keras_reference):
    _, proc = runner({**KERAS, "fit": "cb", "signal_at": 13}, data_dir, tmp_path / "ck",
                     tmp_path / "a.npz", ok=False)
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert "preempted (SIGTERM): step 14 is saved in" in proc.stderr, proc.stderr[-2000:]
    weights, proc = runner({**KERAS, "fit": "cb"}, data_dir, tmp_path / "ck", tmp_path / "b.npz")
    assert "trained to step 30" in proc.stdout
    same_weights(weights, keras_reference)


def test_keras_model_fit_resumes_at_an_epoch_boundary(data_dir, tmp_path, keras_reference):
    """model.fit(callbacks=[cb]) itself: killed after the row at step 20 (the
    end of epoch 1), rerun: the same weights."""
    _, proc = runner({**KERAS, "fit": "model", "kill_at": 20}, data_dir, tmp_path / "ck",
                     tmp_path / "a.npz", ok=False)
    assert proc.returncode == -9
    weights, _ = runner({**KERAS, "fit": "model"}, data_dir, tmp_path / "ck", tmp_path / "b.npz")
    same_weights(weights, keras_reference)


@pytest.mark.parametrize("fit", ["cb", "model"])
def test_keras_validations_after_a_resume_read_the_batches_of_an_uninterrupted_fit(
        data_dir, tmp_path, fit):
    """The checkpoint at an epoch's end was taken before that epoch's
    validation, which the resumed fit (starting at the next epoch) never
    repeats: every later validation read the batches of the one before, and
    val_loss was wrong without a word (found by a sweep)."""
    cfg = {**KERAS, "fit": fit, "val": True}
    whole, _ = runner(cfg, data_dir, tmp_path / "whole", tmp_path / "w.npz")
    _, proc = runner({**cfg, "kill_at": 20}, data_dir, tmp_path / "ck", tmp_path / "a.npz",
                     ok=False)
    assert proc.returncode == -9, proc.stderr[-2000:]
    resumed, _ = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "b.npz")
    assert sorted(k for k in resumed if k.startswith("val_")) == ["val_loss_2"]
    assert resumed["val_loss_2"] == whole["val_loss_2"]
    same_weights({k: v for k, v in resumed.items() if not k.startswith("val_")},
                 {k: v for k, v in whole.items() if not k.startswith("val_")})


def test_keras_use_ema_resumed_mid_epoch_ends_with_the_uninterrupted_fits_weights(
        data_dir, tmp_path):
    """Found by a sweep: cb.fit resumes mid-epoch with two model.fit calls,
    and Keras wrote the optimizer's moving average into the weights at the
    first one's end: the run went on training from the average."""
    cfg = {**KERAS, "fit": "cb", "use_ema": True}
    whole, _ = runner(cfg, data_dir, tmp_path / "whole", tmp_path / "w.npz")
    _, proc = runner({**cfg, "kill_at": 15}, data_dir, tmp_path / "ck", tmp_path / "a.npz",
                     ok=False)
    assert proc.returncode == -9, proc.stderr[-2000:]
    resumed, _ = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "b.npz")
    same_weights(resumed, whole)


def test_keras_model_fit_refuses_to_start_mid_epoch(data_dir, tmp_path, keras_reference):
    runner({**KERAS, "fit": "cb", "kill_at": 15}, data_dir, tmp_path / "ck",
           tmp_path / "a.npz", ok=False)
    _, proc = runner({**KERAS, "fit": "model"}, data_dir, tmp_path / "ck", tmp_path / "b.npz",
                     ok=False)
    assert proc.returncode != 0
    assert "inside epoch 1 (step 5 of 10)" in proc.stderr and "cb.fit(" in proc.stderr
    # cb.fit resumes that checkpoint exactly
    weights, _ = runner({**KERAS, "fit": "cb"}, data_dir, tmp_path / "ck", tmp_path / "c.npz")
    same_weights(weights, keras_reference)


def test_keras_fit_on_a_dataset_mapped_outside_is_refused(data_dir, tmp_path):
    _, proc = runner({**KERAS, "fit": "cb", "map_outside": True}, data_dir, tmp_path / "ck",
                     tmp_path / "a.npz", ok=False)
    assert proc.returncode != 0
    assert "transform=" in proc.stderr and "ConfigError" in proc.stderr
    assert not (tmp_path / "ck").exists() or not any(
        p.name.startswith("step-") for p in (tmp_path / "ck").iterdir())


def test_no_tf_extra_needed_to_import_dvc_dali(tmp_path):
    """The package imports and `load`s without TensorFlow (the tf extra is optional)."""
    code = ("import sys; sys.modules['tensorflow'] = None; sys.modules['keras'] = None; "
            "import dvc_dali; dvc_dali.Checkpointer")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path,
                   env=child_env())


def test_without_tensorflow_tf_dataset_says_what_to_install(data_dir, tmp_path):
    code = ("import sys; sys.modules['tensorflow'] = None\n"
            "import dvc_dali\nfrom tests.helpers import pipelines\n"
            f"ck = dvc_dali.Checkpointer({str(tmp_path / 'ck')!r})\n"
            "try:\n"
            f"    ck.tf_dataset('t', pipelines.rotate_pipe, data={str(data_dir)!r}, batch_size=4,"
            " num_threads=1, device_id=None, output_dtypes=None)\n"
            "except dvc_dali.ConfigError as exc:\n"
            "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=child_env())
    assert "tf_dataset() needs TensorFlow" in out.stdout and "no-build-isolation" in out.stdout, \
        out.stdout + out.stderr
