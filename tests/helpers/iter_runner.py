"""Runs a framework iterator (or DALI dynamic mode) under a Checkpointer in a
process of its own; every batch and every end of epoch goes to OUT (.npz).

    python iter_runner.py CONFIG_JSON DATA CKPT OUT --until N [--save-at K ...] [--fresh]

CONFIG: {"framework": "torch"|"jax"|"dynamic", "iterator": "generic"|"classification",
"policy": "FILL"|"DROP"|"PARTIAL", "auto_reset": bool, "reader_name": bool,
"prefetch": int, "plain": bool (the iterator built as plain DALI would: refused),
"default_rng": bool (dynamic: random ops draw from the seeded default RNG)}
"""

from __future__ import annotations

import json
import shutil

import numpy as np

import dvc_dali
from tests.helpers import pipelines

BATCH = 5  # 24 samples: the last batch of an epoch is partial


def framework_iterator(cfg, ck, data):
    if cfg["framework"] == "jax":
        from nvidia.dali.plugin.jax import DALIGenericIterator as Generic
        from nvidia.dali.plugin.base_iterator import LastBatchPolicy
        Classification = None
    else:
        from nvidia.dali.plugin.pytorch import (DALIClassificationIterator as Classification,
                                                DALIGenericIterator as Generic,
                                                LastBatchPolicy)
    fn, kw = pipelines.make("rotate", data, batch_size=BATCH,
                            device=cfg.get("device", "cpu"))["train"]
    kw["prefetch_queue_depth"] = cfg.get("prefetch", 2)
    if cfg.get("iterator") == "classification":
        fn, kw = pipelines.classify_pipe, {k: v for k, v in kw.items()
                                           if k not in ("shuffle", "device")}
    pipe = ck.pipeline("train", fn, **kw)
    size = {"reader_name": "reader"} if cfg.get("reader_name", True) else {"size": 24}
    options = dict(last_batch_policy=getattr(LastBatchPolicy, cfg.get("policy", "FILL")),
                   auto_reset=cfg.get("auto_reset", True), **size)
    if cfg.get("iterator") == "classification":
        args = (Classification, [pipe])
    else:
        args = (Generic, [pipe], ["data", "label", "angle"])
    if cfg.get("plain"):  # what a user of DALI alone writes: refused
        return args[0](*args[1:], **options)
    return ck.iterator(*args, **options)


def main() -> None:
    ap = pipelines.runner_parser("config")
    args = ap.parse_args()
    cfg = json.loads(args.config)
    if cfg.get("default_rng"):  # random ops without rng=: the thread's default RNG
        import nvidia.dali.experimental.dynamic as ndd

        ndd.random.set_seed(7)
    ck = dvc_dali.Checkpointer(args.ckpt, resume=not args.fresh)
    results = {}
    step = ck.step

    def saved(step):
        if step in args.save_at:
            ck.save(step)
            shutil.copytree(args.ckpt, f"{args.ckpt}-{step}")

    if cfg["framework"] == "dynamic":
        import nvidia.dali.experimental.dynamic as ndd

        dyn = ck.dynamic()
        reader = ndd.readers.File(file_root=f"{args.data}/images", random_shuffle=True, seed=5)
        rng = ndd.random.RNG(seed=42)
        dyn.register(reader, "reader")
        dyn.register(rng, "rng")
        while step < args.until:
            for files, labels in reader.next_epoch(batch_size=BATCH):
                step += 1
                angle = ndd.random.uniform(batch_size=BATCH, range=(-10.0, 10.0),
                                           rng=None if cfg.get("default_rng") else rng)
                results[f"{step:04d}_label"] = np.asarray(ndd.as_tensor(labels))
                results[f"{step:04d}_angle"] = np.asarray(ndd.as_tensor(angle))
                saved(step)
                if step >= args.until:
                    break
            # No end-of-epoch marker here: next_epoch() has no StopIteration to
            # lose, and a run stopped right at an epoch's end never sees one.
    else:
        it = framework_iterator(cfg, ck, args.data)
        while step < args.until:
            try:
                batch = next(it)
            except StopIteration:
                results[f"{step:04d}_epoch_end"] = np.array(1)
                if not cfg.get("auto_reset", True):
                    it.reset()
                continue
            step += 1
            outputs = batch if isinstance(batch, dict) else batch[0]  # JAX: one dict
            for key, value in outputs.items():
                value = value.cpu() if hasattr(value, "cpu") else value  # CUDA tensors
                results[f"{step:04d}_{key}"] = np.asarray(value)
            saved(step)
    np.savez(args.out, **results)


if __name__ == "__main__":
    main()
