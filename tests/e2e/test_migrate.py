"""`dvc-dali migrate` end to end: a DVC 2 project, ported by changing only the
import, migrated through the real entry point, then run, killed and resumed
under DVC 3's real `dvc exp run` in a temporary git + DVC repository."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dvc_dali.cli.migrate import check_project

from tests.helpers.dvc_project import commit_all, make_project, run
from tests.helpers.rows import exp_refs

MIGRATE = [sys.executable, "-m", "dvc_dali.cli.migrate"]
TOTAL = 5

# DVC 2's stage: `checkpoint: true` only, no persist, no always_changed.
DVC2_YAML = """\
stages:
  train:
    cmd: python train.py   # DVC 2 recorded each make_checkpoint()
    deps:
      - train.py
    outs:
      - checkpoint: {checkpoint: true}
"""

# A DVC 2 training script whose only change is the import.
TRAIN_PY = f"""\
import os
from pathlib import Path

from dvc_dali import make_checkpoint

state = Path("checkpoint/state.txt")
done = int(state.read_text()) if state.exists() else 0
print(f"starting at step {{done + 1}}", flush=True)
for step in range(done + 1, {TOTAL} + 1):
    state.parent.mkdir(exist_ok=True)
    state.write_text(str(step))
    make_checkpoint()
    if os.environ.get("KILL_AT") == str(step):
        os._exit(9)
"""

# DVC 2's own test fixture trained only when DVC 2 set DVC_CHECKPOINT.
GUARDED_PY = """\
import os
from pathlib import Path

from dvc_dali import make_checkpoint

state = Path("checkpoint/state.txt")
value = int(state.read_text()) if state.exists() else 0
if os.environ.get("DVC_CHECKPOINT"):
    for _ in range(3):
        value += 1
        state.parent.mkdir(exist_ok=True)
        state.write_text(str(value))
        make_checkpoint()
"""


def _project(path: Path, script: str) -> Path:
    return make_project(path, files={"dvc.yaml": DVC2_YAML, "train.py": script},
                        message="a DVC 2 project")


def _rows(path: Path) -> set[str]:
    return {ref.rsplit("/", 1)[1] for _, ref in exp_refs(path, dvc_exec=True)}


def _migrate(path: Path, *args: str, check: bool = True):
    return run([*MIGRATE, *args], path, check=check)


def test_dvc2_project_migrated_resumes_after_a_kill(tmp_path):
    project = _project(tmp_path, TRAIN_PY)
    assert check_project(project) == [
        "dvc.yaml: stage 'train' will not resume under DVC 3: it needs persist: true; "
        "always_changed: true. Fix: `dvc-dali migrate dvc.yaml`"]
    checked = _migrate(project, "--check", check=False)
    assert checked.returncode == 1, checked.stderr
    assert "dvc.yaml: needs stage 'train', output 'checkpoint': persist: true" in checked.stdout
    assert "dvc.yaml: needs stage 'train': always_changed: true" in checked.stdout
    assert (project / "dvc.yaml").read_text() == DVC2_YAML  # --check changes nothing
    # doctor says it once, with the fix (it said it twice: found by a sweep)
    doctor = run([sys.executable, "-m", "dvc_dali.cli", "doctor"], project, check=False)
    bad = [line for line in doctor.stdout.splitlines()
           if line.startswith("BAD") and "stage 'train'" in line]
    assert len(bad) == 1 and "Fix: `dvc-dali migrate dvc.yaml`" in bad[0], doctor.stdout

    done = _migrate(project)
    assert "git diff dvc.yaml" in done.stdout
    assert (project / "dvc.yaml").read_text() == DVC2_YAML.replace(
        "{checkpoint: true}", "{checkpoint: true, persist: true}") + "    always_changed: true\n"
    assert _migrate(project, "--check").returncode == 0
    assert check_project(project) == []
    commit_all(project, "dvc-dali migrate")

    killed = run(["dvc", "exp", "run", "-n", "a"], project, check=False, env={"KILL_AT": "2"})
    assert killed.returncode != 0
    assert {"a-step1", "a-step2"} <= _rows(project) and "a-step3" not in _rows(project)
    again = run(["dvc", "exp", "run", "-n", "b"], project)
    assert "starting at step 3" in again.stdout
    assert (project / "checkpoint" / "state.txt").read_text() == str(TOTAL)
    assert {"a-step1", "a-step2", "a-step3", "a-step4", "a-step5"} <= _rows(project)  # one run


def test_dvc_checkpoint_guarded_script_records_after_migrate(tmp_path):
    project = _project(tmp_path, GUARDED_PY)
    done = _migrate(project)
    assert "trains only when DVC_CHECKPOINT is set" in done.stdout
    text = (project / "dvc.yaml").read_text()
    assert ("cmd: dvc-dali run --checkpoint checkpoint -- python train.py   # DVC 2 recorded"
            in text)
    assert _migrate(project).stdout.startswith("dvc.yaml: nothing to migrate")  # wrapped once
    assert (project / "dvc.yaml").read_text() == text
    commit_all(project, "dvc-dali migrate")

    run(["dvc", "exp", "run", "-n", "g"], project)
    assert (project / "checkpoint" / "state.txt").read_text() == "3"
    assert {"g-step1", "g-step2", "g-step3"} <= _rows(project)  # one row per signal
    run(["dvc", "exp", "run", "-n", "h"], project)  # resumes from the persisted output
    assert (project / "checkpoint" / "state.txt").read_text() == "6"
    assert {"g-step4", "g-step5", "g-step6"} <= _rows(project)  # run g goes on


@pytest.mark.parametrize("name, content, message", [
    ("absent.yaml", None, "absent.yaml: no such file"),
    ("dvc.yaml", "stages:\n  train: [\n", "dvc.yaml: not valid YAML at line 3"),
])
def test_entry_point_bad_file_is_one_line_and_exit_1(tmp_path, name, content, message):
    if content is not None:
        (tmp_path / name).write_text(content)
    out = _migrate(tmp_path, name, check=False)
    assert out.returncode == 1
    assert out.stderr.startswith(f"dvc-dali migrate: {message}")
    assert "Traceback" not in out.stderr and out.stdout == ""
