"""Child of benchmark 9: one restore in a fresh process; prints JSON with
its seconds and the process's peak memory (KiB) before and after."""

import json
import resource
import sys
import time

mode, where = sys.argv[1], sys.argv[2]
import torch  # noqa: E402  (imported before the clock starts, for every mode)

import dvc_dali  # noqa: E402

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
if mode == "torch.load":
    state = torch.load(f"{where}/state.pt")
elif mode == "load":
    state = dvc_dali.load(f"{where}/ck").arrays["model"]
else:
    state = dvc_dali.Checkpointer(f"{where}/ck").arrays["model"]
took = time.perf_counter() - t
assert len(state) > 0
print(json.dumps({"s": took, "rss_before_kib": before,
                  "rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
