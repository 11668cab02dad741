"""`dvc-dali show`, `rows()` and `load` against real `dvc exp run` projects:
DVC's own experiments named on the right row only, --metrics-file refused
where no row can hold it, the API refusing outside a DVC project as the CLI
does, and a row recorded before `dvc remote add` loaded from the DVC remote."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

import dvc_dali
from dvc_dali.core.errors import ConfigError, DvcDaliError

from tests.e2e.test_cli import shell_project
from tests.helpers.dvc_project import commit_all, make_project, run

DVC_DALI = [sys.executable, "-m", "dvc_dali.cli"]


@pytest.fixture(scope="module")
def two_baselines(tmp_path_factory) -> Path:
    """The shell trainer (same files at each step, whatever the run) run as
    sh1 on one commit, then, started over, as sh2 on the next: the rows of each step hold
    the same outputs on two baselines, and DVC's experiments sh1 and sh2
    those of step 3."""
    project = shell_project(tmp_path_factory.mktemp("show") / "p")
    run(["dvc", "exp", "run", "-n", "sh1"], project)
    (project / "NOTES.md").write_text("# notes\n")
    run(["git", "add", "NOTES.md"], project)  # not sh1's dvc.lock: sh2 is no resume of it
    run(["git", "commit", "-q", "-m", "notes"], project)
    shutil.rmtree(project / "checkpoint")  # started over: a new run, not sh1 resumed
    (project / "dvc.lock").unlink()
    # and on purpose: else a run whose recorded checkpoint is gone is refused
    run([*DVC_DALI, "reset"], project)
    run(["dvc", "exp", "run", "-n", "sh2"], project)
    return project


def marks(text: str) -> dict[str, str]:
    """{row name: what its line says after "(= DVC's experiment "}."""
    found = {}
    for line in text.splitlines():
        if " step " in line:
            name = line.split()[3]
            found[name] = line.split("(= DVC's experiment ")[1].rstrip(")") if \
                "(= DVC's experiment " in line else ""
    return found


def test_dvc_experiments_are_named_on_their_own_baseline_only(two_baselines):
    text = run([*DVC_DALI, "show"], two_baselines).stdout
    assert marks(text) == {"sh1-step1": "", "sh1-step2": "", "sh1-step3": "sh1",
                           "sh2-step1": "", "sh2-step2": "", "sh2-step3": "sh2"}, text
    found = {r["name"]: r["dvc_experiments"] for r in dvc_dali.rows(repo=two_baselines)}
    assert found["sh1-step3"] == ["sh1"] and found["sh2-step3"] == ["sh2"], found


def test_show_of_one_run_takes_no_other_run_row_for_dvc_s_experiment(two_baselines):
    text = run([*DVC_DALI, "show", "sh2"], two_baselines).stdout
    assert marks(text) == {"sh2-step1": "", "sh2-step2": "", "sh2-step3": "sh2"}, text
    found = dvc_dali.rows("sh1", repo=two_baselines)
    assert [r["dvc_experiments"] for r in found] == [[], [], ["sh1"]], found


def test_two_rows_with_the_same_outputs_only_the_newest_is_dvc_s_experiment(two_baselines):
    """`make_checkpoint` twice at one step with nothing changed: two rows,
    the same outputs; DVC's experiment is the run's end, the second one."""
    last = run(["git", "for-each-ref", "--format=%(objectname) %(refname)",
                "refs/exps/*/*/sh2-step3"], two_baselines).stdout.split()
    message = run(["git", "log", "-1", "--format=%B", last[0]], two_baselines).stdout
    twin_message = message.replace("parent=", f"parent={last[0]} was=")
    tree = run(["git", "rev-parse", f"{last[0]}^{{tree}}"], two_baselines).stdout.strip()
    base = run(["git", "rev-parse", f"{last[0]}^"], two_baselines).stdout.strip()
    # recorded after it: a row's commit time may run ahead of the clock (rows
    # of one second get the next seconds), so the twin's is set past it
    after = int(run(["git", "log", "-1", "--format=%ct", last[0]], two_baselines).stdout) + 1
    twin = run(["git", "commit-tree", tree, "-p", base, "-m", twin_message], two_baselines,
               env={"GIT_COMMITTER_DATE": f"{after} +0000", "GIT_AUTHOR_DATE": f"{after} +0000"}
               ).stdout.strip()
    ref = last[1] + "-again"
    run(["git", "update-ref", ref, twin], two_baselines)
    try:
        text = run([*DVC_DALI, "show", "sh2"], two_baselines).stdout
        assert marks(text) == {"sh2-step1": "", "sh2-step2": "", "sh2-step3": "",
                               "sh2-step3-again": "sh2"}, text
    finally:
        run(["git", "update-ref", "-d", ref], two_baselines)


def test_a_metrics_file_no_row_holds_or_outside_the_project_is_refused(two_baselines):
    for path in ("nosuch.json", "/etc/passwd", "../outside.json"):
        out = run([*DVC_DALI, "show", "--metrics-file", path], two_baselines, check=False)
        assert out.returncode == 1 and out.stdout == "", (path, out.stdout)
        assert out.stderr.startswith("dvc-dali show: ") and out.stderr.count("\n") == 1, \
            out.stderr
        assert "cat-file" not in out.stderr and path in out.stderr, out.stderr
    assert "is outside the DVC project" in out.stderr
    # the file the shell trainer writes: held by every row (its only number is the step)
    held = run([*DVC_DALI, "show", "--metrics-file", "metrics.json"], two_baselines)
    assert "sh2-step3" in held.stdout
    with pytest.raises(ConfigError, match="outside the DVC project"):
        dvc_dali.rows(repo=two_baselines, metrics_file="/etc/passwd")


def test_the_api_refuses_outside_a_dvc_project_as_the_cli_does(tmp_path, monkeypatch):
    """A monorepo's git top, above `dvc init --subdir`: no rows read with
    paths that miss, no "not in the revision read"."""
    top = tmp_path / "mono"
    make_project(top, dvc_init=False, files={"README": "top\n"})
    project = top / "ml"
    project.mkdir()
    run([sys.executable, "-m", "dvc", "init", "-q", "--subdir"], project)
    commit_all(top, "dvc")
    monkeypatch.chdir(top)
    cli = run([*DVC_DALI, "show"], top, check=False)
    assert cli.returncode == 1 and "not inside a DVC repository" in cli.stderr
    for call in (dvc_dali.rows, lambda: dvc_dali.load(rev="HEAD")):
        with pytest.raises(DvcDaliError, match="not inside a DVC repository") as got:
            call()
        assert str(top) in str(got.value) and "run inside the DVC project" in str(got.value)
        assert "\n" not in str(got.value)


TRAIN = """\
import numpy as np
import dvc_dali

ck = dvc_dali.Checkpointer("checkpoint", params={"a": 1}, total_steps=2)
live = ck.live()
for step in range(ck.step + 1, 3):
    live.step = step
    live.log_metric("m", float(step))
    live.next_step()
    ck.make_checkpoint(step, arrays={"w": np.full(2, float(step))})
"""

STAGE = """\
stages:
  train:
    cmd: python train.py
    deps: [train.py]
    outs:
      - checkpoint:
          persist: true
    metrics:
      - dvclive/metrics.json:
          cache: false
          persist: true
    always_changed: true
"""


def test_load_reads_a_row_recorded_before_the_dvc_remote_was_added(tmp_path):
    """The row's commit has a .dvc/config naming no remote: DVC's filesystem
    of that commit finds none; load reads with the workspace's, as
    `dvc-dali pull` does."""
    project = make_project(tmp_path / "p", files={"train.py": TRAIN, "dvc.yaml": STAGE})
    origin = tmp_path / "origin.git"
    run(["git", "init", "-q", "--bare", str(origin)], tmp_path)
    run(["git", "remote", "add", "origin", str(origin)], project)
    run(["dvc", "exp", "run", "-n", "a"], project)
    run(["dvc", "remote", "add", "-d", "store", str(tmp_path / "store")], project)
    commit_all(project, "remote")
    run(["git", "push", "-q", "origin", "HEAD:main"], project)
    run([*DVC_DALI, "push", "origin", "a"], project)
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", "-b", "main", str(origin), str(clone)], tmp_path)
    run(["git", "fetch", "-q", "origin", "refs/exps/*:refs/exps/*"], clone)
    read = ("import dvc_dali; s = dvc_dali.load(rev='a-step2'); "
            "print(s.step, s.arrays['w'].tolist())")
    out = run([sys.executable, "-c", read], clone, check=False)
    assert out.returncode == 0 and out.stdout == "2 [2.0, 2.0]\n", out.stderr


def test_a_name_reused_for_a_new_run_from_step_0_is_shown_as_a_run_of_its_own(tmp_path):
    """`dvc exp run -f -n n` with other params after n finished: a new run from
    step 0 whose rows were drawn in n's list after n-step4, as if they went
    on from it (found by a sweep)."""
    from tests.helpers.dvc_project import template_project

    project = template_project(tmp_path, steps=4)
    run(["dvc", "exp", "run", "-n", "n", "-S", "train.checkpoint_every=2"], project)
    again = run(["dvc", "exp", "run", "-f", "-n", "n", "-S", "train.lr=0.07"], project)
    assert "starting a new run from step 0" in again.stdout + again.stderr
    shown = run(["dvc-dali", "show", "n"], project).stdout
    headers = [line for line in shown.splitlines() if line.startswith("n  (baseline")]
    assert len(headers) == 2 and all("2 checkpoints" in h for h in headers), shown
