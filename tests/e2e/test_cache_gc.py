"""`dvc gc` between runs: which rows keep their data, and what reading or
resuming a row whose data is gone says.

Rows are DVC experiments: `dvc gc -w` deletes the data of every row but the
workspace's, `--all-experiments` keeps it. `load` of a row whose data went
said DVC's words ("failed to load directory ('checkpoint',)"), or, for one
file gone, asked whether the path was the checkpoint output's; now one line
saying the data is in neither the cache nor the remote, that `dvc gc` does
that, and how to fetch it. A resume from such a row is refused, naming it.
Real `dvc exp run` and `dvc gc` in one git + DVC project (the `dvc-dali
init` template), shared by the tests of this module, in order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.dvc_project import commit_all, run, template_project
from tests.helpers.rows import exp_refs

LOAD = "import json, sys, dvc_dali; print(dvc_dali.load(**json.loads(sys.argv[1])).step)"


def load(project: Path, **kwargs) -> tuple[bool, str]:
    """(whether it loaded, what it printed) of dvc_dali.load(**kwargs) in a
    process of its own."""
    proc = run([sys.executable, "-c", LOAD, json.dumps(kwargs)], project, check=False)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def gone(text: str) -> None:
    """One line, no traceback: the data is in neither place, `dvc gc` may
    have removed it, and `dvc-dali pull` fetches it."""
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert "in neither the local DVC cache nor the DVC remote" in text, text
    assert "`dvc gc`" in text and "`dvc-dali pull <git remote> <run>`" in text, text


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The template after a workspace run `a` to step 4, a row every 2 steps
    (the workspace holds a-step4)."""
    project = template_project(tmp_path_factory.mktemp("gc"), steps=4)
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("checkpoint_every: 10", "checkpoint_every: 2"))
    commit_all(project, "a row every 2 steps")
    run(["dvc", "exp", "run", "-n", "a"], project)
    return project


def cached_files(project: Path, row: str) -> list[Path]:
    """The cache objects of the row's checkpoint output: its listing, then
    its files (LATEST first), whether the cache holds them or not."""
    ref = next(ref for _, ref in exp_refs(project) if ref.endswith(f"/{row}"))
    lock = yaml.safe_load(run(["git", "show", f"{ref}:dvc.lock"], project).stdout)
    listing = next(out["md5"] for out in lock["stages"]["train"]["outs"]
                   if out["path"] == "checkpoint")
    cache = project / ".dvc" / "cache" / "files" / "md5"
    files = sorted(json.loads((cache / listing[:2] / listing[2:]).read_text()),
                   key=lambda f: f["relpath"] != "LATEST")
    return [cache / md5[:2] / md5[2:] for md5 in [listing] + [f["md5"] for f in files]]


def test_gc_of_all_experiments_keeps_every_rows_data(project):
    """Checked in the cache, not by loading: a row read once has its listing
    in DVC's index, and the next test reads a-step2 for the first time."""
    run(["dvc", "gc", "-w", "--all-experiments", "-f"], project)
    assert all(path.is_file() for path in cached_files(project, "a-step2"))


def test_a_row_whose_data_gc_removed_is_named_by_load_and_not_resumed(project):
    run(["dvc", "gc", "-w", "-f"], project)
    assert load(project, rev="a-step4") == (True, "4")  # the workspace's: kept
    loaded, text = load(project, rev="a-step2")
    assert not loaded and "a-step2" in text, text
    gone(text)
    run(["dvc", "exp", "apply", "a-step2"], project, check=False)  # "Is your cache up to date?"
    proc = run(["dvc", "exp", "run", "-n", "b", "-S", "train.steps=6"], project, check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "starting" not in proc.stdout, said[-3000:]
    assert "of row a-step2" in said and "neither in the workspace nor in the DVC cache" in said
    assert not any(ref.rsplit("/", 1)[-1].startswith("b-") for _, ref in exp_refs(project))


def test_a_row_missing_one_file_is_named_by_load(project):
    """One object of the row gone from the cache (not its listing, which DVC
    also keeps in its index once read): the file the revision names and
    cannot be had, in the same words: a file of the snapshot, then LATEST."""
    listing, latest, *files = cached_files(project, "a-step4")
    member = next(f for f in files if f.is_file())
    for gone_now in (member, latest):
        gone_now.unlink()
        loaded, text = load(project, rev="a-step4")
        assert not loaded and "the revision names it" in text, text
        gone(text)


def test_doctor_names_the_rows_whose_data_gc_removed(project):
    """`dvc-dali show` lists every row, the data `dvc gc -w` removed or not,
    and `doctor` said nothing of it: a row looked as good to apply or resume
    as any. Doctor now names the rows the local cache lacks (a-step2 by gc,
    a-step4 by the files the test above removed), as a note."""
    proc = run([sys.executable, "-m", "dvc_dali.cli", "doctor"], project, check=False)
    said = [line for line in proc.stdout.splitlines() if line.startswith("--   rows:")]
    assert len(said) == 1 and "lacks the checkpoint data of 2 of 2 (a-step2, a-step4)" in said[0] \
        and "`dvc-dali pull <git remote> <run>`" in said[0], proc.stdout[-3000:]
