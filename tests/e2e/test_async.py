"""Asynchronous checkpoints: captured at the call, written and recorded in
the background, one at a time, finished whole at exit or on Ctrl-C."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

import dvc_dali

from tests.helpers import pipelines
from tests.helpers.dvc_project import make_project, run, sigint_default, template_project
from tests.helpers.rows import asynchronous_row_steps, exp_rows


def test_async_checkpoint_captures_state_at_the_call(data_dir, tmp_path):
    fn, kw = pipelines.make("rotate", str(data_dir))["train"]
    ck = dvc_dali.Checkpointer(tmp_path / "c", asynchronous=True)
    pipe = ck.pipeline("train", fn, **kw)
    w = np.zeros(4)
    batches = []
    for step in range(1, 7):
        batches.append(pipelines.outputs_of(pipe))
        w += step
        assert ck.make_checkpoint(step, arrays={"w": w}) is None  # returned before writing
        if step == 3:
            expected_w = w.copy()
            ck.wait()
            shutil.copytree(tmp_path / "c", tmp_path / "c3")
        w += 100  # training goes on and mutates the arrays in place
    ck.wait()
    assert dvc_dali.Checkpointer(tmp_path / "c").step == 6
    back = dvc_dali.Checkpointer(tmp_path / "c3")
    assert back.step == 3 and np.array_equal(back.arrays["w"], expected_w)
    # The DALI state is the one at the call: the restored pipeline yields batch 4.
    restored = pipelines.outputs_of(back.pipeline("train", fn, **kw))
    assert all(np.array_equal(a, b) for a, b in zip(restored, batches[3]))


TRAIN = """
import os, shutil, signal, sys, numpy as np, dvc_dali, pipelines
ck = dvc_dali.Checkpointer("checkpoint", asynchronous=True, total_steps=4)
fn, kw = pipelines.make("rotate", sys.argv[1])["train"]
pipe = ck.pipeline("train", fn, **kw)
mode = sys.argv[2]
for step in range(ck.step + 1, 5):
    pipe.run()
    if step == 2 and mode == "early":  # the directory a file: its write fails
        ck.wait(); shutil.rmtree("checkpoint"); open("checkpoint", "w").close()
    ck.make_checkpoint(step, arrays={"w": np.full(3, step)})
    if step == 2 and mode == "early":
        break                                 # early stop, its checkpoint failing, no wait()
    if step == 2 and mode == "sigint":
        os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C right after an async checkpoint
    if step == 2 and mode == "exit":
        sys.exit(0)                           # exit with the checkpoint in flight
"""


def async_project(path, data_dir, mode):
    return make_project(path, files={
        "train.py": TRAIN, "pipelines.py": Path(pipelines.__file__),
        "dvc.yaml": f"stages:\n  train:\n    cmd: {sys.executable} train.py {data_dir} {mode}\n"
                    "    outs:\n      - checkpoint:\n          persist: true\n"
                    "    always_changed: true\n"})


def test_exit_and_ctrl_c_finish_the_checkpoint_in_flight(tmp_path, data_dir):
    for mode in ("exit", "sigint"):
        project = async_project(tmp_path / mode, data_dir, mode)
        proc = run(["dvc", "exp", "run", "-n", mode], project, check=False,
                   preexec_fn=sigint_default)
        rows = exp_rows(project)
        assert {f"{mode}-step1", f"{mode}-step2"} <= set(rows), proc.stderr[-2000:]
        assert f"{mode}-step3" not in rows
        back = dvc_dali.Checkpointer(project / "checkpoint")
        assert back.step == 2 and back.arrays["w"].tolist() == [2, 2, 2]
        assert not (project / ".dvc/tmp/DVC_CHECKPOINT").exists()
        assert not [p for p in (project / "checkpoint").iterdir() if p.name.startswith(".tmp")]


def test_an_early_stop_whose_last_checkpoint_failed_fails_the_run(tmp_path, data_dir):
    """The loop ends before total_steps, its last (asynchronous) checkpoint
    failing, and nothing waits for it: `dvc exp run` fails, saying which step
    was lost, and records no experiment as if it held it."""
    project = async_project(tmp_path / "early", data_dir, "early")
    proc = run(["dvc", "exp", "run", "-n", "early"], project, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said[-3000:]
    assert ("the checkpoint of step 2 failed in the background and was never waited for: "
            "CheckpointWriteError: ") in said, said[-3000:]
    assert set(exp_rows(project)) == {"early-step1"}  # no row, and no final experiment



def test_the_init_templates_asynchronous_rows_hold_their_own_steps_metrics(tmp_path):
    """`dvc-dali init`'s train.py with DVC_DALI_ASYNC=1: each row holds the
    metrics (and model) of its own step, not of the next checkpoint's, which
    the loop wrote while the row was still being recorded."""
    assert asynchronous_row_steps(template_project(tmp_path, steps=30), []) == [10, 20, 30]


def test_ck_lives_writes_wait_for_the_asynchronous_checkpoint_in_flight(tmp_path):
    """The loop logs to `ck.live()` without calling `ck.wait()` first: its
    `next_step` waits for the row still being recorded, so each row holds its
    own step's metrics (not the next checkpoint's), in --temp runs too."""
    project = template_project(tmp_path, steps=30)
    train = project / "train.py"
    loop = train.read_text()
    assert "        ck.wait()" in loop
    train.write_text(loop.replace("        ck.wait()", "        pass"))
    run(["git", "commit", "-qam", "no wait"], project)
    assert asynchronous_row_steps(project, [], "tmp", ("--temp",)) == [10, 20, 30]
    assert asynchronous_row_steps(project, [], "ws") == [10, 20, 30]


def test_an_output_written_after_an_asynchronous_checkpoint_refuses_its_row(tmp_path):
    """The loop saves its model just after `make_checkpoint` returns, while
    that checkpoint's row is still to be recorded: the row would hold a file
    of the training after it, so it is refused, naming the file, and
    dvc.lock names no checkpoint; never a row holding it (--temp too)."""
    project = template_project(tmp_path, steps=30)
    train = project / "train.py"
    save = '        save_model(w)  # every output exists when DVC records it\n'
    call = '        ck.make_checkpoint(step, arrays={"w": w}, metadata={"lr": p["lr"]})\n'
    loop = train.read_text()
    assert save + call in loop
    train.write_text(loop.replace(save + call, call + save))
    run(["git", "commit", "-qam", "saved after the call"], project)
    for how, name in ((["--temp"], "tmp"), ([], "ws")):
        proc = run(["dvc", "exp", "run", *how, "-n", name], project, check=False,
                   env={"DVC_DALI_ASYNC": "1"})
        said = proc.stdout + proc.stderr
        assert proc.returncode != 0, said[-3000:]
        assert ("model/weights.npy: written after make_checkpoint(10) returned, before its row "
                "was recorded (asynchronous=True)") in said, said[-3000:]
        assert "Traceback" not in said, said[-3000:]  # DVCLive's repository closed at exit
    assert exp_rows(project) == {}
    assert not (project / "dvc.lock").exists()
