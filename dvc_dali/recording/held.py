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
import shlex
import shutil
from dataclasses import dataclass, field
from typing import Any, Optional

from ..core import atomic_file, plain_file
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


_MAX_BYTES = 1 << 20  # a note is a few hundred bytes; more is none dvc-dali wrote
# what git refuses in a ref name (git check-ref-format), so no row is named so
_NOT_IN_REFS = set(" ~^:?*[\\")


@dataclass(frozen=True)
class Note:
    """A note as read: the row and step it names and that row's outputs
    ({path: md5}); ``problem``: why it could not be read ("" when it could:
    then row, step and outs are what was written), ``where``: its path
    relative to the DVC root."""

    where: str
    row: str = ""
    step: Optional[int] = None
    outs: dict = field(default_factory=dict)
    problem: str = ""


def valid_row(row: Any) -> bool:
    """A row name git would take as a ref's last part: printable, no
    whitespace, none of git's forbidden characters. Pure."""
    return (isinstance(row, str) and 0 < len(row) <= 255 and row.isprintable()
            and not _NOT_IN_REFS & set(row))


def parse(raw: Any, where: str) -> Note:
    """A note's parsed JSON as a :class:`Note` (``problem`` set where it is not
    what :func:`write` writes). Pure."""
    if not isinstance(raw, dict):
        return Note(where, problem="not a JSON object")
    row, step, outs = raw.get("row"), raw.get("step"), raw.get("outs", {})
    if not valid_row(row):
        return Note(where, problem="no valid row name")
    if step is not None and (type(step) is not int or step < 0):
        return Note(where, problem="its step is not a whole number")
    if not isinstance(outs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in outs.items()):
        return Note(where, problem="its outputs are not a map of paths to hashes")
    return Note(where, row, step, dict(outs))


def read(root: str, lock_rel: str, stage_name: str) -> Optional[Note]:
    """The note; None when there is none. Never blocks nor follows a link
    (a FIFO, a device, a directory or a link there is a note that cannot be
    read: its ``problem`` says why)."""
    path = note_path(root, lock_rel, stage_name)
    where = os.path.relpath(path, root)
    try:
        opened = plain_file.open_regular(path)
    except FileNotFoundError:
        return None
    except plain_file.Unreadable as exc:
        return Note(where, problem=exc.why)
    with opened as fobj:
        try:
            data = fobj.read(_MAX_BYTES + 1)
        except OSError as exc:
            return Note(where, problem=exc.strerror or str(exc))
    if len(data) > _MAX_BYTES:
        return Note(where, problem="larger than 1 MB")
    try:
        return parse(json.loads(data.decode("utf-8")), where)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return Note(where, problem="not JSON")


def forget(root: str, lock_rel: str, stage_name: str) -> Optional[Note]:
    """Remove the note (`dvc-dali reset`), whatever is there; the note that
    was there (``problem`` set where it could not be read), None when none."""
    path = note_path(root, lock_rel, stage_name)
    note = read(root, lock_rel, stage_name)
    if note is None:
        return None
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    except FileNotFoundError:
        return None
    return note


def lost(note: Optional[Note], def_path: str, named_md5: Optional[str], kept: bool) -> bool:
    """Whether the run lost the workspace's recorded checkpoint ``def_path``:
    it holds no checkpoint it did not write itself (``kept`` false), dvc.lock
    names none for it, and the workspace last held one a row recorded (or
    a note is there that cannot be read: which outputs it held is unknown,
    so it may have been this one). Pure."""
    if kept or named_md5 or note is None:
        return False
    return bool(note.problem) or bool(note.outs.get(def_path))


def refusal(lock_rel: str, stage: str, def_path: str, note: Note, row_exists: bool,
            temp: bool) -> str:
    """The one line that refuses such a run: what is wrong, and what to do. Pure."""
    why = ("so DVC does not bring the workspace's into this --temp/queued run" if temp else
           "so DVC deleted the workspace's before this run started, as it deletes every "
           "output dvc.lock does not name")
    step = note.step if note.step is not None else "?"
    others = "`dvc exp show` lists the rows: `dvc exp apply <row>` then `dvc exp run` resumes one"
    if note.problem:
        back = (f"The note of which row this workspace last recorded, {note.where}, cannot be "
                f"read ({note.problem}), so which checkpoint it held is unknown; {others}. ")
    elif row_exists:
        back = (f"The last checkpoint this workspace recorded is row {note.row} (step {step}), "
                f"kept in the DVC cache: `dvc exp apply {shlex.quote(note.row)}` restores "
                f"{lock_rel} and that checkpoint, then run again to resume from step {step}. ")
    else:
        back = (f"The last checkpoint this workspace recorded, row {note.row} (step {step}), "
                f"has been removed since; {others}. ")
    return (f"{lock_rel} names no {def_path} for stage '{stage}' (the file is missing, or "
            f"lacks the stage's entry), {why}: this run would start from step 0. {back}"
            "To start over from step 0 on purpose: `dvc-dali reset`, then `dvc exp run`. "
            "Nothing was recorded.")
