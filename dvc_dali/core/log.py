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

logger = logging.getLogger("dvc_dali")


class _StderrHandler(logging.StreamHandler):
    """Writes to the current ``sys.stderr`` (tests and tools swap it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("dvc-dali: %(message)s"))

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
