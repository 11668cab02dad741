"""dvc_door.shown_address: a stage as `dvc exp run` and `dvc pull` take it
from the repository's root, whatever the current directory. DVC's own
``addressing`` is relative to the current directory, which in a stage's
process is its ``wdir``: messages named a stage in `wdir: a` as
'../dvc.yaml:ta'. Real DVC stages of a real repository."""

from __future__ import annotations

from dvc.repo import Repo

from dvc_dali.recording import dvc_door
from tests.helpers.dvc_project import make_project

STAGE = "    cmd: echo {name}\n    wdir: {wdir}\n    outs:\n      - {name}.out\n"


def test_a_stage_is_named_from_the_root_whatever_its_wdir_and_the_cwd(tmp_path, monkeypatch):
    project = make_project(tmp_path / "p", files={
        "a/.keep": "", "sub/b/.keep": "",
        "dvc.yaml": "stages:\n  top:\n" + STAGE.format(name="top", wdir=".")
                    + "  ta:\n" + STAGE.format(name="ta", wdir="a"),
        "sub/dvc.yaml": "stages:\n  tb:\n" + STAGE.format(name="tb", wdir="b")})
    want = {"top": "top", "ta": "ta", "tb": "sub/dvc.yaml:tb"}
    for cwd in (project, project / "a", project / "sub" / "b"):
        monkeypatch.chdir(cwd)  # a stage's process runs in its wdir
        with Repo(str(project)) as repo:
            got = {s.name: dvc_door.shown_address(s) for s in dvc_door.named_stages(repo)}
        assert got == want, (cwd, got)
        if cwd != project:  # DVC's own names them from the cwd: what this replaces
            with Repo(str(project)) as repo:
                assert any(s.addressing.startswith("..") for s in dvc_door.named_stages(repo))
