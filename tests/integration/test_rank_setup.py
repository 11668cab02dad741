"""A Checkpointer built in a rank before torch.distributed is initialized
(a launcher's WORLD_SIZE set, init_process_group not called yet) is
refused by name in every rank: it would checkpoint as a single process, all
ranks into one directory (distributed.checked_world)."""

from __future__ import annotations

import os
import sys

import pytest

from dvc_dali.training import distributed

from tests.helpers.ranks import run_ranks

EARLY = """
import os
import sys
import dvc_dali
ck = dvc_dali.Checkpointer(sys.argv[1])  # before init_process_group: refused
import torch.distributed as dist
dist.init_process_group("gloo")
print("built", flush=True)
"""


@pytest.mark.parametrize("environ, initialized, found", [
    ({"RANK": "1", "WORLD_SIZE": "2"}, False, (1, 2)),
    ({"RANK": "0", "WORLD_SIZE": "8"}, False, (0, 8)),
    ({"RANK": "1", "WORLD_SIZE": "2"}, True, None),  # initialized: its own world
    ({"RANK": "0", "WORLD_SIZE": "1"}, False, None),  # one process
    ({}, False, None),  # not started by a launcher
    ({"WORLD_SIZE": "two"}, False, None),  # not torchrun's
    # Lightning's DDP launcher: LOCAL_RANK, no RANK (rank 1 was named rank 0; a sweep)
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, False, (1, 2)),
])
def test_which_processes_are_ranks_not_initialized(environ, initialized, found):
    assert distributed.launched_rank(environ, initialized) == found


def test_a_checkpointer_built_before_init_process_group_is_refused_in_every_rank(tmp_path):
    """Each rank started as torchrun starts it (its environment), but with no
    launcher to stop one rank when the other fails: every rank must say it."""
    pytest.importorskip("torch")
    script = tmp_path / "early.py"
    script.write_text(EARLY)
    ranks = run_ranks([sys.executable, str(script), str(tmp_path / "ck")], tmp_path)
    for rank, proc in enumerate(ranks):
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "built" not in proc.stdout, said[-3000:]
        assert (f"dvc-dali: ConfigError: Checkpointer built in rank {rank} of 2 (WORLD_SIZE "
                "set by a launcher: torchrun, Lightning's DDP) before "
                "torch.distributed.init_process_group()") in said
        assert "Call init_process_group() first, then build the Checkpointer" in said
        assert "/dvc_dali/" not in said, said[-3000:]  # one line, no traceback of ours
    assert not (tmp_path / "ck" / "LATEST").exists()


NO_STORE = """
import os
import sys
import numpy as np
import torch.distributed as dist
from torch.distributed import distributed_c10d
import dvc_dali
dist.init_process_group("gloo")
del distributed_c10d._get_default_store  # a torch that gives no store
rank = dist.get_rank()
ck = dvc_dali.Checkpointer(sys.argv[1] + ("", "-rank1")[rank * int(sys.argv[2])],
                           asynchronous=False)
ck.save(10, arrays={"w": np.arange(3) + rank})
print("saved", flush=True)
"""


@pytest.mark.parametrize("apart", [0, 1])
def test_synchronous_ranks_compare_setups_without_the_store(tmp_path, apart):
    """The ranks compare their directories through the store at the first
    save; where torch gives no store (so no rank can be asynchronous), through
    a collective: synchronous checkpoints work as before, and ranks given
    different directories are still refused."""
    pytest.importorskip("torch")
    script = tmp_path / "no_store.py"
    script.write_text(NO_STORE)
    real = os.path.realpath(tmp_path)
    ranks = run_ranks([sys.executable, str(script), str(tmp_path / "ck"), str(apart)],
                      tmp_path)
    for proc in ranks:
        said = proc.stdout + proc.stderr
        if apart:
            assert proc.returncode != 0 and "saved" not in said, said[-3000:]
            assert ("the ranks checkpoint into different directories (rank 0 into "
                    f"{real}/ck; rank 1 into {real}/ck-rank1)") in said, said[-3000:]
        else:
            assert proc.returncode == 0 and "saved" in proc.stdout, said[-3000:]
    assert (tmp_path / "ck" / "LATEST").exists() != bool(apart)


READER_FIRST = """
import sys
import numpy as np
import torch.distributed as dist
import dvc_dali
dist.init_process_group("gloo")
rank = dist.get_rank()
asynchronous = bool(int(sys.argv[2]))
if rank == 0:  # a Checkpointer to read only, on rank 0 only, built first
    reader = dvc_dali.Checkpointer(sys.argv[1] + "-eval", asynchronous=asynchronous)
ck = dvc_dali.Checkpointer(sys.argv[1], asynchronous=asynchronous)
for step in (10, 20):
    ck.make_checkpoint(step, arrays={"w": np.arange(3) + rank + step})
ck.wait()
print("saved", flush=True)
"""


@pytest.mark.parametrize("asynchronous", [0, 1])
def test_a_checkpointer_built_on_one_rank_to_read_is_not_counted(tmp_path, asynchronous):
    """The ranks compare the setups of their n-th checkpointing Checkpointers:
    one built on rank 0 only, which never checkpoints, shifts nothing."""
    pytest.importorskip("torch")
    script = tmp_path / "reader_first.py"
    script.write_text(READER_FIRST)
    ranks = run_ranks([sys.executable, str(script), str(tmp_path / "ck"), str(asynchronous)],
                      tmp_path)
    for proc in ranks:
        assert proc.returncode == 0 and "saved" in proc.stdout, proc.stderr[-3000:]
    latest = (tmp_path / "ck" / "LATEST").read_text()
    assert latest.count("rank-0000") == 2 and "step-000000020" in latest, latest


TWICE = """
import sys, time
import numpy as np
import torch.distributed as dist
import dvc_dali
dist.init_process_group("gloo")
rank = dist.get_rank()
for phase in (100, 200):  # a Checkpointer, closed, then another in the same directory
    if rank == 1 and phase == 200:
        time.sleep(1)  # rank 1 between the two (evaluating, say): rank 0 waits for it
    ck = dvc_dali.Checkpointer(sys.argv[1], asynchronous=True, resume=False)
    ck.make_checkpoint(10, arrays={"w": np.full(3, phase + rank)})
    ck.close()
dist.barrier()
print("restored", rank, int(dvc_dali.Checkpointer(sys.argv[1]).arrays["w"][0]), flush=True)
"""


def test_a_later_checkpointer_of_a_directory_never_takes_an_earlier_ones_files(tmp_path):
    """Asynchronous ranks agree through the store on each checkpoint: a
    second Checkpointer of the same directory in the same processes (training
    in phases) took the first one's mark of its first checkpoint, so LATEST
    named rank 0's new state beside rank 1's old one, and rank 1 was told
    its checkpoint was recorded before it was; and rank 1 between its two
    Checkpointers (its lock released) read as a rank that ended."""
    pytest.importorskip("torch")
    script = tmp_path / "twice.py"
    script.write_text(TWICE)
    ranks = run_ranks([sys.executable, str(script), str(tmp_path / "ck")], tmp_path)
    for rank, proc in enumerate(ranks):
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"restored {rank} {200 + rank}" in proc.stdout, proc.stdout[-3000:]


SKEWED = """
import sys
import numpy as np
import torch.distributed as dist
import dvc_dali
dist.init_process_group("gloo")
rank = dist.get_rank()
ck = dvc_dali.Checkpointer(sys.argv[1], asynchronous=bool(int(sys.argv[2])))
ck.make_checkpoint(2 + rank, arrays={"w": np.arange(3) + rank})  # rank 1 one step ahead
ck.wait()
print("saved", flush=True)
"""


@pytest.mark.parametrize("asynchronous", [0, 1])
def test_ranks_checkpointing_different_steps_are_refused_on_every_rank(tmp_path, asynchronous):
    """A row holds every rank's state at one step: a synchronous checkpoint
    published rank 0 at step 2 and rank 1 at step 3 (a resume then hung in
    the ranks' next collective; found by a sweep); it is refused on every
    rank, as the asynchronous one is, and nothing is published."""
    pytest.importorskip("torch")
    script = tmp_path / "skewed.py"
    script.write_text(SKEWED)
    ranks = run_ranks([sys.executable, str(script), str(tmp_path / "ck"), str(asynchronous)],
                      tmp_path)
    said = "the ranks checkpointed different steps (rank 0 step 2, rank 1 step 3)"
    for proc in ranks[:1] if asynchronous else ranks:  # asynchronous: rank 0 decides
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "saved" not in proc.stdout, text[-3000:]
        assert said in text and "Traceback" not in text, text[-3000:]
    assert not (tmp_path / "ck" / "LATEST").exists()


PHASES = """
import sys
from datetime import timedelta
from pathlib import Path
import numpy as np
import torch.distributed as dist
import dvc_dali
dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a hang fails, not waits
rank, path = dist.get_rank(), sys.argv[1]
ck = dvc_dali.Checkpointer(path, resume=False)
ck.make_checkpoint(10, arrays={"w": np.arange(3) + rank})
ck.close()
if rank == 0:  # to read only, on rank 0 only: agrees with no rank, waits for none
    reader = dvc_dali.Checkpointer(path)
    print("read", int(reader.arrays["w"][0]), flush=True)
    reader.close()
for step in (20, 30):  # two phases, each resuming the other's checkpoint on every rank
    if step == 30 and rank == 1:  # rank 1's snapshot of step 20 damaged
        entry = (Path(path) / "LATEST").read_text().splitlines()[1].split()[0]
        pack = next((Path(path) / entry / "arrays").iterdir())
        pack.chmod(0o644)
        data = bytearray(pack.read_bytes())
        data[-1] ^= 0xFF
        pack.write_bytes(bytes(data))
    dist.barrier()
    ck = dvc_dali.Checkpointer(path)  # no pipeline: agreed on at its first checkpoint
    ck.make_checkpoint(step, arrays={"w": np.arange(3) + rank + step})
    ck.close()
    print("saved", step, flush=True)
"""


def test_ranks_agree_on_each_restore_and_a_reader_is_not_counted(tmp_path):
    """Training in phases: the second phase's restore is agreed on apart from
    the first's (its keys are its own: the first's "restored" would have let
    rank 0 train), and a Checkpointer built on rank 0 only, to read, neither
    waits for rank 1 nor shifts the count. Rank 1's damaged snapshot
    refuses the last phase on both ranks, naming rank 1, before any saves."""
    pytest.importorskip("torch")
    script = tmp_path / "phases.py"
    script.write_text(PHASES)
    ranks = run_ranks([sys.executable, str(script), str(tmp_path / "ck")], tmp_path)
    assert "read 0" in ranks[0].stdout, ranks[0].stderr[-3000:]
    for proc in ranks:
        said = proc.stdout + proc.stderr
        assert proc.returncode == 1 and "saved 20" in said and "saved 30" not in said, said
        assert "Traceback" not in said, said[-3000:]
        assert ("dvc-dali: CheckpointCorruptError: rank 1 of 2 could not restore step 20 from "
                f"{tmp_path / 'ck'}/rank-00001/step-000000020-") in said, said[-3000:]
    latest = (tmp_path / "ck" / "LATEST").read_text()
    assert latest.count("step-000000020") == 2, latest


SKIPS = """
import sys
from datetime import timedelta
import os
import numpy as np
import torch.distributed as dist
import dvc_dali
from dvc_dali.training.distributed import KeyValue
dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a hang fails, not waits
rank, skipped = dist.get_rank(), int(sys.argv[2])
ck = dvc_dali.Checkpointer(sys.argv[1], asynchronous=False)
for n, step in enumerate((10, 20), 1):
    if rank == 1 and step == skipped:  # rank 1's loop ends a checkpoint early
        # once rank 0 is at that checkpoint (else it may not be yet when rank 1 exits)
        KeyValue(f"dvc_dali/{os.path.realpath(sys.argv[1])}/").get(f"1.{n}/at/0")
        break
    ck.make_checkpoint(step, arrays={"w": np.arange(3) + rank + step})
print("done", flush=True)
"""


@pytest.mark.parametrize("skipped", [10, 20])
def test_a_rank_that_ends_without_a_synchronous_checkpoint_is_named(tmp_path, skipped):
    """Synchronous checkpoints: rank 1 ends its loop before a checkpoint rank
    0 makes. Rank 0 waited in the store (the first checkpoint) or in a gloo
    collective until the process group's timeout (30 min by default), then
    died with a traceback; it now refuses as soon as rank 1 exits, naming
    rank 1 and the step, and rank 1, which finds rank 0 waiting for it as it
    exits, says the same line."""
    pytest.importorskip("torch")
    script = tmp_path / "skips.py"
    script.write_text(SKIPS)
    ranks = run_ranks([sys.executable, str(script), str(tmp_path / "ck"), str(skipped)],
                      tmp_path)
    line = (f"{tmp_path / 'ck'}: rank 1 of 2 ended (its Checkpointer closed or its process "
            f"exited) without calling make_checkpoint() for step {skipped}; step {skipped} is "
            "not recorded")
    said = [proc.stdout + proc.stderr for proc in ranks]
    assert ranks[0].returncode == 1 and "done" not in ranks[0].stdout, said[0][-3000:]
    assert f"dvc-dali: CheckpointWriteError: {line}" in said[0], said[0][-3000:]
    assert "Traceback" not in said[0], said[0][-3000:]
    assert f"[rank 1] dvc-dali: {line}" in said[1], said[1][-3000:]
    latest = tmp_path / "ck" / "LATEST"
    assert (latest.read_text().count("step-000000010") == 2 if skipped == 20
            else not latest.exists())
