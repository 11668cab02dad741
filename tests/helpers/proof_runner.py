"""Runs a test pipeline under a Checkpointer and can kill itself (SIGKILL)
between two checkpoints, for the proof-at-runtime tests.

    python proof_runner.py KIND DATA CKPT OUT --until N [--save-at K ...]
        [--kill-after M]

Steps from the checkpoint's step (0 when fresh) to N, saving after each
step K; after step M it kills itself. Every output of every step goes to
OUT (.npz) when it gets to N. KIND "dynamic": a DALI dynamic-mode reader
(and an RNG) registered on ``Checkpointer.dynamic()`` instead of pipelines.
PROOF_DIGEST_FAILS=K[,K...]: the K-th batch digest computed while recording
(counted from 1) raises, as a failing digest would.
PROOF_GROUPED=1: the pipelines' batches are recorded in groups, as a GPU
pipeline's are (batch_digests.GROUP_ON_CPU), however slowly they come.
PROOF_TOTAL_STEPS=N: the Checkpointer's total_steps (as under dvc exp run).
"""

from __future__ import annotations

import itertools
import os
import signal

import numpy as np

import dvc_dali
from tests.helpers import pipelines


def pipeline_steps(ck, kind: str, data: str):
    """Each step's samples by key: every output of every pipeline (built
    now, before the loop reads the checkpoint's step)."""
    pipes = {name: ck.pipeline(name, fn, **kw)
             for name, (fn, kw) in pipelines.make(kind, data).items()}

    def steps():
        while True:
            yield {f"{name}_{i:03d}": sample for name, pipe in pipes.items()
                   for i, sample in enumerate(pipelines.outputs_of(pipe))}

    return steps()


def dynamic_steps(ck, data: str):
    """Each step's samples by key: a dynamic-mode reader's batch (encoded
    files of different lengths, labels) and a uniform draw of a registered
    RNG, epoch after epoch (registered now, before the loop reads the step)."""
    import nvidia.dali.experimental.dynamic as ndd

    dyn = ck.dynamic()
    reader = ndd.readers.File(file_root=f"{data}/images", random_shuffle=True, seed=5)
    rng = ndd.random.RNG(seed=42)
    dyn.register(reader, "reader")
    dyn.register(rng, "rng")

    def steps():
        while True:
            for files, labels in reader.next_epoch(batch_size=5):
                angle = ndd.random.uniform(batch_size=5, range=(-10.0, 10.0), rng=rng)
                out = {f"files_{i:03d}": np.asarray(f) for i, f in enumerate(files)}
                out["labels"] = np.asarray(ndd.as_tensor(labels))
                out["angle"] = np.asarray(ndd.as_tensor(angle))
                yield out

    return steps()


def fail_digests(which: str) -> None:
    """The K-th batch digest (K in ``which``) raises."""
    from dvc_dali.proof import batch_digests

    original, count = batch_digests.digest, itertools.count(1)
    fails = {int(k) for k in which.split(",")}

    def digest(outputs):
        if next(count) in fails:
            raise RuntimeError("a digest failed")
        return original(outputs)

    batch_digests.digest = digest


def fill_up_after(ckpt: str) -> None:
    """No file may grow more than 40 bytes past the largest companion file's
    size now (RLIMIT_FSIZE, SIGXFSZ ignored: EFBIG, as on a full disk): the
    next batch's digest line is cut short, the ones after it not written."""
    import resource

    from dvc_dali.proof import batch_digests

    logs = list(batch_digests.companion_dir(ckpt).glob("*.jsonl"))
    size = max(p.stat().st_size for p in logs) + 40
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


def main() -> None:
    ap = pipelines.runner_parser("kind")
    ap.add_argument("--kill-after", type=int, default=None)
    args = ap.parse_args()
    if os.environ.get("PROOF_DIGEST_FAILS"):
        fail_digests(os.environ["PROOF_DIGEST_FAILS"])
    if os.environ.get("PROOF_GROUPED"):
        from dvc_dali.proof import batch_digests

        batch_digests.GROUP_ON_CPU, batch_digests.GROUP_WINDOW_S = True, 3600.0

    total = os.environ.get("PROOF_TOTAL_STEPS")  # the run's length, as under dvc exp run
    ck = dvc_dali.Checkpointer(args.ckpt, resume=not args.fresh,
                               total_steps=int(total) if total else None)
    steps = (dynamic_steps(ck, args.data) if args.kind == "dynamic"
             else pipeline_steps(ck, args.kind, args.data))
    results = {}
    for step in range(ck.step, args.until):
        for key, sample in next(steps).items():
            results[f"{step:04d}_{key}"] = sample
        if step + 1 in args.save_at:
            ck.save(step + 1)
        if step + 1 == args.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if step + 1 == int(os.environ.get("PROOF_FULL_AFTER", -1)):
            fill_up_after(args.ckpt)
    results["restored_step"] = np.array(ck.step)
    np.savez(args.out, **results)


if __name__ == "__main__":
    main()
