"""The ``dvc_dali`` logger: one line per event on stderr, as DVC and DVCLive do.

A handler is installed only when the application configured none for this
logger, so ``logging.basicConfig`` or a framework's own setup takes over.
Levels work as usual: ``logging.getLogger("dvc_dali").setLevel("WARNING")``
silences progress lines.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Mapping

from .errors import readable
from .launcher import initialized_group, launcher_world

logger = logging.getLogger("dvc_dali")


def rank_prefix(initialized: tuple[int, int] | None, environ: Mapping[str, str]) -> str:
    """"[rank N] " on a rank other than 0 (torchrun mixes every rank's output
    in one stream, and a line alone never said whose it was), else "".
    ``initialized``: torch.distributed's (rank, world size) where it is
    initialized; else the launcher's variables (still set after
    destroy_process_group(), for the lines said at exit)."""
    found = initialized if initialized is not None else launcher_world(environ)
    if found is None:
        return ""
    rank, size = found
    return f"[rank {rank}] " if size > 1 and rank != 0 else ""


def _initialized() -> tuple[int, int] | None:
    dist = initialized_group()
    try:
        return (dist.get_rank(), dist.get_world_size()) if dist is not None else None
    except (AttributeError, RuntimeError):  # a group being torn down
        return None


class _RankFormatter(logging.Formatter):
    """A line from a rank other than 0 names its rank; one naming a path
    that is not UTF-8 shows its bytes as \\xNN."""

    def format(self, record: logging.LogRecord) -> str:
        return rank_prefix(_initialized(), os.environ) + readable(super().format(record))


class _StderrHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` (tests and tools swap it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_RankFormatter("dvc-dali: %(message)s"))

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ sets it
        pass


if not logger.handlers:
    logger.addHandler(_StderrHandler())
    # DVC_DALI_DEBUG=1 (see context.py) adds debug lines, such as where a
    # recording's time went; read here too, as the logger exists first.
    logger.setLevel(logging.DEBUG if os.environ.get("DVC_DALI_DEBUG", "").strip() == "1"
                    else logging.INFO)
    logger.propagate = False
