"""The example trainer (examples/train.py) with one fault at one instant of
an asynchronous checkpoint across ranks, for tests/e2e/test_async_distributed.py.

    python -m torch.distributed.run --nproc_per_node 2 async_faults.py

Env ASYNC_FAULT="<what>:<rank>:<step>": that rank, at that checkpoint step,
SIGKILLs itself (what = kill-...) or sends itself SIGTERM (term-write) at:

- ``before-write``: in the background thread, before its snapshot is written;
- ``mid-write``: its snapshot's files written, not yet fsynced and renamed;
- ``durable``: its files durable and said so in the store, nothing recorded;
- ``mid-record`` (rank 0): the row being recorded (outputs hashed, not cached);
- ``recorded``: the row recorded and the other ranks told.

``other-dir:<rank>:0``: that rank checkpoints into ``checkpoint-rank<rank>``
instead of the stage's ``checkpoint`` (a directory of its own, as a user
who appends the rank to the path would). ``sync-mode:<rank>:0``: that rank
checkpoints synchronously (DVC_DALI_ASYNC=0 in its environment only).

The instants are reached through dvc-dali's own functions, wrapped here (no
DVC, DALI or torch code is replaced). Without ASYNC_FAULT: the example as it is.
"""

import os
import runpy
import signal
import sys

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

FAULT = os.environ.get("ASYNC_FAULT", "")


def _fault(what: str, step: int) -> None:
    sig = signal.SIGTERM if what.startswith("term") else signal.SIGKILL
    print(f"async_faults: rank {os.environ.get('RANK')} {what} at step {step}: "
          f"{sig.name}", flush=True)
    os.kill(os.getpid(), sig)


def _install(what: str, step: int) -> None:
    from dvc_dali.training import async_ranks
    from dvc_dali.format import store

    at = what.split("-", 1)[1]  # kill-mid-write -> mid-write
    armed = {"on": False}

    def write_capture(root, capture, rank=None, _orig=store.write_capture):
        if capture.step == step:
            if at in ("before-write", "write"):
                _fault(what, step)
            armed["on"] = at == "mid-write"
        return _orig(root, capture, rank)

    store.write_capture = write_capture
    if at == "mid-write":
        orig_sync = store._Batch.sync

        def sync(self):
            if armed["on"]:
                _fault(what, step)
            return orig_sync(self)

        store._Batch.sync = sync

    for name in ("_commit", "_await_done"):
        orig = getattr(async_ranks.AsyncRanks, name)

        def wrapped(self, seq, s, *args, _orig=orig):
            # rank 0's _commit gets the rank's durable mark, the others' wait its step
            here = getattr(s, "step", s)
            if here == step and at == "durable":
                _fault(what, step)
            armed["on"] = here == step and at == "mid-record"
            out = _orig(self, seq, s, *args)
            if here == step and at == "recorded":
                _fault(what, step)
            return out

        setattr(async_ranks.AsyncRanks, name, wrapped)
    if at == "mid-record":
        from dvc_dali.recording import outputs

        orig_cache = outputs.cache_outputs

        def cache_outputs(stage):
            if armed["on"]:
                _fault(what, step)
            return orig_cache(stage)

        outputs.cache_outputs = cache_outputs


_args = sys.argv[1:]
if FAULT:
    _what, _rank, _step = FAULT.split(":")
    if os.environ.get("RANK") == _rank:
        if _what == "other-dir":
            _args += ["--checkpoint", f"checkpoint-rank{_rank}"]
        elif _what == "sync-mode":
            os.environ["DVC_DALI_ASYNC"] = "0"
        else:
            _install(_what, int(_step))

sys.path.insert(0, os.path.join(os.getcwd(), "examples"))
sys.argv = ["examples/train.py", *_args]
runpy.run_path("examples/train.py", run_name="__main__")
