"""torch.distributed coupling: which rank this is, and the collectives a
consistent multi-rank checkpoint needs. torch is imported only if it is
already loaded (a process that never imported it is not distributed)."""

from __future__ import annotations

import sys
from typing import Any


def _dist():
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    return dist if dist.is_available() and dist.is_initialized() else None


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside torch.distributed."""
    dist = _dist()
    return (dist.get_rank(), dist.get_world_size()) if dist else (0, 1)


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (JSON-like objects only)."""
    dist = _dist()
    if dist is None:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()
