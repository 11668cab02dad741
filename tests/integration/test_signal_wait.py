"""DVC 2's protocol, the waiting side: a bare make_checkpoint() waits for
the process that records it (DVC 2's `dvc exp run`, `dvc-dali run`) to
remove the signal file. Real processes: a recorder that is killed while its
command waits."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

import pytest

from tests.helpers import child_env

WAITER = """
import os, sys, time
from pathlib import Path
from dvc_dali.core import ancestry
from dvc_dali.core.errors import SignalError
from dvc_dali.training.signal_file import signal_and_wait, wait_removed, write_signal
path = Path(sys.argv[1])
try:
    if sys.argv[2] == "late":  # a first checkpoint, answered; the recorder ends before the next
        signal_and_wait(path, 3600)
        recorder = os.getppid()
        print("waiting", flush=True)
        while os.getppid() == recorder:
            time.sleep(0.01)
        signal_and_wait(path, 3600)
    else:
        watcher = ancestry.starter()  # as signal_and_wait takes it, before the signal
        write_signal(path)
        print("waiting", flush=True)
        wait_removed(path, 3600, watcher)
except SignalError as exc:
    print(f"refused: {exc}", flush=True)
"""

RECORDER = """
import os, shlex, subprocess, sys, time
command = [sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]]
if sys.argv[3] == "shell":  # DVC runs a stage's command as $SHELL -c, or /bin/sh -c
    command = ["/bin/sh", "-c", shlex.join(command)]
waiter = subprocess.Popen(command)
if sys.argv[3] == "late":  # answers the first signal
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
    os.unlink(sys.argv[2])
waiter.wait()
"""


@pytest.mark.parametrize("between", ["nothing", "shell", "late"])
def test_a_wait_ends_when_the_recorder_is_killed(tmp_path, between):
    """`dvc-dali run` (or DVC 2) SIGKILLed while its command waits for a
    checkpoint to be recorded: the command waited an hour
    (DVC_DALI_SIGNAL_TIMEOUT) as an orphan, holding `dvc exp run`'s output
    pipe open (found by a sweep); it is refused at once, naming what ended.
    Also where a shell stands between (dash, Debian's /bin/sh, does not exec
    a lone command: it stays the waiter's parent; CI found it), and where
    the recorder answered a first checkpoint and ended before the next
    (``late``: the watcher taken at each wait was then this process's new
    parent, so it waited on; CI found the same where the recorder ended
    before the wait began)."""
    recorder = subprocess.Popen(
        [sys.executable, "-c", RECORDER, WAITER, str(tmp_path / "DVC_CHECKPOINT"), between],
        stdout=subprocess.PIPE, text=True, env=child_env(this_python=True))
    assert recorder.stdout.readline() == "waiting\n"
    os.kill(recorder.pid, signal.SIGKILL)
    recorder.wait()
    # until the waiter, which holds the pipe too, ends (a bound only for a
    # regression: it waited an hour)
    ready, _, _ = select.select([recorder.stdout], [], [], 300)
    assert ready, "the waiter still waits for a recorder that is gone"
    said = recorder.stdout.read()
    assert f"the process that records checkpoints (pid {recorder.pid}, DVC 2's `dvc exp run` " \
        "or `dvc-dali run`) ended while this checkpoint waited for it" in said, said
    assert (tmp_path / "DVC_CHECKPOINT").exists()  # nobody answered it
