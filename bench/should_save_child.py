"""One rank of benchmark 7's should_save row (started by torch.distributed.run).

    should_save_child.py CHECKPOINT CALLS

Times Checkpointer.should_save, asked at every step (preemption agreed
across ranks: one all_reduce of one integer), against the way it asked
before (an all_gather_object of each rank's signal), alternated in blocks
of 100 calls. Rank 0 prints {"should_save": [...], "all_gather_object":
[...]} (seconds a call, per block) as JSON.
"""

import json
import sys
import time

import torch.distributed as dist

import dvc_dali
from dvc_dali.training import distributed

dist.init_process_group("gloo")
ck = dvc_dali.Checkpointer(sys.argv[1], resume=False)
calls = int(sys.argv[2])
times = {"should_save": [], "all_gather_object": []}
ask = {"should_save": lambda step: ck.should_save(step, 10 ** 9),
       "all_gather_object": lambda step: max(distributed.all_gather(0))}
for block in range(calls // 100):
    for name, fn in ask.items():
        dist.barrier()
        t0 = time.perf_counter()
        for step in range(1, 101):
            fn(step)
        times[name].append((time.perf_counter() - t0) / 100)
if dist.get_rank() == 0:
    print(json.dumps(times))
ck.close()
dist.destroy_process_group()
