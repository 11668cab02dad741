"""Child of benchmark 9: one restore in a fresh process; prints JSON with
its seconds and the process's peak memory (KiB) before and after.

    restore_big_child.py make WHERE LAYERS      write WHERE/state.pt and WHERE/ck
    restore_big_child.py MODE WHERE             MODE: torch.load, Checkpointer, load

torch, dvc_dali's Checkpointer and load (dvc_dali imports its parts on first
use) and nvidia.dali are imported before the clock starts, in every mode; the
clock stops once one byte of every 4 KiB page of every tensor has been read."""

import json
import resource
import sys
import time

mode, where = sys.argv[1], sys.argv[2]
import numpy as np  # noqa: E402
import torch  # noqa: E402

from dvc_dali import Checkpointer, load  # noqa: E402
import nvidia.dali  # noqa: E402,F401


def touch(state) -> int:
    """One byte of every 4 KiB page of every tensor read; how many tensors."""
    n, total = 0, 0
    for part in (state["model"], state["optim"]):  # load() also gives the RNG states
        for t in part.values():
            pages = t.detach().reshape(-1).view(torch.uint8).numpy()[::4096]
            total += int(pages.sum(dtype=np.uint64))
            n += 1
    return n


if mode == "make":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    import bigstate

    bigstate.LAYERS = int(sys.argv[3])
    state = bigstate.make_state()
    torch.save(state, f"{where}/state.pt")
    ck = Checkpointer(f"{where}/ck", resume=False)
    ck.save(1, arrays=state)
    ck.close()
    print(json.dumps({"bytes": bigstate.nbytes(state), "tensors": touch(state)}))
    sys.exit(0)

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if mode == "torch.load":
    state = torch.load(f"{where}/state.pt")
elif mode == "load":
    state = load(f"{where}/ck").arrays
else:
    state = Checkpointer(f"{where}/ck").arrays
tensors = touch(state)
took = time.perf_counter() - t
assert tensors > 0
print(json.dumps({"s": took, "tensors": tensors, "rss_before_kib": before,
                  "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
