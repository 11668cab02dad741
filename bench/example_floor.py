"""The distributed example (examples/train.py) with the floor of an
asynchronous checkpoint in place of dvc-dali's (benchmark 7). At each
checkpoint a rank copies the tensors it hands over (the in-memory snapshot);
a background thread writes them into one new file, fsyncs it and removes
the previous one; ``ck.wait()`` waits for it. Nothing else: no agreement
between ranks, no LATEST, no DALI state, no proof. It is what any durable
asynchronous checkpoint of these bytes costs the training. Run as the
example is: ``torch.distributed.run ... bench/example_floor.py ARGS``."""

from __future__ import annotations

import os
import runpy
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dvc_dali

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


class _Floor:
    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(1)
        self.future: Future | None = None
        self.n = 0
        self.rank = os.environ.get("RANK", "0")

    def make_checkpoint(self, ck: Any, step: int, arrays: Any = None, **_: Any) -> None:
        self.wait(ck)
        self.n += 1
        self.future = self.pool.submit(self._write, Path(ck.path), _copies(arrays, []), self.n)

    def _write(self, root: Path, copies: list, n: int) -> None:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / f"floor-{self.rank}-{n}.bin", "wb") as fh:
            for array in copies:
                fh.write(array.view("uint8"))
            fh.flush()
            os.fsync(fh.fileno())
        (root / f"floor-{self.rank}-{n - 1}.bin").unlink(missing_ok=True)

    def wait(self, _ck: Any = None) -> None:
        if self.future is not None:
            self.future.result()
        self.future = None


FLOOR = _Floor()
dvc_dali.Checkpointer.make_checkpoint = (  # type: ignore[method-assign]
    lambda self, step, **kwargs: FLOOR.make_checkpoint(self, step, **kwargs))
dvc_dali.Checkpointer.wait = lambda self: FLOOR.wait(self)  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv[0] = str(EXAMPLE)
    sys.path.insert(0, str(EXAMPLE.parent))
    runpy.run_path(str(EXAMPLE), run_name="__main__")
