"""DALI pipelines the tests checkpoint, and the data they read.

Every pipeline has a reader and random operators, so a restore that is off by
one sample or one random draw shows in the outputs.
"""

from __future__ import annotations

import argparse
import io
import tarfile
from pathlib import Path

import numpy as np
from nvidia.dali import fn, pipeline_def, types

CLASSES, PER_CLASS, SIDE = 3, 8, 24  # 24 images: with batch 4 an epoch is 6 steps


def make_data(root: Path) -> Path:
    """Real image files in class folders, .npy files and a webdataset tar."""
    from PIL import Image

    rng = np.random.default_rng(0)
    wds = io.BytesIO()
    with tarfile.open(fileobj=wds, mode="w") as tar:
        for c in range(CLASSES):
            (root / "images" / f"class{c}").mkdir(parents=True, exist_ok=True)
            for i in range(PER_CLASS):
                pixels = rng.integers(0, 256, (SIDE, SIDE + i, 3), dtype=np.uint8)
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
                (root / "images" / f"class{c}" / f"{i:03d}.jpg").write_bytes(buf.getvalue())
                for ext, data in (("jpg", buf.getvalue()), ("cls", str(c).encode())):
                    info = tarfile.TarInfo(f"s{c}_{i:03d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    (root / "shards").mkdir(exist_ok=True)
    (root / "shards" / "data.tar").write_bytes(wds.getvalue())
    (root / "npy").mkdir(exist_ok=True)
    for i in range(CLASSES * PER_CLASS):
        np.save(root / "npy" / f"{i:03d}.npy", rng.standard_normal((5, 3)).astype(np.float32))
    return root


@pipeline_def
def rotate_pipe(data, shuffle=True, device="cpu", shard_id=0, num_shards=1, pad=False):
    """The DALI checkpointing notebook's pipeline (decode, random angle,
    rotate) plus a random crop. ``pad``: an epoch's last batch is padded with
    its last sample (the reader's pad_last_batch), not filled from the next."""
    jpegs, labels = fn.readers.file(file_root=f"{data}/images", random_shuffle=shuffle,
                                    shard_id=shard_id, num_shards=num_shards, name="reader",
                                    pad_last_batch=pad)
    images = fn.decoders.image(jpegs, device="mixed" if device == "gpu" else "cpu",
                               output_type=types.RGB)
    angle = fn.random.uniform(range=(-45.0, 45.0), name="angle")
    images = fn.rotate(images, angle=angle, fill_value=0, keep_size=True)
    images = fn.random_resized_crop(images, size=(16, 16), name="crop")
    return images, labels, angle


@pipeline_def
def numpy_pipe(data, shuffle=True):
    arrays = fn.readers.numpy(file_root=f"{data}/npy", random_shuffle=shuffle, name="reader")
    noise = fn.random.normal(arrays, name="noise")
    return arrays, arrays + noise


@pipeline_def
def webdataset_pipe(data, shuffle=True):
    jpegs, cls = fn.readers.webdataset(paths=[f"{data}/shards/data.tar"], ext=["jpg", "cls"],
                                       random_shuffle=shuffle, name="reader")
    images = fn.decoders.image(jpegs, device="cpu")
    flip = fn.random.coin_flip(name="flip")
    return fn.flip(images, horizontal=flip), cls, flip


@pipeline_def
def validation_pipe(data):
    jpegs, labels = fn.readers.file(file_root=f"{data}/images", random_shuffle=False,
                                    name="val_reader")
    return fn.decoders.image(jpegs, device="cpu"), labels


class ShiftedSource:
    """An external_source callable of one argument (its position is saved)
    whose values move with PROOF_SOURCE_SHIFT: a behaviour change the
    pipeline's description cannot see."""

    def __call__(self, info: types.SampleInfo) -> np.ndarray:
        import os

        shift = int(os.environ.get("PROOF_SOURCE_SHIFT", "0"))
        return np.full((3,), info.idx_in_epoch * 10 + shift, dtype=np.int32)


@pipeline_def
def source_pipe():
    values = fn.external_source(source=ShiftedSource(), batch=False, name="values")
    return values, fn.random.uniform(range=(0.0, 1.0), name="noise")


def make(kind: str, data: str, batch_size: int = 4, shuffle: bool = True, seed: int = 7,
         device: str = "cpu") -> dict:
    """{name: (pipeline_def function, keyword arguments)} for one test case."""
    common = dict(batch_size=batch_size, num_threads=2, seed=seed,
                  device_id=0 if device == "gpu" else None)
    if kind == "rotate":
        return {"train": (rotate_pipe, dict(data=data, shuffle=shuffle, device=device, **common))}
    if kind == "numpy":
        return {"train": (numpy_pipe, dict(data=data, shuffle=shuffle, **common))}
    if kind == "webdataset":
        return {"train": (webdataset_pipe, dict(data=data, shuffle=shuffle, **common))}
    if kind == "source":
        return {"train": (source_pipe, dict(**common))}
    if kind == "two":
        return {"train": (rotate_pipe, dict(data=data, shuffle=shuffle, **common)),
                "val": (validation_pipe, dict(data=data, **{**common, "batch_size": 5}))}
    raise ValueError(kind)


def outputs_of(pipe) -> list[np.ndarray]:
    """Every sample of every output of one iteration, on the host."""
    result = []
    for out in pipe.run():
        if hasattr(out, "as_cpu"):
            out = out.as_cpu()
        result.extend(np.array(sample) for sample in out)
    return result


@pipeline_def
def classify_pipe(data):
    """Two outputs, as DALIClassificationIterator wants."""
    jpegs, labels = fn.readers.file(file_root=f"{data}/images", random_shuffle=True,
                                    name="reader")
    images = fn.decoders.image(jpegs, device="cpu")
    return fn.random_resized_crop(images, size=(12, 12), name="crop"), labels


def runner_parser(first: str) -> argparse.ArgumentParser:
    """Arguments shared by the runner scripts:
    FIRST DATA CKPT OUT --until N [--save-at K ...] [--fresh]."""
    ap = argparse.ArgumentParser()
    for name in (first, "data", "ckpt", "out"):
        ap.add_argument(name)
    ap.add_argument("--until", type=int, required=True)
    ap.add_argument("--save-at", type=int, nargs="*", default=[])
    ap.add_argument("--fresh", action="store_true")
    return ap
