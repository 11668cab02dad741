"""The workspace dvc.lock: DVC 3 checks persisted outputs out to what it
names at the start of `dvc exp run`, so it must name the latest checkpoint."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from ..core import atomic_file
from ..reading import gitcmd
from ..core.errors import RecordError
from ..core.process_state import STATE
from . import dvc_door
from .commit import sweep_leftovers


def read(path: str) -> tuple[str, Any]:
    """(text, parsed data) of a dvc.lock; ("", {}) when there is none."""
    try:
        with open(path, encoding="utf-8") as fobj:
            text = fobj.read()
    except FileNotFoundError:
        return "", {}
    try:
        return text, dvc_door.parse_yaml(text, path) or {}
    except Exception as exc:
        raise RecordError(f"'{path}' is not valid YAML ({exc}). Restore it with "
                          f"`git checkout -- {os.path.basename(path)}` or delete it.") from exc


def entry_at(git_dir: str, cwd: str, rev: str, lock_rel: str, stage_name: str) -> Any:
    """The stage's entry in ``lock_rel`` as commit ``rev`` holds it (None when
    it holds none); raises when that file is not YAML (callers decide what an
    unreadable one means)."""
    proc = gitcmd.run(["--git-dir", git_dir, "show", f"{rev}:{lock_rel}"], cwd=cwd, check=False)
    return stage_entry(dvc_door.parse_yaml(proc.stdout, lock_rel), stage_name)


def write_atomic(path: str, text: str) -> None:
    """dvc.lock replaced durably (a killed process's temporary files swept first)."""
    sweep_leftovers(f"{path}.dvc-dali-*.tmp")
    atomic_file.replace_durable(path, text)


def current(path: str) -> Any:
    """dvc.lock parsed; what this process wrote last while the file is unchanged."""
    return STATE.from_files(("lock", path), lambda: ([path], read(path)[1]))


def stage_entry(data: Any, stage_name: str) -> Any:
    return (data.get("stages") or {}).get(stage_name) if isinstance(data, dict) else None


def entry_of(stage: Any) -> Any:
    """The stage's entry in its dvc.lock as the file holds it now (None: none)."""
    return stage_entry(read(dvc_door.lockfile_path(stage))[1], stage.name)


def out_md5(entry: Any, def_path: str) -> str | None:
    """The md5 a dvc.lock entry records for the output (a file's, or a
    directory's ending in .dir)."""
    for item in (entry or {}).get("outs") or []:
        if isinstance(item, dict) and item.get("path") == def_path:
            md5 = item.get("md5")
            return md5 if isinstance(md5, str) and md5 else None
    return None


def with_entry(data: Any, stage_name: str, entry: dict) -> tuple[dict, str]:
    """(data, text) of dvc.lock ``data`` with the stage's entry replaced
    (other stages untouched); ``data`` itself is left as it is."""
    new = dict(data or {"schema": "2.0"})
    new["stages"] = dict(new.get("stages") or {})
    new["stages"][stage_name] = entry
    return new, dvc_door.dump_yaml(new)


def write_entry(path: str, data: Any, stage_name: str, entry: dict,
                text: str | None = None) -> None:
    """Replace the stage's entry in dvc.lock (other stages untouched);
    ``data``, ``text``: with_entry's, when already made."""
    if text is None:
        data, text = with_entry(data, stage_name, entry)
    write_atomic(path, text)
    STATE.remember(("lock", path), [path], data)
    STATE.written_lock_entries[(os.path.realpath(path), stage_name)] = _canonical(entry)


@dataclass(frozen=True)
class Before:
    """dvc.lock before this process writes a stage's entry: its text (""
    where there was none) and the entry this process had written last (None:
    none was its own), so that both can be put back."""

    path: str
    stage_name: str
    text: str
    own: str | None


def before_write(path: str, stage_name: str) -> Before:
    try:
        with open(path, encoding="utf-8") as fobj:
            text = fobj.read()
    except FileNotFoundError:
        text = ""
    return Before(path, stage_name, text,
                  STATE.written_lock_entries.get((os.path.realpath(path), stage_name)))


def put_back(before: Before) -> None:
    """dvc.lock as it was before this process wrote the stage's entry, and
    the entry it wrote before that counted as its own again."""
    if before.text:
        write_atomic(before.path, before.text)
    else:
        try:
            os.remove(before.path)
        except FileNotFoundError:
            pass
    STATE.forget_files()
    key = (os.path.realpath(before.path), before.stage_name)
    if before.own is None:
        STATE.written_lock_entries.pop(key, None)
    else:
        STATE.written_lock_entries[key] = before.own


def _canonical(entry: Any) -> str:
    return json.dumps(entry, sort_keys=True, default=str)


def replaced(path: str, stage_name: str, entry: Any) -> bool:
    """Whether the stage's entry ``entry`` (as read now) differs from the one
    this process wrote last: another command (`dvc exp apply`, `git
    checkout`...) rewrote dvc.lock, and checked the outputs out with it."""
    mine = STATE.written_lock_entries.get((os.path.realpath(path), stage_name))
    return mine is not None and mine != _canonical(entry)


def remove_entry(path: str, stage_name: str) -> bool:
    """Drop the stage's entry; False when it had none."""
    _, data = read(path)
    if (data.get("stages") or {}).pop(stage_name, None) is None:
        return False
    write_atomic(path, dvc_door.dump_yaml(data))
    return True
