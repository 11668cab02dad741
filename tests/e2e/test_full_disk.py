"""A write that fails while a row is recorded (a full disk, a file-size
limit: EFBIG here, through tests/helpers/fs_faults.py) loses nothing
recorded: one line names what failed, no row holds a partial or another
step's state, and the next `dvc exp run` resumes from the last row exactly."""

from __future__ import annotations

import json
import os
import sys

import pytest

from dvc_dali.reading.exp_refs import list_rows
from dvc_dali.recording import held, pending
from tests.helpers import HELPERS
from tests.helpers.dvc_project import commit_all, run, template_project
from tests.helpers.rows import exp_rows


def fault_project(tmp_path, steps: int):
    """`dvc-dali init`'s project whose stage runs train.py under fs_faults.py."""
    project = template_project(tmp_path, steps=steps)
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace(
        "cmd: python train.py", f"cmd: {sys.executable} {HELPERS / 'fs_faults.py'} train.py"))
    commit_all(project, "under fs_faults")
    return project


def test_a_rows_commit_that_cannot_be_written_puts_dvc_lock_back(tmp_path):
    """dvc.lock was left naming the checkpoint of the step whose commit
    failed (with a traceback): the next run resumed from it as a run of its
    own, its row's lineage cut (`b-step6`, parent none; found by a sweep)."""
    project = fault_project(tmp_path, steps=6)
    failed = run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=2"], project,
                 check=False, env={"FS_FAULT": "commit:2:transient"})
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "Traceback" not in said, said
    assert "RecordError: cannot write the row's commit into " in said, said
    assert "(failed to write out file: File too large); nothing was recorded" in said, said
    assert set(exp_rows(project)) == {"a-step2"}
    resumed = run(["dvc", "exp", "run", "-n", "b"], project)
    assert "resuming at step 2" in resumed.stdout, resumed.stdout
    rows = exp_rows(project)
    assert {"a-step2", "a-step4", "a-step6"} <= set(rows) and "b-step6" not in rows, rows


def test_a_dvc_lock_that_cannot_be_written_is_one_line_and_the_run_resumes(tmp_path):
    """The write of dvc.lock itself failed (a full disk) with a traceback."""
    project = fault_project(tmp_path, steps=6)
    failed = run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=2"], project,
                 check=False, env={"FS_FAULT": "lockfile:2:transient"})
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "Traceback" not in said, said
    assert f"RecordError: cannot write {project / 'dvc.lock'} ([Errno 27] File too large)" \
        ", so step 4 is not recorded; dvc.lock still names the last recorded row." in said, said
    assert set(exp_rows(project)) == {"a-step2"}
    resumed = run(["dvc", "exp", "run", "-n", "b"], project)
    assert "resuming at step 2" in resumed.stdout, resumed.stdout
    rows = exp_rows(project)
    assert {"a-step2", "a-step4", "a-step6"} <= set(rows) and "b-step6" not in rows, rows


def killed_at_step_4(tmp_path, at: str = "lock"):
    """Run a (rows every 2 steps) SIGKILLed while it records step 4: right
    after its dvc.lock write (``at`` "lock"), or right before its held note
    is written, its ref made (``at`` "held")."""
    project = template_project(tmp_path, steps=6)
    dvc_yaml = project / "dvc.yaml"
    dvc_yaml.write_text(dvc_yaml.read_text().replace(
        "cmd: python train.py", f"cmd: {sys.executable} {HELPERS / 'interrupt_at.py'} train.py"))
    commit_all(project, "under interrupt_at")
    killed = run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=2"], project,
                 check=False, env={"INTERRUPT_AT": "2", "INTERRUPT_SIGNAL": "KILL",
                                   "INTERRUPT_ON": at})
    assert killed.returncode != 0, killed.stdout + killed.stderr
    return project


@pytest.mark.parametrize("writer", ["gone", "pid-reused"])
def test_a_row_killed_between_its_dvc_lock_and_its_ref_is_completed_by_the_next_run(tmp_path,
                                                                                     writer):
    """SIGKILL right after dvc.lock named step 4's checkpoint, before its
    ref: the next run resumed from it as a run of its own (`b-step6`, parent
    none: run a's history cut). Now its start publishes a-step4 from the
    note the killed run left, and run a goes on from it. Also when the
    killed writer's pid belongs to another live process by then (here this
    test's: the note was left alone as a row being recorded, found by a
    sweep); its start time tells it from the writer."""
    project = killed_at_step_4(tmp_path)
    assert set(exp_rows(project)) == {"a-step2"}
    if writer == "pid-reused":
        [note] = (project / pending.NOTES).glob("*.json")
        note.write_text(json.dumps({**json.loads(note.read_text()), "pid": os.getpid()}))
    resumed = run(["dvc", "exp", "run", "-n", "b"], project, env={"INTERRUPT_AT": "99"})
    said = resumed.stdout + resumed.stderr
    assert "row a-step4 completed: a killed run had recorded it" in said, said
    assert "resuming at step 4" in resumed.stdout, resumed.stdout
    rows = exp_rows(project)
    assert {"a-step2", "a-step4", "a-step6"} <= set(rows) and "b-step6" not in rows, rows
    lineage = {r["name"]: r for r in list_rows(str(project), "a")}
    assert lineage["a-step6"]["parent"] == lineage["a-step4"]["sha"], lineage
    assert lineage["a-step4"]["parent"] == lineage["a-step2"]["sha"], lineage


def test_a_row_killed_between_its_ref_and_its_held_note_is_noted_by_the_next_start(tmp_path):
    """SIGKILL after step 4's ref, before its held note: the note kept naming
    a-step2 as the workspace's checkpoint, so a run that lost the checkpoint
    was told `dvc exp apply a-step2`, two steps back. The pending note goes
    only after the held note; the next run's start writes it from there."""
    project = killed_at_step_4(tmp_path, at="held")
    assert set(exp_rows(project)) == {"a-step2", "a-step4"}
    pending.at_run_start(str(project))  # as the next `dvc exp run`'s start does
    note = held.read(str(project), "dvc.lock", "train")
    assert note is not None and (note.row, note.step) == ("a-step4", 4), note
    assert not list((project / pending.NOTES).glob("*.json"))


def test_a_cache_that_cannot_take_the_checkpoint_says_so_first(tmp_path):
    """DVC logs "failed to transfer" and goes on; the line blamed another
    command changing the output first (the cache's space came last), and
    EFBIG got no advice about the cache at all."""
    project = fault_project(tmp_path, steps=4)
    failed = run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=2"], project,
                 check=False, env={"FS_FAULT": "cache:3:transient"})
    said = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "Traceback" not in said, said
    assert "failed: OSError: [Errno 27] File too large. Nothing was recorded for this " \
        "checkpoint; the DVC cache " in said, said
    assert "cannot be written: free space there (or lift the file-size limit" in said, said
    assert "changed while it was recorded" not in said, said
    assert set(exp_rows(project)) == {"a-step2"}
