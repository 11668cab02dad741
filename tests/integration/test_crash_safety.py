"""A crash at any instant of a save leaves the previous complete checkpoint."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np

import dvc_dali
from dvc_dali.format import store

SAVER = """
import sys, numpy as np, dvc_dali
ck = dvc_dali.Checkpointer(sys.argv[1])
step = ck.step
while True:
    step += 1
    ck.save(step, arrays={"a": np.full(1_000_000, step, np.float32),
                          "b": np.full(1000, -step, np.int64)}, metadata={"step": step})
    print(step, flush=True)
"""


def test_sigkill_during_saves_never_loses_the_last_complete_checkpoint(tmp_path):
    rng = random.Random(1234)  # seeded: the kill instants are reproducible
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    last_reported = 0
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(ckpt)], env=env,
                                stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()  # at least one save of this process completed
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        reported = [int(x) for x in out.split()]
        last_reported = max([last_reported, *reported])
        back = dvc_dali.Checkpointer(ckpt)
        # Every save reported complete is there, or a later one.
        assert back.step >= last_reported
        assert (back.arrays["a"] == back.step).all() and (back.arrays["b"] == -back.step).all()
        assert back.metadata == {"step": back.step}
    dvc_dali.Checkpointer(ckpt).save(back.step + 1)
    left = sorted(p.name for p in ckpt.iterdir())
    assert len(left) == 2 and store.LATEST in left, f"leftovers not cleaned up: {left}"


def test_leftovers_of_a_crashed_save_are_ignored_then_removed(tmp_path):
    ckpt = tmp_path / "ckpt"
    dvc_dali.Checkpointer(ckpt).save(1, arrays={"w": np.ones(3)})
    (ckpt / ".tmp-step-000000002-deadbeef" / "arrays").mkdir(parents=True)
    (ckpt / ".tmp-step-000000002-deadbeef" / "arrays" / "00000.npy").write_bytes(b"half")
    (ckpt / "step-000000002-0badcafe").mkdir()  # renamed, LATEST not yet moved
    (ckpt / ".tmp-LATEST-12345678").write_text("step-000000002-0badcafe")
    ck = dvc_dali.Checkpointer(ckpt)
    assert ck.step == 1 and np.array_equal(ck.arrays["w"], np.ones(3))
    ck.save(2)
    names = sorted(p.name for p in ckpt.iterdir())
    assert len(names) == 2 and names[0] == store.LATEST, names
    assert names[1] != "step-000000002-0badcafe" and store.latest(ckpt)[0][0] == names[1]
