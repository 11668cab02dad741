"""Read a checkpoint without resuming it: for evaluation, export and
downstream stages. No lock, no writes, no DALI, no messages.

    state = dvc_dali.load(rev="a-step40", names=["w"])
    state.step, state.arrays["w"], state.metadata, state.params, state.row

A row (or any git revision, of this repository or another: ``repo``) is
read through DVC's own filesystem (`dvc.api`), so its files come from the
workspace, the local cache or the DVC remote, without `dvc exp apply`;
only the files the chosen arrays need are fetched. Every check of a resume
applies to what is read (store.py).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import store
from .errors import ConfigError, DvcDaliError


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` read."""

    step: int
    arrays: dict[str, Any]
    metadata: dict[str, Any]
    params: dict[str, Any]  # the run's params as its Checkpointer recorded them
    row: str | None  # the row name ``rev`` named, else None
    total_steps: int | None = None
    path: str = ""
    manifest: dict[str, Any] = field(default_factory=dict, repr=False)


def _resolve(rev: str, repo: str | None) -> tuple[str, str | None]:
    """(git revision, row name): a row name is looked up among the recorded
    rows of ``repo`` (a local path); anything else is passed to git as is."""
    from .recording.rows import list_rows

    root = repo or str(_here())
    if os.path.isdir(root):
        named = [r for r in list_rows(root) if r["name"] == rev]
        if len(named) > 1:
            raise ConfigError(f"rev={rev!r}: {len(named)} rows have this name (on other "
                              f"baselines: {', '.join(r['sha'][:7] for r in named)}); pass "
                              "the commit instead")
        if named:
            return named[0]["sha"], rev
    return rev, None


def _here() -> Path:
    from .context import repo_root

    return repo_root() or Path.cwd()


def _fetch(fs: Any, src: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        fs.get_file(src, str(dest))
    except FileNotFoundError:
        raise DvcDaliError(f"{src}: not in the revision read, nor in the cache or the DVC "
                           "remote; is it the checkpoint output's path?") from None


def _copy_needed(fs: Any, path: str, dest: Path, names: list[str] | None) -> None:
    """LATEST, the manifests, and the files the chosen arrays need, from DVC's
    filesystem into ``dest`` (which then reads as a local checkpoint)."""
    _fetch(fs, f"{path}/{store.LATEST}", dest / store.LATEST)
    lines = (dest / store.LATEST).read_text(errors="replace").split("\n")
    snapshots = [line.split()[0] for line in lines if len(line.split()) == 2]
    for rel in snapshots:
        if ".." in rel.split("/") or rel.startswith("/"):
            break  # store.latest refuses it, naming the file
        _fetch(fs, f"{path}/{rel}/{store.MANIFEST}", dest / rel / store.MANIFEST)
    entries = store.latest(dest)  # checks LATEST's form before anything else is used
    if not entries:
        return
    rel, md5 = entries[0]
    manifest = store.read_manifest(dest / rel, md5)
    for member in store.needed_files(manifest, names):
        _fetch(fs, f"{path}/{rel}/{member}", dest / rel / member)


def load(path: str | os.PathLike = "checkpoint", *, rev: str | None = None,
         repo: str | os.PathLike | None = None, names: list[str] | None = None) -> Loaded:
    """Read the checkpoint at ``path`` (the stage's checkpoint output)
    read-only: of the workspace by default, else of ``rev`` (a row name or
    any git revision) in ``repo`` (a path or git URL; default this one).
    ``names``: only these arrays (only their files are read)."""
    names = None if names is None else list(names)
    repo_s = None if repo is None else os.fspath(repo)
    if rev is None and repo_s is None:
        return _loaded(store.read_arrays(Path(path), names), None)
    from dvc.api import DVCFileSystem  # DVC's public API: rows, caches and remotes

    git_rev, row = _resolve(rev, repo_s) if rev else ("HEAD", None)
    rel = os.fspath(path).strip("/")
    with tempfile.TemporaryDirectory(prefix="dvc-dali-load-") as tmp:
        try:  # DVC opens the revision lazily: its errors come with the first file
            _copy_needed(DVCFileSystem(repo_s or str(_here()), rev=git_rev), rel, Path(tmp),
                         names)
        except DvcDaliError:
            raise
        except Exception as exc:
            raise DvcDaliError(
                f"cannot read {rel} at revision {rev!r} of {repo_s or _here()}: {exc}. "
                "`dvc-dali show` lists the rows; `dvc exp pull <remote> <row>` fetches one "
                "from a remote.") from None
        return _loaded(store.read_arrays(Path(tmp), names), row, f"{rev}:{rel}")


def _loaded(snap: store.Snapshot, row: str | None, where: str = "") -> Loaded:
    manifest = snap.manifest
    run = manifest.get("run") or {}
    return Loaded(snap.step, dict(snap.arrays), dict(manifest.get("metadata") or {}),
                  dict(run.get("params") or {}), row, run.get("total_steps"),
                  where or str(snap.path), manifest)
