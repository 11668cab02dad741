"""Kill fuzz and signals on the example under real `dvc exp run`.

1. SIGKILL at random (seeded) instants: the trainer, `dvc exp run`, or the
   whole process group (machine death), rerun, repeat; see fuzz_kill.py for
   what each kind does and what a user faces after it. At least 30 kills by
   default; DVC_DALI_FUZZ_KILLS=300 (and DVC_DALI_FUZZ_SEED=N) for long runs.
   After the last run completes: the model is the uninterrupted run's, byte
   for byte; every experiment row points only at data in the cache; every
   checkpoint row holds a complete checkpoint at its step, the model of that
   step and the run's params; `dvc exp apply` of sampled rows (5 + the last)
   restores a checkpoint that loads at that step; nothing of ours is left.
2. SIGINT (Ctrl-C) and SIGTERM right inside a checkpoint's snapshot write or
   its recording, to the trainer, to `dvc exp run`, or to the whole group as
   a terminal does: the run ends (or, for DVC that ignores SIGINT while the
   stage runs, completes); the checkpoint directory loads; a rerun completes
   with the bit-identical model and leaves no `.tmp-*`.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from tests.helpers.dvc_project import make_project, run
from tests.helpers.fuzz_harness import (ExpRun, load_checkpoint, model_digest, reset,
                                        stale_files, wait_for_phase)
from tests.helpers.fuzz_kill import (EVERY, PARAMS, STEPS, check_rows, fuzz, md5_of,
                                     reference_run, workspace_resume_step)

KILLS = int(os.environ.get("DVC_DALI_FUZZ_KILLS", "30"))
SEED = int(os.environ.get("DVC_DALI_FUZZ_SEED", "20240611"))
RUN_PARAMS = {"steps": STEPS, "checkpoint_every": EVERY}


def test_kill_fuzz_resumes_bit_identical(tmp_path, record_property):
    project = make_project(tmp_path / "project", example=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    t0 = time.monotonic()
    ref = reference_run(project, logs)
    stats = fuzz(project, ref, KILLS, SEED, logs)
    fuzz_s = time.monotonic() - t0
    summary = {**stats.summary(), "seed": SEED, "fuzz_seconds": round(fuzz_s, 1)}
    for key, value in summary.items():
        record_property(key, value)
    print("kill fuzz:", summary)
    assert not stats.problems, "\n\n".join(stats.problems)
    assert stats.total_kills >= KILLS
    assert model_digest(project) == ref.model

    # Nothing of ours left behind by the killed runs after a successful one.
    assert stale_files(project) == []

    t = time.monotonic()
    rows = check_rows(project, ref, RUN_PARAMS)
    record_property("rows", len(rows))
    print(f"kill fuzz: {len(rows)} checkpoint rows checked in {time.monotonic() - t:.1f} s")
    assert len(rows) >= STEPS // EVERY  # at least the reference run's

    # `dvc exp apply` of sampled rows and of the last one recorded: each
    # restores a checkpoint that loads at its step, and the model of that step.
    rng = random.Random(SEED)
    last = max(rows, key=lambda r: (r["time"], r["step"]))
    unfinished = [r for r in rows if r["step"] < STEPS]
    resume_from = rng.choice(unfinished)
    sample = rng.sample(rows, min(5, len(rows))) + [last, resume_from]
    t = time.monotonic()
    for row in sample:
        run(["dvc", "exp", "apply", row["name"]], project)
        assert load_checkpoint(project / "checkpoint") == row["step"], row["name"]
        assert md5_of(project / "model" / "model.npz") == ref.model_md5_at[row["step"]]
    record_property("applied", len(sample))
    print(f"kill fuzz: {len(sample)} rows applied in {time.monotonic() - t:.1f} s")
    # ... and `dvc exp run` after applying a row resumes there, to the same model.
    # (on purpose: the row's run went on from it, so unchanged it is refused)
    out = run(["dvc", "exp", "run", "-n", "after-apply", *PARAMS], project,
              env={"DVC_DALI_RETRAIN": "1"})
    assert f"resuming from step {resume_from['step']}" in out.stdout
    assert model_digest(project) == ref.model
    assert stale_files(project) == []


# ---------------------------------------------------------------------------
# SIGINT / SIGTERM right around a checkpoint
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def signal_project(tmp_path_factory):
    path = tmp_path_factory.mktemp("signals")
    project = make_project(path / "project", example=True, prepared=True)
    (path / "logs").mkdir()
    return project, path / "logs", reference_run(project, path / "logs")


def _wait_for(project: Path, exp: ExpRun, where: str, nth: int) -> bool:
    """Until the nth checkpoint's snapshot write or recording of this run is under way."""
    return wait_for_phase(project, lambda: exp.poll() is None, where, nth, 120)


CASES = [(sig, target, where)
         for sig in ("SIGINT", "SIGTERM")
         for target in ("train", "group")
         for where in ("save", "record")] + [
    ("SIGINT", "dvc", "record"), ("SIGTERM", "dvc", "record")]


@pytest.mark.parametrize("signame,target,where", CASES,
                         ids=[f"{s}-{t}-{w}" for s, t, w in CASES])
def test_signal_around_checkpoint(signal_project, signame, target, where, record_property):
    project, logs, ref = signal_project
    sig = getattr(signal, signame)
    name = f"{signame}-{target}-{where}".lower()
    nth = 3 + len(name) % 5  # a checkpoint a few in, different per case
    reset(project)  # the previous case finished its run: train from step 0
    exp = ExpRun(project, ["-n", name, *PARAMS], logs / f"{name}.log")
    try:
        caught = _wait_for(project, exp, where, nth)
        assert caught, f"the run ended before checkpoint {nth}:\n{exp.output()[-3000:]}"
        if target == "train":
            trainer = exp.train()
            assert trainer is not None
            os.kill(trainer.pid, sig)
        elif target == "dvc":
            os.kill(exp.pgid, sig)
        else:  # Ctrl-C in a terminal: the whole foreground process group
            exp.kill_group(sig)
        rc = exp.wait(120)
        # SIGTERM of `dvc exp run` orphans the trainer (DVC has no handler and
        # does not forward it): as a user would, wait for it to end.
        assert exp.wait_leftovers(120), exp.leftovers()
        out = exp.output()
    finally:
        exp.close()
    record_property("rc", rc)
    if signame == "SIGINT" and target == "dvc":
        # DVC ignores SIGINT while a stage runs (the terminal delivers it to
        # the stage's process group): the run goes on and completes.
        assert rc == 0, out[-3000:]
    else:
        assert rc != 0, out[-3000:]
    # The checkpoint in flight is finished or abandoned whole: the directory
    # loads (every digest checked) at a step of this run.
    step = load_checkpoint(project / "checkpoint")
    assert step % EVERY == 0 and step >= (nth - 1) * EVERY, step
    leftover = stale_files(project)
    record_property("left_after_signal", " ".join(os.path.basename(f) for f in leftover))

    finished = workspace_resume_step(project) == STEPS
    rerun = ExpRun(project, ["-n", f"{name}-again", *PARAMS], logs / f"{name}-again.log")
    try:
        rc = rerun.wait(300)
        out = rerun.output()
    finally:
        rerun.close()
    check_rerun(project, finished, rc, out)
    assert model_digest(project) == ref.model
    assert stale_files(project) == []


def check_rerun(project: Path, finished: bool, rc: int, out: str) -> None:
    """A rerun resumes and ends well; one of a run that already got to its end
    (DVC ignores SIGINT while a stage runs; an orphaned trainer finishes) is
    refused, nothing being left to train, and `dvc checkout` brings back the
    model DVC deleted before it."""
    if finished:
        assert rc != 0 and "and nothing changed" in out, out[-3000:]
        run(["dvc", "checkout"], project)
    else:
        assert rc == 0, out[-3000:]


def test_signal_rows_point_at_cached_complete_checkpoints(signal_project):
    """After all the signal cases: every row of the project passes the checks."""
    project, _, ref = signal_project
    rows = check_rows(project, ref, RUN_PARAMS)
    assert len(rows) >= STEPS // EVERY


# ---------------------------------------------------------------------------
# A rerun while the orphaned trainer of a killed `dvc exp run` still runs
# ---------------------------------------------------------------------------


def test_rerun_while_orphaned_trainer_still_runs(tmp_path, record_property):
    """`kill -9` of `dvc exp run` leaves its trainer running (DVC does not
    forward the kill); a user who does not notice it runs `dvc exp run` again.

    A real job spends nearly all its time training between checkpoints, so
    the orphan is stopped (SIGSTOP) right after a recording, the rerun is
    started, and the orphan is continued (SIGCONT) once the rerun's trainer
    resumed. Expected: the rerun refuses, naming the process still writing
    the checkpoint, or completes; whatever both recorded points at cached,
    complete data of the right step; a last rerun gives the identical model.
    """
    project = make_project(tmp_path / "project", example=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    ref = reference_run(project, logs)
    signal_file = project / ".dvc" / "tmp" / "DVC_CHECKPOINT"
    from dvc_dali.reading.exp_refs import list_rows
    from tests.helpers.fuzz_kill import check_row

    problems: list[str] = []
    for trial in range(2):
        reset(project)  # the reference or the last trial finished: train from step 0
        a = ExpRun(project, ["-n", f"a{trial}", *PARAMS], logs / f"a{trial}.log")
        b = None
        try:
            assert _wait_for(project, a, "record", 3 + trial), a.output()[-3000:]
            while signal_file.exists():
                time.sleep(0.0002)
            trainer = a.train()
            os.kill(trainer.pid, signal.SIGSTOP)
            os.kill(a.pgid, signal.SIGKILL)
            a.wait(60)
            b = ExpRun(project, ["-n", f"b{trial}", *PARAMS], logs / f"b{trial}.log")
            try:
                while "resuming from step" not in b.output() and b.poll() is None:
                    time.sleep(0.005)
            finally:
                os.kill(trainer.pid, signal.SIGCONT)
            rc = b.wait(300)
            assert a.wait_leftovers(300)
            out = b.output()
        finally:
            a.kill_group(signal.SIGCONT)
            a.kill_group()
            a.close()
            if b is not None:
                b.close()
        if rc != 0 and str(trainer.pid) not in out:
            problems.append(f"trial {trial}: the rerun failed without naming the trainer "
                            f"(pid {trainer.pid}) still writing the checkpoint:\n"
                            + "\n".join(out.strip().splitlines()[-3:]))
        for row in list_rows(str(project)):
            if row["exp"] in (f"a{trial}", f"b{trial}"):
                try:
                    check_row(project, ref, row, RUN_PARAMS)
                except AssertionError as exc:
                    problems.append(f"trial {trial}: {exc}")
        try:
            load_checkpoint(project / "checkpoint")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"trial {trial}: checkpoint/ does not load: {exc}")
        finished = workspace_resume_step(project) == STEPS
        last = run(["dvc", "exp", "run", "-n", f"c{trial}", *PARAMS], project, check=False)
        if finished and "and nothing changed" in last.stdout + last.stderr:
            run(["dvc", "checkout"], project)  # refused: nothing left to train
            last = run(["true"], project)
        if last.returncode != 0 or model_digest(project) != ref.model:
            problems.append(f"trial {trial}: the last rerun exited {last.returncode} with "
                            f"{'another' if model_digest(project) != ref.model else 'the'} model"
                            f":\n{last.stderr[-1500:]}")
        if problems:
            break
    record_property("orphan_problems", len(problems))
    assert not problems, "\n".join(problems)
