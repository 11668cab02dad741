"""The stage of benchmark 8 (copied into a temporary project as train.py):
a DALI pipeline, a 1 MB array, a checkpoint every EVERY steps under
`dvc exp run`. Logs the loop's time, and when each row was recorded and
when its ref reached the git remote (dvc_dali's functions wrapped from
outside, looked up at call time; nothing in dvc_dali is changed), and at
the end the CPU this process and its children used, and the pusher's own
count (its thread's CPU and its git processes', from wait4)."""

import json
import os
import resource
import time

import numpy as np

import dvc_dali
from dali_pipes import PIPE_ARGS, decode_crop
from dvc_dali.recording import auto_push as push
from dvc_dali.recording import pipeline as recording

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
_push_refs = push.push_refs


def push_refs(dvc_root, remote, refs):
    out = _push_refs(dvc_root, remote, refs)
    at = time.time()
    for sha, ref in refs:
        if sha:
            log(event="pushed", at=at, key=ref)
    return out


push.push_refs = push_refs

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
pusher = push.pusher()
stats = {}
if pusher is not None:
    pusher.wait(60)
    stats = dict(pusher.stats)


def cpu(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


log(event="end", pusher=stats, cpu_s=cpu(resource.RUSAGE_SELF),
    children_cpu_s=cpu(resource.RUSAGE_CHILDREN))
