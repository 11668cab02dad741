"""The cost of batch digests on a Checkpointer.tf_dataset: batches/s of eager
iteration with DVC_DALI_VERIFY_BATCHES=0 (the check node is an identity) and
with the default (every batch copied to the host and CRC'd in a
tf.numpy_function), alternated in one process, while recording (after a
save) and while a resume compares each batch with its digest.

    python bench/b_tf_digests.py [--side 224] [--batch 32] [--steps 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pipe_fn(data: str, side: int):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def pipe():
        jpegs, labels = fn.readers.file(file_root=data, random_shuffle=True, name="reader")
        images = fn.decoders.image(jpegs, output_type=types.RGB)
        images = fn.resize(images, size=(side, side))
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="HWC",
                                        mean=[128.0] * 3, std=[64.0] * 3), labels

    return pipe


def rate(ckdir: Path, data: str, args, verify: str, resume: bool) -> float:
    import tensorflow as tf

    import dvc_dali

    os.environ["DVC_DALI_VERIFY_BATCHES"] = verify
    ck = dvc_dali.Checkpointer(ckdir, resume=resume)
    ds = ck.tf_dataset("train", pipe_fn(data, args.side), batch_size=args.batch, num_threads=4,
                       device_id=None, seed=1, output_dtypes=(tf.float32, tf.int32),
                       output_shapes=((args.batch, args.side, args.side, 3), (args.batch, 1)))
    it = iter(ds)
    if not resume:
        ck.save(0)  # digests are recorded from a checkpoint on
    for _ in range(5):  # warm up (compared with the recording when resuming)
        next(it)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        next(it)
    took = time.perf_counter() - t0
    ck.close()
    return args.steps / took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from tests.helpers import pipelines

    tmp = Path(tempfile.mkdtemp(prefix="b_tf_digests-"))
    try:
        data = str(pipelines.make_data(tmp / "d") / "images")
        mb = args.batch * args.side * args.side * 3 * 4 / 1e6
        print(f"batch {args.batch} x {args.side}x{args.side}x3 float32 ({mb:.1f} MB)")
        for n in range(args.rounds):
            for verify, label in (("0", "off"), ("", "on ")):
                ckdir = tmp / f"ck-{n}-{label.strip()}"
                rec = rate(ckdir, data, args, verify, resume=False)
                cmp_ = rate(ckdir, data, args, verify, resume=True)
                print(f"round {n} digests {label}: {rec:7.1f} batches/s recording, "
                      f"{cmp_:7.1f} resumed (comparing)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
