"""A ~1.06 GB torch model + optimizer state (336 float32 tensors) and the
reference ways of making it durable, shared by benchmark 12 (in-process) and
benchmark 13's stage script (bench/train_big.py)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

perf = time.perf_counter
LAYERS = 84  # weight (1536 x 1024) + bias per layer, each with an Adam exp_avg


def make_state(seed: int = 0) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    model, optim = {}, {}
    for i in range(LAYERS):
        for name, shape in ((f"l{i}.weight", (1536, 1024)), (f"l{i}.bias", (1536,))):
            model[name] = torch.randn(shape, generator=gen)
            optim[name] = torch.zeros(shape)
    return {"model": model, "optim": optim}


def nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for part in state.values() for t in part.values())


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def torch_save(state: dict, path: Path) -> float:
    """torch.save into one file + fsync of it; seconds."""
    import torch

    t = perf()
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    return perf() - t


def dcp_save(state: dict, path: Path) -> float:
    """torch.distributed.checkpoint (one process, its own fsyncs); seconds."""
    import torch.distributed.checkpoint as dcp

    t = perf()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    return perf() - t


def disk_floor(buf, path: Path) -> float:
    """The same bytes in one large write + fsync; seconds."""
    t = perf()
    with open(path, "wb", buffering=0) as fh:
        view = memoryview(buf)
        while view:
            view = view[fh.write(view[:1 << 30]):]
        os.fsync(fh.fileno())
    return perf() - t


def clean(path: Path) -> None:
    """Remove path and flush the page cache's dirty pages (untimed), so the
    next timing does not pay for this one's writeback."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    os.sync()
