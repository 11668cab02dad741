"""A wait for another rank is never silent: with asynchronous checkpoints
across two real gloo ranks, a rank that checkpoints while the other never
does (the common mistake of saving on rank 0 only) waits for it, and says
so, naming the step and the rank, while it waits (async_ranks._Waiting;
its thresholds lowered here, as the script's own setting)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from tests.helpers import child_env

pytest.importorskip("torch")

SCRIPT = """
import sys
import numpy as np
import torch.distributed as dist
dist.init_process_group("gloo")
import dvc_dali
from dvc_dali.training import async_ranks
async_ranks.WAITING_S, async_ranks.WAITING_AGAIN_S = 0.5, 1000.0
ck = dvc_dali.Checkpointer(sys.argv[1], asynchronous=True)
if dist.get_rank() == int(sys.argv[2]):  # the only rank that checkpoints
    ck.make_checkpoint(10, arrays={"w": np.zeros(3)})
    ck.make_checkpoint(20, arrays={"w": np.ones(3)})  # waits for step 10's
dist.barrier()
"""

SAID = {
    0: "rank 0 of 2 has waited 1 s for the files of step 10 from rank 1, alive",
    1: "rank 1 of 2 has waited 1 s for rank 0 to record step 10",
}


def _first_line_with(proc: subprocess.Popen, text: str, timeout: float) -> str | None:
    """The first line of ``proc``'s output holding ``text`` (None: it ended,
    or ``timeout`` passed, without one)."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None or text in line:
            return line


@pytest.mark.parametrize("saver", [0, 1])
def test_a_rank_waiting_for_one_that_never_checkpoints_says_so(tmp_path, saver):
    script = tmp_path / "rank.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         "2", str(script), str(tmp_path / "ck"), str(saver)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(),
        start_new_session=True)
    try:
        line = _first_line_with(proc, SAID[saver][:SAID[saver].index(" 1 s")], timeout=300)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert line is not None, "no line said the wait"
    waited = line.split("has waited ", 1)[1].split(" s", 1)[0]
    assert int(waited) >= 0, line
    assert SAID[saver].replace(" 1 s", f" {waited} s") in line, line
    assert "make_checkpoint() at the same step" in line, line


LEAVES = """
import sys
import numpy as np
import torch.distributed as dist
dist.init_process_group("gloo")
import dvc_dali
rank, how = dist.get_rank(), sys.argv[2]
ck = dvc_dali.Checkpointer(sys.argv[1], asynchronous=True)
if rank == 1:  # its loop ends first (uneven data)
    if how == "closed":
        ck.make_checkpoint(10, arrays={"w": np.zeros(3)})
        ck.close()
    sys.exit(0)  # "exited": it never checkpoints, and its process ends
step = 20 if how == "closed" else 10
if how == "closed":
    ck.make_checkpoint(10, arrays={"w": np.zeros(3)})
ck.make_checkpoint(step, arrays={"w": np.ones(3)})
try:
    ck.close()
except dvc_dali.CheckpointWriteError as exc:
    print("refused:", exc, flush=True)
    sys.exit(3)
"""


@pytest.mark.parametrize("how", ["exited", "closed"])
def test_a_rank_that_ended_without_the_checkpoint_fails_it_by_name(tmp_path, how):
    """A rank whose loop ends first (its process exits having never
    checkpointed, or its Checkpointer closed after step 10) is not waited for
    as if alive, nor said to have died mid-write: rank 0's checkpoint fails
    at once, naming the rank, the step and the likely cause."""
    from tests.helpers.ranks import run_ranks

    script = tmp_path / "leaves.py"
    script.write_text(LEAVES)
    zero, one = run_ranks([sys.executable, str(script), str(tmp_path / "ck"), how], tmp_path,
                          timeout=240)
    assert one.returncode == 0, one.stderr[-3000:]
    step = 20 if how == "closed" else 10
    assert zero.returncode == 3, zero.stdout + zero.stderr[-3000:]
    assert (f"refused: {tmp_path / 'ck'}: rank 1 of 2 ended (its Checkpointer closed or its "
            f"process exited) without calling make_checkpoint() for step {step}; step {step} "
            "is not recorded") in zero.stdout, zero.stdout
    latest = (tmp_path / "ck" / "LATEST")
    assert ("step-000000010" in latest.read_text()) if how == "closed" else not latest.exists()


FORKS = """
import atexit
import os
import sys
import numpy as np
import torch.distributed as dist
dist.init_process_group("gloo")
import dvc_dali
ck = dvc_dali.Checkpointer(sys.argv[1], asynchronous=True)
if dist.get_rank() == 1:  # a child of its own, forked, that ends running its exit hooks
    child = os.fork()
    if child == 0:  # (not sys.exit: torch's C++ teardown hangs in a forked child)
        atexit._run_exitfuncs()
        os._exit(0)
    os.waitpid(child, 0)
dist.barrier()  # the child has ended before either rank checkpoints
ck.make_checkpoint(10, arrays={"w": np.zeros(3)})
ck.close()
"""


def test_a_forked_child_that_exits_is_not_its_rank_leaving(tmp_path):
    """The exit of a child a rank forked (atexit hooks run there too) is not
    the rank's: the other rank still records the step both checkpoint."""
    from tests.helpers.ranks import run_ranks

    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    zero, one = run_ranks([sys.executable, str(script), str(tmp_path / "ck")], tmp_path,
                          timeout=240)
    assert one.returncode == 0, one.stderr[-3000:]
    assert zero.returncode == 0, zero.stdout + zero.stderr[-3000:]
    assert "step-000000010" in (tmp_path / "ck" / "LATEST").read_text()
