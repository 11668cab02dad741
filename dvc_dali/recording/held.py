"""Which recorded row the workspace's checkpoint is, per stage: what a run
can no longer see once DVC has deleted that checkpoint.

Before `dvc exp run` runs a stage, DVC checks the stage's outputs out to
what dvc.lock names (repo/experiments/executor/base.py, `BaseExecutor.
reproduce` -> repo/checkout.py, force=True), in its own process, before
any dvc_dali code runs. A cached output dvc.lock does not name (the file
deleted, or without the stage's entry) is deleted there, `persist: true`
or not ("No file hash info found ... It won't be created"); DVC 2.58 did
the same to `checkpoint: true` outputs (measured). The run would then start
from step 0 and end as a success that resumed nothing.

So each row a workspace run records leaves a note here (in DVC's scratch
directory, .dvc/tmp) of which row the workspace's checkpoint now is; a run
that lacks its checkpoint while dvc.lock names none and such a note exists
is refused (carry.refuse_lost), naming the row that brings it back. Which
row the workspace held when DVC deleted it cannot be told for sure (`dvc
exp apply` may have put another there since the note), so the run is not
resumed from a guess. `dvc-dali reset` forgets the note: a start from step
0 on purpose.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Optional

from ..core import atomic_file
from ..core.log import logger
from .commit import sweep_leftovers

NOTES = os.path.join(".dvc", "tmp", "dvc-dali", "held")


def note_path(root: str, lock_rel: str, stage_name: str) -> str:
    """The note of stage ``stage_name`` of the dvc.lock at ``lock_rel``
    (relative to the DVC repository ``root``); the same relative path in a
    --temp/queued run's copy names the workspace's stage. Pure."""
    key = hashlib.sha1(f"{lock_rel}\0{stage_name}".encode()).hexdigest()[:12]
    return os.path.join(root, NOTES, f"{key}.json")


def out_md5s(entry: Any) -> dict[str, str]:
    """{output path: md5} of a dvc.lock entry's outputs. Pure."""
    return {str(o["path"]): o["md5"] for o in (entry or {}).get("outs") or []
            if isinstance(o, dict) and isinstance(o.get("md5"), str) and "path" in o}


def write(root: str, lock_rel: str, stage_name: str, row: str, step: int, entry: Any) -> None:
    """After a workspace row: its outputs are the workspace's. Not fsynced,
    and never a reason to fail a row already published: a note lost only
    loses this protection."""
    path = note_path(root, lock_rel, stage_name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sweep_leftovers(f"{path}.dvc-dali-*.tmp")  # a killed writer's
        atomic_file.replace_whole(path, json.dumps(
            {"row": row, "step": step, "outs": out_md5s(entry)}, sort_keys=True))
    except OSError as exc:
        logger.debug("cannot note row %s as the workspace's checkpoint: %s", row, exc)


def read(root: str, lock_rel: str, stage_name: str) -> Optional[dict]:
    """The note; None when there is none, or it does not parse (no protection)."""
    try:
        with open(note_path(root, lock_rel, stage_name), encoding="utf-8") as fobj:
            note = json.load(fobj)
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) and isinstance(note.get("row"), str) else None


def forget(root: str, lock_rel: str, stage_name: str) -> Optional[str]:
    """Remove the note (`dvc-dali reset`); the row it named, None when there was none."""
    note = read(root, lock_rel, stage_name)
    try:
        os.remove(note_path(root, lock_rel, stage_name))
    except FileNotFoundError:
        return None
    return note["row"] if note else "?"


def lost(note: Optional[dict], def_path: str, named_md5: Optional[str], kept: bool) -> bool:
    """Whether the run lost the workspace's recorded checkpoint ``def_path``:
    it holds no checkpoint it did not write itself (``kept`` false), dvc.lock
    names none for it, and the workspace last held one a row recorded. Pure."""
    if kept or named_md5 or not note:
        return False
    return bool((note.get("outs") or {}).get(def_path))


def refusal(lock_rel: str, stage: str, def_path: str, note: dict, row_exists: bool,
            temp: bool) -> str:
    """The one line that refuses such a run: what is wrong, and what to do. Pure."""
    row, step = note["row"], note.get("step", "?")
    why = ("so DVC does not bring the workspace's into this --temp/queued run" if temp else
           "so DVC deleted the workspace's before this run started, as it deletes every "
           "output dvc.lock does not name")
    back = (f"The last checkpoint this workspace recorded is row {row} (step {step}), kept "
            f"in the DVC cache: `dvc exp apply {row}` restores {lock_rel} and that checkpoint, "
            f"then run again to resume from step {step}. " if row_exists else
            f"The last checkpoint this workspace recorded, row {row} (step {step}), has been "
            "removed since. ")
    return (f"{lock_rel} names no {def_path} for stage '{stage}' (the file is missing, or "
            f"lacks the stage's entry), {why}: this run would start from step 0. {back}"
            "To start over from step 0 on purpose: `dvc-dali reset`, then `dvc exp run`. "
            "Nothing was recorded.")
