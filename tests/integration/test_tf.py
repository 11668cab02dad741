"""TensorFlow: Checkpointer.tf_dataset (DALI's DALIDataset) and
ck.keras_callback resume bit for bit in new processes; what cannot resume
exactly is refused. Real TensorFlow, Keras 3 and DALI's TF plugin (the tf
extra); the dvc exp run end to end is tests/e2e/test_example_keras.py."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="install the tf extra (README: two pip commands)")
pytest.importorskip("nvidia.dali.plugin.tf", reason="install nvidia-dali-tf-plugin (README)")


from tests.helpers.tf_cases import runner, same_from


# 24 images: at batch 4 an epoch of the reader is 6 steps; at batch 5 a batch
# spans two epochs (or, padded, an epoch is 5 steps). Saves in an epoch, right
# at its end, and right after it.
@pytest.mark.parametrize("batch,save,extra", [
    (4, 3, {}), (4, 6, {}), (4, 7, {}), (5, 5, {}), (4, 12, {"prefetch": 1}),
    (4, 6, {"transform": True}), (5, 9, {"prefetch": 3}),
    # the reader pads an epoch's last batch: 5 batches an epoch, the 5th padded
    (5, 5, {"pad": True}), (5, 4, {"pad": True}), (5, 11, {"pad": True}),
])
def test_tf_dataset_resumes_exactly_in_a_new_process(data_dir, tmp_path, batch, save, extra):
    cfg = {"mode": "stream", "until": 16, "batch": batch, **extra}
    reference, _ = runner(cfg, data_dir, tmp_path / "ref", tmp_path / "ref.npz")
    runner({**cfg, "until": save, "save_at": [save]}, data_dir, tmp_path / "ck",
           tmp_path / "first.npz")
    resumed, _ = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "resumed.npz")
    same_from(reference, resumed, save)


def test_a_new_iterator_continues_the_stream_and_resumes_the_same(data_dir, tmp_path):
    """Keras makes a new iterator per fit call: each continues where the last
    stopped, in a fresh run as in a resumed one."""
    cfg = {"mode": "stream", "until": 14, "save_at": [4, 9], "reiter": True}
    fresh, _ = runner(cfg, data_dir, tmp_path / "a", tmp_path / "a.npz")
    plain, _ = runner({"mode": "stream", "until": 14}, data_dir, tmp_path / "b",
                      tmp_path / "b.npz")
    for key in plain:
        assert np.array_equal(fresh[key], plain[key]), f"{key}: a new iterator restarted"
    runner({**cfg, "until": 9}, data_dir, tmp_path / "c", tmp_path / "c1.npz")
    resumed, _ = runner(cfg, data_dir, tmp_path / "c", tmp_path / "c2.npz")
    same_from(plain, resumed, 9)


def test_tf_dataset_refuses_another_seed_or_batch(data_dir, tmp_path):
    runner({"mode": "stream", "until": 3, "save_at": [3]}, data_dir, tmp_path / "ck",
           tmp_path / "a.npz")
    for change, expect in (({"seed": 8}, "seed: 7 -> 8"), ({"batch": 5}, "batch_size: 4 -> 5")):
        _, proc = runner({"mode": "stream", "until": 6, **change}, data_dir, tmp_path / "ck",
                         tmp_path / "b.npz", ok=False)
        assert proc.returncode != 0
        assert "PipelineMismatchError" in proc.stderr and expect in proc.stderr, proc.stderr


def test_tf_dataset_data_rewritten_in_place_is_refused_by_name(data_dir, tmp_path):
    """The content digest covers a tf_dataset's readers too (data_contents)."""
    from tests.helpers.proof import perturb_same_size_and_mtime

    data = tmp_path / "data"
    shutil.copytree(data_dir / "images", data / "images")
    runner({"mode": "stream", "until": 3, "save_at": [3]}, data, tmp_path / "ck",
           tmp_path / "a.npz")
    perturb_same_size_and_mtime(data / "images" / "class1" / "003.jpg")
    _, proc = runner({"mode": "stream", "until": 6}, data, tmp_path / "ck", tmp_path / "b.npz",
                     ok=False)
    assert proc.returncode != 0 and "PipelineMismatchError" in proc.stderr, proc.stderr
    assert "changed class1/003.jpg" in proc.stderr, proc.stderr


@pytest.mark.parametrize("fit", ["cb", "model"])
def test_the_last_checkpoint_off_the_every_grid_holds_its_own_loss(data_dir, tmp_path, fit):
    """The run's last checkpoint (step 5, every 2) was saved with no logs: its
    row showed step 4's metrics, its metadata none (found by a sweep)."""
    import dvc_dali

    cfg = {"mode": "keras", "fit": fit, "epochs": 1, "steps_per_epoch": 5, "every": 2}
    runner(cfg, data_dir, tmp_path / "ck", tmp_path / "out.npz")
    saved = dvc_dali.load(tmp_path / "ck")
    assert saved.step == 5 and "loss" in saved.metadata["keras"], saved.metadata


@pytest.mark.parametrize("fit,how,said", [
    ("cb", "twice", "the callback is in fit's callbacks twice"),
    ("model", "twice", "the callback is in fit's callbacks twice"),
    ("cb", "another", "fit has two callbacks of one Checkpointer"),
])
def test_the_callback_given_twice_is_refused_not_counted_twice(data_dir, tmp_path, fit, how,
                                                               said):
    """cb.fit(model, ds, callbacks=[cb]) counted each step twice: rows at
    steps 2, 4... of batches 1, 2..., and a resume trained too few steps,
    silently; a second ck.keras_callback() recorded each checkpoint twice
    (found by a sweep)."""
    cfg = {"mode": "keras", "fit": fit, "epochs": 1, "steps_per_epoch": 4, "every": 2,
           how: True}
    _, proc = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "out.npz", ok=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"ConfigError: keras_callback(): {said}" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").glob("step-*"))


def test_a_resumed_fit_with_nothing_left_to_train_holds_the_checkpoints_model(data_dir,
                                                                               tmp_path):
    """cb.fit resumed where its epochs were all done (epochs * steps_per_epoch
    below total_steps: the guide's epochs=steps // 15) called no model.fit,
    so nothing restored the model: the script saved, and DVC recorded, the
    fresh initial weights (found by a sweep)."""
    cfg = {"mode": "keras", "fit": "cb", "epochs": 2, "steps_per_epoch": 3, "every": 3}
    trained, _ = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "a.npz")
    again, proc = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "b.npz")
    assert "trained to step 6" in proc.stdout, proc.stdout
    assert sorted(again) == sorted(trained)
    for key in trained:
        assert np.array_equal(again[key], trained[key]), f"{key}: not the checkpoint's"


@pytest.mark.parametrize("fit", ["cb", "model"])
def test_a_fit_that_ends_before_total_steps_says_the_run_is_unfinished(data_dir, tmp_path, fit):
    """epochs * steps_per_epoch below total_steps ended the run unfinished at
    step 3 of 5 without a word: its row looked like a finished run's (found by
    a sweep). One line says it; a fit that reaches total_steps says nothing."""
    cfg = {"mode": "keras", "fit": fit, "epochs": 1, "steps_per_epoch": 3, "every": 3,
           "total_steps": 5}
    _, short = runner(cfg, data_dir, tmp_path / "a", tmp_path / "a.npz")
    said = [line for line in short.stderr.splitlines() if "total_steps=5" in line]
    assert said == [f"dvc-dali: {fit}.fit ended at step 3 of total_steps=5 ({tmp_path / 'a'}): "
                    "the run is unfinished. A later fit continues it from step 3; to finish "
                    "it, give fit epochs * steps_per_epoch = 5."], short.stderr[-3000:]
    _, whole = runner({**cfg, "total_steps": 3}, data_dir, tmp_path / "b", tmp_path / "b.npz")
    assert "unfinished" not in whole.stderr, whole.stderr[-3000:]


@pytest.mark.parametrize("fit,how", [("cb", "val_same"), ("model", "val_same"),
                                     ("cb", "evaluate_same")])
def test_validating_on_the_training_dataset_is_refused_before_its_checkpoint(data_dir,
                                                                            tmp_path, fit,
                                                                            how):
    """validation_data= the training tf_dataset made a second iterator of its
    stream: the epoch's checkpoint saved the validation's position, and the
    resumed fit trained and validated on other batches, silently (val_loss at
    epoch 2: 1.1135 uninterrupted, 1.1108 resumed; found by a sweep); so did
    a callback's model.evaluate on it."""
    import dvc_dali

    cfg = {"mode": "keras", "fit": fit, "epochs": 2, "steps_per_epoch": 4, "every": 2,
           how: True}
    _, proc = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "out.npz", ok=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert ("ConfigError: keras_callback(): the tf_dataset fit trains from was read by another "
            "iterator during the fit") in proc.stderr, proc.stderr[-3000:]
    # val_same: step 4's checkpoint, after the validation, refused; evaluate_same: taken
    # before the callback's evaluate, it holds the training's position; step 5 is refused
    assert dvc_dali.load(tmp_path / "ck").step == (2 if how == "val_same" else 4)


@pytest.mark.parametrize("fit", ["cb", "model"])
def test_a_fit_given_its_own_initial_epoch_is_refused_before_it_trains(data_dir, tmp_path, fit):
    """model.fit(initial_epoch=1, epochs=3) trained 2 epochs; killed after
    the first, the resume started at the checkpoint's epoch (1) and trained
    2 more: 3 epochs in all, silently (found by a sweep). cb.fit failed with
    Python's TypeError traceback."""
    cfg = {"mode": "keras", "fit": fit, "epochs": 3, "steps_per_epoch": 2, "every": 2,
           "initial_epoch": 1}
    _, proc = runner(cfg, data_dir, tmp_path / "ck", tmp_path / "out.npz", ok=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "ConfigError: keras_callback(): fit was given initial_epoch=1" in proc.stderr, \
        proc.stderr[-3000:]
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").glob("step-*"))


def test_a_dataset_read_before_a_fit_resumed_from_inside_it_is_refused(data_dir, tmp_path):
    """cb.fit(epochs=1); model.evaluate(val); cb.fit(epochs=3, validation_data=val),
    resumed from step 4 (inside the second fit): the rerun's evaluate took
    the validation batches the second fit had read, and its last val_loss
    differed from the uninterrupted run's without a word (3.377 for 3.492;
    found by a sweep). Resumed from step 2, the first fit's end, the
    evaluate ran there uninterrupted too: that resume is exact."""
    cfg = {"mode": "keras", "fit": "cb", "epochs": 3, "steps_per_epoch": 2, "every": 2,
           "val": True, "phases": True}
    whole, _ = runner(cfg, data_dir, tmp_path / "whole", tmp_path / "w.npz")
    for kill, ck in ((4, "inside"), (2, "between")):
        _, proc = runner({**cfg, "kill_at": kill}, data_dir, tmp_path / ck, tmp_path / "a.npz",
                         ok=False)
        assert proc.returncode == -9, proc.stderr[-2000:]
    _, proc = runner(cfg, data_dir, tmp_path / "inside", tmp_path / "b.npz", ok=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "the script read tf_dataset 'val' before the resumed fit, but step 4 was saved " \
           "inside a fit" in proc.stderr, proc.stderr[-3000:]
    resumed, _ = runner(cfg, data_dir, tmp_path / "between", tmp_path / "c.npz")
    assert sorted(resumed) == sorted(k for k in whole if k != "val_loss_0")  # epoch 0: done
    for key in resumed:
        assert np.array_equal(resumed[key], whole[key]), key
