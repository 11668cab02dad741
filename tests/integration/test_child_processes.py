"""A child the training process forks (a multiprocessing worker) is not the
run: SIGTERM ends it as it would without dvc-dali. `Pool.terminate` (and
leaving a `with Pool(...)` block) sends SIGTERM to each worker and waits for
it: a worker that inherited the preemption flag's handler ignored it, and
the training hung; one that inherited the exit line's handler printed the
run's "terminated" line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import child_env

SCRIPT = """
import multiprocessing as mp
import signal
import sys
import time
import dvc_dali
from dvc_dali.core import exit_hooks

def sleeper(ready):
    ready.set()  # a SIGTERM before the child runs Python is lost to any Python handler
    time.sleep(60)

if __name__ == "__main__":
    if sys.argv[1] == "flag":  # the preemption flag, from the first should_save
        ck = dvc_dali.Checkpointer("checkpoint", params={"a": 1}, total_steps=10)
        ck.should_save(1, 10)
    else:  # the exit line's handler, as under `dvc exp run` (its variables are set)
        from dvc_dali.core.context import RunContext
        exit_hooks.install(RunContext.from_environ())
        assert signal.getsignal(signal.SIGTERM) is exit_hooks.on_sigterm
    fork = mp.get_context("fork")
    ready = fork.Event()
    child = fork.Process(target=sleeper, args=(ready,))
    child.start()
    assert ready.wait(120)
    child.terminate()
    child.join(120)
    print("exitcode", child.exitcode, flush=True)
    if child.exitcode is None:
        child.kill()
"""


@pytest.mark.parametrize("handler", ["flag", "exit line"])
def test_a_forked_worker_ends_on_sigterm(tmp_path, handler):
    script = tmp_path / "pool.py"
    script.write_text(SCRIPT)
    under = {"DVC_ROOT": str(tmp_path), "DVC_EXP_BASELINE_REV": "0" * 40}
    out = subprocess.run([sys.executable, str(script), handler.split()[0]], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env=child_env(under if handler == "exit line" else {}))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "exitcode -15" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "terminated (SIGTERM)" not in out.stderr, out.stderr
