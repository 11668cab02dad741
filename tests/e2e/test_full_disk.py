"""A write that fails while a row is recorded (a full disk, a file-size
limit: EFBIG here, through tests/helpers/fs_faults.py) loses nothing
recorded: one line names what failed, no row holds a partial or another
step's state, and the next `dvc exp run` resumes from the last row exactly."""

from __future__ import annotations

import sys

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
