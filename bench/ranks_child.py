"""One rank of the ranks benchmark (started by torch.distributed.run):
saves a checkpoint of its DALI shard and 1 MB of arrays SAVES times and
prints the save durations (rank 0: every rank's, gathered)."""

import json
import sys

import numpy as np
import torch.distributed as dist

from nvidia.dali import fn, pipeline_def

import dvc_dali


@pipeline_def
def shard_pipe(root, shard_id, num_shards):
    jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, shard_id=shard_id,
                                    num_shards=num_shards, name="reader")
    images = fn.decoders.image(jpegs, device="cpu")
    return fn.random_resized_crop(images, size=(32, 32), name="crop"), labels


data, ckpt, saves = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ck = dvc_dali.Checkpointer(ckpt, resume=False)
pipe = ck.pipeline("train", shard_pipe, batch_size=4, num_threads=1, device_id=None, seed=1,
                   root=data, shard_id=rank, num_shards=world)
w = np.ones(1 << 17)  # 1 MB per rank
times = []
for step in range(1, saves + 1):
    pipe.run()
    ck.save(step, arrays={"w": w * step})
    times.append(ck.timings["save_s"])
everyone = [None] * world
dist.all_gather_object(everyone, times)
if rank == 0:
    print(json.dumps(everyone))
dist.destroy_process_group()
