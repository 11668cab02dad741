"""dvc.lock deleted after checkpoints were recorded, then `dvc exp run`.

Before running the stage, `dvc exp run` checks its outputs out to what
dvc.lock names and deletes a cached output it does not name (DVC 2.58 did
the same to `checkpoint: true` outputs); `--temp` and queued runs get no
checkpoint then either. The run started from step 0 and ended as a
success that resumed nothing. It is refused now, in one line naming
dvc.lock and the row to `dvc exp apply` (which resumes it), or
`dvc-dali reset` to start over. Real `dvc exp run`, a real DALI pipeline
over PNG files: the `dvc-dali init` template (a Checkpointer) in one shared
project, a bare make_checkpoint() port of a DVC 2 script in another.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.dvc_project import (commit_all, example_on_two_ranks, run,
                                       template_project)
from tests.helpers.rows import exp_refs

REFUSED = "dvc.lock names no checkpoint for stage 'train'"


def row_names(project: Path) -> set[str]:
    return {ref.rsplit("/", 1)[-1] for _, ref in exp_refs(project)}


def refused(text: str, failed: bool) -> tuple[str, int]:
    """(row, step) the refusal names, after checking the run failed with it,
    one line and not a traceback, saying what to do."""
    assert failed, text[-3000:]
    assert REFUSED in text and "Traceback" not in text, text[-3000:]
    found = re.search(r"recorded is row (\S+) \(step (\d+)\).*`dvc exp apply \1`", text)
    assert found and "`dvc-dali reset`" in text, text[-3000:]
    return found.group(1), int(found.group(2))


def said(proc) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """The template (a Checkpointer) after a workspace run `a` to step 4,
    a row every 2 steps."""
    project = template_project(tmp_path_factory.mktemp("lost_lock"), steps=4)
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("checkpoint_every: 10", "checkpoint_every: 2"))
    commit_all(project, "a row every 2 steps")
    run(["dvc", "exp", "run", "-n", "a"], project)
    assert {"a-step2", "a-step4"} <= row_names(project)
    return project


def test_checkpointer_run_without_dvc_lock_is_refused_and_the_row_resumes(template):
    """DVC deletes the checkpoint; the run is refused, recording nothing, and
    the row it names brings it back: `dvc exp apply` then `dvc exp run` resumes."""
    (template / "dvc.lock").unlink()
    proc = run(["dvc", "exp", "run", "-n", "b", "-S", "train.steps=6"], template, check=False)
    assert "starting: 6 steps" not in proc.stdout, proc.stdout  # step 0 was the bug
    assert refused(said(proc), proc.returncode != 0) == ("a-step4", 4)
    assert not any(n.startswith("b") for n in row_names(template))
    run(["dvc", "exp", "apply", "a-step4"], template)
    again = run(["dvc", "exp", "run", "-n", "c", "-S", "train.steps=6"], template)
    assert "resuming at step 4" in again.stdout and "step 2/6" not in again.stdout, again.stdout


@pytest.mark.parametrize("how", ["temp", "queue"])
def test_temp_and_queued_runs_without_the_workspaces_dvc_lock_are_refused(template, how):
    """They never get the workspace's checkpoint then (nothing names it), and
    started from step 0; now refused alike, the workspace's left as it was."""
    (template / "dvc.lock").unlink(missing_ok=True)
    latest = (template / "checkpoint" / "LATEST").read_bytes()
    before = row_names(template)
    if how == "temp":
        proc = run(["dvc", "exp", "run", "--temp", "-n", how, "-S", "train.steps=8"], template,
                   check=False)
        text, failed = said(proc), proc.returncode != 0
    else:
        run(["dvc", "exp", "run", "--queue", "-n", how, "-S", "train.steps=8"], template)
        text = said(run(["dvc", "exp", "run", "--run-all", "-j", "1"], template))
        text += run(["dvc", "queue", "logs", how], template, check=False).stdout
        failed = f"Failed to reproduce experiment(s) '{how}'" in text  # --run-all exits 0
    assert "starting: 8 steps" not in text, text[-3000:]
    refused(text, failed)
    assert "into this --temp/queued run" in text, text[-3000:]
    assert (template / "checkpoint" / "LATEST").read_bytes() == latest
    assert row_names(template) - before <= {how}  # DVC's own failed experiment at most


BARE_TRAIN = textwrap.dedent("""\
    # a DVC 2 script ported by its import: it saves and restores its DALI
    # pipeline itself, and calls the bare make_checkpoint()
    import os
    import yaml
    from nvidia.dali import fn, pipeline_def, types
    from dvc_dali import make_checkpoint

    steps = yaml.safe_load(open("params.yaml"))["train"]["steps"]
    state, at = "checkpoint/pipeline.bin", "checkpoint/step.txt"
    start = int(open(at).read()) if os.path.exists(at) else 0
    print(f"start at {start}", flush=True)


    @pipeline_def
    def images():
        files, labels = fn.readers.file(file_root="data/images", random_shuffle=True,
                                        name="reader")
        return fn.decoders.image(files, output_type=types.GRAY), labels


    pipe = images(batch_size=4, num_threads=1, device_id=None, seed=0,
                  enable_checkpointing=True,
                  checkpoint=open(state, "rb").read() if start else None)
    pipe.build()
    os.makedirs("checkpoint", exist_ok=True)
    for step in range(start + 1, steps + 1):
        pipe.run()
        open(state, "wb").write(pipe.checkpoint())
        open(at, "w").write(str(step))
        make_checkpoint()
    """)

BARE_STAGE = textwrap.dedent("""\
    stages:
      train:
        cmd: python train.py
        deps: [train.py, data/images]
        params: [train.steps]
        outs:
          - checkpoint:
              checkpoint: true
              persist: true
        always_changed: true
    """)


def test_bare_make_checkpoint_run_without_dvc_lock_is_refused_until_reset(tmp_path):
    """The bare make_checkpoint() port: refused at `import dvc_dali`, before
    the script reads its state; `dvc-dali reset` starts over on purpose."""
    project = template_project(tmp_path, steps=3)
    (project / "train.py").write_text(BARE_TRAIN)
    (project / "dvc.yaml").write_text(BARE_STAGE)
    commit_all(project, "a bare port")
    first = run(["dvc", "exp", "run", "-n", "a"], project)
    assert "start at 0" in first.stdout and {"a-step3"} <= row_names(project), first.stdout
    (project / "dvc.lock").unlink()
    proc = run(["dvc", "exp", "run", "-n", "b", "-S", "train.steps=5"], project, check=False)
    assert "start at" not in proc.stdout, proc.stdout
    assert refused(said(proc), proc.returncode != 0) == ("a-step3", 3)
    assert not any(n.startswith("b") for n in row_names(project))
    reset = run([sys.executable, "-m", "dvc_dali.cli", "reset"], project)
    assert "the note that stage 'train' last held row a-step3" in reset.stdout, reset.stdout
    again = run(["dvc", "exp", "run", "-n", "c", "-S", "train.steps=2"], project)
    assert "start at 0" in again.stdout and {"c-step1", "c-step2"} <= row_names(project)
    assert "a-step3" in row_names(project)  # recorded rows are kept


def test_two_ranks_without_dvc_lock_are_refused_on_each_rank(tmp_path):
    """The distributed example (torchrun, 2 ranks, gloo): every rank refuses
    before it trains, or is ended by the launcher once the other refused (no
    rank trains, none waits for ever). CI once saw the second case."""
    pytest.importorskip("torch", reason="install the test extra's torch==2.13.0 (CPU)")
    project = example_on_two_ranks(tmp_path / "ranks", "examples/train.py", "2 ranks")
    torch = ["-S", "train.framework=torch", "-S", "train.steps=20"]
    run(["dvc", "exp", "run", "-n", "a", *torch], project)
    (project / "dvc.lock").unlink()
    proc = run(["dvc", "exp", "run", "-n", "b", *torch, "-S", "train.steps=30"], project,
               check=False)
    text = said(proc)
    # Each rank refuses; torchrun ends the other one as soon as the first
    # refusal exits, so the slower rank may be ended (SIGTERM) before it says so.
    refusals, ended = text.count(REFUSED), len(re.findall(r"exitcode\s*:\s*-15\b", text))
    assert proc.returncode != 0 and (refusals == 2 or (refusals, ended) == (1, 1)), text[-3000:]
    assert "is row a-step20 (step 20)" in text and "`dvc exp apply a-step20`" in text
    # one line each, no frame of ours (torchrun prints its own ChildFailedError)
    assert "dvc_dali/" not in text and "starting: 30 steps" not in text, text[-3000:]
    assert not any(n.startswith("b") for n in row_names(project))


FORGED = {  # how the note was damaged -> the problem the refusal names
    "outs-list": "its outputs are not a map",  # a traceback at `import dvc_dali`
    "row-with-newline": "no valid row name",  # printed raw: a forged second line
    "fifo": "not a regular file",  # the run and `dvc-dali reset` waited on it for ever
}


def test_a_damaged_note_is_named_and_refused_and_reset_removes_it(template):
    """A note that cannot be read (a FIFO, outputs that are no map, a row name
    no git ref has) while the checkpoint is gone: one line naming the note
    and the ways out, no traceback, no wait; `dvc-dali reset` removes it.
    Last in this module: it resets the shared project."""
    (template / "dvc.lock").unlink(missing_ok=True)
    notes = list((template / ".dvc/tmp/dvc-dali/held").glob("*.json"))
    assert len(notes) == 1, notes
    note = notes[0]
    for how, problem in FORGED.items():
        note.unlink()
        if how == "fifo":
            os.mkfifo(note)
        else:
            note.write_text(json.dumps(
                {"row": "a-step4", "step": 4, "outs": ["checkpoint"]} if how == "outs-list"
                else {"row": "a-step4\nERROR: forged", "step": 4,
                      "outs": {"checkpoint": "x.dir"}}))
        proc = run(["dvc", "exp", "run", "-n", how, "-S", "train.steps=8"], template,
                   check=False, timeout=300)
        text = said(proc)
        assert proc.returncode != 0 and "starting: 8 steps" not in text, text[-3000:]
        assert REFUSED in text and "Traceback" not in text and "forged" not in text, text
        rel = note.relative_to(template)
        assert f"The note of which row this workspace last recorded, {rel}, cannot be read " \
               f"({problem}" in text, text[-3000:]
    reset = run(["dvc-dali", "reset"], template, timeout=120)
    assert f"removed {rel} (the note of which row stage 'train' last held, which could not " \
           "be read: not a regular file)" in reset.stdout, reset.stdout
    assert not os.path.lexists(note)
    fresh = run(["dvc", "exp", "run", "-n", "fresh", "-S", "train.steps=2"], template)
    assert "starting: 2 steps" in fresh.stdout, fresh.stdout[-3000:]
