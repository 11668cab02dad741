"""Runs interrupted by what a user or a supervisor sends besides one Ctrl-C
or one SIGTERM: a second signal while the run stops, `dvc queue kill` (with
and without --force), a SIGTERM to a `--temp` run's process group. Real `dvc
exp run`, real DALI: the `dvc-dali init` template, each interruption timed by
a file the trainer writes (no sleeps)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time

from pathlib import Path

import pytest

from tests.helpers import child_env
from tests.helpers.dvc_project import (queue_report, run, template_project,
                                       wait_queue)
from tests.helpers.fuzz_harness import ExpRun
from tests.helpers.preempt import ctrl_c_then, preemptible_project, weights
from tests.helpers.rows import exp_rows

EVERY_5 = ("-S", "train.checkpoint_every=5")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    project = template_project(tmp_path_factory.mktemp("ref"))
    run(["dvc", "exp", "run", "-n", "ref", "-S", "train.checkpoint_every=1000"], project)
    return weights(project)


def queued_trainer_at_13(project: Path, name: str, *args: str) -> int:
    """Queue ``name`` (``args``: more of `dvc exp run`'s), start a worker,
    and return its trainer's pid once it waits at step 13 (in the queued
    run's own directory)."""
    run(["dvc", "exp", "run", "--queue", "-n", name, *EVERY_5, *args], project)
    ExpRun(project, [], project.parent / "queue.log", cmd=("dvc", "queue", "start"),
           env={"PREEMPT_AT": "13"}).proc.wait()
    ready = lambda _status: list(project.glob(".dvc/tmp/exps/*/preempt-ready"))  # noqa: E731
    wait_queue(project, ready, "trainer at step 13", lambda st: queue_report(project, st))
    return int(ready(None)[0].read_text())


def row_names(project: Path) -> set[str]:
    """The recorded rows (DVC's queued or failed experiment left out)."""
    return {name for name in exp_rows(project) if "-step" in name}


def wait_gone(pid: int) -> None:
    """Until ``pid`` (no child of ours: a queue worker's) has ended."""
    while os.path.exists(f"/proc/{pid}") and \
            open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.05)


def test_a_sigterm_while_a_ctrl_c_stops_the_run_is_ignored_and_said(tmp_path):
    """Ctrl-C, then SIGTERM while the run stops (in an exit hook of the
    program's own), in a loop that does not ask should_save: the SIGTERM
    raised SystemExit wherever the exit was, printing a traceback, a second
    'terminated (SIGTERM)' line, and cutting that exit hook short. It is
    ignored now, said once; the row kept resumes."""
    project = preemptible_project(tmp_path, at_exit=True)
    train = project / "train.py"
    train.write_text(train.read_text().replace(
        'ck.should_save(step, p["checkpoint_every"])', 'step % p["checkpoint_every"] == 0'))
    run(["git", "commit", "-qam", "no should_save"], project)
    code, out = ctrl_c_then(project, lambda _dvc, trainer: os.kill(trainer, signal.SIGTERM))
    assert code != 0, out
    assert "Traceback" not in out and "terminated (SIGTERM)" not in out, out
    assert "dvc-dali: interrupted (Ctrl-C): step 10 is kept as row a-step10" in out, out
    assert out.count("dvc-dali: SIGTERM: ignored, the run is stopping") == 1, out
    assert {r["step"] for r in exp_rows(project).values()} == {5, 10}
    again = run(["dvc", "exp", "run", "-S", "train.checkpoint_every=5"], project)
    assert "resuming at step 10" in again.stdout, again.stdout


def test_queue_kill_keeps_its_rows_and_the_applied_row_resumes_exactly(tmp_path, uninterrupted):
    """`dvc queue kill` (DVC's Ctrl-C) mid-training: its log names the row
    kept and the apply it needs; `dvc exp apply` of it then `dvc exp run`
    ends bit-identical to an uninterrupted run."""
    project = preemptible_project(tmp_path)
    trainer = queued_trainer_at_13(project, "q")
    run(["dvc", "queue", "kill", "q"], project)
    wait_gone(trainer)
    log = run(["dvc", "queue", "logs", "q"], project).stdout
    assert "dvc-dali: interrupted (Ctrl-C): step 10 is kept as row q-step10; `dvc exp apply " \
           "q-step10` then `dvc exp run` resumes from it" in log and "Traceback" not in log, log
    assert row_names(project) == {"q-step5", "q-step10"}
    run(["dvc", "exp", "apply", "q-step10"], project)
    again = run(["dvc", "exp", "run", *EVERY_5], project)
    assert "resuming at step 10" in again.stdout, again.stdout
    assert weights(project) == uninterrupted


def test_queue_kill_force_leaves_a_trainer_that_stops_at_its_next_step_saying_why(tmp_path):
    """`dvc queue kill --force` ends DVC's process, not the training, and
    deletes the queued run's directory under it: the trainer's next DVCLive
    write failed with a FileNotFoundError traceback and a line that it
    'cannot put the params back' with 'no DVC repo', asking to run it under
    `dvc exp run`. Then one line named DVC's end, but only at that write:
    the trainer went on to it (hours with rare checkpoints). It stops at its
    next should_save now (step 13, no row due), saying why and what to resume."""
    project = preemptible_project(tmp_path)
    trainer = queued_trainer_at_13(project, "f")
    run(["dvc", "queue", "kill", "--force", "f"], project)
    while os.path.exists(f"/proc/{trainer}/cwd/train.py"):  # DVC removes its directory
        time.sleep(0.05)
    (project / "preempt-go").touch()  # the orphan trains on
    wait_gone(trainer)
    log = run(["dvc", "queue", "logs", "f"], project).stdout
    assert "Traceback" not in log and "cannot put the params" not in log, log
    assert re.search(r"`dvc exp run` \(pid \d+\) ended and the directory this run trains in "
                     r"was deleted while the training went on \(`dvc queue kill --force` does "
                     r"both\), so it stops at step 13: step 10 is kept as row f-step10; `dvc "
                     r"exp apply f-step10` then `dvc exp run` resumes from it", log), log
    assert row_names(project) == {"f-step5", "f-step10"}
    run(["dvc", "exp", "apply", "f-step10"], project)
    again = run(["dvc", "exp", "run", *EVERY_5], project)
    assert "resuming at step 10" in again.stdout, again.stdout


def test_a_temp_run_terminated_keeps_its_rows_and_the_applied_row_resumes_exactly(
        tmp_path, uninterrupted):
    """SIGTERM to a `--temp` run's process group (SLURM, Kubernetes): DVC
    ends at once, the trainer records the signal's step into the workspace's
    rows and names the apply it needs; applied, a `--temp` rerun resumes it
    and ends bit-identical to an uninterrupted run."""
    project = preemptible_project(tmp_path)
    proc = subprocess.Popen(
        ["dvc", "exp", "run", "--temp", "-n", "t", *EVERY_5], cwd=project, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        env=child_env({"PREEMPT_AT": "13"}, this_python=True))
    while not list(project.glob(".dvc/tmp/exps/standalone/*/preempt-ready")):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    out = proc.communicate()[0]  # the pipe closes when the trainer has ended too
    assert "dvc-dali: preempted (SIGTERM): step 13 is kept as row t-step13; `dvc exp apply " \
           "t-step13` then `dvc exp run` resumes from it" in out and "Traceback" not in out, out
    assert row_names(project) == {"t-step5", "t-step10", "t-step13"}
    run(["dvc", "exp", "apply", "t-step13"], project)
    again = run(["dvc", "exp", "run", "--temp", *EVERY_5], project)
    assert "resuming at step 13" in again.stdout, again.stdout
    run(["dvc", "exp", "apply", "t-step20"], project)
    assert weights(project) == uninterrupted


# The orphan cases' trainer, set by params (the queue's worker outlives a
# test, its environment with it): train.plain, a loop that never asks
# should_save; train.asynchronous; train.hold, the step whose background save
# waits for preempt-go (so that it is in flight when the run's directory goes).
ORPHAN_SWITCHES = '''
if yaml.safe_load(open("params.yaml"))["train"]["hold"]:
    import time
    from dvc_dali.format import store

    def _held(root, capture, *args, _write=store.write_capture, **kwargs):
        if capture.step == yaml.safe_load(open("params.yaml"))["train"]["hold"]:
            while not os.path.exists(os.path.join(os.environ["DVC_ROOT"], "preempt-go")):
                time.sleep(0.01)
        return _write(root, capture, *args, **kwargs)
    store.write_capture = _held
'''


@pytest.fixture(scope="module")
def orphans(tmp_path_factory) -> Path:
    """One project for the `dvc queue kill --force` orphans below (each
    queued under a name of its own; the workspace is left as it is)."""
    project = preemptible_project(tmp_path_factory.mktemp("orphans"))
    train = project / "train.py"
    text = train.read_text().replace("import dvc_dali\n", "import dvc_dali\n" + ORPHAN_SWITCHES)
    text = text.replace('ck.should_save(step, p["checkpoint_every"])',
                        '(step % p["checkpoint_every"] == 0 if p.get("plain") else '
                        'ck.should_save(step, p["checkpoint_every"]))')
    text = text.replace("total_steps=p[\"steps\"])",
                        "total_steps=p[\"steps\"],\n"
                        "                          asynchronous=p.get(\"asynchronous\", False))")
    train.write_text(text)
    params = project / "params.yaml"
    params.write_text(params.read_text() + "  plain: false\n  asynchronous: false\n  hold: 0\n")
    run(["git", "commit", "-qam", "orphan switches"], project)
    return project


def orphaned(project: Path, name: str, *params: str) -> str:
    """`dvc queue kill --force` of queued run ``name`` at step 13, its
    trainer then let go on: its log once the trainer has ended."""
    trainer = queued_trainer_at_13(project, name, *params)
    run(["dvc", "queue", "kill", "--force", name], project)
    while os.path.exists(f"/proc/{trainer}/cwd/train.py"):  # DVC removes its directory
        time.sleep(0.05)
    (project / "preempt-go").touch()  # the orphan trains on
    wait_gone(trainer)
    (project / "preempt-go").unlink()
    log = run(["dvc", "queue", "logs", name], project).stdout
    run(["dvc", "queue", "remove", name], project)  # its failure would fail the next wait_queue
    return log


@pytest.mark.parametrize("name,params,kept,also", [
    # no should_save: its next DVCLive write (step 15) is where it stops; it
    # said "Free disk space or fix that directory's permissions"
    pytest.param("plain", ["train.plain=true"], 10, "", id="plain"),
    pytest.param("plainasync", ["train.plain=true", "train.asynchronous=true"], 10, "",
                 id="plain-async"),
    # the step-10 checkpoint in flight when the directory goes, lost with it:
    # said again at exit as "never waited for", status 1
    pytest.param("held", ["train.asynchronous=true", "train.hold=10"], 5,
                 "; the checkpoint of step 10, in flight then, was lost with the directory: no "
                 "row holds it", id="in-flight"),
    # ...raised by the loop's wait(): "A part of checkpoint was removed ... Save again"
    pytest.param("plainheld", ["train.plain=true", "train.asynchronous=true", "train.hold=10"],
                 5, "", id="in-flight-waited"),
])
def test_an_orphan_stopped_by_its_deleted_directory_says_so_in_one_line(orphans, name, params,
                                                                       kept, also):
    """`dvc queue kill --force`, the orphan's loop going on to a DVCLive write
    or a `wait()` before any should_save, or with an asynchronous checkpoint
    in flight: one line, naming the row kept, the apply that resumes it and
    what became of the checkpoint in flight; every row recorded is kept."""
    log = orphaned(orphans, name, *(f"-S{p}" for p in params))
    said = [line for line in log.splitlines() if line.startswith("dvc-dali: ")
            and not line.startswith(("dvc-dali: recorded ", "dvc-dali: waited "))]
    assert len(said) == 1 and "Traceback" not in log, log
    assert re.search(r"`dvc exp run` \(pid \d+\) ended and the directory this run trains in "
                     r"was deleted while the training went on \(`dvc queue kill --force` does "
                     rf"both\), so it stops.*: step {kept} is kept as row {name}-step{kept}; "
                     rf"`dvc exp apply {name}-step{kept}` then `dvc exp run` resumes from "
                     rf"it{re.escape(also)}$", said[0]), log
    assert {r for r in row_names(orphans) if r.startswith(f"{name}-")} == {
        f"{name}-step{s}" for s in range(5, kept + 1, 5)}
