"""DVC 2.58.2's own checkpoint fixture, run under DVC 3 + dvc-dali as a user
would chain it (treeverse/dvc 2.58.2, tests/unit/repo/experiments/conftest.py:
`checkpoint_stage` and CHECKPOINT_SCRIPT, with the import switched to
dvc_dali). The script trains only when DVC_CHECKPOINT is set, as DVC 2 set it
for checkpoint stages; its output `foo` holds the iteration count.

Chains, not features: the project as it is (refused, naming the fix), then
after `dvc-dali migrate`; an applied non-head row rerun unchanged (refused,
as DVC 2 did); the applied row carried into --temp and queued runs; two
byte-identical runs, where the applied one is the one continued.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.helpers.dvc_project import commit_all, make_project, run, wait_queue
from tests.helpers.rows import exp_rows

# DVC 2.58.2's CHECKPOINT_SCRIPT, `from dvc.api import make_checkpoint` switched
CHECKPOINT_SCRIPT = """\
import os
import sys
import shutil

from dvc_dali import make_checkpoint

checkpoint_file = sys.argv[1]
checkpoint_iterations = int(sys.argv[2])
if os.path.exists(checkpoint_file):
    with open(checkpoint_file) as fobj:
        try:
            value = int(fobj.read())
        except ValueError:
            value = 0
else:
    with open(checkpoint_file, "w"):
        pass
    value = 0

shutil.copyfile(sys.argv[3], sys.argv[4])

if os.getenv("DVC_CHECKPOINT"):
    for index in range(checkpoint_iterations):
        value += 1

        with open(checkpoint_file, "w") as fobj:
            fobj.write(str(value))
        make_checkpoint()
"""

# What DVC 2's `dvc.run(..., checkpoints=["foo"], name="checkpoint-file")` writes
DVC_YAML = """\
stages:
  checkpoint-file:
    cmd: python checkpoint.py foo 2 params.yaml metrics.yaml
    deps:
    - checkpoint.py
    params:
    - foo
    outs:
    - foo:
        checkpoint: true
    metrics:
    - metrics.yaml:
        cache: false
"""


def _project(path):
    return make_project(path, files={"checkpoint.py": CHECKPOINT_SCRIPT, "params.yaml": "foo: 1\n",
                                     "dvc.yaml": DVC_YAML, ".gitignore": "/foo\n"})


def _foo_of(project, rev: str) -> str:
    """The `foo` a row recorded, read from the DVC cache its dvc.lock names."""
    import yaml

    lock = yaml.safe_load(run(["git", "show", f"{rev}:dvc.lock"], project).stdout)
    md5 = next(o["md5"] for o in lock["stages"]["checkpoint-file"]["outs"]
               if o["path"] == "foo")
    return (project / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]).read_text()


def _rows(project) -> dict[str, str]:
    """{row name: foo} of dvc-dali's rows."""
    return {name: _foo_of(project, row["rev"]) for name, row in exp_rows(project).items()
            if "-step" in name}


def _refused(proc, *words):
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"not refused:\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]
    for word in words:
        assert word in out, f"{word!r} not said:\n{out[-3000:]}"


@pytest.fixture(scope="module")
def migrated(tmp_path_factory):
    """The fixture project refused as it is, then migrated and run once
    (`-n a`: rows a-step1, a-step2)."""
    project = _project(tmp_path_factory.mktemp("dvc2fixture"))
    # 1. As it is: DVC 3 never sets DVC_CHECKPOINT, so the script would train
    # nothing and exit 0; dvc_dali, imported by it, refuses before that.
    _refused(run(["dvc", "exp", "run"], project, check=False),
             "checkpoint-file", "dvc-dali migrate")
    assert _rows(project) == {}
    run([sys.executable, "-m", "dvc_dali.cli", "migrate"], project)
    commit_all(project, "migrate")
    run(["dvc", "exp", "run", "-n", "a"], project)
    assert _rows(project) == {"a-step1": "1", "a-step2": "2"}
    assert (project / "foo").read_text() == "2"
    return project


def test_as_is_then_migrated_trains_and_resumes(migrated):
    # DVC 2's test_resume_checkpoint: a second run continues the same run
    run(["dvc", "exp", "run"], migrated)
    assert _rows(migrated) == {"a-step1": "1", "a-step2": "2", "a-step3": "3", "a-step4": "4"}


def test_unchanged_applied_row_is_refused_then_carried(migrated):
    before = _rows(migrated)
    run(["dvc", "exp", "apply", "a-step1"], migrated)
    # 2. DVC 2: "Nothing to do for unchanged checkpoint"
    _refused(run(["dvc", "exp", "run"], migrated, check=False),
             "Nothing to do for an unchanged checkpoint", "a-step2")
    assert _rows(migrated) == before
    # 3. --temp with a changed param: resumes from the applied row (foo 1 -> 3)
    run(["dvc", "exp", "run", "--temp", "-S", "foo=2", "-n", "t"], migrated)
    rows = _rows(migrated)
    assert {k: v for k, v in rows.items() if k.startswith("t-")} == {
        "t-step2": "2", "t-step3": "3"}, rows
    # ... and a queued one, run later by the queue
    run(["dvc", "exp", "apply", "a-step1"], migrated)
    run(["dvc", "exp", "run", "--queue", "-S", "foo=3", "-n", "q"], migrated)
    run(["dvc", "queue", "start"], migrated)
    wait_queue(migrated, lambda s: s.get("q") == "Success", "queued run q done",
               lambda s: f"{s}")
    rows = _rows(migrated)
    assert {k: v for k, v in rows.items() if k.startswith("q-")} == {
        "q-step2": "2", "q-step3": "3"}, rows


def test_the_applied_run_is_continued_among_identical_ones(tmp_path):
    project = _project(tmp_path)
    run([sys.executable, "-m", "dvc_dali.cli", "migrate"], project)
    commit_all(project, "migrate")
    run(["dvc", "exp", "run", "-n", "a"], project)
    run([sys.executable, "-m", "dvc_dali.cli", "reset"], project)
    time.sleep(1.1)  # commit times have 1 s resolution: b's rows must be newer than a's
    run(["dvc", "exp", "run", "-n", "b"], project)
    rows = _rows(project)
    assert rows == {"a-step1": "1", "a-step2": "2", "b-step1": "1", "b-step2": "2"}
    # 4. a's and b's outputs are byte-identical: the applied row names the run
    run(["dvc", "exp", "apply", "a-step2"], project)
    run(["dvc", "exp", "run"], project)
    rows = _rows(project)
    assert set(rows) == {"a-step1", "a-step2", "a-step3", "a-step4", "b-step1", "b-step2"}, rows
    # killed-and-resumed style: the newest of the identical rows is the workspace's
    run(["dvc", "exp", "run"], project)
    assert {"a-step5", "a-step6"} <= set(_rows(project))


def test_dvc_dali_run_wrapper_refuses_an_unchanged_rerun_before_the_child(migrated):
    """`dvc-dali run` (what migrate wraps the command in) decides before the
    child starts: the script never runs, so `foo` keeps the applied row."""
    run(["dvc", "exp", "apply", "a-step1"], migrated)
    proc = run(["dvc", "exp", "run"], migrated, check=False)
    _refused(proc, "Nothing to do for an unchanged checkpoint")
    assert (migrated / "foo").read_text() == "1"
    assert subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "dvc.yaml"],
                          cwd=migrated).returncode == 0


def test_a_temp_run_that_read_its_state_too_early_is_refused_not_restarted(tmp_path):
    """A bare script in a stage without `checkpoint: true` (so `import
    dvc_dali` does not start the run): a --temp run has read its (absent)
    state before the first make_checkpoint(); refused there, not a silent
    restart from step 0."""
    project = _project(tmp_path)
    (project / "checkpoint.py").write_text(
        CHECKPOINT_SCRIPT.replace('if os.getenv("DVC_CHECKPOINT"):', "if True:"))
    (project / "dvc.yaml").write_text(DVC_YAML.replace(
        "        checkpoint: true\n", "        persist: true\n").replace(
        "    metrics:\n", "    always_changed: true\n    metrics:\n"))
    commit_all(project, "a DVC 3 stage, bare script")
    run(["dvc", "exp", "run", "-n", "a"], project)
    assert _rows(project) == {"a-step1": "1", "a-step2": "2"}
    _refused(run(["dvc", "exp", "run", "--temp", "-S", "foo=2", "-n", "t"], project,
                 check=False), "checkpoint: true", "nothing was recorded")
    assert _rows(project) == {"a-step1": "1", "a-step2": "2"}
