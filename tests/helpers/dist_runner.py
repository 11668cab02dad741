"""A data-parallel training loop under torchrun: one DALI shard per rank.

    python -m torch.distributed.run --nproc_per_node N dist_runner.py DATA OUT_PREFIX UNTIL EVERY

Each rank writes the batches it produced to OUT_PREFIX-rank<r>.npz. Env
KILL_RANK/KILL_AT: that rank SIGKILLs itself right after step KILL_AT's
checkpoint (KILL_RANK=all: every rank); KILL_SIG=SIGTERM sends that instead,
and the loop then asks ``should_save`` at every step (preemption).
"""

import os
import signal
import sys

import numpy as np
import torch.distributed as dist

import dvc_dali
from tests.helpers import pipelines

data, out_prefix, until, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ck = dvc_dali.Checkpointer("checkpoint", total_steps=until)
fn, kw = pipelines.make("rotate", data, batch_size=2)["train"]
pipe = ck.pipeline("train", fn, **{**kw, "shard_id": rank, "num_shards": world})
w = ck.arrays.get("w", np.zeros(2))
results = {}
kill_rank, kill_at = os.environ.get("KILL_RANK"), int(os.environ.get("KILL_AT", "0"))
kill_sig = getattr(signal, os.environ.get("KILL_SIG", "SIGKILL"))
for step in range(ck.step + 1, until + 1):
    for i, sample in enumerate(pipelines.outputs_of(pipe)):
        results[f"{step:04d}_{i:02d}"] = sample
    w = w + rank + step
    if ck.should_save(step, every) if kill_sig == signal.SIGTERM else step % every == 0:
        ck.make_checkpoint(step, arrays={"w": w})
        if step == kill_at and kill_rank in (str(rank), "all"):
            os.kill(os.getpid(), kill_sig)
results["final_w"] = w
np.savez(f"{out_prefix}-rank{rank}.npz", **results)
dist.destroy_process_group()
