"""Experiments checkpointing at the same time into one repository.

(a) two queued experiments run by `dvc queue start -j 2`;
(b) a workspace run beside a `--temp` run;
(c) a workspace run while another DVC command (`dvc push`, `gc`, `status`...)
    holds the DVC repo lock for a while.

Each experiment must get one row per checkpoint, every row holding its own
experiment's params, lineage and data (cached, complete, at its step), and the
model of a row must be the model that experiment's params give at that step:
runs with equal params give equal models step by step, whichever executor
(queue worker, --temp, workspace) ran them, so nothing was mixed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml


from tests.helpers.dvc_project import make_project, queue_report, run, wait_queue
from tests.helpers.fuzz_harness import dvc_env, reset
from tests.helpers.fuzz_harness import (
    ExpRun,
    cached_checkpoint_step,
    check_row_data,
    git,
    is_train,
    model_digest,
    show,
    stale_files,
)
from tests.helpers.fuzz_kill import model_md5_in_row
from tests.helpers.rows import exp_refs
from dvc_dali.reading.exp_refs import list_rows as list_checkpoint_rows

STEPS, EVERY = 40, 2
LONG = 160  # steps of the runs that must overlap
LRS = {"a": 0.1, "b": 0.05}


def params(lr: float, steps: int = STEPS) -> list[str]:
    return ["-S", f"train.steps={steps}", "-S", f"train.checkpoint_every={EVERY}",
            "-S", f"train.lr={lr}"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("concurrency")
    (path / "logs").mkdir()
    return make_project(path / "project", example=True, prepared=True)


def check_experiment(project: Path, exp: str, lr: float, total: int = STEPS) -> dict[int, str]:
    """All rows of ``exp``: one per checkpoint, its own params and lineage,
    data in the cache, checkpoint complete at the row's step. Returns
    {step: model md5}."""
    rows = list_checkpoint_rows(str(project), exp)
    steps = [r["step"] for r in rows]
    assert steps == list(range(EVERY, total + 1, EVERY)), f"{exp}: rows at steps {steps}"
    models = {}
    for row in rows:
        assert row["name"] == f"{exp}-step{row['step']}", row
        assert row["exp"] == exp
        msg = git(project, "log", "-1", "--format=%B", row["sha"])
        assert f"exp={exp} step={row['step']} " in msg, msg
        p = yaml.safe_load(show(project, row["sha"], "params.yaml"))["train"]
        assert p["lr"] == lr and p["steps"] == total, f"{row['name']}: params {p}"
        lock = yaml.safe_load(show(project, row["sha"], "dvc.lock"))
        lock_p = lock["stages"]["train"]["params"]["params.yaml"]["train"]
        assert lock_p["lr"] == lr, f"{row['name']}: dvc.lock params {lock_p}"
        outs = check_row_data(project, row["sha"])
        assert cached_checkpoint_step(project, outs["checkpoint"]) == row["step"]
        models[row["step"]] = model_md5_in_row(project, lock)
    return models


def row_times(project: Path, exp: str) -> tuple[int, int]:
    times = [r["time"] for r in list_checkpoint_rows(str(project), exp)]
    return min(times), max(times)


MODELS: dict[str, dict[int, str]] = {}


def queued_trainers(project: Path) -> list[psutil.Process]:
    """The training processes of queued runs (in DVC's temporary copies)."""
    tmp = str(project / ".dvc" / "tmp" / "exps") + os.sep
    found = []
    for p in psutil.process_iter():
        try:
            if is_train(p) and p.cwd().startswith(tmp):
                found.append(p)
        except psutil.Error:
            continue
    return found


def test_two_queued_experiments_run_in_parallel(project, record_property):
    before = git(project, "status", "--porcelain")
    head = git(project, "rev-parse", "HEAD")
    for key, lr in LRS.items():
        run(["dvc", "exp", "run", "--queue", "-n", f"q{key}", *params(lr)], project)
    t0 = time.monotonic()
    logs = project.parent / "logs"

    def start_workers(jobs: str) -> None:
        # The workers inherit the stdout of `dvc queue start`: a file, never a pipe.
        starter = ExpRun(project, ["-j", jobs], logs / f"queue{jobs}.log",
                         cmd=("dvc", "queue", "start"))
        try:
            assert starter.wait(120) == 0, starter.output()
        finally:
            starter.close()

    paused: list[psutil.Process] = []

    def pause_new_trainer() -> bool:
        new = [p for p in queued_trainers(project) if p not in paused]
        for p in new:
            p.suspend()
        paused.extend(new)
        return bool(new)

    try:
        # One worker, then the second once the first run's training started:
        # DVC sets up two queued runs at once with a race of its own that can
        # fail one before its stage starts (treeverse/dvc#10673). Each
        # training process is paused (SIGSTOP) as soon as it exists and both
        # are let go together, so the two surely record at the same time,
        # which is what this test is about.
        # `dvc queue status` is not asked meanwhile: it takes a second, in
        # which the trainer would get past its imports into dvc-dali's run
        # start, and paused there it could hold a lock the other run needs.
        start_workers("1")
        try:
            wait_queue(project, lambda _: pause_new_trainer(), "training of the first run",
                       lambda st: queue_report(project, st), ask=False)
            start_workers("2")
            wait_queue(project, lambda _: pause_new_trainer(), "training of the second run",
                       lambda st: queue_report(project, st), ask=False)
        finally:
            for p in paused:
                p.resume()
        status = wait_queue(project, lambda st: all(st.get(f"q{k}") in ("Success", "Failed")
                                                    for k in LRS), "end of both runs",
                            lambda st: queue_report(project, st))
    finally:
        run(["dvc", "queue", "stop"], project, check=False)
    record_property("queue_seconds", round(time.monotonic() - t0, 1))
    assert status == {"qa": "Success", "qb": "Success"}, queue_report(project, status)
    for key, lr in LRS.items():
        MODELS[f"q{key}"] = check_experiment(project, f"q{key}", lr)
    # The two ran at the same time (-j 2): their rows interleave in time.
    (a0, a1), (b0, b1) = row_times(project, "qa"), row_times(project, "qb")
    assert a0 <= b1 and b0 <= a1, "the queued experiments did not overlap"
    assert MODELS["qa"] != MODELS["qb"]
    # DVC's own rows of the two experiments point at cached data too.
    for sha, _ in exp_refs(project):
        check_row_data(project, sha)
    # The workspace is not touched by queued runs.
    assert git(project, "status", "--porcelain") == before
    assert git(project, "rev-parse", "HEAD") == head
    assert not (project / "dvc.lock").exists() and not (project / "checkpoint").exists()
    assert stale_files(project) == []


def test_workspace_run_beside_temp_run(project, record_property):
    logs = project.parent / "logs"
    t0 = time.monotonic()
    # The workspace run starts once the --temp run trains: two `dvc exp run`
    # starting together wait for each other's repo lock only 3 s (DVC's own
    # limit), which a loaded machine exceeds. (The other way round, DVC would
    # carry the workspace run's progress into the --temp run: its stash holds
    # the untracked dvc.lock.) Longer runs, so they overlap.
    tmp = ExpRun(project, ["--temp", "-n", "tmp", *params(LRS["b"], LONG)], logs / "tmp.log")
    while not list_checkpoint_rows(str(project), "tmp") and tmp.poll() is None:
        time.sleep(0.05)
    ws = ExpRun(project, ["-n", "ws", *params(LRS["a"], LONG)], logs / "ws.log")
    try:
        rc_ws, rc_tmp = ws.wait(480), tmp.wait(480)
        out_ws, out_tmp = ws.output(), tmp.output()
    finally:
        ws.close()
        tmp.close()
    record_property("workspace_and_temp_seconds", round(time.monotonic() - t0, 1))
    assert rc_ws == 0, out_ws[-3000:]
    assert rc_tmp == 0, out_tmp[-3000:]
    models = {"ws": check_experiment(project, "ws", LRS["a"], LONG),
              "tmp": check_experiment(project, "tmp", LRS["b"], LONG)}
    (a0, a1), (b0, b1) = row_times(project, "ws"), row_times(project, "tmp")
    assert a0 <= b1 and b0 <= a1, "the two runs did not overlap"
    # Same params, same model at every step, whoever ran it.
    for run_models, queued in ((models["ws"], "qa"), (models["tmp"], "qb")):
        same = MODELS.get(queued, {})  # the queued runs stopped at STEPS
        assert {s: run_models[s] for s in same} == same
    assert models["ws"] != models["tmp"]
    for sha, _ in exp_refs(project):
        check_row_data(project, sha)
    # The workspace holds the workspace run's result, not the --temp run's.
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    assert lock["stages"]["train"]["params"]["params.yaml"]["train"]["lr"] == LRS["a"]
    ck_md5 = next(o["md5"] for o in lock["stages"]["train"]["outs"] if o["path"] == "checkpoint")
    assert cached_checkpoint_step(project, ck_md5) == LONG
    assert model_digest(project) is not None
    assert stale_files(project) == []


def test_dvc_command_holding_the_repo_lock_does_not_end_training(project):
    """`dvc push` of a big cache in the workspace while training: it holds
    DVC's repo lock for minutes. Here a process holds that same lock (DVC's
    own Repo.lock, as every @locked command does) for 8 s across several
    checkpoints; the training must wait for it, not die."""
    logs = project.parent / "logs"
    # The holder imports DVC first, then takes the lock the moment it is told:
    # DVC's own lock file and call, tried until it is free (between two
    # recordings), not on DVC's 0.5 s retry schedule, which the recordings
    # of a short run may all overlap.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom dvc.repo import Repo\n"
         "from dvc.lock import LockError\n"
         "repo = Repo(sys.argv[1])\nprint('ready', flush=True)\nsys.stdin.readline()\n"
         "while True:\n    try:\n        repo.lock._do_lock()\n        break\n"
         "    except LockError:\n        time.sleep(0.001)\n"
         "print('held', flush=True)\ntime.sleep(8)\nrepo.lock.unlock()", str(project)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dvc_env())
    exp = None
    try:
        assert holder.stdout.readline().strip() == "ready"
        reset(project)  # the workspace run above finished: train from step 0
        exp = ExpRun(project, ["-n", "locked", *params(LRS["a"])], logs / "locked.log")
        signal_file = project / ".dvc" / "tmp" / "DVC_CHECKPOINT"
        deadline = time.monotonic() + 120
        while not signal_file.exists() and exp.poll() is None:  # training has begun
            assert time.monotonic() < deadline
            time.sleep(0.002)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "held"
        rc = exp.wait(300)
        out = exp.output()
    finally:
        if exp is not None:
            exp.close()
        holder.kill()
        holder.wait()
    assert rc == 0, out[-2000:]
    check_experiment(project, "locked", LRS["a"])
