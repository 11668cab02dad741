"""How an asynchronous checkpoint ends is never lost: the run's last one
(step >= total_steps) raises its error at the call, like a synchronous one;
one that failed and that no wait() or close() read is said at exit and the
process ends with status 1; a later Checkpointer of the directory in the
same process (training in phases) resumes the save still in flight, not
the one before it; and an array is written with its layout, as a
synchronous save writes it."""

from __future__ import annotations

import collections
import subprocess
import sys

import numpy as np
import pytest

import dvc_dali
from dvc_dali.core.errors import CheckpointLockedError

from tests.helpers import child_env

ENDS = """
import pathlib, shutil, sys
import numpy as np
import dvc_dali
ck = dvc_dali.Checkpointer(sys.argv[1], asynchronous=True, total_steps=int(sys.argv[2]))
ck.make_checkpoint(1, arrays={"w": np.ones(2)})
ck.wait()
shutil.rmtree(sys.argv[1])
pathlib.Path(sys.argv[1]).write_text("")  # the directory is a file now: the write fails
try:
    ck.make_checkpoint(2, arrays={"w": np.ones(2)})
except dvc_dali.CheckpointWriteError as exc:
    print("raised at the call:", exc, flush=True)
    sys.exit(4)
print("returned", flush=True)  # and the script ends without wait() or close()
"""


@pytest.mark.parametrize("total", [2, 10])
def test_a_failed_save_is_raised_at_the_last_step_or_said_at_exit(tmp_path, total):
    script = tmp_path / "ends.py"
    script.write_text(ENDS)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "ck"), str(total)],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    said = proc.stdout + proc.stderr
    if total == 2:  # the last step: waited for at once, raised where it was passed
        assert proc.returncode == 4 and "raised at the call: " in said, said
        return
    # an early end (the loop broke before total_steps) with nothing waiting
    assert proc.returncode == 1 and "returned" in proc.stdout, said
    assert ("the checkpoint of step 2 failed in the background and was never waited for: "
            "CheckpointWriteError: ") in said, said
    assert "this process ends with status 1" in said and "Traceback" not in said, said


def test_an_array_the_save_refuses_is_refused_at_the_call(tmp_path):
    """As a synchronous checkpoint does, not from a later call."""
    bad = {"nt": collections.namedtuple("P", "a")(1), "obj": np.array([object()]),
           "set": {1}, "key": {(1, 2): np.ones(1)}}
    ck = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=True, rng=False)
    for name, value in bad.items():
        with pytest.raises(TypeError, match=f"'{name}"):
            ck.make_checkpoint(1, arrays={"w": np.ones(2), name: {"x": [value]}})
    ck.make_checkpoint(1, arrays={"w": np.ones(2)})
    ck.close()
    assert dvc_dali.load(tmp_path / "ck").step == 1


def test_a_later_checkpointer_resumes_the_save_still_in_flight(tmp_path):
    """Training in phases without close(): the second phase's Checkpointer is
    built while the first's last save (large: still being written) is in
    flight; it resumes that save, never the checkpoint before it."""
    first = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=True, rng=False)
    first.make_checkpoint(10, arrays={"w": np.zeros(4)})
    first.wait()
    first.make_checkpoint(20, arrays={"w": np.ones(4), "big": np.ones(5_000_000)})
    second = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=True, rng=False)
    assert second.step == 20 and second.arrays["w"].tolist() == [1, 1, 1, 1]
    first.close()
    second.close()


def test_the_older_of_two_live_checkpointers_on_one_directory_is_refused(tmp_path):
    """Two live Checkpointers of one process on one directory both wrote (found
    by a sweep): the older one's save then removed the newer one's save in
    flight as a leftover, its error blamed the disk, and a later save of a
    smaller step took the checkpoint back. The newer one writes; the older
    one's saves are refused, and the newer one's checkpoint stands."""
    first = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=True, rng=False)
    first.make_checkpoint(2, arrays={"w": np.zeros(2)})
    second = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=True, rng=False)
    second.make_checkpoint(11, arrays={"w": np.ones(2), "big": np.ones(2_000_000)})
    for save in (lambda: first.make_checkpoint(3, arrays={"w": np.zeros(2)}),
                 lambda: first.save(3, arrays={"w": np.zeros(2)})):
        with pytest.raises(CheckpointLockedError, match="a newer Checkpointer in this process "
                           "took this directory over, so step 3 is not saved"):
            save()
    second.wait()
    first.close()  # the newer one still holds the directory
    second.make_checkpoint(12, arrays={"w": np.full(2, 2.0)})
    second.close()
    loaded = dvc_dali.load(tmp_path / "ck")
    assert loaded.step == 12 and loaded.arrays["w"].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_broadcast_view_of_terabytes_is_refused_at_the_call(tmp_path, asynchronous):
    ck = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=asynchronous, rng=False)
    view = np.broadcast_to(np.zeros(1, np.float32), (10**6, 10**6))
    with pytest.raises(TypeError, match="array 'b': a view of 4 bytes of memory"):
        ck.make_checkpoint(1, arrays={"b": view})
    small = np.broadcast_to(np.arange(3.0), (4, 3))  # a small one is written whole
    ck.make_checkpoint(2, arrays={"b": small})
    ck.close()
    assert dvc_dali.load(tmp_path / "ck").arrays["b"].tolist() == small.tolist()


def test_an_array_keeps_its_layout_as_a_synchronous_save_writes_it(tmp_path):
    fortran = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    arrays = {"f": fortran, "t": np.arange(6).reshape(2, 3).T}
    for mode in (False, True):
        ck = dvc_dali.Checkpointer(tmp_path / str(mode), asynchronous=mode, rng=False)
        ck.make_checkpoint(1, arrays=arrays)
        ck.close()
    sync, asynchronous = (dvc_dali.load(tmp_path / str(m)).arrays for m in (False, True))
    for name, value in arrays.items():
        assert asynchronous[name].flags.f_contiguous == sync[name].flags.f_contiguous == (
            value.flags.f_contiguous), name
        assert asynchronous[name].strides == sync[name].strides
        assert np.array_equal(asynchronous[name], value)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_step_below_the_last_checkpoints_is_refused(tmp_path, asynchronous):
    """make_checkpoint(6) then (2) was taken: the row of step 2 came after
    step 6's, holding the later training (found by a sweep)."""
    ck = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=asynchronous, rng=False)
    ck.make_checkpoint(6, arrays={"w": np.ones(2)})
    for save in (ck.make_checkpoint, ck.save):
        with pytest.raises(dvc_dali.ConfigError, match="step=2: below the last checkpoint's "
                           "step 6, so its row would be named and ordered as if it came before"):
            save(2)
    ck.close()
    again = dvc_dali.Checkpointer(tmp_path / "ck", asynchronous=asynchronous, rng=False)
    with pytest.raises(dvc_dali.ConfigError, match="step=5: below the last checkpoint's step 6"):
        again.make_checkpoint(5)  # resumed at 6
    again.make_checkpoint(7)
    again.close()
    assert dvc_dali.load(tmp_path / "ck").step == 7
