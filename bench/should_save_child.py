"""One rank of benchmark 7's should_save row (started by torch.distributed.run).

    should_save_child.py CHECKPOINT CALLS

Times Checkpointer.should_save, asked at every step (preemption agreed
across ranks: an asynchronous all_reduce of one integer, read one step
later), against the two ways it asked before: one synchronous all_reduce
(distributed.max_int) and an all_gather_object of each rank's signal.
Each step is a synchronous all_reduce of 100 KB (a gradient's, which keeps
the ranks in lockstep, as training does) and then the call timed;
alternated in blocks of 100 steps. Rank 0 prints {"should_save": [...],
"max_int": [...], "all_gather_object": [...]} (seconds a call, per block)
as JSON.
"""

import json
import sys
import time

import torch
import torch.distributed as dist

import dvc_dali
from dvc_dali.training import distributed

dist.init_process_group("gloo")
ck = dvc_dali.Checkpointer(sys.argv[1], resume=False)
calls = int(sys.argv[2])
grad = torch.zeros(25_000)
ask = {"should_save": lambda step: ck.should_save(step, 10 ** 9),
       "max_int": lambda step: distributed.max_int(0),
       "all_gather_object": lambda step: max(distributed.all_gather(0))}
times: dict[str, list[float]] = {name: [] for name in ask}
for block in range(calls // 100):
    for name, fn in ask.items():
        dist.barrier()
        spent = 0.0
        for step in range(1, 101):
            dist.all_reduce(grad)
            t0 = time.perf_counter()
            fn(step)
            spent += time.perf_counter() - t0
        times[name].append(spent / 100)
if dist.get_rank() == 0:
    print(json.dumps(times))
ck.close()
dist.destroy_process_group()
