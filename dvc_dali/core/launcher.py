"""Which rank this process is, as the launcher and torch.distributed say it.

The one reading of torchrun's variables and of torch.distributed's state,
shared by the log's "[rank N] " prefix (core) and the training layer's rank
checks: torch is never imported here (a process that never loaded it is not
distributed)."""

from __future__ import annotations

import sys
from typing import Any, Mapping


def launcher_world(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(rank, world size) from a launcher's variables: torchrun's ``RANK``
    and ``WORLD_SIZE``, or ``LOCAL_RANK`` where ``RANK`` is unset (Lightning's
    launcher sets only that); (0, 1) where none is set; None where one is not
    an integer."""
    try:
        return (int(environ.get("RANK", environ.get("LOCAL_RANK", "0"))),
                int(environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return None


def initialized_group() -> Any:
    """``torch.distributed`` where torch is loaded and its process group is
    initialized, else None (also while torch is being imported or torn down)."""
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    try:
        return dist if dist is not None and dist.is_available() and dist.is_initialized() \
            else None
    except (AttributeError, RuntimeError):
        return None
