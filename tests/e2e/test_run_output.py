"""What a person sees when a run under `dvc exp run` is interrupted or
refused: one line to act on, no traceback. Real `dvc exp run`, real DALI."""

from __future__ import annotations

import os

import pytest

from tests.helpers.dvc_project import run, template_project

# After the step-10 checkpoint, the trainer interrupts itself as Ctrl-C or a
# SIGTERM would (SIGINT's default handler first: a suite started in the
# background would otherwise have it ignored).
INTERRUPT = '''
    if step == 15 and os.environ.get("INTERRUPT"):
        import signal
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.kill(os.getpid(), getattr(signal, os.environ["INTERRUPT"]))
'''


def interrupting_project(tmp_path):
    project = template_project(tmp_path)
    train = project / "train.py"
    text = train.read_text()
    loop_body = "    x, y = (np.asarray(out.as_tensor()) for out in pipe.run())\n"
    train.write_text(text.replace(loop_body, loop_body + INTERRUPT.lstrip("\n")))
    run(["git", "commit", "-qam", "interrupting"], project)
    return project


@pytest.mark.parametrize("sig,plain,says,step", [
    ("SIGINT", False, "interrupted (Ctrl-C)", 10),
    # the template's loop asks ck.should_save: SIGTERM checkpoints step 15 first
    ("SIGTERM", False, "preempted (SIGTERM)", 15),
    # a loop that does not: the last recorded step is kept
    ("SIGTERM", True, "terminated (SIGTERM)", 10)])
def test_interrupted_run_says_what_is_kept_without_a_traceback(tmp_path, sig, plain, says, step):
    project = interrupting_project(tmp_path)
    if plain:
        train = project / "train.py"
        train.write_text(train.read_text().replace(
            'ck.should_save(step, p["checkpoint_every"])', 'step % p["checkpoint_every"] == 0'))
        run(["git", "commit", "-qam", "no should_save"], project)
    proc = run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={"INTERRUPT": sig})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"dvc-dali: {says}: step {step} is kept as row a-step{step}; `dvc exp run` " \
           "resumes from it" in out, out
    assert "Traceback" not in out, out
    again = run(["dvc", "exp", "run", "-n", "b"], project)
    assert f"resuming at step {step}" in again.stdout + again.stderr


def test_a_refusal_prints_its_message_not_a_traceback(tmp_path):
    project = interrupting_project(tmp_path)
    run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={"INTERRUPT": "SIGTERM"})
    # batch_size shapes the DALI stream: an unfinished run cannot resume with another
    proc = run(["dvc", "exp", "run", "-n", "b", "-S", "train.batch_size=8"], project,
               check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "dvc-dali: PipelineMismatchError: " in out and "batch_size: 16 -> 8" in out, out
    assert "Traceback" not in out, out
    assert "resuming" not in out  # no "resuming ..." before a refusal that contradicts it
    debug = run(["dvc", "exp", "run", "-n", "c", "-S", "train.batch_size=8"], project,
                check=False, env={"DVC_DALI_DEBUG": "1"})
    assert "Traceback" in debug.stdout + debug.stderr


def test_a_missing_data_directory_is_named(tmp_path):
    """Not DALI's C++ assertion at build(): the operator, argument and path."""
    import dvc_dali
    from tests.helpers import pipelines

    fn, kw = pipelines.make("rotate", str(tmp_path / "nowhere"))["train"]
    ck = dvc_dali.Checkpointer(tmp_path / "c")
    with pytest.raises(dvc_dali.ConfigError,
                       match=r"reader.file_root='.*nowhere/images': no such file"):
        ck.pipeline("train", fn, **kw)


@pytest.mark.parametrize("asynchronous", ["0", "1"])
def test_a_ctrl_c_while_a_row_is_written_keeps_that_row_and_says_so(tmp_path, asynchronous):
    """Ctrl-C right after a row's dvc.lock entry is written, before its ref:
    the row was left half written (dvc.lock naming a checkpoint no row
    held), the line named the row before it, and the next run resumed that
    checkpoint under a new name; asynchronous, the line came before the row
    in flight was recorded (found by a sweep). The row is finished, the line
    names it, and the run goes on under its name."""
    from pathlib import Path

    project = template_project(tmp_path)
    helper = Path(__file__).resolve().parent.parent / "helpers" / "interrupt_at.py"
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace("python train.py",
                                                     f"python {helper} train.py"))
    run(["git", "commit", "-qam", "interrupted at a row's write"], project)
    proc = run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project,
               check=False, env={"INTERRUPT_AT": "2", "DVC_DALI_ASYNC": asynchronous})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "dvc-dali: interrupted (Ctrl-C): step 10 is kept as row a-step10; `dvc exp run` " \
           "resumes from it" in out, out
    again = run(["dvc", "exp", "run", "-S", "train.checkpoint_every=5"], project,
                env={"INTERRUPT_AT": "0"})
    said = again.stdout + again.stderr
    assert "resuming at step 10" in said and "recorded a-step15" in said, said


def test_a_run_name_too_long_for_its_rows_is_refused_before_training(tmp_path):
    """A name DVC accepts (250 bytes) cannot name the rows (<name>-step<N>):
    it failed after the first interval, advising to check that the
    repository is writable (found by a sweep). Refused before training,
    with the most bytes a name can have."""
    project = template_project(tmp_path)
    proc = run(["dvc", "exp", "run", "-n", "M" * 250], project, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in said, said
    assert "is too long for its row at step 20" in said and "at most 243 bytes" in said, said
    assert "step 1/" not in said and "writable" not in said, said


def test_a_run_started_from_a_subdirectory_with_a_relative_target_records(tmp_path):
    """`cd data; dvc exp run ../dvc.yaml`: DVC names the stage relative to
    where it was typed (DVC_STAGE=../dvc.yaml:train), which the command,
    running in the stage's directory, does not know: it was refused as
    matching no stage (found by a sweep)."""
    project = template_project(tmp_path)
    proc = run(["dvc", "exp", "run", "-n", "sub", "../dvc.yaml"], project / "data", check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "recorded sub-step20" in said, said


GO_AT_13 = '''
    if step == 13:
        import pathlib, time
        pathlib.Path("ready.tmp").write_text(str(os.getpid()))
        os.replace("ready.tmp", "ready")
        while not os.path.exists("go"):
            time.sleep(0.01)
'''


@pytest.mark.parametrize("launcher", ["", "timeout 900 "], ids=["shell", "launcher"])
def test_a_training_whose_dvc_exp_run_ended_stops_at_its_next_row(tmp_path, launcher):
    """SIGTERM to `dvc exp run` alone (a supervisor that signals its direct
    child): the training went on as an orphan to its end, and a second `dvc
    exp run`, no longer held off, started beside it (found by a sweep). It
    stops at its next row, saying so. DVC runs the command as $SHELL -c:
    /bin/sh is dash on Debian, which does not exec it and stays the
    training's parent (CI, where SHELL is unset, found it). A launcher
    between them that outlives DVC (`timeout` here, torchrun's agent for
    ranks) hid DVC's end the same way."""
    import signal
    import subprocess
    import time

    from tests.helpers import child_env

    project = template_project(tmp_path)
    train = project / "train.py"
    loop_body = "    x, y = (np.asarray(out.as_tensor()) for out in pipe.run())\n"
    train.write_text(train.read_text().replace(loop_body, loop_body + GO_AT_13.lstrip("\n")))
    stages = project / "dvc.yaml"
    stages.write_text(stages.read_text().replace("cmd: python", f"cmd: {launcher}python"))
    (project / ".gitignore").write_text("ready\ngo\nout.log\n")
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "waits at 13"], project)
    with open(project / "out.log", "w") as log:  # a file: an orphan writing to a pipe dies
        dvc = subprocess.Popen(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"],
                               cwd=project, stdout=log, stderr=subprocess.STDOUT,
                               env={**child_env(this_python=True), "SHELL": "/bin/sh"},
                               start_new_session=True)
        while not (project / "ready").exists():
            assert dvc.poll() is None, (project / "out.log").read_text()
            time.sleep(0.02)
        trainer = int((project / "ready").read_text())
        dvc.send_signal(signal.SIGTERM)  # to `dvc exp run` alone
        dvc.wait()
        (project / "go").write_text("")
        for _ in range(6000):  # the orphan is no child of ours: its end is polled
            if not os.path.exists(f"/proc/{trainer}") or \
                    open(f"/proc/{trainer}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.05)
    said = (project / "out.log").read_text()
    assert f"`dvc exp run` (pid {dvc.pid}) ended while this training went on, so it stops: " \
        "step 15 is kept as row a-step15" in said, said
    assert "recorded a-step20" not in said, said


def in_session(sid: int) -> list[int]:
    """The live processes of session ``sid`` (zombies left out)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as fobj:
                fields = fobj.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # not a process, or gone meanwhile
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry))
    return found


def test_ranks_whose_dvc_exp_run_ended_stop_at_their_next_row(tmp_path):
    """The distributed example (torchrun, 2 ranks, gloo) under `dvc exp run`,
    SIGTERM to `dvc exp run` alone once a row is recorded: torchrun's agent
    outlives DVC, so the ranks, whose parent it is, went on as orphans to
    their last step. Rank 0 stops at its next row, saying so, and torchrun
    ends rank 1."""
    import signal
    import subprocess
    import time

    pytest.importorskip("torch", reason="install the test extra's torch==2.13.0 (CPU)")
    from tests.helpers import child_env
    from tests.helpers.dvc_project import example_on_two_ranks

    project = example_on_two_ranks(tmp_path / "ranks", "examples/train.py", "2 ranks")
    (project / ".gitignore").write_text((project / ".gitignore").read_text() + "out.log\n")
    run(["git", "commit", "-qam", "out.log ignored"], project)
    refs = project / ".git" / "refs" / "exps"
    with open(project / "out.log", "w") as log:  # a file: an orphan writing to a pipe dies
        dvc = subprocess.Popen(["dvc", "exp", "run", "-n", "a", "-S", "train.framework=torch",
                                "-S", "train.steps=3000"], cwd=project, stdout=log,
                               stderr=subprocess.STDOUT, env=child_env(this_python=True),
                               start_new_session=True)
        while not list(refs.glob("??/*/a-step10")):  # the first row (an event on disk)
            assert dvc.poll() is None, (project / "out.log").read_text()
            time.sleep(0.02)
        dvc.send_signal(signal.SIGTERM)  # to `dvc exp run` alone
        dvc.wait()
        for _ in range(6000):  # the ranks and torchrun are no children of ours: polled
            if not in_session(dvc.pid):
                break
            time.sleep(0.05)
    said = (project / "out.log").read_text()
    assert f"`dvc exp run` (pid {dvc.pid}) ended while this training went on, so it " \
        "stops: step " in said, said[-3000:]
    assert "step 3000/3000" not in said and not list(refs.glob("??/*/a-step3000")), said[-3000:]
