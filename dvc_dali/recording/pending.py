"""A workspace row between its dvc.lock and its ref.

A row is three writes: its commit (holding the new dvc.lock, pinned), the
workspace dvc.lock, then its ref. A kill between dvc.lock and the ref
(SIGKILL, a machine's death: no signal handler runs) left dvc.lock naming a
checkpoint no row held; the next `dvc exp run` checks it out and resumed
from it as a run of its own, the run's history cut. So right before
dvc.lock is written, a note here names the row's commit and refs, and the
next run's start decides from it (:func:`fate`), for a kill at each instant:

    before the note          no note; dvc.lock names the last row
    note, not dvc.lock       dvc.lock does not name the note's row: dropped
    dvc.lock, not the ref    completed: the ref is created (the commit is whole)
    the ref, not its removal the ref holds the commit: dropped, the held
                             note (held.py) written from it, should the kill
                             have come before that note
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Optional

from ..core import atomic_file
from ..core.ancestry import start_token
from ..core.errors import RecordError
from ..core.log import logger
from ..reading import gitcmd
from ..reading.exp_refs import outs_digest
from . import held
from .commit import pid_alive, sweep_leftovers

NOTES = os.path.join(".dvc", "tmp", "dvc-dali", "pending")
LEAVE, DROP, COMPLETE, LOST = "leave", "drop", "complete", "lost"


def _path(root: str, lock_rel: str, stage_name: str) -> str:
    return os.path.join(root, NOTES, os.path.basename(held.note_path(root, lock_rel, stage_name)))


def write(root: str, lock_rel: str, stage_name: str, row: dict[str, Any]) -> None:
    """Before dvc.lock names the row ``row`` (sha, name, step, refs: the refs
    it may be published as, in order, outs: outs_digest of its entry, after:
    the row it follows or "").  A note that cannot be written fails the row,
    dvc.lock untouched: else a kill would cut the run's history again."""
    path = _path(root, lock_rel, stage_name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sweep_leftovers(f"{path}.dvc-dali-*.tmp")  # a killed writer's
        # durable before dvc.lock, which is: a machine that dies between them
        atomic_file.replace_durable(path, json.dumps(
            {**row, "pid": os.getpid(), "pid_started": start_token(os.getpid()),
             "lock": lock_rel, "stage": stage_name}))
    except OSError as exc:
        raise RecordError(
            f"cannot write {os.path.relpath(path, root)} ({exc}), the note that lets a run "
            f"killed while it records step {row['step']} be completed; that step is not "
            "recorded, dvc.lock still names the last row. Free disk space there or fix its "
            "permissions, then `dvc exp run` again: it resumes from the last recorded row."
        ) from exc


def clear(root: str, lock_rel: str, stage_name: str) -> None:
    """The row published (or not begun): its note gone."""
    clear_path(_path(root, lock_rel, stage_name))


def writer_alive(pid_alive: bool, noted_start: Optional[str], start_now: Optional[str]) -> bool:
    """Whether the note's writer still runs: its pid is a live process that
    started when the writer did. A killed writer's pid given to another
    process left the note alone, and the next run resumed from dvc.lock's
    unpublished checkpoint as a run of its own (its history cut: found by a
    sweep). A start not known on either side (an older release's note)
    trusts the pid, as before. Pure."""
    if not pid_alive:
        return False
    return noted_start is None or start_now is None or noted_start == start_now


def fate(writer_alive: bool, ref_holds_row: bool, lock_names_row: bool,
         commit_is_row: bool) -> str:
    """What the next run's start does with a note. Pure."""
    if writer_alive:
        return LEAVE  # a row being recorded now (another process of this repo)
    if ref_holds_row or not lock_names_row:
        return DROP  # published, or killed before dvc.lock named it
    return COMPLETE if commit_is_row else LOST


def _writer_alive(note: dict) -> bool:
    pid, noted = note.get("pid"), note.get("pid_started")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid == os.getpid() or pid <= 0:
        return False
    alive = pid_alive(pid)
    return writer_alive(alive, noted if isinstance(noted, str) else None,
                        start_token(pid) if alive else None)


def _git(git_dir: str, *args: str) -> Any:
    return gitcmd.run(["--git-dir", git_dir, *args], git_dir, check=False)


def _judge(root: str, git_dir: str, note: dict) -> tuple[str, Any, list[str]]:
    """(fate, the stage's dvc.lock entry now, the note's refs that hold its
    commit) of a parsed note."""
    from . import lockfile

    sha = note["sha"]
    entry = lockfile.stage_entry(lockfile.read(os.path.join(root, note["lock"]))[1],
                                 note["stage"])
    held_by = [ref for ref in note["refs"]
               if _git(git_dir, "rev-parse", "--verify", "--quiet", ref).stdout.strip() == sha]
    is_row = _git(git_dir, "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0
    return fate(_writer_alive(note), bool(held_by),
                _names(entry, note), is_row), entry, held_by


def _names(entry: Any, note: dict) -> bool:
    """Whether a dvc.lock entry names the note's row's outputs."""
    return entry is not None and outs_digest(entry) == note["outs"]


def _complete(git_dir: str, note: dict) -> Optional[str]:
    """The first of the note's refs created for its commit (None: all exist)."""
    for ref in note["refs"]:
        # create only: zeros as the old value refuse an existing ref
        if _git(git_dir, "update-ref", ref, note["sha"], "0" * 40).returncode == 0:
            return ref
    return None


def _lost(note: dict, why: str) -> RecordError:
    after = (f"`dvc exp apply {note['after']}` (the run's last row) restores it"
             if note["after"] else "`dvc exp show` lists the rows to `dvc exp apply`")
    return RecordError(
        f"{note['lock']} names the checkpoint of step {note['step']} of a run killed while "
        f"it recorded it, and {why}, so no row can hold it; "
        f"resuming from it would cut the run's history: {after}, then `dvc exp run` again. "
        "Nothing was recorded.")


def repair(root: str, git_dir: str) -> list[str]:
    """At a run's start in the DVC repo ``root`` (git dir ``git_dir``): each
    note :func:`fate` decides; returns what was done, one line each (also
    logged). Raises RecordError where the row cannot be completed."""
    done = []
    for path in sorted(glob.glob(os.path.join(root, NOTES, "*.json"))):
        try:
            with open(path, encoding="utf-8") as fobj:
                note = json.load(fobj)
            what, entry, held_by = _judge(root, git_dir, note)
        except (OSError, ValueError, KeyError, TypeError, RecordError) as exc:
            logger.debug("%s: not a note of a row being published (%s): dropped", path, exc)
            what, note, held_by = DROP, None, []
        if what == LEAVE:
            continue
        if what == DROP and held_by and _names(entry, note):
            # published, its held note perhaps not written (killed between them)
            held.write(root, note["lock"], note["stage"], held_by[0].rsplit("/", 1)[1],
                       note["step"], entry)
        if what == LOST:
            raise _lost(note, f"its commit {note['sha'][:7]} is gone")
        if what == COMPLETE:
            ref = _complete(git_dir, note)
            if ref is None:
                raise _lost(note, f"each ref it could be published as ({', '.join(note['refs'])}) "
                                  "names another commit")
            row = ref.rsplit("/", 1)[1]
            held.write(root, note["lock"], note["stage"], row, note["step"], entry)
            line = (f"row {row} completed: a killed run had recorded it ({note['sha'][:7]}) "
                    "and written dvc.lock, but not published it")
            logger.warning("%s", line)
            done.append(line)
        clear_path(path)
    return done


def clear_path(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass  # none, or unremovable: the next start drops it (its ref holds the commit)


def at_run_start(root: str) -> None:
    """:func:`repair` in the DVC repo ``root`` (the main one: DVC_ROOT)."""
    from ..reading.exp_refs import git_dirs

    repair(root, git_dirs(root)[0])
