"""One rank of the ranks benchmark (started by torch.distributed.run).

    ranks_child.py DATA CHECKPOINT SAVES MODE MB

MODE ``sync``: SAVES synchronous make_checkpoint calls of the rank's DALI
shard state and MB megabytes of arrays; ``async``: the same, asynchronous
(each timed call finds nothing in flight: the previous one is waited for
outside the timing); ``snapshot``: the in-memory copy alone
(dvc_dali.format.arrays.snapshot), what an asynchronous call cannot do without,
kept until the next one as the background write keeps it; ``capture``: that
and the rest of the in-memory state (DALI states, the random generators: the
Checkpointer's capture, a private method).
Outside `dvc exp run`: nothing is recorded; rank 0's "record" time is its
commit (every rank's files durable, LATEST written, superseded files removed).
Rank 0 prints every rank's timings, gathered, as JSON:
{"block": [...], "write": [...], "record": [...]} per rank.
"""

import json
import sys
import time

import numpy as np
import torch.distributed as dist

from nvidia.dali import fn, pipeline_def

import dvc_dali
from dvc_dali.format import arrays as arrays_mod


@pipeline_def
def shard_pipe(root, shard_id, num_shards):
    jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, shard_id=shard_id,
                                    num_shards=num_shards, name="reader")
    images = fn.decoders.image(jpegs, device="cpu")
    return fn.random_resized_crop(images, size=(32, 32), name="crop"), labels


data, ckpt, saves = sys.argv[1], sys.argv[2], int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "sync"
mb = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ck = dvc_dali.Checkpointer(ckpt, resume=False, asynchronous=mode == "async")
pipe = ck.pipeline("train", shard_pipe, batch_size=4, num_threads=1, device_id=None, seed=1,
                   root=data, shard_id=rank, num_shards=world)
w = np.ones(int(mb * (1 << 20)) // 8)
times = {"block": [], "write": [], "record": []}
held = None
for step in range(1, saves + 1):
    pipe.run()
    w[0] = step
    t0 = time.perf_counter()
    if mode == "snapshot":
        held = arrays_mod.snapshot({"w": w})
    elif mode == "capture":
        held = ck._capture(step, arrays_mod.snapshot({"w": w}), None)
    else:
        ck.make_checkpoint(step, arrays={"w": w})
    times["block"].append(time.perf_counter() - t0)
    ck.wait()  # untimed: the next call finds nothing in flight
    times["write"].append(ck.timings.get("save_s", 0.0))
    times["record"].append(ck.timings.get("record_s", 0.0))
everyone = [None] * world
dist.all_gather_object(everyone, times)
if rank == 0:
    print(json.dumps(everyone))
dist.destroy_process_group()
