"""One consistent checkpoint across ranks: torchrun (gloo, CPU) under real
`dvc exp run`; kills of one rank or all; each rank resumes its own stream."""

from __future__ import annotations

import hashlib
import re
import shutil
import sys

import numpy as np
import pytest

from tests.helpers import HELPERS
from tests.helpers.dvc_project import make_project, run
from tests.helpers.rows import row_refs, row_ranks

pytest.importorskip("torch", reason="install the test extra's torch==2.13.0 (CPU)")

UNTIL, EVERY = 12, 3


def project(path, data_dir, nproc):
    return make_project(path, files={
        "dist_runner.py": HELPERS / "dist_runner.py",  # imports tests.helpers (PYTHONPATH)
        ".gitignore": "out-*\n",
        "dvc.yaml": "stages:\n  train:\n"
        f"    cmd: {sys.executable} -m torch.distributed.run --standalone --nproc_per_node "
        f"{nproc} dist_runner.py {data_dir} $RUN_ID {UNTIL} {EVERY}\n"
        "    outs:\n      - checkpoint:\n          persist: true\n    always_changed: true\n"})


def exp_run(path, run_id, check=True, **env):
    # $RUN_ID in the cmd is expanded by the shell DVC runs it in.
    return run(["dvc", "exp", "run", "-n", run_id], path, check=check,
               env={"RUN_ID": f"out-{run_id}", **env})


def batches(path, run_id, rank):
    with np.load(path / f"out-{run_id}-rank{rank}.npz") as npz:
        return {k: npz[k] for k in npz.files}


@pytest.mark.parametrize("nproc,kill", [(2, "1"), (4, "all")], ids=["2-ranks-kill-one",
                                                                    "4-ranks-kill-all"])
def test_ranks_resume_their_own_stream(tmp_path, data_dir, nproc, kill):
    ref = project(tmp_path / "ref", data_dir, nproc)
    exp_run(ref, "ref")
    work = project(tmp_path / "work", data_dir, nproc)
    killed = exp_run(work, "k", check=False, KILL_RANK=kill, KILL_AT="6")
    assert killed.returncode != 0
    resumed = exp_run(work, "r")
    assert resumed.stderr.count("read step 6") == nproc
    for rank in range(nproc):
        want, got = batches(ref, "ref", rank), batches(work, "r", rank)
        assert sorted(got) == sorted(k for k in want if k == "final_w" or int(k[:4]) > 6)
        for key in got:
            assert np.array_equal(want[key], got[key]), f"rank {rank}: {key} differs"
    # Every recorded row holds every rank's state, all at the row's step.
    for step in (3, 6, 9, 12):
        name = f"k-step{step}"  # the resumed run keeps its name
        assert row_ranks(work, name) == [(f"rank-{r:05d}", f"{step:09d}")
                                         for r in range(nproc)], name


def test_a_preempted_rank_says_its_step_is_kept_by_rank_0(tmp_path, data_dir):
    """SIGTERM to rank 1 right after step 6's checkpoint, the loop asking
    should_save: the ranks checkpoint one more step and exit. Rank 1's line
    says that step is kept (rank 0 recorded the row and names it), not that
    the run recorded nothing, which was what it said; the rerun resumes it."""
    work = project(tmp_path / "work", data_dir, 2)
    termed = exp_run(work, "k", check=False, KILL_RANK="1", KILL_AT="6", KILL_SIG="SIGTERM")
    said = termed.stdout + termed.stderr
    assert termed.returncode != 0
    kept = re.findall(r"preempted \(SIGTERM\): step (\d+) is kept as row k-step(\d+)", said)
    assert len(kept) == 1 and kept[0][0] == kept[0][1], said[-3000:]  # rank 0's line
    step = int(kept[0][0])
    assert (f"dvc-dali: preempted (SIGTERM): step {step} is kept (rank 0 recorded its row); "
            "`dvc exp run` resumes from it") in said, said[-3000:]
    assert "no checkpoint was recorded by this run" not in said, said[-3000:]
    assert row_ranks(work, f"k-step{step}") == [(f"rank-{r:05d}", f"{step:09d}") for r in (0, 1)]
    resumed = exp_run(work, "r")
    assert resumed.stderr.count(f"read step {step}") == 2, resumed.stderr[-3000:]


def test_other_world_size_and_swapped_ranks_are_refused(tmp_path, data_dir):
    work = project(tmp_path / "w", data_dir, 2)
    exp_run(work, "k", check=False, KILL_RANK="all", KILL_AT="6")
    dvc_yaml = work / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("--nproc_per_node 2", "--nproc_per_node 4"))
    refused = exp_run(work, "w4", check=False)
    assert refused.returncode != 0
    assert "saved by 2 process(es), this run has 4" in refused.stderr
    assert "--nproc_per_node 2" in refused.stderr
    dvc_yaml.write_text(dvc_yaml.read_text().replace("--nproc_per_node 4", "--nproc_per_node 2"))
    # Another rank's state file: outside DVC (which would check the recorded
    # version out again), rank 0 is handed rank 1's state and vice versa.
    plain = tmp_path / "plain"
    shutil.copytree(work / "checkpoint", plain / "checkpoint")
    latest = plain / "checkpoint" / "LATEST"
    latest.write_text("\n".join(reversed(latest.read_text().splitlines())) + "\n")
    swapped = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", "2", str(HELPERS / "dist_runner.py"), str(data_dir),
                   str(plain / "out"), str(UNTIL), str(EVERY)], plain, check=False)
    assert swapped.returncode != 0
    assert "holds the state of rank 1 of 2, but rank 0 of 2 is reading it" in swapped.stderr


def test_a_rank_that_cannot_restore_stops_every_rank_before_training(tmp_path, data_dir):
    """Found by a sweep: rank 1's snapshot corrupt on resume, rank 1 refused
    with one line but rank 0 restored and trained on, then died in its next
    collective with a gloo traceback (two stories). The ranks now agree on
    the restore before either trains: both refuse with one line naming rank
    1 and its reason, in both modes, and nothing is trained or recorded."""
    work = project(tmp_path / "w", data_dir, 2)
    exp_run(work, "k", check=False, KILL_RANK="all", KILL_AT="6")
    rows = sorted(row_refs(work))
    entry = (work / "checkpoint" / "LATEST").read_text().splitlines()[1].split()[0]
    assert entry.startswith("rank-00001/step-000000006"), entry
    damaged = work / "checkpoint" / entry / "pipelines" / "00000.dali"  # the reader's state
    data = bytearray(damaged.read_bytes())
    md5 = hashlib.md5(data).hexdigest()
    data[len(data) // 2] ^= 0xFF  # a flipped byte: its size unchanged
    # in DVC's cache too: `dvc exp run` checks the recorded checkpoint out first
    for copy in (damaged, work / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]):
        copy.chmod(0o644)
        copy.write_bytes(bytes(data))
    for mode in ("0", "1"):  # synchronous, asynchronous checkpoints
        refused = exp_run(work, f"r{mode}", check=False, DVC_DALI_ASYNC=mode)
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0, said[-3000:]
        # no rank's traceback: only torchrun's own report that its ranks failed
        assert said.count("Traceback") == said.count("raise ChildFailedError(") == 1, (
            mode, said[-5000:])
        assert "dist_runner.py\", line" not in said, (mode, said[-5000:])
        lines = re.findall(r"dvc-dali: CheckpointCorruptError: .*", said)
        assert len(lines) == 2, (mode, said[-5000:])  # one line a rank
        for line in lines:
            assert (f"rank 1 of 2 could not restore step 6 from checkpoint/{entry}: "
                    f"checkpoint/{entry}/pipelines/00000.dali") in line, (mode, line)
        assert "read step 6" in said and "saved step 9" not in said, (mode, said[-5000:])
        assert sorted(row_refs(work)) == rows
        assert not list(work.glob("out-r*"))  # no rank finished its loop
