"""The distributed example (examples/train.py) with the floor of an
asynchronous checkpoint in place of dvc-dali's (benchmark 7): at each
checkpoint a rank copies the tensors it hands over (the in-memory snapshot)
and common.FloorWriter writes them into one new file, fsyncs it and removes
the previous one on a background thread; ``ck.wait()`` waits for it.
Nothing else: no agreement between ranks, no LATEST, no DALI state, no
proof (but at the last step, where the run without checkpoints makes one
too, ours). It is what any durable asynchronous checkpoint of these bytes costs
the training. Run as the example is: ``torch.distributed.run ...
bench/example_floor.py ARGS``."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

from common import FloorWriter

import dvc_dali

del sys.modules["common"]  # the bench's: the example imports a common module of its own

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train.py"


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
    """The floor's write; at the run's last step ours, which the run without
    checkpoints makes too (its one checkpoint, with a first checkpoint's costs),
    so that both pay it alike."""
    global _writer
    if _writer is None:
        _writer = FloorWriter(Path(ck.path), f"floor-{os.environ.get('RANK', '0')}-")
    if ck.total_steps is not None and step >= ck.total_steps:
        _writer.wait()
        _ours(ck, step, arrays=arrays, **kwargs)
        return
    _writer.save(lambda: _copies(arrays, []))


def _wait(ck: Any) -> None:
    if _writer is not None:
        _writer.wait()
    _our_wait(ck)  # the last step's checkpoint, ours (a no-op before it)


_ours = dvc_dali.Checkpointer.make_checkpoint
dvc_dali.Checkpointer.make_checkpoint = _make_checkpoint  # type: ignore[method-assign]
_our_wait = dvc_dali.Checkpointer.wait
dvc_dali.Checkpointer.wait = _wait  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv[0] = str(EXAMPLE)
    sys.path.insert(0, str(EXAMPLE.parent))
    runpy.run_path(str(EXAMPLE), run_name="__main__")
