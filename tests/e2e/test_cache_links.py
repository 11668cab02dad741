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
import json
import os
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



def test_an_applied_row_of_a_bare_port_resumes_exactly(bare):
    """`dvc exp apply a-step1` (links into the cache), `dvc exp run`: the
    bare port resumes at step 1 and writes a-step2's pipeline state again,
    through no link: every cached object keeps its bytes, a-step1 applied
    still holds step 1."""
    run(["dvc", "exp", "apply", "a-step2"], bare)
    want = (bare / "checkpoint" / "pipeline.bin").read_bytes()
    run(["dvc", "exp", "apply", "a-step1"], bare)
    proc = run(["dvc", "exp", "run", "-n", "r"], bare, env={"DVC_DALI_RETRAIN": "1"})
    assert "start at 1" in proc.stdout and "r-step2" in row_names(bare), proc.stdout
    assert (bare / "checkpoint" / "pipeline.bin").read_bytes() == want
    assert damaged_objects(bare) == []
    run(["dvc", "exp", "apply", "a-step1"], bare)
    assert (bare / "checkpoint" / "step.txt").read_text() == "1"

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


def dvc_dali_cli(project: Path, *args: str):
    return run([sys.executable, "-m", "dvc_dali.cli", *args], project, check=False)


def test_doctor_verify_reads_a_symlinked_checkpoint(linked):
    """`dvc-dali doctor --verify` refused the workspace's checkpoint, and a
    row's, as damaged ("is a symlink") where DVC had left links into the
    cache; `dvc exp apply`, its fix, made the same links again."""
    assert (linked / "checkpoint" / "LATEST").is_symlink()
    proc = dvc_dali_cli(linked, "doctor", "--verify")
    assert proc.returncode == 0 and "checkpoint (workspace), pipeline 'train'" in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = dvc_dali_cli(linked, "doctor", "--verify", "a-step2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "a-step2, pipeline 'train': the 2 batches recorded after step 2 are reproduced " \
           "exactly" in proc.stdout, proc.stdout[-2000:]



WEIGHTS = ("import hashlib, json, sys, dvc_dali; ck = dvc_dali.load(**json.loads(sys.argv[1])); "
           "print(ck.step, hashlib.sha256(ck.arrays['w'].tobytes()).hexdigest())")


def weights(project: Path, **kwargs) -> tuple[int, str]:
    """(step, sha256 of the array w) of dvc_dali.load(**kwargs)."""
    step, digest = run([sys.executable, "-c", WEIGHTS, json.dumps(kwargs)], project
                       ).stdout.split()
    return int(step), digest


def test_an_applied_row_resumes_exactly_and_leaves_the_cache_intact(linked):
    """`dvc exp run`, `dvc exp apply a-step2` (links into the cache again),
    `dvc exp run`: it resumes at step 2 and trains a-step4's weights again,
    writing no cached object; the workspace is then links again."""
    run(["dvc", "exp", "apply", "a-step2"], linked)
    assert (linked / "checkpoint" / "LATEST").is_symlink()
    proc = run(["dvc", "exp", "run", "-n", "r"], linked, env={"DVC_DALI_RETRAIN": "1"})
    assert "resuming at step 2" in proc.stdout, proc.stdout[-3000:]
    assert weights(linked) == weights(linked, rev="a-step4")
    assert damaged_objects(linked) == []
    assert (linked / "checkpoint" / "LATEST").is_symlink()


def test_a_plain_run_resumes_from_a_symlinked_checkpoint_without_writing_the_cache(linked):
    """`python train.py` outside `dvc exp run`, the workspace's checkpoint
    links into the cache (as `dvc exp apply` and every run leave it): the
    Checkpointer refused it as damaged ("is a symlink"). It resumes, trains
    what the --temp run from the same step trained (a-step6), and its next
    snapshot is written beside the links, never through them: the objects
    they pointed to keep their bytes. So do the model's: the template's
    np.save of model/weights.npy wrote through DVC's link into the rows'
    cached model (a-step4's); it writes a new file and renames it now."""
    if "a-step6" not in row_names(linked):  # made by the --temp test above
        run(["dvc", "exp", "run", "--temp", "-n", "b", "-S", "train.steps=6"], linked)
    ck = linked / "checkpoint"
    targets = [Path(os.readlink(p)) for p in ck.rglob("*") if p.is_symlink()]
    assert targets and weights(linked)[0] == 4, targets
    params = linked / "params.yaml"
    params.write_text(params.read_text().replace("steps: 4", "steps: 6"))
    try:
        proc = run([sys.executable, "train.py"], linked, check=False)
    finally:
        run(["git", "checkout", "params.yaml"], linked)
    assert proc.returncode == 0 and "resuming at step 4" in proc.stdout, proc.stderr[-2000:]
    assert weights(linked) == weights(linked, rev="a-step6")
    assert not any(p.is_symlink() for p in ck.rglob("*"))
    assert [t for t in targets
            if hashlib.md5(t.read_bytes()).hexdigest() != t.parent.name + t.name] == []
    assert damaged_objects(linked) == []
