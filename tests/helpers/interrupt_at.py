"""A trainer (the script given first) interrupted as a Ctrl-C would, right
after dvc-dali's n-th write of a row's dvc.lock entry (INTERRUPT_AT=<n>):
between that write and the row's ref, on the training thread, or on the
background thread of an asynchronous checkpoint. The instant is reached
through dvc-dali's own function, wrapped here (no DVC or DALI code is
replaced).

    python interrupt_at.py train.py ARGS...

INTERRUPT_SIGNAL=KILL: SIGKILLed there instead (no handler runs: a machine's
death, an OOM kill). INTERRUPT_ON=held: at the n-th write of a row's held
note instead, before it (the row's ref made).
"""

import os
import runpy
import signal
import sys
import threading

from dvc_dali.recording import held, lockfile

_AT = int(os.environ["INTERRUPT_AT"])
_ON_HELD = os.environ.get("INTERRUPT_ON") == "held"
_write = lockfile.write_entry
_write_held = held.write
_calls = []
_raised = threading.Event()  # the training thread got the Ctrl-C


def _interrupt(_signum, _frame):
    _raised.set()
    raise KeyboardInterrupt


# SIGINT raises KeyboardInterrupt (a suite started in the background has it ignored)
signal.signal(signal.SIGINT, _interrupt)


def _write_then_interrupt(*args, **kwargs):
    out = _write(*args, **kwargs)
    _calls.append(1)
    if len(_calls) == _AT:
        if os.environ.get("INTERRUPT_SIGNAL") == "KILL":
            os.kill(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGINT)
        if threading.current_thread() is not threading.main_thread():
            _raised.wait()  # the row goes on once the training thread is interrupted
    return out


def _interrupt_then_write_held(*args, **kwargs):
    _calls.append(1)
    if len(_calls) == _AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return _write_held(*args, **kwargs)


if _ON_HELD:
    held.write = _interrupt_then_write_held
else:
    lockfile.write_entry = _write_then_interrupt
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
