"""Train the digit classifier with Keras 3 from a DALIDataset, checkpointing with dvc-dali.

    python examples/train.py             # with params.yaml train.framework: keras
    dvc exp run -S train.framework=keras

The Keras twin of examples/train.py: the same DALI pipeline
(common.digits_pipeline), params, outputs (checkpoint/, model/model.npz,
dvclive/) and DVC_DALI_EXAMPLE_KILL_AT_STEP behaviour, but a keras.Sequential
MLP with dropout, trained by model.fit with Adam from Checkpointer.tf_dataset
(DALI's DALIDataset). Keras epochs are 15 steps (one epoch when train.steps
is not a multiple of 15): the DALIDataset never ends, so fit needs
steps_per_epoch. The checkpoint holds the DALIDataset's iterator, the
model's and the optimizer's variables and the dropout's seed state; a rerun
after an interruption, also in the middle of an epoch, resumes and writes
byte for byte the model an uninterrupted run writes. Adam's learning rate
is `train.adam_lr` (default 0.01; `train.lr` is the NumPy example's SGD
step, 0.1, at which Adam stays at chance here). Needs the `tf` extra (see
README).
"""

import os

# Before TensorFlow loads: one thread per op and deterministic kernels, so
# the CPU math is bitwise reproducible, which exact resume needs.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

try:
    import keras  # noqa: E402
    import tensorflow as tf  # noqa: E402
except ImportError as exc:
    sys.exit(f"train.framework is keras, but TensorFlow is not installed ({exc}). Install "
             "the tf extra as README says (two pip commands), or set train.framework to "
             "numpy or torch.")
from common import (CLASSES, CROP, KILL_ENV, digits_pipeline, kill_at_step,  # noqa: E402
                    cpu_adam_params, parse_args, read_params,
                    save_arrays_zip)

import dvc_dali  # noqa: E402

EPOCH = 15


def make_model(hidden: int, lr: float) -> "keras.Model":
    model = keras.Sequential([
        keras.Input((CROP, CROP, 1)),
        keras.layers.Flatten(),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dropout(0.1),  # its seed state is saved: the same draws on resume
        keras.layers.Dense(CLASSES),
    ])
    model.compile(optimizer=keras.optimizers.Adam(lr),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")])
    return model


def save_model(path: Path, model: "keras.Model") -> None:
    """The variables, byte-stable (common.save_arrays_zip)."""
    save_arrays_zip(path, ((variable.path, np.asarray(variable))
                           for variable in model.variables))


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    p = read_params(Path(args.params))
    steps, every, lr = cpu_adam_params(p, "keras", "here (tensorflow-cpu)")
    kill_at = kill_at_step()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(int(p["seed"]))  # weight init and the dropout's seed

    ck = dvc_dali.Checkpointer(args.checkpoint, total_steps=steps,
                               params={k: v for k, v in p.items() if k != "steps"})
    batch = int(p["batch_size"])
    # Raises dvc_dali.PipelineMismatchError when batch_size, seed or the data
    # differ from the checkpoint being resumed: let it propagate.
    dataset = ck.tf_dataset("train", digits_pipeline, batch_size=batch,
                            num_threads=min(4, os.cpu_count() or 1), device_id=None,
                            seed=int(p["seed"]), data=str(p["data"]),
                            output_dtypes=(tf.float32, tf.int32),
                            output_shapes=((batch, CROP, CROP, 1), (batch, 1)))
    model = make_model(int(p["hidden"]), lr)
    live = ck.live(args.live)

    def on_checkpoint(step: int, logs: dict) -> None:
        save_model(Path(args.model), model)  # every row's model is that step's
        print(f"step {step:>6}/{steps}  loss {logs.get('loss', float('nan')):.4f}  "
              f"acc {logs.get('acc', float('nan')):.3f}", flush=True)

    cb = ck.keras_callback(every, live=live, on_checkpoint=on_checkpoint)
    print(f"train: {'resuming from step %d' % ck.step if ck.resumed else 'starting'} (keras): "
          f"{steps} steps, batch {batch}, seed {p['seed']}, lr {lr}, checkpoint every {every}")
    epoch_steps = EPOCH if steps % EPOCH == 0 else steps
    cb.fit(model, dataset, epochs=steps // epoch_steps, steps_per_epoch=epoch_steps,
           verbose=0, callbacks=[_KillAt(kill_at, cb, epoch_steps)] if kill_at else [])
    save_model(Path(args.model), model)
    live.end()
    print(f"train: wrote {args.model} at step {max(ck.step, steps)}")
    return 0


class _KillAt(keras.callbacks.Callback):
    """DVC_DALI_EXAMPLE_KILL_AT_STEP: SIGKILL right after that step's checkpoint."""

    def __init__(self, step: int, cb, epoch_steps: int) -> None:
        super().__init__()
        self.kill_step, self.cb, self.epoch_steps = step, cb, epoch_steps

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self.cb.step == self.kill_step and self.cb.step % self.epoch_steps:
            self._kill()

    def on_epoch_end(self, epoch, logs=None) -> None:
        if self.cb.step == self.kill_step:  # an epoch's checkpoint is taken at its end
            self._kill()

    def _kill(self) -> None:
        import signal

        print(f"train: {KILL_ENV}={self.kill_step}: killing myself (SIGKILL)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
