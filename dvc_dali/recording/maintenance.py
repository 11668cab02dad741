"""Checks and chores around recording: is the stage resumable (before the
first step, and for `dvc-dali doctor`), and starting over (`dvc-dali reset`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

from ..core.context import RunContext
from ..core.errors import RecordError
from ..core.process_state import STATE
from ..format import dirlock
from . import dvc_door, held, lockfile
from .outputs import is_checkpoint_dir
from .stage import STAGE_FIX, find_stage, run_alone_hint, stage_problems


def repo_at(start: str) -> Any:
    root = dvc_door.find_root(start)
    if root not in STATE.dvc_repos:
        STATE.dvc_repos[root] = dvc_door.open_repo(root)
    return STATE.dvc_repos[root]


def check_stage(ctx: RunContext, checkpoint_path: Optional[str],
                stage: Optional[str] = None) -> None:
    """Refuse, before any training step, a stage that DVC 3 cannot resume.

    DVC 3 ignores ``checkpoint: true``: it deletes the output before each run
    and skips a stage whose deps did not change. Resuming needs the
    checkpoint output ``persist: true`` and the stage ``always_changed: true``.
    ``checkpoint_path`` None: a bare make_checkpoint(), which names no output.
    """
    if ctx.dvc_root and not os.path.isdir(os.path.join(ctx.dvc_root, ".dvc")):
        raise RecordError(
            f"DVC_ROOT={ctx.dvc_root!r} is not a DVC repository (no .dvc directory), so no "
            "checkpoint could be recorded. Run training through `dvc exp run` in the "
            "repository, or unset DVC_ROOT to train without recording.")
    repo = repo_at(os.getcwd())
    stg = find_stage(repo, stage or ctx.stage, checkpoint_path, ctx.stage)
    problems, path = stage_problems(stg, checkpoint_path)
    if problems:
        declared = sorted(dvc_door.declared_checkpoint_outs(stg))
        if path in declared:
            dvc2 = ("It is a DVC 2 checkpoint stage (`checkpoint: true`): run `dvc-dali "
                    "migrate`, commit, and `dvc exp run` again; or declare it yourself as:\n")
        elif declared:  # the script names another directory than the stage's checkpoint
            dvc2 = (f"Pass its checkpoint output ({', '.join(declared)}) as the checkpoint "
                    f"path, or declare '{path}' as:\n")
        else:
            dvc2 = "Declare it as:\n"
        raise RecordError(
            f"{os.path.relpath(stg.path, repo.root_dir)}: stage '{stg.name}' cannot resume "
            f"from checkpoints under DVC 3: {'; and '.join(problems)}. {dvc2}"
            + STAGE_FIX.format(path=path))
    _check_cache_writable(repo.cache.local_cache_dir)


def finished_stage_hint(ctx: RunContext, checkpoint_path: Optional[str]) -> str:
    """run_alone_hint for the stage recording into ``checkpoint_path``: its
    project's other stages with a checkpoint output ("" where none, or the
    stages cannot be read: a hint is never a reason to fail)."""
    try:
        repo = repo_at(os.getcwd())
        stg = find_stage(repo, ctx.stage, checkpoint_path, ctx.stage)
        others = list(dict.fromkeys(dvc_door.shown_address(s) for s, _ in
                                    _checkpoint_outs(repo.root_dir)
                                    if s.addressing != stg.addressing))
    except Exception:  # noqa: BLE001 - the refusal stands without it
        return ""
    return run_alone_hint(dvc_door.shown_address(stg), others)


def _check_cache_writable(cache: Optional[str]) -> None:
    """A cache this run cannot write fails at the first checkpoint, after
    the training up to it: said before the first step instead."""
    if not cache or not os.path.isdir(cache) or os.access(cache, os.W_OK):
        return
    try:
        read_only = bool(os.statvfs(cache).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    why = "a read-only file system" if read_only else "no write permission"
    raise RecordError(
        f"the DVC cache {cache} is not writable ({why}), so no checkpoint could be recorded "
        "in it; training was not started. Fix its "
        "permissions or mount, or use another cache (`dvc cache dir <path>`), then run again.")


def reset_stage(stage: Optional[str] = None, root: Optional[str] = None) -> list[str]:
    """Start over: delete the stage's dvc-dali checkpoint outputs and its
    dvc.lock entry, so the next `dvc exp run` does not check them out again
    (DVC 2's `dvc exp run --reset`). Recorded rows are kept. Returns what
    was removed."""
    repo = repo_at(root or os.getcwd())
    stages = dvc_door.named_stages(repo)
    if stage is not None:  # "" names no stage (it reset every one)
        stages = [s for s in stages if stage in (s.name, s.addressing)]
        if not stages:
            raise RecordError(f"no stage '{stage}' in {repo.root_dir}; `dvc stage list` shows "
                              "the stages")
    found = []
    for stg in stages:
        # a dvc-dali checkpoint, or what a bare make_checkpoint() port persists
        declared = dvc_door.declared_checkpoint_outs(stg)
        found.append((stg, [o for o in stg.outs if o.persist and (
            o.def_path in declared or is_checkpoint_dir(o) or _locked_checkpoint(stg, o))]))
    _refuse_if_training([o for _, outs in found for o in outs], repo.root_dir)  # before any
    removed: list[str] = []
    for stg, outs in found:
        for out in outs:
            if os.path.isdir(out.fs_path):
                shutil.rmtree(out.fs_path)
            elif os.path.lexists(out.fs_path):
                os.unlink(out.fs_path)
            else:  # deleted by hand: dvc.lock still names it, DVC would check it out
                continue
            removed.append(os.path.relpath(out.fs_path, repo.root_dir))
        lock_path = dvc_door.lockfile_path(stg)
        if outs and lockfile.remove_entry(lock_path, stg.name):
            removed.append(f"{os.path.relpath(lock_path, repo.root_dir)}:{stg.name}")
        removed += _forget_held(repo.root_dir, stg, lock_path)
    if not removed and stage is not None:
        raise RecordError(f"stage '{stage}' has no persisted checkpoint to reset (no output "
                          "with a LATEST file or declared `checkpoint: true`)")
    return removed


def _forget_held(root: str, stg: Any, lock_path: str) -> list[str]:
    """The note of which row the workspace's checkpoint was (held.py), removed:
    else a run after a reset whose checkpoint is gone would be refused."""
    lock_rel = os.path.relpath(lock_path, root)
    note = held.forget(root, lock_rel, stg.name)
    if note is None:
        return []
    if note.problem:
        return [f"{note.where} (the note of which row stage '{stg.name}' last held, which "
                f"could not be read: {note.problem})"]
    return [f"{note.where} (the note that stage '{stg.name}' last held row {note.row})"]


def _locked_checkpoint(stg: Any, out: Any) -> bool:
    """A persisted output deleted by hand whose dvc.lock entry names a
    dvc-dali checkpoint directory (one with LATEST, in the cache): the next
    `dvc exp run` would check it out again and resume it."""
    if os.path.lexists(out.fs_path):
        return False
    entry = lockfile.entry_of(stg)
    md5 = lockfile.out_md5(entry, out.def_path)
    if not (md5 and md5.endswith(".dir")):
        return False
    from ..format import store

    return store.LATEST in (dvc_door.tree_listing(stg.repo, md5) or {})


def _holder(out: Any) -> int | None:
    """The live process training into the checkpoint directory ``out`` (None: none)."""
    return dirlock.holder(Path(out.fs_path)) if os.path.isdir(out.fs_path) else None


def _refuse_if_training(outs: list[Any], root: str) -> None:
    """A checkpoint a live process holds (a run training into it) is not
    reset under it: its next checkpoint would fail, blaming another command."""
    for out in outs:
        pid = _holder(out)
        if pid is not None:
            raise RecordError(
                f"{os.path.relpath(out.fs_path, root)} is in use by process {pid} (a run "
                "training into it): nothing was reset. Stop that run first (Ctrl-C, or `dvc "
                "queue kill`), then `dvc-dali reset` again.")


def runs_in_training(root: str, rows: Callable[[], list[Any]]) -> dict[str, int]:
    """{run name: pid} of the runs a live process is training into a
    checkpoint now, in this workspace or in the directory DVC runs a
    `--temp` or queued experiment in: the run of the row its stage's
    dvc.lock entry there names (each recorded row rewrites that entry).
    ``rows`` lists the rows once those entries are read: a row recorded
    while they were looked for (a second or so) is among them (rows listed
    before missed it, and a run training fast was not seen: a sweep)."""
    from ..reading.exp_refs import outs_digest

    held: list[tuple[int, str]] = []
    for stg, out in _training_outs(root):
        pid = _holder(out)
        entry = lockfile.entry_of(stg) if pid is not None else None
        if entry:
            held.append((pid, outs_digest(entry)))
    if not held:
        return {}
    listed = rows()
    return {r["exp"]: pid for pid, digest in held for r in listed if r["outs"] == digest}


def _training_outs(root: str) -> list[tuple[Any, Any]]:
    """The checkpoint outputs of the workspace at ``root`` and of the
    directories DVC runs its `--temp` and queued experiments in (one being
    made or removed is passed over)."""
    found = _checkpoint_outs(root)
    for where in dvc_door.executor_dirs(repo_at(root)):
        try:
            found += _checkpoint_outs(where)
        except RecordError:
            continue
    return found


def checkpoint_outputs(root: str) -> list[tuple[str, str]]:
    """(stage, output path) for every output declared `checkpoint: true` or
    holding a dvc-dali checkpoint, for `dvc-dali doctor`."""
    return [(stg.addressing, out.fs_path) for stg, out in _checkpoint_outs(root)]


def replay_targets(root: str) -> list[tuple[str, str]]:
    """(output path, its stage's working directory) for each of
    :func:`checkpoint_outputs`, for `dvc-dali doctor --verify`: the training
    ran there, so the relative paths in its pipelines name the same files."""
    return [(out.fs_path, stg.wdir) for stg, out in _checkpoint_outs(root)]


def _checkpoint_outs(root: str) -> list[tuple[Any, Any]]:
    found = []
    for stg in dvc_door.named_stages(repo_at(root)):
        declared = dvc_door.declared_checkpoint_outs(stg)
        found += [(stg, o) for o in stg.outs if o.def_path in declared or is_checkpoint_dir(o)]
    return found
