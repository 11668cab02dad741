"""Child process of benchmark 5 (a fresh interpreter per measurement).

    restore_child.py make CKDIR ROOT STEPS      run STEPS batches, save a checkpoint
    restore_child.py time CKDIR ROOT STEP       Checkpointer + pipeline + first batch,
                                                timed; prints JSON (STEP 0: fresh start)
"""

import json
import sys
import time

perf = time.perf_counter
t_import = perf()
from nvidia.dali import Pipeline  # noqa: E402

import dvc_dali  # noqa: E402
from dvc_dali.dali import dali_state  # noqa: E402
from dali_pipes import PIPE_ARGS, decode_crop  # noqa: E402

t_import = perf() - t_import
parts: dict = {}


def wrap(owner, name, key):
    orig = getattr(owner, name)

    def timed(*args, **kwargs):
        t = perf()
        try:
            return orig(*args, **kwargs)
        finally:
            parts[key] = parts.get(key, 0.0) + perf() - t

    setattr(owner, name, timed)


def main():
    what, ckdir, root, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if what == "make":
        ck = dvc_dali.Checkpointer(ckdir, resume=False)
        pipe = ck.pipeline("train", decode_crop, root=root, size=8, **PIPE_ARGS)
        for _ in range(n):
            pipe.run()
        ck.save(n)
        return
    wrap(dali_state, "describe", "describe")
    wrap(dali_state, "_data_digest", "digest")
    wrap(Pipeline, "build", "build")
    t0 = perf()
    ck = dvc_dali.Checkpointer(ckdir)
    t1 = perf()
    pipe = ck.pipeline("train", decode_crop, root=root, size=8, **PIPE_ARGS)
    t2 = perf()
    pipe.run()
    t3 = perf()
    if ck.step != n:
        raise SystemExit(f"expected step {n}, the Checkpointer says {ck.step}")
    print(json.dumps({"total": t3 - t0, "checkpointer": t1 - t0, "pipeline": t2 - t1,
                      "first_batch": t3 - t2, "import": t_import, **parts}))


main()
