"""Carry the workspace's checkpoint into `--temp` and queued runs.

DVC copies the workspace's tracked files into a temporary repository for
these runs, but not an untracked dvc.lock, and it does not check out the
persisted checkpoint there ("No file hash info found ... It won't be
created"), so they would silently start at step 0. They resume like a
workspace run instead: from the checkpoint the run's own dvc.lock names,
else the one the workspace's (DVC_ROOT) dvc.lock names, checked out of the
cache they share; but not while a workspace run is writing the workspace's
checkpoint (both dvc.lock files then name that run's progress, not a state
this run was asked to start from).
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

from ..core import atomic_file
from ..core.context import RunContext
from ..core.errors import RecordError
from ..core.log import logger
from . import dvc_door, held, lockfile
from ..reading import gitcmd
from ..reading.exp_refs import git_dirs, list_rows, outs_digest, tree_path


def _present(path: str) -> bool:
    """The run already has its checkpoint: a dvc-dali one (LATEST), or a bare
    script's output file, or a directory holding anything."""
    from ..format import store

    if os.path.exists(os.path.join(path, store.LATEST)) or os.path.isfile(path):
        return True
    try:
        return any(not name.startswith(".") for name in os.listdir(path))
    except OSError:
        return False


def _entries(ctx: RunContext, repo: Any, stage: Any) -> list[tuple[str, Any]]:
    """(dvc.lock path, the stage's entry there): the run's own, then the workspace's.
    Read through lockfile.current: a run's start asks for them more than once
    (carry, then refuse_lost), and in the workspace both are one file."""
    own = dvc_door.lockfile_path(stage)
    main = os.path.join(ctx.dvc_root, os.path.relpath(own, repo.root_dir))
    return [(path, lockfile.stage_entry(lockfile.current(path), stage.name))
            for path in (own, main)]


def _workspace_busy(ctx: RunContext, repo: Any, out: Any) -> bool:
    """A workspace run is writing the workspace's checkpoint right now: its
    dvc.lock names that run's progress, not a state this run was started
    from, so this run starts from its own (none: step 0)."""
    from pathlib import Path

    from ..format.dirlock import holder

    workspace_out = Path(ctx.dvc_root) / os.path.relpath(out.fs_path, repo.root_dir)
    pid = holder(workspace_out)
    if pid is not None:
        logger.info("not resuming from the workspace's %s: a run (pid %s) is writing it",
                    out.def_path, pid)
    return pid is not None


def carry(ctx: RunContext, repo: Any, stage: Any, out: Any) -> Optional[str]:
    """Check the checkpoint out into a --temp/queued run that lacks it; the
    md5 restored. Under a lock: every rank of a multi-process run calls it,
    the first one carries, the others find it there."""
    if not ctx.dvc_root:
        return None
    from ..format.dirlock import exclusive

    with exclusive(os.path.join(repo.root_dir, ".dvc", "tmp", "dvc-dali", "carry.lock")):
        if _present(out.fs_path):
            return None
        return _carry(ctx, repo, stage, out)


def _workspace_run(ctx: RunContext, repo: Any) -> bool:
    """This run's repository is the workspace's (not a --temp/queue clone)."""
    return os.path.samefile(git_dirs(repo.root_dir)[0], git_dirs(ctx.dvc_root)[0])


def _carry(ctx: RunContext, repo: Any, stage: Any, out: Any) -> Optional[str]:
    if _workspace_run(ctx, repo):
        # a workspace run: DVC checks persisted outputs out itself, when it can
        _require_cached(ctx, repo, stage, out)
        return None
    entries = _entries(ctx, repo, stage)
    found = next(((p, e, md5) for p, e in entries
                  if (md5 := lockfile.out_md5(e, out.def_path))), None)
    if found is None:
        return None
    path, entry, md5 = found
    if _workspace_busy(ctx, repo, out):
        return None
    dvc_door.checkout_out(repo, md5, out.fs_path)
    _carry_history(ctx, repo, stage, entry)
    own = entries[0][0]
    if path != own:  # the row this run resumes from is then found as its parent
        lockfile.write_entry(own, lockfile.read(own)[1], stage.name, entry)
    logger.info("resuming %s from the checkpoint %s names (DVC does not carry it into "
                "--temp and queued runs)", out.def_path, os.path.relpath(path, ctx.dvc_root)
                if path != own else "dvc.lock")
    return md5


def _carry_history(ctx: RunContext, repo: Any, stage: Any, entry: Any) -> None:
    """The stage's persisted outputs that DVC does not cache (DVCLive's
    metrics and plots), as the row recorded with the carried checkpoint
    holds them: DVC copies neither into --temp and queued runs, so their
    rows would hold only the steps trained there, where a workspace resume
    keeps the history (DVC 2 checked the checkpoint's commit out)."""
    outs = [o for o in stage.outs if o.persist and not o.use_cache]
    digest = outs_digest(entry)
    found = [r for r in (list_rows(ctx.dvc_root) if outs else []) if r["outs"] == digest]
    if not found:
        return
    sha, top = found[-1]["sha"], git_dirs(repo.root_dir)[1]
    for out in outs:
        tree = tree_path(ctx.dvc_root, os.path.relpath(out.fs_path, repo.root_dir))
        listing = gitcmd.run(["ls-tree", "-r", "-z", "--name-only", sha, "--", tree],
                             ctx.dvc_root).stdout
        paths = [p for p in listing.split("\0") if p]
        if not paths:
            continue
        if os.path.isdir(out.fs_path):  # the baseline's copy: the row's replaces it whole
            shutil.rmtree(out.fs_path)
        for path, data in zip(paths, gitcmd.read_blobs(ctx.dvc_root,
                                                       [f"{sha}:{p}" for p in paths])):
            if data is not None:
                dest = os.path.join(top, *path.split("/"))
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                atomic_file.replace_whole(dest, data)
    logger.info("%s as row %s holds them (DVC does not carry them into --temp and queued "
                "runs either)", ", ".join(str(o.def_path) for o in outs), found[-1]["name"])


def _require_cached(ctx: RunContext, repo: Any, stage: Any, out: Any) -> None:
    """dvc.lock names a checkpoint that is neither in the workspace nor in the
    cache (a row pulled without its data, a cache cleaned by `dvc gc`): the
    run would start from step 0 while dvc.lock says it resumes. Refused."""
    entry = lockfile.entry_of(stage)
    md5 = lockfile.out_md5(entry, out.def_path)
    if md5 is None or dvc_door.out_in_cache(repo, md5):
        return
    digest = outs_digest(entry)
    named = [r["name"] for r in list_rows(ctx.dvc_root) if r["outs"] == digest]
    row = named[-1] if named else None
    fetch = (f"`dvc exp pull <git remote> {row}` (or `dvc pull {dvc_door.shown_address(stage)}`)"
             if row else f"`dvc pull {dvc_door.shown_address(stage)}`")
    raise RecordError(
        f"dvc.lock names the checkpoint {out.def_path} of "
        f"{'row ' + row if row else 'a recorded run'} ({md5}), but its data is neither in the "
        f"workspace nor in the DVC cache, so this run would start from step 0. Fetch it with "
        f"{fetch}, or start over on purpose with `dvc-dali reset`.")


def refuse_lost(ctx: RunContext, repo: Any, stage: Any, out: Any, late: bool) -> None:
    """Refuse a run that lost the workspace's recorded checkpoint (held.py):
    DVC deleted it, or does not carry it, because dvc.lock names none, and
    the run would start from step 0 as if there were none. ``late``: the
    script read its state already, so a cached output there is its own."""
    if not ctx.dvc_root:
        return
    entries = _entries(ctx, repo, stage)
    named = next((md5 for _, e in entries if (md5 := lockfile.out_md5(e, out.def_path))), None)
    lock_rel = os.path.relpath(entries[0][0], repo.root_dir)
    note = held.read(ctx.dvc_root, lock_rel, stage.name)
    kept = _present(out.fs_path) and not (late and out.use_cache)
    if not held.lost(note, out.def_path, named, kept):
        return
    temp = not _workspace_run(ctx, repo)
    if temp and _workspace_busy(ctx, repo, out):  # its run's dvc.lock is not written yet
        return
    exists = not note.problem and any(r["name"] == note.row for r in list_rows(ctx.dvc_root))
    address = dvc_door.shown_address(stage)
    raise RecordError(held.refusal(lock_rel, address, out.def_path, note, exists, temp))


def missed(ctx: RunContext, repo: Any, stage: Any, out: Any) -> Optional[str]:
    """For a script that read its state before dvc-dali could carry it: the
    md5 of the workspace's checkpoint this --temp/queued run should have
    started from and DVC did not bring (dvc.lock at the run's HEAD does not
    name it); None for workspace runs and when there was none."""
    if not ctx.dvc_root or _workspace_run(ctx, repo):
        return None
    main = _entries(ctx, repo, stage)[1][1]
    md5 = lockfile.out_md5(main, out.def_path)
    if md5 is None or _workspace_busy(ctx, repo, out):
        return None
    lock_rel = os.path.relpath(dvc_door.lockfile_path(stage), repo.root_dir)
    try:
        committed = lockfile.entry_at(git_dirs(repo.root_dir)[0], repo.root_dir, "HEAD",
                                      lock_rel, stage.name)
    except Exception:
        committed = None
    return None if lockfile.out_md5(committed, out.def_path) == md5 else md5
