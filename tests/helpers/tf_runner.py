"""Runs Checkpointer.tf_dataset (and, in keras mode, a Keras 3 fit with
ck.keras_callback) in a process of its own; what it saw goes to OUT (.npz).

    python tf_runner.py CONFIG_JSON DATA CKPT OUT

CONFIG, stream mode: {"mode": "stream", "until": N, "save_at": [K...], "batch": B,
"seed": S, "reiter": bool (a new iter() after each save), "transform": bool,
"kill_after": K (SIGKILL after step K), "old_layout": bool (the TF state saved
as dvc-dali did before its check node), "random_transform": bool (a tf.random op)}
-> every batch's images, labels and angles by 1-based step.
CONFIG, keras mode: {"mode": "keras", "fit": "cb"|"model", "epochs": E,
"steps_per_epoch": S, "every": N, "signal_at": K (SIGTERM to itself after step K),
"kill_at": K (SIGKILL after step K's checkpoint), "map_outside": bool,
"val": bool (validation_data: a tf_dataset "val", 2 steps an epoch),
"twice": bool (the callback listed in fit's callbacks twice: once more than fit gives it),
"another": bool (a second ck.keras_callback() in fit's callbacks),
"total_steps": T (the Checkpointer's),
"val_same": bool (validation_data: the training dataset itself, 2 steps),
"evaluate_same": bool (a callback's model.evaluate on the training dataset at each epoch's end),
"initial_epoch": E (given to fit),
"phases": bool (with val and fit "cb": a cb.fit of one epoch, then model.evaluate on
"val", before the fit)}
-> the final model variables, and each epoch's val_loss (val_loss_<epoch>).
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys

from tests.helpers import tf_env  # its setup comes before TensorFlow is imported

tf_env.apply()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dvc_dali  # noqa: E402
from tests.helpers import pipelines  # noqa: E402


def to_float(images, labels, angles):
    return tf.cast(images, tf.float32) / 255.0, labels


def dataset(ck, cfg, data, name="train"):
    batch = cfg.get("batch", 4)
    transform = None
    if cfg.get("transform"):
        transform = lambda ds: ds.map(lambda im, lab, ang: (im, lab, ang * 2.0))  # noqa: E731
    if cfg.get("random_transform"):  # TensorFlow's own random state: not saved
        transform = lambda ds: ds.map(  # noqa: E731
            lambda im, lab, ang: (im, lab, ang + tf.random.uniform(tf.shape(ang))))
    if cfg["mode"] == "keras" and not cfg.get("map_outside"):
        transform = lambda ds: ds.map(to_float)  # noqa: E731
    return ck.tf_dataset(name, pipelines.rotate_pipe, data=data, batch_size=batch,
                         num_threads=1, device_id=None, seed=cfg.get("seed", 7),
                         pad=cfg.get("pad", False),
                         prefetch_queue_depth=cfg.get("prefetch", 2),
                         output_dtypes=(tf.uint8, tf.int32, tf.float32),
                         output_shapes=((batch, 16, 16, 3), (batch, 1), (batch,)),
                         transform=transform)


def old_layout() -> None:
    """Datasets built and saved without the check node (dali_tf), as by an
    earlier dvc-dali."""
    from dvc_dali.training import restorable

    restore = restorable.TfDataset.restore

    def without(self, saved) -> None:
        restore(self, saved)
        self.check_node = False

    restorable.TfDataset.restore = without


def stream(cfg, data, ckpt) -> dict:
    if cfg.get("old_layout"):
        old_layout()
    ck = dvc_dali.Checkpointer(ckpt)
    ds = dataset(ck, cfg, data)
    it = iter(ds)
    out = {}
    for step in range(ck.step + 1, cfg["until"] + 1):
        images, labels, angles = (t.numpy() for t in next(it))
        out.update({f"{step:04d}_images": images, f"{step:04d}_labels": labels,
                    f"{step:04d}_angles": angles})
        if step == cfg.get("kill_after"):
            os.kill(os.getpid(), signal.SIGKILL)
        if step in cfg.get("save_at", []):
            ck.save(step)
            if cfg.get("reiter"):  # the old iterator gone first, as Keras drops a fit's
                del it
                gc.collect()
                it = iter(ds)
    return out


class _Signals(keras.callbacks.Callback):
    def __init__(self, cb, cfg) -> None:
        super().__init__()
        self.cb, self.cfg = cb, cfg
        self.val_loss: dict[str, float] = {}

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self.cb.step == self.cfg.get("signal_at"):
            os.kill(os.getpid(), signal.SIGTERM)
        if self.cb.step == self.cfg.get("kill_at") and self.cb.step % self.cfg[
                "steps_per_epoch"]:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, epoch, logs=None) -> None:
        if "val_loss" in (logs or {}):
            self.val_loss[f"val_loss_{epoch}"] = float(logs["val_loss"])
        if self.cb.step == self.cfg.get("kill_at"):  # an epoch's end: checkpointed by now
            os.kill(os.getpid(), signal.SIGKILL)


def keras_fit(cfg, data, ckpt) -> dict:
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(3)
    ck = dvc_dali.Checkpointer(ckpt, total_steps=cfg.get("total_steps"))
    ds = dataset(ck, cfg, data)
    if cfg.get("map_outside"):
        ds = ds.map(to_float)
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.3), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.01, use_ema=bool(cfg.get("use_ema"))),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = ck.keras_callback(cfg.get("every", 5))
    fit = dict(epochs=cfg["epochs"], steps_per_epoch=cfg["steps_per_epoch"], verbose=0)
    if cfg.get("val"):  # a validation dataset of its own, 2 batches an epoch
        fit.update(validation_data=dataset(ck, {**cfg, "seed": 9}, data, "val"),
                   validation_steps=2)
    if "initial_epoch" in cfg:
        fit.update(initial_epoch=cfg["initial_epoch"])
    if cfg.get("val_same"):
        fit.update(validation_data=ds, validation_steps=2)
    if cfg.get("evaluate_same"):
        class _Evaluate(keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None) -> None:
                self.model.evaluate(ds, steps=2, verbose=0)
    extra = [_Signals(cb, cfg), *([_Evaluate()] if cfg.get("evaluate_same") else []),
             *([cb] if cfg.get("twice") else []),
             *([ck.keras_callback(cfg.get("every", 5))] if cfg.get("another") else [])]
    if cfg.get("phases"):
        cb.fit(model, ds, callbacks=extra, **{**fit, "epochs": 1})
        model.evaluate(fit["validation_data"], steps=2, verbose=0)
    if cfg["fit"] == "cb":
        cb.fit(model, ds, callbacks=extra, **fit)
    else:
        model.fit(ds, callbacks=[cb, *extra], **fit)
    print(f"tf_runner: trained to step {cb.step}", flush=True)
    return {**{v.path.replace("/", "__"): np.asarray(v) for v in model.variables},
            **{k: np.array(v) for k, v in extra[0].val_loss.items()}}


def damaged(cfg, data, ckpt) -> dict:
    """Restore states with random bytes changed, cut or flipped in the TF
    files (past the store's digests, as an attacker could): each restores or
    raises CheckpointCorruptError; anything else is counted as a failure."""
    import random

    from dvc_dali.dali import dali_tf
    from dvc_dali.core.errors import CheckpointCorruptError

    ck = dvc_dali.Checkpointer(ckpt)
    ds = dataset(ck, {**cfg, "mode": "stream"}, data)
    it = iter(ds)
    next(it)
    files = dali_tf.unpack(dali_tf._save_iterator(it), "saved")
    rng = random.Random(cfg["seed"])
    counts = {"restored": 0, "typed": 0, "other": 0}
    for _ in range(cfg["cases"]):
        name = rng.choice(sorted(files))
        raw = bytearray(files[name])
        how = rng.randrange(3)
        if how == 0:
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        elif how == 1:
            raw = raw[:rng.randrange(len(raw))]
        else:
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        try:
            dali_tf._restore_iterator(iter(ds), dali_tf.pack({**files, name: bytes(raw)}), "x")
            counts["restored"] += 1
        except CheckpointCorruptError:
            counts["typed"] += 1
        except Exception as exc:  # noqa: BLE001 (the test's point: none may escape)
            print(f"tf_runner: {type(exc).__name__}: {exc}", flush=True)
            counts["other"] += 1
    return {k: np.array(v) for k, v in counts.items()}


def main() -> None:
    cfg, data, ckpt, out = json.loads(sys.argv[1]), *sys.argv[2:5]
    run = {"stream": stream, "keras": keras_fit, "damaged": damaged}[cfg["mode"]]
    np.savez(out, **run(cfg, data, ckpt))


if __name__ == "__main__":
    main()
