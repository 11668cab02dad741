"""Remotes for a project: a bare git repository as origin and a local
directory as the default DVC remote, and what reached them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.dvc_project import run
from tests.helpers.rows import row_refs


def with_remotes(project: Path, tmp_path: Path, auto_push: bool = True) -> tuple[Path, Path]:
    """origin: a bare git repo; the default DVC remote: a directory."""
    bare, store = tmp_path / "origin.git", tmp_path / "store"
    run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], tmp_path)
    run(["git", "remote", "add", "origin", str(bare)], project)
    run(["dvc", "remote", "add", "-d", "store", str(store)], project)
    if auto_push:
        run(["dvc", "config", "exp.auto_push", "true"], project)
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "remotes"], project)
    run(["git", "push", "-q", "origin", "main"], project)
    return bare, store


def remote_rows(bare: Path) -> dict[str, str]:
    """row name -> sha of the dvc-dali rows on the git remote."""
    return {name: sha for name, (_, sha) in row_refs(bare).items()}


def missing_data(bare: Path, store: Path, sha: str) -> list[str]:
    """The cached files a row's dvc.lock names that the DVC remote lacks:
    every stage's outputs (the data another stage made too), but those its
    dvc.yaml declares `cache: false` (metrics and plots: in git)."""
    import yaml

    def show(path: str) -> dict:
        return yaml.safe_load(run(["git", "show", f"{sha}:{path}"], bare).stdout)

    in_git = set()
    for stage in show("dvc.yaml")["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for out in stage.get(kind) or []:
                if isinstance(out, dict):
                    (path, opts), = out.items()
                    if isinstance(opts, dict) and opts.get("cache") is False:
                        in_git.add(path)

    def obj(md5: str) -> Path:
        return store / "files" / "md5" / md5[:2] / md5[2:]

    missing = []
    for entry in show("dvc.lock")["stages"].values():
        for out in entry.get("outs", []):
            if out["path"] in in_git:
                continue
            if not obj(out["md5"]).exists():
                missing.append(out["md5"])
            elif out["md5"].endswith(".dir"):
                for item in json.loads(obj(out["md5"]).read_text()):
                    if not obj(item["md5"]).exists():
                        missing.append(f"{out['path']}/{item['relpath']}")
    return missing
