"""Preemption: SIGTERM (Kubernetes, SLURM, spot instances) or SIGUSR1 (SLURM's
`--signal`) turns into one more checkpoint at the next step, then an exit.

The handlers only set a flag (and chain to any handler the application
installed): the training loop asks :func:`should_save` at each step, so the
checkpoint is taken between steps, where the state is consistent, never
from inside a signal handler.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable, Optional

from ..core import exit_hooks
from ..core.process_state import STATE

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def due(step: int, every: int, preempted: bool) -> bool:
    """The checkpoint rule: every ``every`` steps, and at once after a signal."""
    return preempted or (every > 0 and step % every == 0)


class Flag:
    """The first preemption signal this process received (per process: signal
    handlers are)."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: dict[int, Any] = {}
        self._pid = 0  # the process it was installed in: the run

    def install(self, ours: tuple[Callable, ...] = ()) -> None:
        """Handle SIGTERM and SIGUSR1 from now on (main thread only; elsewhere
        Python cannot). A previous handler in ``ours`` (dvc-dali's own
        SIGTERM-to-exit) is replaced, not chained: the exit now comes after
        the checkpoint."""
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            previous = signal.getsignal(sig)
            self._previous[sig] = None if previous in ours else previous
            signal.signal(sig, self._handle)
        self._pid = os.getpid()

    def _handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked child (a worker): not the run
            previous = self._previous.get(signum)
            if callable(previous):  # the application's own, as without dvc-dali
                signal.signal(signum, previous)
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                exit_hooks.as_if_not_handled(signum)
            return
        if self.signum is None:
            self.signum = STATE.preemption_signal = signum  # exit_hooks.on_sigterm defers
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    @property
    def signal(self) -> Optional[signal.Signals]:
        return None if self.signum is None else signal.Signals(self.signum)


FLAG = Flag()
