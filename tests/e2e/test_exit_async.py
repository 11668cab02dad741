"""How an asynchronous run (DVC_DALI_ASYNC=1) stopped by Ctrl-C, SIGTERM or
a preemption ends when the checkpoint in flight then fails (a full disk:
EFBIG through tests/helpers/fs_faults.py), and a preempted synchronous one
whose own checkpoint fails, or an orphan whose refusal nothing waited for:
one line, naming the row kept and that checkpoint's failure, every recorded
row kept. Real `dvc exp run --temp` (each run starts from the same
workspace), real DALI."""

from __future__ import annotations

import os
import re
import signal
import sys
import time

import pytest

from tests.helpers import HELPERS
from tests.helpers.dvc_project import commit_all, run, template_project
from tests.helpers.preempt import WAIT_FOR_SIGNAL, start
from tests.helpers.rows import exp_rows

# At step 13 the trainer interrupts itself as Ctrl-C or a SIGTERM would
# (SIGINT's default handler first: a suite started in the background would
# otherwise have it ignored); the step-10 checkpoint is in flight or failed
# by then, and nothing has waited for it.
INTERRUPT = '''
    if step == 13 and "INTERRUPT" in os.environ:
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), getattr(signal, os.environ["INTERRUPT"]))
'''

# A program that ends right after a checkpoint, before anything waited for it.
END_EARLY = '''        if step == int(os.environ.get("END_AT", "0")):
            sys.exit(0)
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """`dvc-dali init`'s project under fs_faults.py, a checkpoint every 5
    steps, interrupted at step 13 (env INTERRUPT) or waiting there (env
    PREEMPT_AT, preempt.py), the program ended at once after the checkpoint
    of step END_AT; train.plain: a loop that never asks should_save (SIGTERM
    then ends it at once, not after a checkpoint)."""
    project = template_project(tmp_path_factory.mktemp("exit"))
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace(
        "cmd: python train.py", f"cmd: {sys.executable} {HELPERS / 'fs_faults.py'} train.py"))
    train = project / "train.py"
    loop_body = "    x, y = (np.asarray(out.as_tensor()) for out in pipe.run())\n"
    call = 'ck.make_checkpoint(step, arrays={"w": w}, metadata={"lr": p["lr"]})\n'
    train.write_text(train.read_text().replace(
        loop_body, loop_body + INTERRUPT.lstrip("\n") + WAIT_FOR_SIGNAL.lstrip("\n"))
                     .replace(call, call + END_EARLY)
                     .replace('ck.should_save(step, p["checkpoint_every"])',
                              '(step % p["checkpoint_every"] == 0 if p["plain"] else '
                              'ck.should_save(step, p["checkpoint_every"]))'))
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("checkpoint_every: 10", "checkpoint_every: 5")
                      + "  plain: false\n")
    (project / ".gitignore").write_text("preempt-ready*\npreempt-go\n")
    commit_all(project, "interrupted at step 13, under fs_faults")
    return project


@pytest.mark.parametrize("name,interrupt,params,how,status", [
    ("c", "SIGINT", [], "interrupted (Ctrl-C)", -2),
    ("t", "SIGTERM", ["-S", "train.plain=true"], "terminated (SIGTERM)", 143),
])
def test_an_interrupted_run_whose_checkpoint_in_flight_failed_says_both_in_one_line(
        project, name, interrupt, params, how, status):
    """The step-10 row's dvc.lock cannot be written (the disk is full): the
    interruption's line was followed at exit by a second, "the checkpoint
    of step 10 failed in the background and was never waited for ... Call
    wait() or close()", and the run ended with status 1, not the signal's."""
    proc = run(["dvc", "exp", "run", "--temp", "-n", name, *params], project, check=False,
               env={"DVC_DALI_ASYNC": "1", "INTERRUPT": interrupt,
                    "FS_FAULT": "lockfile:2:transient"})
    out = proc.stdout + proc.stderr
    said = [line for line in out.splitlines() if line.startswith("dvc-dali: ")
            and not line.startswith(("dvc-dali: recorded ", "dvc-dali: waited "))]
    assert proc.returncode != 0 and "Traceback" not in out and len(said) == 1, out
    assert said[0].startswith(
        f"dvc-dali: {how}: step 5 is kept as row {name}-step5; `dvc exp apply {name}-step5` "
        "then `dvc exp run` resumes from it; the checkpoint of step 10, in flight then, failed "
        "(RecordError: cannot write "), out
    assert "File too large), so step 10 is not recorded; dvc.lock still names the last " \
           "recorded row. Free disk space there" in said[0], out
    assert said[0].endswith("): no row holds it"), out
    # the signal's, as DVC tells it; a Ctrl-C: Python ends itself by SIGINT,
    # or with 128 + 2 where that kill does not end it at once (seen once in CI)
    assert any(f"train.py, exited with {code}\n" in out
               for code in ((status, 130) if status == -2 else (status,))), out
    assert {r for r in exp_rows(project) if r.startswith(f"{name}-")} == {f"{name}-step5"}


def said_lines(out: str) -> list[str]:
    """dvc-dali's lines but the rows recorded and the waits."""
    return [line for line in out.splitlines() if line.startswith("dvc-dali: ")
            and not line.startswith(("dvc-dali: recorded ", "dvc-dali: waited "))]


@pytest.mark.parametrize("name,asynchronous,fault,failed,kept", [
    # the step-10 checkpoint failed in the background, raised by the loop's
    # wait() at the preempted step: only the RecordError was said, its advice
    # `dvc exp run` again (no apply), with status 1
    ("pa", "1", "lockfile:2:transient", 10, 5),
    # the preempted step's own checkpoint failed (synchronous)
    ("ps", "0", "lockfile:3:transient", 13, 10),
])
def test_a_preempted_run_whose_checkpoint_failed_says_both_in_one_line(
        project, name, asynchronous, fault, failed, kept):
    """SIGTERM at step 13 to a loop that asks should_save, a checkpoint then
    failing (a full disk): one line that says the preemption, the failure
    and the row kept with the apply a `--temp` run needs; status 143."""
    proc = run(["dvc", "exp", "run", "--temp", "-n", name], project, check=False,
               env={"DVC_DALI_ASYNC": asynchronous, "INTERRUPT": "SIGTERM", "FS_FAULT": fault})
    out = proc.stdout + proc.stderr
    said = said_lines(out)
    assert "Traceback" not in out and len(said) == 1, out
    row = f"{name}-step{kept}"
    assert said[0].startswith("dvc-dali: preempted (SIGTERM), but its checkpoint could not "
                              "be made (RecordError: cannot write "), out
    assert f"File too large), so step {failed} is not recorded; dvc.lock still names the last " \
           "recorded row. Free disk space there (or lift the file-size limit, fix its " \
           f"permissions), then `dvc exp apply {row}` then `dvc exp run`: it resumes from " \
           "that row)" in said[0], out
    assert said[0].endswith(f": step {kept} is kept as row {row}; `dvc exp apply {row}` then "
                            "`dvc exp run` resumes from it"), out
    assert "train.py, exited with 143\n" in out, out
    assert {r for r in exp_rows(project) if r.startswith(f"{name}-")} == {
        f"{name}-step{s}" for s in range(5, kept + 1, 5)}


def test_an_orphan_that_ends_before_waiting_for_its_refused_row_says_it_once(project):
    """`dvc exp run` killed at step 13 (its directory kept), the asynchronous
    trainer going on: its step-15 row is recorded, then refused in the
    background as an orphan's; the program ends right after, never waiting.
    That refusal was said at exit as a checkpoint that "failed in the
    background ... It is not saved (nor recorded)", yet its row was."""
    proc = start(project, "--temp", "-n", "o",
                 env={"DVC_DALI_ASYNC": "1", "PREEMPT_AT": "13", "END_AT": "15"})
    while not list(project.glob(".dvc/tmp/exps/standalone/*/preempt-ready")) or not run(
            ["git", "for-each-ref", "refs/exps/**/o-step10"], project).stdout:  # nothing in flight
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # `dvc exp run` alone: the trainer goes on
    proc.wait()
    (project / "preempt-go").touch()
    try:
        out = proc.stdout.read()  # the pipe closes when the trainer has ended too
    finally:
        (project / "preempt-go").unlink()
    said = said_lines(out)
    assert "Traceback" not in out and len(said) == 1, out
    assert re.fullmatch(r"dvc-dali: RecordError: `dvc exp run` \(pid \d+\) ended while this "
                        r"training went on, so it stops: step 15 is kept as row o-step15; `dvc "
                        r"exp apply o-step15` then `dvc exp run` resumes from it", said[0]), out
    assert {r for r in exp_rows(project) if r.startswith("o-")} == {
        "o-step5", "o-step10", "o-step15"}
