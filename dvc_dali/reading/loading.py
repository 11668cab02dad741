"""Read a checkpoint without resuming it: for evaluation, export and
downstream stages. No lock, no writes, no DALI, no messages.

    state = dvc_dali.load(rev="a-step40", names=["w"])
    state = dvc_dali.load(rev=row)      # a row from dvc_dali.rows(), or its ref
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
from typing import TYPE_CHECKING, Any, Mapping

from ..format import manifest_schema, store
from ..core.arguments import check_path, kind_of, shown
from ..core.checked_calls import checked_call
from ..core.errors import (ArgumentError, ArgumentTypeError, CheckpointCorruptError,
                           ConfigError, DvcDaliError)

if TYPE_CHECKING:
    from .exp_refs import Row


@dataclass(frozen=True)
class Loaded:
    """What `load` read: a checkpoint, not resumed.

    Attributes:
        step: the checkpoint's step.
        arrays: its arrays by name (as `Checkpointer.save` took them; the
            random generators' ``~dvc_dali.rng`` too).
        metadata: its JSON metadata.
        params: the run's params as its `Checkpointer` recorded them.
        row: the row name ``rev`` named, else None.
        total_steps: the run's ``total_steps`` as recorded, else None.
        path: where the checkpoint was read from.
        manifest: its ``manifest.json`` (see the on-disk format).
        ref: that row's full ref (``refs/exps/...``), else None.
    """

    step: int
    arrays: dict[str, Any]
    metadata: dict[str, Any]
    params: dict[str, Any]  # the run's params as its Checkpointer recorded them
    row: str | None  # the row name ``rev`` named, else None
    total_steps: int | None = None
    path: str = ""
    manifest: dict[str, Any] = field(default_factory=dict, repr=False)
    ref: str | None = None  # that row's full ref (refs/exps/...), else None


def _resolve(rev: str | Mapping[str, Any], repo: str | None
             ) -> tuple[str, Row | None, str]:
    """(git revision, row, repository to read): a row (a dict from
    dvc_dali.rows()), a row's ref, sha or name is looked up among the
    recorded rows (row_queries.rows_root: under `dvc exp run` DVC_ROOT's);
    anything else is passed to git as is, in ``repo`` (default this one)."""
    from .exp_refs import list_rows
    from .row_queries import matching_rows, rows_root, the_row

    root = rows_root(repo)
    if isinstance(rev, Mapping):
        if not isinstance(rev.get("sha"), str):
            raise ConfigError(f"rev={dict(rev)!r}: a row needs its 'sha'; pass a row from "
                              "dvc_dali.rows(), its ref or a git revision")
        known = matching_rows(list_rows(root), dict(rev)) if os.path.isdir(root) else []
        return rev["sha"], (known or [dict(rev)])[0], root  # a pruned row: its commit
    if os.path.isdir(root):
        named = matching_rows(list_rows(root), rev)
        if len(named) > 1:
            the_row(named, rev, f"rev={rev!r}", root)  # raises, naming each row's ref
        if named:
            return named[0]["sha"], named[0], root
    return rev, None, repo or str(_here())


def _label(rev: Any) -> str:
    if isinstance(rev, Mapping):
        return str(rev.get("ref") or rev.get("name") or rev.get("sha"))
    return str(rev)


def _here() -> Path:
    from ..core.context import repo_root

    return repo_root() or Path.cwd()


class _NotThere(DvcDaliError):
    """A file of the revision neither in the cache nor on its DVC remote
    (raised as a DvcDaliError naming the revision: :func:`_read_revision`)."""


# What removes a row's data from the cache, and what brings it back.
_GONE = ("(`dvc gc` removes the data of the rows the workspace does not hold, unless given "
         "--all-experiments): `dvc-dali pull <git remote> <run>` fetches a run's rows with "
         "their data (`dvc-dali show` lists the runs), or load another row")


def _fetch(fs: Any, src: str, dest: Path, named: bool = True) -> None:
    """``src`` of DVC's filesystem copied to ``dest``; ``named``: the
    checkpoint's LATEST or manifest names it (else it is LATEST itself)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        fs.get_file(src, str(dest))
    except FileNotFoundError:
        raise _NotThere(f"{src}: the revision names it, but its data is in neither the local "
                        f"DVC cache nor the DVC remote {_GONE}" if named or _listed(fs, src)
                        else f"{src}: not in that revision, nor in the cache or the DVC "
                        "remote; is it the checkpoint output's path?") from None
    # Under `cache.type symlink` DVC's filesystem makes ``dest`` a link into
    # the cache: the store reads such a link (format/cache_links.py).


def _listed(fs: Any, src: str) -> bool:
    """Whether the revision's dvc.lock (a directory's listing) names ``src``."""
    try:
        return bool(fs.isfile(src))
    except Exception:  # the listing itself is gone: DVC's error, said by the caller
        return False


def _copy_needed(fs: Any, path: str, dest: Path, names: list[str] | None) -> None:
    """LATEST, the manifests, and the files the chosen arrays need, from DVC's
    filesystem into ``dest`` (which then reads as a local checkpoint)."""
    _fetch(fs, f"{path}/{store.LATEST}", dest / store.LATEST, named=False)
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


@checked_call
def load(path: str | os.PathLike = "checkpoint", *, rev: str | Mapping[str, Any] | None = None,
         repo: str | os.PathLike | None = None, names: list[str] | None = None) -> Loaded:
    """Read a checkpoint without resuming it.

    No lock, no writes, no DALI import, no messages: of the workspace (also
    while a training process holds it), or of ``rev`` in ``repo``. A row's
    files come through DVC's own filesystem (``dvc.api.DVCFileSystem``):
    from the local cache, or fetched from the DVC remote, with no
    `dvc exp apply`; only ``LATEST``, the manifests and the files of the
    arrays in ``names`` are read. A row whose commit names no DVC remote
    (recorded before `dvc remote add`) is read from the workspace's default
    remote, as `dvc-dali pull` fetches it. Every check of a resume applies (see the
    guarantees' "Security").

    Args:
        path: the stage's checkpoint output.
        rev: a row (a dict from `rows` or `current_row`: never ambiguous),
            its ref or sha, a row name (refused, naming each row's ref, when
            a run name was used again on another commit), or any git
            revision. Default: the workspace's checkpoint.
        repo: a path or git URL (with ``rev``). Default: this repository;
            in a stage under `dvc exp run`, the one it records into
            (``DVC_ROOT``).
        names: only these arrays (only their files are read); default all.

    Returns:
        The checkpoint's step, arrays, metadata, params and row.

    Raises:
        ConfigError: ``rev`` names no row or several, or a row without ``sha``.
        ArgumentError: ``rev`` or ``path`` empty; ``path`` absolute with
            ``rev`` (also a ``ValueError``).
        ArgumentTypeError: ``path``, ``rev``, ``repo`` or ``names`` of
            another type, ``names`` a string (also a ``TypeError``).
        DvcDaliError: a file neither in the revision read, nor in the cache
            or the DVC remote; ``rev`` without ``repo`` where the working
            directory is in no DVC project.
        CheckpointCorruptError: a file missing, truncated or edited (of a
            revision: named ``<revision>:<path>``).
        CheckpointFormatError: a foreign or newer format.
    """
    from ..core.exit_hooks import install_hook

    install_hook()  # a refusal that ends an evaluation script: one line
    _check_types(path, rev, repo)
    names = _names(names)
    repo_s = None if repo is None else os.fspath(repo)
    if rev is None and repo_s is None:
        return _workspace(Path(path), names)
    _check_revision_args(rev, path)
    git_rev, row, where = _resolve(rev, repo_s) if rev else ("HEAD", None, repo_s or
                                                             str(_here()))
    rel = os.fspath(path).strip("/")
    label = f"{_label(rev)}:{rel}"
    with tempfile.TemporaryDirectory(prefix="dvc-dali-load-") as tmp:
        try:
            dest = _read_revision(where, git_rev, _label(rev), rel, Path(tmp), names)
            return _loaded(store.read_arrays(dest, names), row, label)
        except (CheckpointCorruptError, ConfigError) as exc:
            raise _relabeled(exc, Path(tmp), label) from None


def _workspace(root: Path, names: list[str] | None) -> Loaded:
    """The workspace's checkpoint. Under `cache.type symlink` DVC checks its
    files out as links into the cache (after `dvc exp apply`, and at the end
    of each `dvc exp run`): the store reads those (format/cache_links.py)."""
    return _loaded(store.read_arrays(root, names), None)


def _check_types(path: Any, rev: Any, repo: Any) -> None:
    """load's arguments of a type it does not take, named (they were
    tracebacks from os.fspath, or rev=5 read as no DVC project)."""
    check_path(path, "load(path", "'checkpoint'")
    check_path(repo, "load(repo", "'.' or a git URL", none_ok=True)
    if rev is not None and not isinstance(rev, (str, Mapping)):
        raise ArgumentTypeError(f"load(rev={shown(rev)}): must be a row (a dict from "
                                "dvc_dali.rows()), its ref, sha or name, or a git revision, "
                                f"not {kind_of(rev)}")


def _check_revision_args(rev: Any, path: str | os.PathLike) -> None:
    """Refuse what names no revision's checkpoint: an empty ``rev`` (it read
    HEAD's), an absolute ``path`` (it was read as a relative one)."""
    if isinstance(rev, str) and not rev.strip():
        raise ArgumentError(f"load(rev={rev!r}): an empty revision names nothing (it read HEAD's "
                          "checkpoint); pass a row, its ref or sha, or leave rev out for the "
                          "workspace's checkpoint")
    if os.path.isabs(path):
        raise ArgumentError(f"load(path={os.fspath(path)!r}, rev=...): with rev, path is the "
                          "checkpoint output's path inside the project, as dvc.yaml names it "
                          "(e.g. 'checkpoint')")


def _names(names: Any) -> list[str] | None:
    """``names=`` as a list; a string is refused (it was split into letters)."""
    if names is None:
        return None
    if isinstance(names, (str, bytes)):
        raise ArgumentTypeError(f"load(names={names!r}): names is a list of array names, "
                                f"e.g. names=[{names!r}]")
    return list(names)


def _relabeled(exc: DvcDaliError, tmp: Path, label: str) -> DvcDaliError:
    """A refusal of the copy under ``tmp`` as the revision's own: its files
    named ``<revision>:<path>`` (the copy is gone when it is read), and the
    fix for a row's data (`dvc exp apply` would check out the same bytes)."""
    text = str(exc)
    for copy in ("rev", "workspace"):
        text = text.replace(str(tmp / copy), label)
    text = text.replace(str(tmp), label)
    if manifest_schema.FIX in text:
        text = text.replace(manifest_schema.FIX, (
            "the data DVC gave for this revision is not what its run recorded (an object "
            "damaged in the DVC cache, or on the DVC remote it came from): load another row, "
            "or remove that object from the cache (`dvc cache dir`) and fetch it again "
            "(`dvc fetch`, `dvc-dali pull`)"))
    return type(exc)(text)


def _read_revision(where: str, rev: str, label: str, rel: str, tmp: Path,
                   names: list[str] | None) -> Path:
    """The checkpoint ``rel`` of revision ``rev``, copied under ``tmp``: read
    with the DVC remote the revision's own .dvc/config names; failing that,
    with this workspace's default remote (a row recorded before `dvc remote
    add` names none), as `dvc-dali pull` fetches it."""
    try:  # DVC opens the revision lazily: its errors come with the first file
        _copy_needed(*revision_fs(where, rev, rel), tmp / "rev", names)
        return tmp / "rev"
    except Exception as exc:
        if isinstance(exc, DvcDaliError) and not isinstance(exc, _NotThere):
            raise
        first = exc
    try:
        remote = _workspace_remote(where)
    except Exception:  # a config DVC refuses: said by `dvc remote list`; the first error stands
        remote = None
    if remote is not None:
        try:
            _copy_needed(*revision_fs(where, rev, rel, remote), tmp / "workspace", names)
            return tmp / "workspace"
        except Exception as exc:
            if isinstance(exc, DvcDaliError) and not isinstance(exc, _NotThere):
                raise
    if isinstance(first, _NotThere):
        raise DvcDaliError(f"revision {label!r} of {where}: {first}") from None
    if isinstance(first, DvcDaliError):
        raise first
    if type(first).__name__ == "DataIndexDirError":  # DVC's: the directory's listing is gone
        raise DvcDaliError(f"cannot read {rel} at revision {label!r} of {where}: its data is "
                           f"in neither the local DVC cache nor the DVC remote {_GONE}"
                           ) from None
    raise DvcDaliError(
        f"cannot read {rel} at revision {label!r} of {where}: {first}. `dvc-dali show` lists "
        "the rows; `dvc-dali pull <git remote> <run>` fetches a run's rows with their data "
        "(`dvc remote list`: the DVC remote that holds it)") from None


def _workspace_remote(where: str) -> tuple[str, dict[str, Any]] | None:
    """(name, settings) of the default DVC remote of the workspace at
    ``where``, as `dvc push` reads them (its config files, the local one
    included); None without one, or where no workspace is."""
    if not os.path.isdir(os.path.join(where, ".dvc")):
        return None
    from dvc.api import DVCFileSystem

    config = DVCFileSystem(where).repo.config
    name = config["core"].get("remote")
    remotes = config.get("remote") or {}
    return (name, dict(remotes[name])) if name and name in remotes else None


def revision_fs(where: str, rev: str, rel: str,
                remote: tuple[str, dict[str, Any]] | None = None) -> tuple[Any, str]:
    """DVC's file system of revision ``rev`` of the project ``where`` (DVC's
    public API: rows, caches and remotes), and ``rel`` (relative to that
    project) as a path in it. A DVC root below the git top (`dvc init
    --subdir`) is a subrepo to it, and its paths start at the top.
    ``remote``: (name, settings) of the DVC remote to read from, instead of
    the one the revision's .dvc/config names."""
    from dvc.api import DVCFileSystem

    in_tree = _in_tree(where, rel)
    extra = {} if remote is None else {"remote": remote[0], "remote_config": remote[1]}
    return DVCFileSystem(where, rev=rev, subrepos=in_tree != rel, **extra), in_tree


def _in_tree(where: str, rel: str) -> str:
    """``rel`` (relative to the DVC root ``where``) as a path from the git
    work tree's top; as it is where that is not a local git work tree."""
    from .exp_refs import tree_path

    if not os.path.isdir(where):
        return rel
    try:
        return tree_path(where, rel)
    except DvcDaliError:
        return rel


def _loaded(snap: store.Snapshot, row: Row | None, where: str = "") -> Loaded:
    manifest = snap.manifest
    run = manifest.get("run") or {}
    return Loaded(snap.step, dict(snap.arrays), dict(manifest.get("metadata") or {}),
                  dict(run.get("params") or {}), row and row.get("name"),
                  run.get("total_steps"), where or str(snap.path), manifest,
                  row and row.get("ref"))
