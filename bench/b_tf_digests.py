"""The cost of batch digests on a Checkpointer.tf_dataset: batches/s of eager
iteration with DVC_DALI_VERIFY_BATCHES=0 (the check node is an identity) and
with the default (every element digested in a tf.numpy_function, through a
zero-copy view of the arrays TensorFlow hands over: on the digest thread
while recording, before the element is returned while a resume compares),
side by side in one process: two datasets, digests on and off, iterated in
alternating blocks of BLOCK elements, so the machine's load falls on both.
Also the time the check node spends per element on the thread that runs it
and the digest thread's CPU time per element (Recorder.costs).

    python bench/b_tf_digests.py [--side 224] [--batch 32] [--steps 60] [--rounds 4]
                                 [--json OUT]

Benchmark 16 (b_verify.py) runs it in a child process with --json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BLOCK = 5  # elements per block; the two datasets alternate block by block
WARM = 5  # elements taken before timing (compared too, when resuming)


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


def _dataset(ckdir: Path, data: str, args, verify: str, resume: bool):
    import tensorflow as tf

    import dvc_dali

    os.environ["DVC_DALI_VERIFY_BATCHES"] = verify
    try:
        ck = dvc_dali.Checkpointer(ckdir, resume=resume)
    finally:
        del os.environ["DVC_DALI_VERIFY_BATCHES"]
    ds = ck.tf_dataset("train", pipe_fn(data, args.side), batch_size=args.batch, num_threads=4,
                       device_id=None, seed=1, output_dtypes=(tf.float32, tf.int32),
                       output_shapes=((args.batch, args.side, args.side, 3), (args.batch, 1)))
    return ck, iter(ds)


def _prepare(ckdir: Path, data: str, args) -> None:
    """A checkpoint followed by WARM + steps recorded elements."""
    shutil.rmtree(ckdir, ignore_errors=True)
    ck, it = _dataset(ckdir, data, args, "", resume=False)
    ck.save(0)
    for _ in range(WARM + args.steps):
        next(it)
    ck.close()
    del ck, it
    gc.collect()


def paired(tmp: Path, data: str, args, resume: bool, first: str = "on") -> dict:
    """Elements/s with digests on and off, and the check's costs (on);
    ``first``: the dataset made first, and first in the even blocks (the
    one made first runs a few percent slower here, whatever it does: the
    rounds alternate it)."""
    runs = {}
    order = (first, "off" if first == "on" else "on")
    for verify in order:
        ckdir = tmp / f"ck-{verify}-{'resumed' if resume else 'recording'}"
        if resume:
            _prepare(ckdir, data, args)
        else:
            shutil.rmtree(ckdir, ignore_errors=True)
        ck, it = _dataset(ckdir, data, args, "" if verify == "on" else "0", resume)
        if not resume:
            ck.save(0)  # digests are recorded from a checkpoint on
        for _ in range(WARM):
            next(it)
        runs[verify] = (ck, it)
    costs = runs["on"][0]._batches.costs
    costs.__init__()  # from here on
    elapsed = {"on": 0.0, "off": 0.0}
    for block in range(args.steps // BLOCK):
        for verify in (order if block % 2 == 0 else order[::-1]):
            it = runs[verify][1]
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                next(it)
            elapsed[verify] += time.perf_counter() - t0
    for ck, _ in runs.values():
        ck.close()  # waits for the digest in flight
    steps = BLOCK * (args.steps // BLOCK)
    out = {v: steps / t for v, t in elapsed.items()}
    out["caller_us"] = costs.caller_s / max(costs.batches, 1) * 1e6
    out["thread_cpu_us"] = costs.background_cpu_s / max(costs.background, 1) * 1e6
    del runs
    gc.collect()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=4)  # even: made first in turn
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    from tests.helpers import pipelines

    tmp = Path(tempfile.mkdtemp(prefix="b_tf_digests-"))
    results: dict[str, list[dict]] = {"recording": [], "resumed": []}
    try:
        data = str(pipelines.make_data(tmp / "d") / "images")
        mb = args.batch * args.side * args.side * 3 * 4 / 1e6
        print(f"batch {args.batch} x {args.side}x{args.side}x3 float32 ({mb:.1f} MB), "
              f"{args.steps} elements a run in blocks of {BLOCK}, on and off alternating",
              flush=True)
        for n in range(args.rounds):
            for resume, label in ((False, "recording"), (True, "resumed")):
                got = paired(tmp, data, args, resume, first=("on", "off")[n % 2])
                results[label].append(got)
                print(f"round {n} {label:9} ({('on', 'off')[n % 2]} made first): on "
                      f"{got['on']:6.1f}/s, off {got['off']:6.1f}/s, "
                      f"ratio {got['on'] / got['off']:.3f}; the check node "
                      f"{got['caller_us']:.0f} us an element, the digest thread "
                      f"{got['thread_cpu_us']:.0f} us of CPU", flush=True)
        for label, rounds in results.items():
            ratio = statistics.geometric_mean(r["on"] / r["off"] for r in rounds)
            print(f"{label}: ratio {ratio:.3f} (geometric mean of the rounds')")
        if args.json:
            Path(args.json).write_text(json.dumps({"megabytes": mb, **results}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
