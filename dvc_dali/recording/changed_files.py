"""Which files of a data set changed since the checkpoint being resumed:
the first few, named, for the refusal of a pipeline whose data changed.

The old listing comes from where the run's recorded row keeps it: the DVC
cache (a data directory that is a DVC output, or `dvc add`ed), else git (a
data directory tracked in git, compared with the row's commit).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ..reading import gitcmd
from ..reading.exp_refs import list_rows, outs_digest
from . import dvc_door, lockfile


def first_changes(old: dict[str, str], new: dict[str, str], limit: int = 3) -> list[str]:
    """'added x' / 'removed y' / 'changed z' for the first paths (sorted) whose
    digest differs between two {relative path: digest} listings."""
    changed = []
    for path in sorted(set(old) | set(new)):
        if path not in old:
            changed.append(f"added {path}")
        elif path not in new:
            changed.append(f"removed {path}")
        elif old[path] != new[path]:
            changed.append(f"changed {path}")
    more = len(changed) - limit
    return changed[:limit] + ([f"and {more} more"] if more > 0 else [])


def _from_git(toplevel: str, sha: str, path: str) -> list[str]:
    """Changes of a git-tracked directory between a commit and the files now."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(toplevel))
    diff = gitcmd.run(["diff", "--name-status", "--no-renames", sha, "--", rel],
                      cwd=toplevel, check=False).stdout.splitlines()
    extra = gitcmd.run(["ls-files", "--others", "--exclude-standard", "--", rel],
                       cwd=toplevel, check=False).stdout.splitlines()
    def inside(name: str) -> str:  # relative to the data directory, as DVC's listing
        return os.path.relpath(name, rel)

    old = {inside(line.split("\t", 1)[1]): "old" for line in diff if line[:1] in "DM"}
    new = {inside(line.split("\t", 1)[1]): "new" for line in diff if line[:1] in "AM"}
    new.update({inside(p): "new" for p in extra})
    return first_changes(old, new)


def describe(repo: Any, stage: Any, dvc_root: str, data_path: str) -> list[str]:
    """The first changes of ``data_path`` since the row the workspace's
    dvc.lock names; [] when that cannot be told."""
    entry = lockfile.entry_of(stage)
    want = os.path.realpath(data_path)
    dep = next((d for d in (entry or {}).get("deps") or [] if isinstance(d, dict) and
                os.path.realpath(os.path.join(stage.wdir, str(d.get("path")))) == want), None)
    md5 = (dep or {}).get("md5")
    if isinstance(md5, str) and md5.endswith(".dir"):
        old = dvc_door.tree_listing(repo, md5)
        if old is not None:
            return first_changes(old, dvc_door.dir_listing(repo, want))
    row = _row_of(dvc_root, entry)
    return _from_git(repo.root_dir, row, want) if row else []


def _row_of(dvc_root: str, entry: Any) -> Optional[str]:
    if not entry:
        return None
    digest = outs_digest(entry)
    found = [r for r in list_rows(dvc_root) if r["outs"] == digest]
    return max(found, key=lambda r: r["time"])["sha"] if found else None
