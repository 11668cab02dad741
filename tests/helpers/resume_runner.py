"""Runs test pipelines under a Checkpointer in a process of its own.

    python resume_runner.py KIND DATA CKPT OUT --until N [--save-at K ...]
        [--fresh] [--shuffle 0|1] [--device cpu|gpu]

Steps from the checkpoint's step (0 when fresh) to N; after step K it saves
and copies the checkpoint to CKPT-K. Every output of every step, and the
arrays restored, go to OUT (.npz) for the test to compare bit for bit.
"""

from __future__ import annotations

import shutil

import numpy as np

import dvc_dali
from tests.helpers import pipelines


def main() -> None:
    ap = pipelines.runner_parser("kind")
    ap.add_argument("--shuffle", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    ck = dvc_dali.Checkpointer(args.ckpt, resume=not args.fresh)
    pipes = {name: ck.pipeline(name, fn, **kw) for name, (fn, kw) in
             pipelines.make(args.kind, args.data, shuffle=bool(args.shuffle),
                            device=args.device).items()}
    xp = np
    if args.device == "gpu":
        import cupy as xp
    weights = ck.arrays.get("weights", xp.zeros(3, dtype=xp.float64))
    results = {}
    for step in range(ck.step, args.until):
        for name, pipe in pipes.items():
            for i, sample in enumerate(pipelines.outputs_of(pipe)):
                results[f"{step:04d}_{name}_{i:03d}"] = sample
        weights = weights + float(step)  # stands in for training
        if step + 1 in args.save_at:
            ck.save(step + 1, arrays={"weights": weights}, metadata={"saved_after": step})
            shutil.copytree(args.ckpt, f"{args.ckpt}-{step + 1}")
    results["restored_step"] = np.array(ck.step)
    results["final_weights"] = xp.asnumpy(weights) if xp is not np else weights
    np.savez(args.out, **results)


if __name__ == "__main__":
    main()
