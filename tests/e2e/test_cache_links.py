"""`dvc config cache.type hardlink` or `symlink`: the DVC cache linked into
the places a checkpoint is read and written.

DVC checks a persisted output out as links into the cache and unprotects
(copies) it before a workspace run; a `--temp` or queued run gets its
checkpoint from dvc-dali's carry, which checked it out as links and left
them: a script that rewrites its checkpoint files in place (a bare DVC 2
port) wrote through them into the cached objects of the rows before, a
silently wrong older row (as root; others got a PermissionError), and a
`Checkpointer` refused the symlinks as a damaged checkpoint. `load` of a
row, and of the workspace after a run or `dvc exp apply`, refused the
symlinks DVC's own checkout made. Real `dvc exp run` in git + DVC projects,
a real DALI pipeline over PNG files.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from tests.e2e.test_lost_lock import BARE_STAGE, BARE_TRAIN, row_names
from tests.helpers.dvc_project import commit_all, run, template_project


def damaged_objects(project: Path) -> list[str]:
    """The DVC cache's file objects whose bytes no longer have the md5 they
    are stored under (a write through a link into the cache)."""
    top = project / ".dvc" / "cache" / "files" / "md5"
    return [str(obj) for obj in top.glob("??/*") if not obj.name.endswith(".dir")
            and hashlib.md5(obj.read_bytes()).hexdigest() != obj.parent.name + obj.name]


@pytest.fixture(scope="module", params=["hardlink", "symlink"])
def bare(request, tmp_path_factory) -> Path:
    """A bare make_checkpoint() port (it rewrites checkpoint/step.txt and
    pipeline.bin in place) after a workspace run `a` to step 2, its cache
    linked."""
    project = template_project(tmp_path_factory.mktemp(f"bare-{request.param}"), steps=2)
    (project / "train.py").write_text(BARE_TRAIN)
    (project / "dvc.yaml").write_text(BARE_STAGE)
    commit_all(project, "a bare port")
    run(["dvc", "config", "--local", "cache.type", request.param], project)
    run(["dvc", "exp", "run", "-n", "a"], project)
    assert {"a-step1", "a-step2"} <= row_names(project)
    return project


def test_a_temp_run_resumed_from_a_linked_cache_leaves_older_rows_intact(bare):
    """The --temp run resumes at step 2 and trains to 4; every cached object
    keeps its bytes, and a-step2 applied holds step 2, not the later state."""
    proc = run(["dvc", "exp", "run", "--temp", "-n", "b", "-S", "train.steps=4"], bare)
    assert "start at 2" in proc.stdout and "b-step4" in row_names(bare), proc.stdout
    assert damaged_objects(bare) == []
    run(["dvc", "exp", "apply", "a-step2"], bare)
    assert (bare / "checkpoint" / "step.txt").read_text() == "2"


def test_a_scripts_own_latest_file_is_not_linked_into_the_cache(tmp_path):
    """dvc-dali hard-links its snapshot files into a hardlink cache (never
    modified once published); it told its checkpoint directory by a file
    named LATEST. A bare script that keeps its step in its own
    checkpoint/LATEST, rewritten in place, rewrote a-step1's cached objects:
    a-step1 applied held step 2. Copied now, as DVC would."""
    project = template_project(tmp_path, steps=2)
    (project / "train.py").write_text(BARE_TRAIN.replace('"checkpoint/step.txt"',
                                                         '"checkpoint/LATEST"'))
    (project / "dvc.yaml").write_text(BARE_STAGE)
    commit_all(project, "a bare port that names its step file LATEST")
    run(["dvc", "config", "--local", "cache.type", "hardlink"], project)
    run(["dvc", "exp", "run", "-n", "a"], project)
    assert damaged_objects(project) == []
    run(["dvc", "exp", "apply", "a-step1"], project)
    assert (project / "checkpoint" / "LATEST").read_text() == "1"


@pytest.fixture(scope="module")
def linked(tmp_path_factory) -> Path:
    """The `dvc-dali init` template (a Checkpointer), `cache.type symlink`,
    after a workspace run `a` to step 4, a row every 2 steps."""
    project = template_project(tmp_path_factory.mktemp("symlink"), steps=4)
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("checkpoint_every: 10", "checkpoint_every: 2"))
    commit_all(project, "a row every 2 steps")
    run(["dvc", "config", "--local", "cache.type", "symlink"], project)
    run(["dvc", "exp", "run", "-n", "a"], project)
    return project


LOAD = "import json, sys, dvc_dali; print(dvc_dali.load(**json.loads(sys.argv[1])).step)"


def test_rows_and_the_workspace_load_from_a_symlinked_cache(linked):
    """DVC's filesystem hands a row's files over as links into the cache, and
    DVC's last commit of the run left the workspace's as links: both load."""
    assert (linked / "checkpoint" / "LATEST").is_symlink()  # what DVC left
    for args, step in (('{"rev": "a-step2"}', "2"), ("{}", "4"), ('{"names": ["w"]}', "4")):
        proc = run([sys.executable, "-c", LOAD, args], linked, check=False)
        assert proc.returncode == 0 and proc.stdout.split() == [step], proc.stderr[-2000:]


def test_a_temp_run_resumes_from_a_symlinked_cache(linked):
    """The Checkpointer refused the carried checkpoint as damaged (its files
    were symlinks); it resumes, continuing run a (more steps), and the cache
    keeps every object's bytes."""
    proc = run(["dvc", "exp", "run", "--temp", "-n", "b", "-S", "train.steps=6"], linked)
    assert "resuming at step 4" in proc.stdout, proc.stdout[-3000:]
    assert "a-step6" in row_names(linked) and damaged_objects(linked) == []
