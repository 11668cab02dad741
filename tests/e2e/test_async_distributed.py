"""Asynchronous checkpoints across ranks: the PyTorch example on 2 processes
(torchrun, gloo) with DVC_DALI_ASYNC=1 under real `dvc exp run`, one rank
killed at seeded instants of a checkpoint (before, during and after its
background write, during and after the recording), then SIGTERM to one rank
while it writes; each time resumed from the last complete checkpoint. The
final model is the uninterrupted run's, bit for bit, and every row holds
both ranks' states at its step. One fault from each phase (the write; between
it and the row; after the row), chosen by DVC_DALI_FUZZ_SEED (default: seeds 39 and 1)."""

from __future__ import annotations

import os
import random
import re
import sys

import pytest

from tests.helpers import HELPERS
from tests.helpers.dvc_project import example_on_two_ranks, model_sha, run
from tests.helpers.ranks import run_ranks
from tests.helpers.rows import exp_rows, row_ranks

pytest.importorskip("torch", reason="install the test extra's torch==2.13.0 (CPU)")

TORCH = ["-S", "train.framework=torch", "-S", "train.lr=0.01"]
ASYNC = {"DVC_DALI_ASYNC": "1"}
# 39 draws rank 1's faults after the write, 1 rank 0's (the rank that records)
SEEDS = ([int(os.environ["DVC_DALI_FUZZ_SEED"])] if os.environ.get("DVC_DALI_FUZZ_SEED")
         else [39, 1])
# (fault, rank) -> for a fault at checkpoint step s (every 10 steps): the
# step LATEST names afterwards, and the step of the last row (the next run
# resumes from it: `dvc exp run` checks out the workspace's recorded outputs)
KILLS = {
    ("kill-before-write", 0): (-10, -10), ("kill-before-write", 1): (-10, -10),
    ("kill-mid-write", 0): (-10, -10), ("kill-mid-write", 1): (-10, -10),
    ("kill-durable", 0): (-10, -10),  # rank 0 records: it died, nobody does
    ("kill-durable", 1): (0, 0),  # rank 1's files were durable: rank 0 records them
    ("kill-mid-record", 0): (0, -10),  # LATEST was published; the row was not
    ("kill-recorded", 0): (0, 0), ("kill-recorded", 1): (0, 0),
}
# one seeded fault from each: during the write, between it and the row, after the row
PHASES = (
    [("kill-before-write", 0), ("kill-before-write", 1), ("kill-mid-write", 0),
     ("kill-mid-write", 1)],
    [("kill-durable", 0), ("kill-durable", 1), ("kill-mid-record", 0)],
    [("kill-recorded", 0), ("kill-recorded", 1)],
)


def two_ranks(path):
    return example_on_two_ranks(path, "async_faults.py",
                                "train on 2 processes, asynchronous checkpoints",
                                files={"async_faults.py": HELPERS / "async_faults.py"})


def exp_run(path, name, check=True, **env):
    return run(["dvc", "exp", "run", "-n", name, *TORCH], path, check=check,
               env={**ASYNC, **env})


def latest_steps(project):
    lines = (project / "checkpoint" / "LATEST").read_text().splitlines()
    return [(line.split("/")[0], int(line.split("/")[1][5:14])) for line in lines]


def failure_message(what, rank, step):
    """What the surviving rank says when the killed one left step unrecorded."""
    if rank == 0 and what != "kill-recorded":
        return f"rank 0 of 2 ended before it recorded step {step}"
    if what in ("kill-before-write", "kill-mid-write"):
        return f"rank {rank} of 2 ended before its files of step {step} were durable"
    return None


def both_ranks_at(step):
    return [("rank-00000", step), ("rank-00001", step)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    ref = two_ranks(tmp_path_factory.mktemp("async") / "ref")
    run(["dvc", "exp", "run", "-n", "ref", *TORCH], ref)  # synchronous checkpoints
    return model_sha(ref)


def test_ranks_given_different_directories_or_modes_are_refused(tmp_path):
    """Rank 1 passes a checkpoint directory of its own, in a run outside
    `dvc exp run` (under it, a directory that is not the stage's output is
    refused by name at the start): asynchronous, rank 0 would wait for its
    files for ever (and rank 1 for the record); synchronous, LATEST would
    name a rank-00001/ that is elsewhere, a checkpoint no resume can load.
    Both are refused at the first checkpoint, every rank saying which
    directories, and no LATEST is written. So are ranks in one directory of
    which one checkpoints synchronously (each would wait for the other for
    ever): the synchronous one refuses at its first save."""
    work = two_ranks(tmp_path / "dirs")
    run(["dvc", "repro", "prepare"], work)  # its run cache: data/digits checked out
    params = work / "params.yaml"
    params.write_text(params.read_text().replace("framework: numpy", "framework: torch"))
    for mode in ("1", "0"):  # no launcher stops a rank when the other fails first
        ranks = run_ranks([sys.executable, "async_faults.py"], work,
                          env={"DVC_DALI_ASYNC": mode, "ASYNC_FAULT": "other-dir:1:0"})
        for refused in ranks:  # every rank says it
            said = refused.stdout + refused.stderr
            assert refused.returncode != 0, said[-3000:]
            found = re.findall(r"the ranks checkpoint into different directories \(rank 0 "
                               r"into (\S+); rank 1 into (\S+)\); step 10 is not recorded", said)
            assert len(set(found)) == 1, (mode, said[-3000:])
            ours, theirs = found[0]
            assert ours.endswith("/dirs/checkpoint"), said[-3000:]
            assert theirs.endswith("/dirs/checkpoint-rank1"), said[-3000:]
            assert "must pass the same checkpoint directory" in said
        assert not list(work.glob("checkpoint*/LATEST"))
    # the same directory, rank 1 synchronous: rank 0 waited for its files for
    # ever, rank 1 for rank 0 in a collective. Rank 1 refuses at its first
    # save; rank 0 says so too, or its training's next collective fails as
    # rank 1 ended (whichever comes first)
    rank0, rank1 = run_ranks([sys.executable, "async_faults.py"], work,
                             env={"DVC_DALI_ASYNC": "1", "ASYNC_FAULT": "sync-mode:1:0"})
    said = rank1.stdout + rank1.stderr
    assert rank0.returncode != 0 and rank1.returncode != 0, said[-3000:]
    assert ("the ranks checkpoint in different modes (rank 0 asynchronously; rank 1 "
            "synchronously); step 10 is not recorded") in said, said[-3000:]
    assert "the same asynchronous=" in said and "/dvc_dali/" not in said, said[-3000:]
    assert not list(work.glob("checkpoint*/LATEST"))


@pytest.mark.parametrize("seed", SEEDS)
def test_kills_at_seeded_instants_resume_bit_identical(reference, tmp_path, seed):
    rng = random.Random(seed)
    faults = [rng.choice(phase) for phase in PHASES]
    work = two_ranks(tmp_path / "work")
    resume_from = None
    for i, ((what, rank), step) in enumerate(zip(faults, (20, 30, 40))):
        killed = exp_run(work, f"k{i}", check=False, ASYNC_FAULT=f"{what}:{rank}:{step}")
        said = killed.stdout + killed.stderr
        assert killed.returncode != 0, said[-3000:]
        assert f"async_faults: rank {rank} {what} at step {step}: SIGKILL" in said, said[-3000:]
        if resume_from is not None:  # both ranks resumed from the last row
            assert said.count(f"resuming from step {resume_from}") == 2, said[-3000:]
        latest, last_row = (step + offset for offset in KILLS[(what, rank)])
        # LATEST names both ranks' snapshots of one step: a complete set
        assert latest_steps(work) == both_ranks_at(latest), (what, rank, said[-3000:])
        assert f"k0-step{last_row}" in exp_rows(work)
        assert f"k0-step{last_row + 10}" not in exp_rows(work)
        resume_from = last_row
        message = failure_message(what, rank, step)
        assert message is None or message in said, (message, said[-3000:])
    # SIGTERM to rank 1 while it writes step 50 in the background: both ranks
    # agree (should_save, one step late: the signal is handed in at step 51's
    # call, or 52's when it comes after it) to checkpoint one step, record
    # it, and exit 143.
    termed = exp_run(work, "t", check=False, ASYNC_FAULT="term-write:1:50")
    said = termed.stdout + termed.stderr
    assert termed.returncode != 0
    assert said.count(f"resuming from step {resume_from}") == 2, said[-3000:]
    preempted = sorted(set(re.findall(r"preempted \(SIGTERM\): step (\d+)", said)))
    assert len(preempted) == 1 and int(preempted[0]) in (52, 53), said[-3000:]
    last = int(preempted[0])
    # rank 0 names the row; rank 1 says the step is kept by it (it said
    # "no checkpoint was recorded by this run")
    assert f"preempted (SIGTERM): step {last} is kept as row t-step{last}" in said \
        or f"preempted (SIGTERM): step {last} is kept as row k0-step{last}" in said, said[-3000:]
    assert (f"preempted (SIGTERM): step {last} is kept (rank 0 recorded its row)"
            in said), said[-3000:]
    assert "no checkpoint was recorded by this run" not in said, said[-3000:]
    assert latest_steps(work) == both_ranks_at(last)
    final = exp_run(work, "r")
    assert final.stdout.count(f"resuming from step {last}") == 2, final.stdout[-3000:]
    assert model_sha(work) == reference
    rows = {name: row for name, row in exp_rows(work).items() if re.search(r"-step\d+$", name)}
    assert "k0-step10" in rows and f"k0-step{last}" in rows and "k0-step60" in rows, sorted(rows)
    for name in rows:  # every row holds both ranks' states, at the row's step
        step = int(name.rsplit("-step", 1)[1])
        assert row_ranks(work, name) == [(f"rank-{r:05d}", f"{step:09d}") for r in (0, 1)], name


def test_temp_and_queued_runs_record_both_ranks_at_every_row(reference, tmp_path):
    """The same asynchronous commit from DVC's temporary directories: under
    `--temp`, and queued then run by a queue worker, every row holds both
    ranks' states at its step, and the run ends with the uninterrupted
    synchronous run's model."""
    work = two_ranks(tmp_path / "work")
    temp = run(["dvc", "exp", "run", "--temp", "-n", "t", *TORCH], work, env=ASYNC)
    run(["dvc", "exp", "run", "--queue", "-n", "q", *TORCH], work, env=ASYNC)
    run(["dvc", "exp", "run", "--run-all", "-j", "1"], work, env=ASYNC)
    queued = run(["dvc", "queue", "logs", "q"], work)
    for said in (temp.stdout + temp.stderr, queued.stdout + queued.stderr):
        # written in the background: 6 checkpoints by each of the 2 ranks
        assert said.count(" (in the background)") == 12, said[-3000:]
        assert said.count("dvc-dali: rank 0/2 committed step 60") == 1, said[-3000:]
    rows = exp_rows(work)
    for name in ("t", "q"):
        for step in range(10, 70, 10):
            assert row_ranks(work, f"{name}-step{step}") == [
                (f"rank-{r:05d}", f"{step:09d}") for r in (0, 1)], (name, step, sorted(rows))
        assert f"{name}-step70" not in rows
        run(["dvc", "exp", "apply", f"{name}-step60"], work)
        assert model_sha(work) == reference, name
