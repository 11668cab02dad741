"""Reading checkpoints without resuming them: `dvc_dali.load`, `dvc_dali.rows`
and `dvc-dali show --best`. Real `dvc exp run`, real DALI, real git remotes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dvc_dali
from dvc_dali import CheckpointCorruptError, ConfigError, DvcDaliError
from dvc_dali.format.store import PACK_BELOW

from tests.helpers.dvc_project import run, template_project
from tests.helpers.preempt import preemptible_project, start, trainer_ready
from tests.helpers.remotes import with_remotes
from tests.helpers.rows import cached_files, row_refs
from tests.helpers import child_env


def listing(path: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(path.rglob("*"))}


def test_load_reads_the_workspace_checkpoint_while_training_holds_it(tmp_path, monkeypatch):
    project = preemptible_project(tmp_path)
    proc = start(project, "-n", "a", "-S", "train.checkpoint_every=5", env={"PREEMPT_AT": "13"})
    pid = trainer_ready(project, proc)
    try:
        before = listing(project / "checkpoint")
        monkeypatch.chdir(project)
        state = dvc_dali.load()  # the trainer holds the directory's writer lock
        assert state.step == 10 and state.arrays["w"].shape == (256, 3)
        assert state.params["lr"] == 0.1 and state.row is None  # the template passes params=
        assert listing(project / "checkpoint") == before  # nothing written
    finally:
        os.kill(pid, signal.SIGKILL)
        proc.communicate()


def test_load_imports_no_dali_and_prints_nothing(tmp_path):
    project = template_project(tmp_path)
    run(["dvc", "exp", "run", "-n", "a"], project)
    code = ("import sys, dvc_dali; s = dvc_dali.load(); "
            "print(s.step, 'nvidia.dali' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True,
                         text=True, env=child_env(), check=True)
    assert out.stdout.split() == ["20", "False"] and out.stderr == "", out.stderr


@pytest.fixture
def finished(tmp_path) -> Path:
    project = template_project(tmp_path)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project)
    return project


def test_load_a_row_by_name_after_applying_another(finished, monkeypatch):
    monkeypatch.chdir(finished)
    run(["dvc", "exp", "apply", "a-step5"], finished)
    state = dvc_dali.load(rev="a-step15")
    assert (state.step, state.row) == (15, "a-step15")
    assert dvc_dali.load().step == 5  # the workspace is untouched
    run(["dvc", "exp", "apply", "a-step15"], finished)
    np.testing.assert_array_equal(state.arrays["w"], dvc_dali.load().arrays["w"])
    with pytest.raises(DvcDaliError, match="nosuch"):
        dvc_dali.load(rev="nosuch")


def test_load_of_a_revision_refuses_what_names_nothing_and_names_the_row_it_read(
        finished, monkeypatch):
    """rev='' read HEAD's checkpoint; names='w' was split into letters; an
    absolute path with rev was read as a relative one; a file missing from
    a revision raised a private class without naming it; a damaged cache
    object was named by a temporary path already gone, with resume advice
    (`dvc exp apply` checks out the same bytes)."""
    monkeypatch.chdir(finished)
    with pytest.raises(ConfigError, match=r"load\(rev=''\): an empty revision names nothing"):
        dvc_dali.load(rev="")
    with pytest.raises(ConfigError, match=r"names is a list of array names, e.g. names=\['w'\]"):
        dvc_dali.load(rev="a-step5", names="w")
    with pytest.raises(ConfigError, match="path inside the project"):
        dvc_dali.load(str(finished / "checkpoint"), rev="a-step5")
    with pytest.raises(DvcDaliError) as err:
        dvc_dali.load(rev="HEAD")  # the commit before any run: no checkpoint in it
    assert type(err.value) is DvcDaliError and "revision 'HEAD'" in str(err.value), err.value
    sha = dict((name, sha) for name, (_, sha) in row_refs(finished).items())["a-step5"]
    pack = next(obj for name, obj in cached_files(finished, sha).items()
                if name.endswith(".pack") or name.endswith(".npy"))
    data = bytearray(pack.read_bytes())
    data[-1] ^= 0xFF
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError) as err:
        dvc_dali.load(rev="a-step5")
    text = str(err.value)
    assert "a-step5:checkpoint/step-" in text and "dvc-dali-load-" not in text, text
    assert "damaged in the DVC cache" in text and "dvc exp apply" not in text, text


def test_load_a_row_from_a_fresh_clone_fetches_its_data_on_demand(tmp_path):
    project = template_project(tmp_path)
    bare, store = with_remotes(project, tmp_path, auto_push=False)
    run(["dvc", "exp", "run", "-n", "a", "-S", "train.checkpoint_every=5"], project)
    run(["dvc-dali", "push", "origin", "a"], project)
    fresh = tmp_path / "fresh"
    run(["git", "clone", "-q", str(bare), str(fresh)], tmp_path)
    run(["dvc", "exp", "pull", "--no-cache", "origin", "a-step10"], fresh)
    def cached() -> list[Path]:  # DVC's cache names its files by hash, not by ours
        return [p for p in (fresh / ".dvc" / "cache").rglob("*")
                if p.is_file() and not p.name.endswith(".dir")]

    assert not cached(), "data came with the ref"
    state = dvc_dali.load(rev="a-step10", repo=fresh)
    assert (state.step, state.row) == (10, "a-step10")
    mine = dvc_dali.load(rev="a-step10", repo=project)
    np.testing.assert_array_equal(state.arrays["w"], mine.arrays["w"])


W = np.arange(PACK_BELOW // 8, dtype=np.float64)


def two_arrays(tmp_path: Path) -> Path:
    # rng=False: the files are the user's arrays only (no generator state)
    ck = dvc_dali.Checkpointer(tmp_path / "ck", rng=False)
    # w: 1 MiB, a file of its own; opt's two small arrays share a pack
    ck.save(3, arrays={"w": W, "opt": {"m": np.ones(4), "v": np.zeros(4)}},
            metadata={"lr": 0.5})
    ck.close()
    return tmp_path / "ck"


def test_load_of_some_names_reads_only_their_files(tmp_path):
    ck = two_arrays(tmp_path)
    manifest = json.loads(next(ck.glob("step-*/manifest.json")).read_text())
    w_file = manifest["array_files"][manifest["arrays"]["w"]["array"]]["file"]
    opt_files = {ck / next(ck.glob("step-*")).name / info["file"]
                 for info in manifest["array_files"] if info["file"] != w_file}
    assert [p.name for p in opt_files] == ["00000.pack"] and w_file.endswith(".npy")
    w_bytes = (ck / next(ck.glob("step-*")).name / w_file).read_bytes()
    (ck / next(ck.glob("step-*")).name / w_file).write_bytes(b"garbage")  # w's file damaged:
    opt = dvc_dali.load(ck, names=["opt"]).arrays["opt"]  # opt alone still reads
    assert opt["m"].tolist() == [1.0] * 4 and opt["v"].tolist() == [0.0] * 4
    (ck / next(ck.glob("step-*")).name / w_file).write_bytes(w_bytes)
    for path in opt_files:  # opt's pack damaged: w alone still reads
        path.write_bytes(b"garbage")
    state = dvc_dali.load(ck, names=["w"])
    assert list(state.arrays) == ["w"] and state.metadata == {"lr": 0.5}
    np.testing.assert_array_equal(state.arrays["w"], W)
    with pytest.raises(CheckpointCorruptError):
        dvc_dali.load(ck)
    with pytest.raises(ConfigError, match="no arrays named"):
        dvc_dali.load(ck, names=["nosuch"])


def test_load_refuses_a_hostile_checkpoint_with_a_typed_error(tmp_path):
    ck = two_arrays(tmp_path)
    manifest = next(ck.glob("step-*/manifest.json"))
    text = manifest.read_text()
    assert '"step":3,' in text
    manifest.write_text(text.replace('"step":3,', '"step":-3,'))
    with pytest.raises(CheckpointCorruptError, match="manifest.json"):
        dvc_dali.load(ck)
    with pytest.raises(CheckpointCorruptError, match="holds no dvc-dali checkpoint"):
        dvc_dali.load(tmp_path)


def test_rows_and_show_best(finished, monkeypatch):
    monkeypatch.chdir(finished)
    found = dvc_dali.rows("a")
    assert [r["step"] for r in found] == [5, 10, 15, 20]
    assert found[0]["params"]["train.lr"] == 0.1 and "train/loss" in found[0]["metrics"]
    best = dvc_dali.best_row(found, "train/loss:min")
    assert best["metrics"]["train/loss"] == min(r["metrics"]["train/loss"] for r in found)
    out = run(["dvc-dali", "show", "--best", "train/loss:min"], finished).stdout
    assert f"best by train/loss:min: {best['name']} (step {best['step']}" in out, out
    # loaded by its ref: a name can repeat on another commit, a ref cannot
    assert "★ best" in out and f"dvc_dali.load(rev='{best['ref']}')" in out
    # DVC's own experiment `a` (committed when `dvc exp run` ended) is the last
    # row's state, marked as such rather than shown as another state
    assert [r["dvc_experiments"] for r in found] == [[], [], [], ["a"]]
    assert "a-step20" in out and "(= DVC's experiment a)" in out.split("a-step20")[1].split(
        "\n")[0], out
    bad = run(["dvc-dali", "show", "--best", "loss"], finished, check=False)
    assert bad.returncode == 1 and "'<metric>:max' or '<metric>:min'" in bad.stderr


def test_a_dvc_project_below_the_git_top_reads_its_rows(tmp_path):
    """`dvc init --subdir` (a monorepo): the rows' files sit under the
    project's directory in their commits. show reads their metrics, --best
    and retention find them, load and doctor --verify read a row."""
    top = tmp_path / "mono"
    top.mkdir()
    run(["git", "init", "-q", "-b", "main"], top)
    run(["git", "config", "user.email", "test@example.invalid"], top)
    run(["git", "config", "user.name", "test"], top)
    project = top / "ml"
    project.mkdir()
    run([sys.executable, "-m", "dvc", "init", "-q", "--subdir"], project)
    run([sys.executable, "-m", "dvc_dali.cli", "init", "--digits"], project)
    params = project / "params.yaml"
    params.write_text(params.read_text().replace("steps: 100", "steps: 30"))
    run(["git", "add", "-A"], top)
    run(["git", "commit", "-qm", "start"], top)
    # keep the last row and the worst: retention reads each row's metrics
    run(["dvc", "exp", "run", "-n", "a"], project,
        env={"DVC_DALI_KEEP_LAST": "1", "DVC_DALI_KEEP_BEST": "train/loss:max"})
    rows = {r["name"]: r for r in dvc_dali.rows(repo=project)}
    assert set(rows) == {"a-step10", "a-step30"}, rows
    assert all("train/loss" in r["metrics"] for r in rows.values()), rows
    shown = run([sys.executable, "-m", "dvc_dali.cli", "show", "--best", "train/loss:min"],
                project)
    assert "best by train/loss:min: a-step30 (step 30" in shown.stdout, shown.stdout
    assert "(= DVC's experiment a)" in shown.stdout, shown.stdout
    assert dvc_dali.load(rev="a-step10", repo=project).step == 10
    verified = run([sys.executable, "-m", "dvc_dali.cli", "doctor", "--verify", "a-step10"],
                   project, check=False)
    assert "ok   a-step10, pipeline 'train': the 10 batches recorded after step 10 are " \
           "reproduced exactly" in verified.stdout, verified.stdout + verified.stderr
    odd = subprocess.run([sys.executable, "-m", "dvc_dali.cli", "doctor", "--verify",
                          b"\xff"], cwd=project, capture_output=True, text=True,
                         env=child_env())  # a row name of non-UTF-8 bytes: codec text
    assert "no row named '\\xff': row names are UTF-8 text" in odd.stderr, odd.stderr
    (top / ".git" / "index.lock").write_text("")  # git's, at the top: doctor looks there
    doctor = run([sys.executable, "-m", "dvc_dali.cli", "doctor"], project / "data", check=False)
    assert doctor.returncode == 1
    assert f"{top / '.git' / 'index.lock'}: a git lock left by a killed" in doctor.stdout, \
        doctor.stdout
