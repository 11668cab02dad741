"""The stage of benchmark 8 (copied into a temporary project as train.py):
a DALI pipeline, a 1 MB array, a checkpoint every EVERY steps under
`dvc exp run`. Logs the loop's time, and when each row was recorded and
when its ref reached the git remote (dvc_dali's functions wrapped from
outside, looked up at call time; nothing in dvc_dali is changed)."""

import json
import os
import time

import numpy as np

import dvc_dali
from dali_pipes import PIPE_ARGS, decode_crop
from dvc_dali import recording
from dvc_dali.recording import push

LOG = os.environ["BENCH_LOG"]
STEPS, EVERY = int(os.environ["BENCH_STEPS"]), int(os.environ["BENCH_EVERY"])


def log(**event):
    with open(LOG, "a") as fh:
        fh.write(json.dumps(event) + "\n")


def wrap(module, name, event, key):
    orig = getattr(module, name)

    def timed(*args, **kwargs):
        out = orig(*args, **kwargs)
        log(event=event, at=time.time(), key=key(args, out))
        return out
    setattr(module, name, timed)


wrap(recording, "record_and_prune", "recorded", lambda a, out: out.ref)
wrap(push, "push_ref", "pushed", lambda a, out: a[3])

ck = dvc_dali.Checkpointer("checkpoint", params={}, total_steps=STEPS)
pipe = ck.pipeline("train", decode_crop, root="data", **PIPE_ARGS)
w = np.zeros(256 * 1024, np.float32)
t0 = time.perf_counter()
for step in range(1, STEPS + 1):
    pipe.run()
    w[0] = step
    if ck.should_save(step, EVERY):
        ck.make_checkpoint(step, arrays={"w": w})
log(event="loop", seconds=time.perf_counter() - t0)
