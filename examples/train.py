"""Train a digit classifier from a DALI pipeline, checkpointing with dvc-dali.

    python examples/prepare.py           # data/digits/<label>/<index>.png
    python examples/train.py             # or: dvc exp run (see templates/dvc.yaml)

Reads params.yaml `train`: steps, checkpoint_every, batch_size, seed, lr,
hidden, device (auto|cpu|gpu), data, framework (numpy|torch|keras|lightning: torch runs
examples/train_torch.py, keras examples/train_keras.py, lightning
examples/train_lightning.py). Writes checkpoint/ (resume state),
model/model.npz and dvclive/. Run it again after an interruption and it
resumes from the last checkpoint, producing byte for byte the model an
uninterrupted run produces. Changing `lr` on resume is allowed; changing
anything that shapes the DALI stream (batch_size, seed, data) is refused
with dvc_dali.PipelineMismatchError.

DVC_DALI_EXAMPLE_KILL_AT_STEP=N kills the process with SIGKILL right after
the checkpoint at step N, or after step N between two checkpoints (to
simulate preemption in tests).
"""

import os

# Single-threaded BLAS before NumPy loads: the CPU math is then bitwise
# reproducible, which exact resume needs (a forced value, not a default).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import runpy  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import zipfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from common import (CLASSES, CROP, IntervalMeter, checkpoint_interval,  # noqa: E402
                    digits_pipeline, kill_at_step, kill_if_at, parse_args, read_params)

import dvc_dali  # noqa: E402

WEIGHTS = ("w1", "b1", "w2", "b2")
def pick_device(requested: str):
    """('gpu', cupy) when a GPU is usable and wanted, else ('cpu', numpy)."""
    if requested == "cpu":
        return "cpu", np
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
        return "gpu", cupy
    except Exception as exc:  # ImportError, CUDA driver errors
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    if requested == "gpu":
        sys.exit(f"train.device is gpu, but no GPU is usable ({why}). Install cupy-cuda12x "
                 "on a machine with a CUDA GPU, or set train.device to cpu or auto.")
    print(f"train: no usable GPU ({why}); device auto falls back to the CPU")
    return "cpu", np


def init_weights(seed: int, hidden: int) -> dict:
    rng = np.random.default_rng(seed)
    inputs = CROP * CROP
    return {
        "w1": (rng.standard_normal((inputs, hidden)) * np.sqrt(2.0 / inputs)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.standard_normal((hidden, CLASSES)) * np.sqrt(1.0 / hidden)).astype(np.float32),
        "b2": np.zeros(CLASSES, np.float32),
    }


def to_host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


def restored_weights(ck, hidden: int, xp) -> dict:
    expected = {k: v.shape for k, v in init_weights(0, hidden).items()}
    saved = ck.arrays
    for name, shape in expected.items():
        if name not in saved or tuple(saved[name].shape) != shape:
            got = tuple(saved[name].shape) if name in saved else "absent"
            sys.exit(f"{ck.path}: saved weight {name!r} has shape {got}, the model needs "
                     f"{shape} (train.hidden changed?). Set train.hidden back to resume, or "
                     f"delete {ck.path} to start over.")
    return {k: xp.asarray(to_host(saved[k]), dtype=xp.float32) for k in expected}


def sgd_step(w: dict, x, y, lr, xp):
    """One step of plain SGD on a 1-hidden-layer ReLU MLP with softmax
    cross-entropy. Updates ``w`` in place; returns (loss, accuracy) as 0-d arrays."""
    n = x.shape[0]
    rows = xp.arange(n)
    pre = x @ w["w1"] + w["b1"]
    h = xp.maximum(pre, 0)
    logits = h @ w["w2"] + w["b2"]
    logits = logits - logits.max(axis=1, keepdims=True)
    logp = logits - xp.log(xp.exp(logits).sum(axis=1, keepdims=True))
    loss = -logp[rows, y].mean()
    acc = (logits.argmax(axis=1) == y).mean()
    g = xp.exp(logp)
    g[rows, y] -= 1
    g /= n
    gh = (g @ w["w2"].T) * (pre > 0)
    w["w2"] -= lr * (h.T @ g)
    w["b2"] -= lr * g.sum(axis=0)
    w["w1"] -= lr * (x.T @ gh)
    w["b1"] -= lr * gh.sum(axis=0)
    return loss, acc


def batch_arrays(outputs, gpu: bool, xp):
    """The pipeline's outputs as (x: N x CROP*CROP float32, y: N int) arrays.

    On the GPU, CuPy wraps DALI's device memory (__cuda_array_interface__):
    no copy to the host and back. DALI reuses that memory at the next run(),
    and CuPy works asynchronously: the float(loss) in the loop waits for the
    step's kernels before the next run().
    """
    images, labels = outputs
    if gpu:
        x = xp.asarray(images.as_tensor())
        y = xp.asarray(labels.as_tensor())
    else:
        x = np.asarray(images.as_tensor())
        y = np.asarray(labels.as_tensor())
    return x.reshape(x.shape[0], -1), y.reshape(-1).astype(xp.int64)


def save_model(path: Path, weights: dict) -> None:
    """np.savez with fixed zip timestamps, so equal weights give equal bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in WEIGHTS:
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w") as fh:
                np.lib.format.write_array(fh, np.ascontiguousarray(to_host(weights[name])),
                                          allow_pickle=False)
    os.replace(tmp, path)


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)

    p = read_params(Path(args.params))
    if p["framework"] in ("torch", "keras", "lightning"):
        # The same job with PyTorch or Keras: examples/train_torch.py or
        # train_keras.py, scripts of their own (run, not imported: no example
        # imports another).
        job = runpy.run_path(str(Path(__file__).with_name(f"train_{p['framework']}.py")))
        return job["main"](argv)
    steps, every = int(p["steps"]), int(p["checkpoint_every"])
    lr_value = float(p["lr"])
    kill_at = kill_at_step()
    if not Path(p["data"]).is_dir():
        sys.exit(f"train.data: {p['data']} is not a directory; run examples/prepare.py first")

    device, xp = pick_device(p["device"])
    gpu = device == "gpu"
    lr = xp.float32(lr_value)

    # The params without the step count: with them dvc-dali tells a finished
    # run continued for more steps from a new experiment.
    ck = dvc_dali.Checkpointer(args.checkpoint, total_steps=steps,
                               params={k: v for k, v in p.items() if k != "steps"})
    # Raises dvc_dali.PipelineMismatchError when batch_size, seed or the data
    # differ from the checkpoint being resumed: let it propagate.
    pipe = ck.pipeline("train", digits_pipeline, batch_size=int(p["batch_size"]),
                       num_threads=min(4, os.cpu_count() or 1),
                       device_id=0 if gpu else None, seed=int(p["seed"]),
                       data=str(p["data"]), gpu=gpu)
    if ck.resumed:
        weights = restored_weights(ck, int(p["hidden"]), xp)
        print(f"train: resuming from step {ck.step} ({ck.path}) on {device}")
    else:
        fresh = init_weights(int(p["seed"]), int(p["hidden"]))
        weights = {k: xp.asarray(v) for k, v in fresh.items()}
        print(f"train: starting on {device}: {steps} steps, batch {p['batch_size']}, "
              f"seed {p['seed']}, lr {lr_value}, checkpoint every {every}")
    start = ck.step

    # DVCLive resumed in step with the checkpoint: later rows of a killed run
    # dropped, a half-written metrics.json repaired, live.step == ck.step.
    live = ck.live(args.live)

    t0 = time.perf_counter()
    meter = IntervalMeter()
    for step in range(start + 1, steps + 1):
        x, y = batch_arrays(pipe.run(), gpu, xp)
        loss, acc = sgd_step(weights, x, y, lr, xp)
        meter.add(float(loss), float(acc))
        if ck.should_save(step, every) or step == steps:
            checkpoint_interval(ck, live, step, steps, *meter.take(), t0, kill_at,
                                lambda: save_model(Path(args.model), weights),
                                arrays=weights, metadata={"lr": lr_value})
        else:
            kill_if_at(step, kill_at)

    ck.wait()  # an asynchronous last checkpoint recorded before its row's model is rewritten
    save_model(Path(args.model), weights)
    live.end()
    print(f"train: wrote {args.model} at step {max(start, steps)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
