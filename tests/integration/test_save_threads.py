"""Saves of 4 MB and more go to a pool of writer threads and are fsynced
together at the end (store._Batch): the same checkpoint as a small save, the
same refusal when a file cannot be written, and a forked child (a DataLoader
worker, a multiprocessing rank) gets a pool of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import dvc_dali
from dvc_dali.format import store

from tests.helpers import child_env
# several files, 4 MB or more in all: the threaded path
BIG = {"a": np.arange(7, dtype=np.int16), "w": np.linspace(0, 1, 600_000),
       "b": np.full((500, 1000), 3, dtype=np.float32), "opt": {"m": [np.ones(300_000)]}}


def manifest_of(root: Path) -> dict:
    rel = (root / store.LATEST).read_text().split()[0]
    return json.loads((root / rel / store.MANIFEST).read_text())


def test_a_threaded_save_reads_back_exactly(tmp_path):
    assert sum(a.nbytes for a in (BIG["a"], BIG["w"], BIG["b"], BIG["opt"]["m"][0])) >= (
        store._THREADS_FROM)
    ck = dvc_dali.Checkpointer(tmp_path / "c", rng=False)  # the files: these arrays only
    ck.save(1, arrays={"x": np.zeros(3)})  # small: written inline
    ck.save(2, arrays=BIG)
    back = dvc_dali.Checkpointer(tmp_path / "c")
    assert back.step == 2
    for name in ("a", "w", "b"):
        assert back.arrays[name].dtype == BIG[name].dtype
        assert np.array_equal(back.arrays[name], BIG[name])
    assert np.array_equal(back.arrays["opt"]["m"][0], BIG["opt"]["m"][0])
    files = manifest_of(tmp_path / "c")["files"]
    # outside dvc exp run nothing hands an md5 to DVC: a CRC-32 only
    assert len(files) == 4 and all(set(f) == {"crc32", "size"} for f in files.values())
    assert [p.name for p in (tmp_path / "c").iterdir() if p.name != store.LATEST] == [
        (tmp_path / "c" / store.LATEST).read_text().split()[0]]  # the small one removed


SAVE_TOO_BIG = """
import os, resource, signal, sys, numpy as np, dvc_dali
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)    # EFBIG instead of being killed
ck = dvc_dali.Checkpointer(sys.argv[1])
ck.save(1, arrays={"w": np.ones(1000)})
fds = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # files up to 1 MiB
for attempt in range(3):
    try:   # four files, two of 8 MB: written on the pool, two of them fail
        ck.save(2, arrays={"a": np.ones(10), "w": np.ones(1_000_000), "v": np.ones(1_000_000),
                           "b": np.ones(10)})
    except dvc_dali.CheckpointWriteError as exc:
        print(exc)
print("fds", fds, len(os.listdir("/proc/self/fd")))
"""


def test_a_threaded_save_that_cannot_write_keeps_the_previous_checkpoint(tmp_path):
    out = subprocess.run([sys.executable, "-c", SAVE_TOO_BIG, str(tmp_path / "c")], text=True,
                         capture_output=True, env=child_env())
    assert out.stdout.count("cannot write the checkpoint (File too large)") == 3, out.stderr
    before, after = out.stdout.split("fds ")[1].split()
    assert after == before, out.stdout  # every file of the failed saves was closed
    back = dvc_dali.Checkpointer(tmp_path / "c")
    assert back.step == 1 and back.arrays["w"].shape == (1000,)
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".tmp-")]


FORK_AND_SAVE = """
import os, sys, numpy as np, dvc_dali
big = {"w": np.linspace(0, 1, 600_000), "b": np.full((500, 1000), 3, dtype=np.float32)}
ck = dvc_dali.Checkpointer(sys.argv[1] + "/parent")
ck.save(1, arrays=big)  # the parent's pool exists now; its threads are not in a child
pid = os.fork()
if pid == 0:  # the child saves, then leaves without the parent's exit handlers
    code = 1
    try:
        dvc_dali.Checkpointer(sys.argv[1] + "/child").save(5, arrays=big)
        code = 0
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)  # a child stuck on the parent's pool never returns
ck.save(2, arrays=big)  # and the parent's pool still works
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_saves_with_its_own_writer_threads(tmp_path):
    """In a fresh interpreter (a fork of pytest, which has other tests'
    threads, is not what a user's training script is)."""
    out = subprocess.run([sys.executable, "-c", FORK_AND_SAVE, str(tmp_path)], text=True,
                         capture_output=True, env=child_env())
    assert "child 0" in out.stdout, out.stderr
    back = dvc_dali.Checkpointer(tmp_path / "child")
    assert back.step == 5 and np.array_equal(back.arrays["b"], BIG["b"])
    assert dvc_dali.Checkpointer(tmp_path / "parent").step == 2
