"""The reference loop: DVC 2.58's own `dvc.api.make_checkpoint()`, run by the
DVC 2 venv's interpreter as a stage of DVC 2's `dvc exp run` (copied into a
temporary project as train.py). The script writes its checkpoint output
itself, as DVC 2 users did (torch.save, np.save), then signals.

Environment: BENCH_LOG, BENCH_PLAN (as bench/train_ckpt.py).
No NumPy or DALI here: the DVC 2 venv has neither.
"""

import json
import os
import random
import time

import dvc.api

perf = time.perf_counter
LOG = os.environ["BENCH_LOG"]
PLAN = [tuple(int(x) for x in part.split(":")) for part in os.environ["BENCH_PLAN"].split(",")]


def log(**event):
    with open(LOG, "a") as fh:
        fh.write(json.dumps(event) + "\n")


rng = random.Random(0)
os.makedirs("checkpoint", exist_ok=True)
log(event="start", mode="dvc2-api", checkpoint_env=os.environ.get("DVC_CHECKPOINT"))
step = 0
for size, n in PLAN:
    buf = bytearray(rng.randbytes(size))
    for _ in range(n):
        step += 1
        buf[:8] = rng.randbytes(8)  # new content: DVC must store it anew
        with open("metrics.json", "w") as fh:
            json.dump({"step": step, "loss": 1.0 / step}, fh)
        t0 = perf()
        with open("checkpoint/w.bin", "wb") as fh:
            fh.write(buf)
        t1 = perf()
        dvc.api.make_checkpoint()
        t2 = perf()
        log(event="checkpoint", step=step, size=size, write=t1 - t0, signal=t2 - t1,
            blocked=t2 - t0)
    del buf
log(event="end")
