"""Runs a test pipeline under a Checkpointer and can kill itself (SIGKILL)
between two checkpoints, for the proof-at-runtime tests.

    python proof_runner.py KIND DATA CKPT OUT --until N [--save-at K ...]
        [--kill-after M]

Steps from the checkpoint's step (0 when fresh) to N, saving after each
step K; after step M it kills itself. Every output of every step goes to
OUT (.npz) when it gets to N.
"""

from __future__ import annotations

import os
import signal

import numpy as np

import dvc_dali
from tests.helpers import pipelines


def main() -> None:
    ap = pipelines.runner_parser("kind")
    ap.add_argument("--kill-after", type=int, default=None)
    args = ap.parse_args()

    ck = dvc_dali.Checkpointer(args.ckpt, resume=not args.fresh)
    pipes = {name: ck.pipeline(name, fn, **kw)
             for name, (fn, kw) in pipelines.make(args.kind, args.data).items()}
    results = {}
    for step in range(ck.step, args.until):
        for name, pipe in pipes.items():
            for i, sample in enumerate(pipelines.outputs_of(pipe)):
                results[f"{step:04d}_{name}_{i:03d}"] = sample
        if step + 1 in args.save_at:
            ck.save(step + 1)
        if step + 1 == args.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
    results["restored_step"] = np.array(ck.step)
    np.savez(args.out, **results)


if __name__ == "__main__":
    main()
