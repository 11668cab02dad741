"""A torch training loop with no RNG code of its own, under a Checkpointer.

    python rng_runner.py DATA CKPT OUT --until N [--kill-at K] [--every E] [--fresh]

Dropout, a ``torch.rand``-driven augmentation, ``random.random()`` and
``np.random`` draws, all from the global generators seeded once at the start
(as a script does); the Checkpointer saves them and restores them on resume.
Checkpoints every E steps; ``--kill-at K``: SIGKILL right after the save of
step K. Every step's draws and loss, and the final weights, go to OUT (.npz).
"""

from __future__ import annotations

import argparse
import os
import random
import signal

import numpy as np
import torch
from nvidia.dali.plugin.pytorch import DALIGenericIterator

import dvc_dali
from tests.helpers import pipelines


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("data", "ckpt", "out"):
        ap.add_argument(name)
    ap.add_argument("--until", type=int, required=True)
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--kill-at", type=int, default=0)
    ap.add_argument("--every", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)

    ck = dvc_dali.Checkpointer(args.ckpt, resume=not args.fresh)
    fn, kw = pipelines.make("rotate", args.data)["train"]
    pipe = ck.pipeline("train", fn, **kw)
    loader = ck.iterator(DALIGenericIterator, [pipe], ["images", "labels", "angle"],
                         reader_name="reader", auto_reset=True)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 3, 8),
                                torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    if ck.resumed:
        model.load_state_dict(ck.arrays["model"])
        opt.load_state_dict(ck.arrays["optim"])
    results = {}
    for step in range(ck.step + 1, args.until + 1):
        try:
            batch = next(loader)[0]
        except StopIteration:
            batch = next(loader)[0]
        x = batch["images"].float() / 255.0
        x = x * (0.8 + 0.4 * torch.rand(x.shape[0], 1, 1, 1))  # random brightness
        lr = 0.05 * (1.0 + 0.1 * random.random())
        noise = np.random.normal(0.0, 0.01, size=3)
        y = batch["labels"].reshape(-1).long()
        for group in opt.param_groups:
            group["lr"] = lr
        loss = torch.nn.functional.cross_entropy(model(x) + torch.from_numpy(noise).float(), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        results[f"{step:04d}_loss"] = loss.detach().numpy()
        results[f"{step:04d}_draws"] = np.array([lr, *noise])
        if step % args.every == 0:
            ck.save(step, arrays={"model": model.state_dict(), "optim": opt.state_dict()})
            if step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
    results["final_weights"] = torch.cat([p.detach().reshape(-1)
                                          for p in model.parameters()]).numpy()
    np.savez(args.out, **results)


if __name__ == "__main__":
    main()
