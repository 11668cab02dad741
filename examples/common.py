"""What both example trainers (examples/train.py: NumPy, examples/train_torch.py:
PyTorch) share: params, command line, the DALI pipeline, metrics and the end
of a checkpoint interval.

Import it after setting the BLAS thread variables: nvidia.dali loads NumPy.
"""

import argparse
import os
import signal
import sys
import time
import zipfile
from pathlib import Path

from nvidia.dali import fn, pipeline_def, types

CROP = 16  # side of the crops the model sees
CLASSES = 10
KILL_ENV = "DVC_DALI_EXAMPLE_KILL_AT_STEP"
DEFAULTS = {
    "steps": 60,
    "checkpoint_every": 10,
    "batch_size": 32,
    "seed": 0,
    "lr": 0.1,
    "adam_lr": 0.01,
    "hidden": 64,
    "device": "auto",
    "data": "data/digits",
    "framework": "numpy",
}


def read_params(path: Path) -> dict:
    import yaml

    params = dict(DEFAULTS)
    if path.is_file():
        with open(path, encoding="utf-8") as fh:
            params.update((yaml.safe_load(fh) or {}).get("train") or {})
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        sys.exit(f"{path}: unknown train params {unknown}; known: {sorted(DEFAULTS)}")
    if params["device"] not in ("auto", "cpu", "gpu"):
        sys.exit(f"{path}: train.device is {params['device']!r}; use auto, cpu or gpu")
    if params["framework"] not in ("numpy", "torch", "keras", "lightning"):
        sys.exit(f"{path}: train.framework is {params['framework']!r}; use numpy, torch, "
                 "keras or lightning")
    for key, least in (("steps", 1), ("checkpoint_every", 1), ("batch_size", 1), ("hidden", 1),
                       ("seed", 0)):
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            kind = "a positive integer" if least else "an integer, 0 or more"
            sys.exit(f"{path}: train.{key} is {value!r}; it must be {kind}")
    for key in ("lr", "adam_lr"):
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not 0 <= value < float("inf"):
            sys.exit(f"{path}: train.{key} is {value!r}; it must be a number, 0 or more")
    return params


def kill_at_step() -> int:
    """DVC_DALI_EXAMPLE_KILL_AT_STEP: the step after which the trainer kills
    itself, after its checkpoint if it has one (0 or unset: never)."""
    value = os.environ.get(KILL_ENV, "")
    try:
        step = int(value or 0)
    except ValueError:
        step = -1
    if step < 0:
        sys.exit(f"{KILL_ENV}={value!r}: must be a step number, the checkpoint step after "
                 f"which the trainer kills itself (e.g. {KILL_ENV}=20); unset it to train "
                 "without being killed")
    return step


def parse_args(description: str, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--checkpoint", default="checkpoint", help="checkpoint directory")
    parser.add_argument("--model", default="model/model.npz", help="final model file")
    parser.add_argument("--live", default="dvclive", help="DVCLive directory")
    return parser.parse_args(argv)


@pipeline_def
def digits_pipeline(data, gpu=False, shard_id=0, num_shards=1):
    """Decode, rotate by a random angle, crop a random area, scale to [0, 1].

    Every stateful operator has a name: its saved state is keyed by it.
    Under torchrun each rank reads its own shard.
    """
    pngs, labels = fn.readers.file(file_root=data, random_shuffle=True, name="reader",
                                   shard_id=shard_id, num_shards=num_shards)
    images = fn.decoders.image(pngs, device="mixed" if gpu else "cpu", output_type=types.GRAY)
    angle = fn.random.uniform(range=(-15.0, 15.0), name="angle")
    images = fn.rotate(images, angle=angle, keep_size=True, fill_value=0)
    images = fn.random_resized_crop(images, size=(CROP, CROP), random_area=(0.6, 1.0),
                                    name="crop")
    images = fn.cast(images, dtype=types.FLOAT) * (1.0 / 255.0)
    if gpu:
        labels = labels.gpu()
    return images, labels


class IntervalMeter:
    """Mean loss and accuracy over the steps since the last checkpoint."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss = self.acc = 0.0
        self.seen = 0

    def add(self, loss: float, acc: float) -> None:
        self.loss += loss
        self.acc += acc
        self.seen += 1

    def take(self) -> tuple[float, float]:
        means = (self.loss / self.seen, self.acc / self.seen)
        self.reset()
        return means


def checkpoint_interval(ck, live, step: int, steps: int, loss: float, acc: float, t0: float,
                        kill_at: int, write_model, arrays, metadata: dict) -> None:
    """The end of a checkpoint interval.

    The metrics of this step are logged first, so the checkpoint DVC records
    holds them (DVCLive's step is the training step); every output of the
    stage exists when DVC records it, so each row's model is that step's.
    With asynchronous checkpoints (DVC_DALI_ASYNC=1) the previous one is
    recorded in the background: wait for it before rewriting what its row
    holds (a no-op otherwise).
    """
    ck.wait()
    live.step = step
    live.log_metric("train/loss", loss)
    live.log_metric("train/acc", acc)
    live.next_step()
    write_model()
    ck.make_checkpoint(step, arrays=arrays, metadata={**metadata, "loss": loss, "acc": acc})
    print(f"step {step:>6}/{steps}  loss {loss:.4f}  acc {acc:.3f}  "
          f"({time.perf_counter() - t0:.2f} s)", flush=True)
    kill_if_at(step, kill_at)


def kill_if_at(step: int, kill_at: int) -> None:
    """SIGKILL at step ``kill_at``, as a preemption would (tests use it)."""
    if step == kill_at:
        print(f"train: {KILL_ENV}={kill_at}: killing myself (SIGKILL)", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def save_arrays_zip(path: Path, arrays) -> None:
    """(name, NumPy array) pairs as .npy members of a zip with fixed
    timestamps, so equal weights give equal bytes (torch.save's archive is
    not byte-stable); written whole, then renamed."""
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays:
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with zf.open(info, "w") as fh:
                np.lib.format.write_array(fh, array, allow_pickle=False)
    os.replace(tmp, path)


def cpu_adam_params(p: dict, framework: str, why: str) -> tuple[int, int, float]:
    """(steps, checkpoint_every, Adam's lr) of the variants that run on the
    CPU only (train.lr is the NumPy example's SGD step); one line and an exit
    when the data is missing or a GPU is asked for."""
    if not Path(p["data"]).is_dir():
        sys.exit(f"train.data: {p['data']} is not a directory; run examples/prepare.py first")
    if p["device"] == "gpu":
        sys.exit(f"train.framework {framework} runs on the CPU {why}; set train.device to cpu "
                 "or auto.")
    return int(p["steps"]), int(p["checkpoint_every"]), float(p["adam_lr"])
