"""Cache the stage's outputs, so a row can be applied later."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any, Optional

from ..core.errors import DvcDaliError, RecordError
from . import dvc_door


def is_checkpoint_dir(out: Any) -> bool:
    """Whether an output is a dvc-dali checkpoint directory (store.py's format)."""
    from ..format import store

    return os.path.isfile(os.path.join(out.fs_path, store.LATEST))


def seed_digests(repo: Any, stage: Any) -> None:
    """Hand DVC the md5 of each checkpoint file, computed while it was written,
    so caching it does not read it all again (a snapshot is never modified
    once published)."""
    from ..format import store

    digests: dict[str, str] = {}
    for out in stage.outs:
        if not (out.use_cache and out.hash_name == "md5" and is_checkpoint_dir(out)):
            continue
        try:
            found = store.file_digests(Path(out.fs_path))
        except DvcDaliError:
            continue  # damaged: let DVC hash what is there
        digests.update({os.fspath(path): md5 for path, md5 in found.items()})
    dvc_door.seed_md5s(repo, digests)


def require_persisted(stage: Any) -> None:
    missing = [str(o) for o in stage.outs if o.persist and not o.hash_info]
    if missing:
        raise RecordError(
            f"persisted output(s) {', '.join(missing)} of stage '{_shown(stage)}' do not "
            "exist; a row holds every persisted output, so write each before make_checkpoint() "
            "(the metrics and plots too: log them to DVCLive first), or drop it from the "
            "stage's outputs.")


def cache_output(out: Any, stage: Any) -> None:
    """Snapshot files are never modified once published, so where cache.type
    starts with hardlink they are linked into the cache, not copied; anything
    else is copied (or reflinked), as DVC would."""
    hardlink = dvc_door.first_cache_type(out) == "hardlink" and _only_snapshots(out)
    with dvc_door.transfer_failures() as failures:
        try:
            dvc_door.cache_output(out, hardlink)
        except Exception as exc:  # removed or changed while it was being cached
            raise _caching_failed(out, stage, _cause(out, failures) or exc) from exc
    # A row must never name outputs the cache cannot check out again. The
    # output is hashed before the repo lock and cached under it: a command
    # that checked it out in between (`dvc checkout`, `dvc exp apply`) left
    # other files to cache than those hashed.
    if not out.cache.exists(out.hash_info.value):
        cause = _cause(out, failures)
        if cause is not None:  # DVC logged it and went on
            raise _caching_failed(out, stage, cause) from cause
        full = _full(out)
        raise RecordError(
            f"output '{out}' of stage '{_shown(stage)}' (md5 {out.hash_info.value}) is not "
            f"in the DVC cache {out.cache.path} after caching it: " + (
                f"{full}; nothing was recorded. Free space there, then `dvc exp run` again "
                "(it resumes from the checkpoint in the workspace)." if full else
                "it changed while it was recorded (another command, such as `dvc checkout` or "
                "`dvc exp apply`, checked it out meanwhile?), or the cache directory is not "
                "writable; nothing was recorded. Run no command that checks outputs out in "
                "this workspace while it trains, and check the cache directory's "
                "permissions."))


def _only_snapshots(out: Any) -> bool:
    """Every file of the output is a published snapshot's (never modified
    again) or LATEST (replaced by a rename): only then may it be linked into
    the cache. A bare script's own LATEST, or a file a user keeps beside the
    snapshots, may be rewritten in place, through the link, into the rows'
    cached objects."""
    from ..format import store

    root = Path(out.fs_path)
    if not is_checkpoint_dir(out):
        return False
    try:
        known = set(store.file_digests(root)) | {root / store.LATEST}
    except DvcDaliError:
        return False
    return all(Path(top, name) in known for top, _, files in os.walk(root) for name in files)


def _cause(out: Any, failures: list[tuple[str, BaseException]]) -> BaseException | None:
    """The error DVC logged for a file of this output it did not cache (one
    the cache lacks: another thread's transfer, an auto-push, reads from it)."""
    return next((exc for oid, exc in failures if not out.cache.exists(oid)), None)


def _caching_failed(out: Any, stage: Any, exc: BaseException) -> RecordError:
    return RecordError(
        f"caching output '{out}' of stage '{_shown(stage)}' failed: "
        f"{type(exc).__name__}: {exc}. Nothing was recorded for this checkpoint; "
        f"{_cache_advice(exc, out.cache.path)}")


def _full(out: Any) -> str:
    """Why the cache cannot hold the output, where its free space tells ("": it can)."""
    try:
        free = shutil.disk_usage(out.cache.path).free
    except OSError:
        return ""
    size = getattr(out.meta, "size", None) or 0
    if free == 0 or free < size:
        return f"the cache directory is full ({free} bytes free, the output is {size} bytes)"
    return ""


_CACHE_UNWRITABLE = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT,
                     errno.EFBIG}


def _cache_advice(exc: BaseException, cache: str) -> str:
    """What to do when caching an output failed: the cache's space or
    permissions where the error says so, else another writer of the output."""
    if isinstance(exc, OSError) and exc.errno in _CACHE_UNWRITABLE:
        limit = " (or lift the file-size limit, `ulimit -f`)" if exc.errno == errno.EFBIG else ""
        return (f"the DVC cache {cache} cannot be written: free space there{limit} or fix its "
                "permissions or mount, then `dvc exp run` again (it resumes from the "
                "checkpoint in the workspace).")
    return "make sure nothing else writes or deletes that output during training."


def cache_outputs(stage: Any) -> None:
    for out in stage.outs:
        if out.use_cache and out.hash_info:
            cache_output(out, stage)


def require_latest(stage: Any, out: Optional[str], expected: str) -> None:
    """The checkpoint directory still holds the checkpoint its run just wrote.
    A second `dvc exp run` in the same workspace checks outputs out again
    before DVC refuses it; a row must never hold another step's checkpoint."""
    from ..format import store

    path = os.path.join(out or ".", store.LATEST)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            found = fh.read()
    except OSError:
        found = ""
    if found != expected:
        raise RecordError(
            f"{path}: changed since this run saved its checkpoint (another command, such as a "
            f"second `dvc exp run` in this workspace, checked out stage '{_shown(stage)}' "
            "outputs meanwhile); this checkpoint was not recorded. Run one `dvc exp run` per "
            "workspace at a time (`--temp` or `--queue` for more).")


def _shown(stage: Any) -> str:
    return dvc_door.shown_address(stage)
