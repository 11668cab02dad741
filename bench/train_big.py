"""Benchmark 13's stage script: a ~1 GB torch state, each checkpoint timed
as torch.save + fsync (into a scratch file, removed) and then as
make_checkpoint (save + record), side by side in this one process.

Environment: BENCH_LOG (JSON lines), BENCH_CHECKPOINTS (how many),
BENCH_SCRATCH (a directory for the torch.save file)."""

import json
import os
import time
from pathlib import Path

import bigstate
import dvc_dali
from dvc_dali.recording import pipeline as recording

perf = time.perf_counter
LOG = os.environ["BENCH_LOG"]
N = int(os.environ["BENCH_CHECKPOINTS"])
SCRATCH = Path(os.environ["BENCH_SCRATCH"])


def log(**event):
    with open(LOG, "a") as fh:
        fh.write(json.dumps(event) + "\n")


phases = {}
_record = recording.record_request


def timed_record(*args, **kwargs):
    t = perf()
    result = _record(*args, **kwargs)
    phases.update(result.phases, record=perf() - t)
    return result


recording.record_request = timed_record  # looked up at call time by record_and_prune


def main():
    state = bigstate.make_state()
    ck = dvc_dali.Checkpointer("checkpoint", params={"n": N}, total_steps=N)
    for step in range(1, N + 1):
        for t in state["model"].values():  # new content each step: DVC stores it anew
            t.view(-1)[0] = float(step)
        bigstate.clean(SCRATCH / "torch.pt")
        ref = bigstate.torch_save(state, SCRATCH / "torch.pt")
        bigstate.clean(SCRATCH / "torch.pt")
        phases.clear()
        t = perf()
        ck.make_checkpoint(step, arrays=state)
        ours = perf() - t
        log(event="checkpoint", step=step, ours=ours, torch=ref, save=ck.timings["save_s"],
            phases=dict(phases))
    ck.close()


main()
