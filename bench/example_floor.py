"""The distributed example (examples/train.py) with its checkpoints made
another way, for benchmark 7; ``DVC_DALI_BENCH_ARM`` says which:

- ``floor``: the floor of an asynchronous checkpoint. At each checkpoint a
  rank copies the tensors it hands over (the in-memory snapshot) and
  common.FloorWriter writes them into one new file, fsyncs it and removes
  the previous one on a background thread; ``ck.wait()`` waits for it.
  Nothing else: no agreement between ranks, no LATEST, no DALI state, no
  proof. It is what any durable asynchronous checkpoint of these bytes
  costs the training.
- ``loop``: no checkpoint at all, but the example's own work at each one
  (its metrics logged, its model file written) still done: what the loop
  costs around a checkpoint, which no checkpoint can avoid.
- ``ours``: dvc-dali's, as the example makes them.
- ``alternate``: ours at every other checkpoint, none at the others; each
  rank prints how long each checkpoint interval took (from one call to the
  next: the call itself, then the training while its background work
  runs), by whether its checkpoint was made. Side by side in one run, so
  what varies from run to run (on 2 cores, +-5%) is left out of the ratio.

At the last step every arm makes ours, because the run without checkpoints
makes one there too (a first checkpoint's costs, inside the example's
clock). At exit each rank prints the CPU its checkpoints took, per
checkpoint: on the training thread (make_checkpoint) and on background
threads (the write, and rank 0's commit). Run as the example is:
``torch.distributed.run ... bench/example_floor.py ARGS``."""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from common import FloorWriter

import dvc_dali
from dvc_dali.training import async_ranks

del sys.modules["common"]  # the bench's: the example imports a common module of its own

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train.py"
ARM = os.environ.get("DVC_DALI_BENCH_ARM", "floor")
CPU_LINE = "bench cpu per checkpoint"  # what b_ranks reads: "<line> rank R: T ms, B ms, N"
INTERVALS_LINE = "bench intervals"  # "<line> rank R: [[made, seconds], ...]" (JSON)


class _Cpu:
    """Thread CPU seconds of the checkpoints before the last, by where they ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seconds = {"training": 0.0, "background": 0.0}
        self.count = 0

    def timed(self, fn: Callable[..., Any], where: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                with self.lock:
                    self.seconds[where] += time.thread_time() - start

        return run

    def say(self) -> None:
        n = max(self.count, 1)
        training, background = (self.seconds[k] / n * 1e3 for k in ("training", "background"))
        print(f"{CPU_LINE} rank {os.environ.get('RANK', '0')}: {training:.3f} ms, "
              f"{background:.3f} ms, {self.count}", flush=True)


CPU = _Cpu()
_calls: list[tuple[bool, float]] = []  # alternate: (ours made, when) of each checkpoint call


def _say_intervals() -> None:
    spans = [[made, later - when] for (made, when), (_, later) in zip(_calls, _calls[1:])]
    print(f"{INTERVALS_LINE} rank {os.environ.get('RANK', '0')}: {json.dumps(spans)}",
          flush=True)


def _copies(value: Any, out: list) -> list:
    """Every tensor in ``value`` (state dicts, nested), copied to host memory."""
    import torch

    if isinstance(value, torch.Tensor):
        out.append(value.detach().cpu().numpy().copy().reshape(-1))
    elif isinstance(value, dict):
        for item in value.values():
            _copies(item, out)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _copies(item, out)
    return out


_writer: FloorWriter | None = None  # made at the first checkpoint, in the Checkpointer's directory


def _make_checkpoint(ck: Any, step: int, arrays: Any = None, **kwargs: Any) -> None:
    """This arm's checkpoint; at the run's last step ours, which the run
    without checkpoints makes too, so that every arm pays it alike."""
    global _writer
    last = ck.total_steps is not None and step >= ck.total_steps
    if last:
        if _calls:
            _calls.append((False, time.perf_counter()))  # the end of the last interval
        if _writer is not None:
            _writer.wait()
        _ours(ck, step, arrays=arrays, **kwargs)
        return
    CPU.count += 1
    if ARM == "alternate":
        made = CPU.count % 2 == 1
        _calls.append((made, time.perf_counter()))
        if made:
            _timed_ours(ck, step, arrays=arrays, **kwargs)
    elif ARM == "ours":
        _timed_ours(ck, step, arrays=arrays, **kwargs)
    elif ARM == "floor":
        if _writer is None:
            _writer = FloorWriter(Path(ck.path), f"floor-{os.environ.get('RANK', '0')}-")
            _writer._write = CPU.timed(_writer._write, "background")  # type: ignore[method-assign]
        _timed_save(_writer, lambda: _copies(arrays, []))


def _wait(ck: Any) -> None:
    if _writer is not None:
        _writer.wait()
    _our_wait(ck)  # ours (the last step's, in every arm)


_ours = dvc_dali.Checkpointer.make_checkpoint
_timed_ours = CPU.timed(_ours, "training")
_timed_save = CPU.timed(FloorWriter.save, "training")
dvc_dali.Checkpointer.make_checkpoint = _make_checkpoint  # type: ignore[method-assign]
_our_wait = dvc_dali.Checkpointer.wait
dvc_dali.Checkpointer.wait = _wait  # type: ignore[method-assign]
_our_job = async_ranks.AsyncRanks._run  # every rank's write, and rank 0's commit
_timed_job = CPU.timed(_our_job, "background")


def _job(self: Any, seq: str, captured: Any, *rest: Any) -> None:
    """Ours, its CPU counted but at the last step (CPU.count is of those before it)."""
    total = (captured.run or {}).get("total_steps")
    last = total is not None and captured.step >= total
    return (_our_job if last else _timed_job)(self, seq, captured, *rest)


async_ranks.AsyncRanks._run = _job  # type: ignore[method-assign]

if __name__ == "__main__":
    if ARM not in ("floor", "loop", "ours", "alternate"):
        sys.exit(f"DVC_DALI_BENCH_ARM={ARM!r}: use floor, loop, ours or alternate")
    atexit.register(CPU.say)
    atexit.register(_say_intervals)
    sys.argv[0] = str(EXAMPLE)
    sys.path.insert(0, str(EXAMPLE.parent))
    runpy.run_path(str(EXAMPLE), run_name="__main__")
