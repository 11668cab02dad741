"""`dvc-dali doctor`: the recorded rows whose checkpoint data the local DVC
cache lacks. `dvc gc -w` keeps only the workspace's data (unless given
--all-experiments): `dvc-dali show` still lists every row, but `dvc exp
apply` of such a row fails, and so does a resume from it."""

from __future__ import annotations

import os
from typing import Any, Callable

import yaml

from ..core.errors import DvcDaliError

SHOWN = 5  # rows named in the line; the rest counted


def lock_out_md5(text: bytes | None, stage: str, out: str) -> str | None:
    """The md5 a dvc.lock's text gives output ``out`` of stage ``stage``
    (None where it names none, or is no dvc.lock)."""
    try:
        stages = (yaml.safe_load(text or b"") or {}).get("stages") or {}
    except (yaml.YAMLError, AttributeError):
        return None
    entry = stages.get(stage) if isinstance(stages, dict) else None
    for item in (entry.get("outs") or []) if isinstance(entry, dict) else []:
        if isinstance(item, dict) and item.get("path") == out and isinstance(item.get("md5"),
                                                                             str):
            return item["md5"]
    return None


def _row_outs(root: str, outputs: list[tuple[str, str]]
              ) -> tuple[list[str], list[tuple[Any, str, str, str]]]:
    """Every row's name, and (row, its dvc.lock as a `git cat-file` spec,
    stage name, output path in that dvc.lock) of each checkpoint output of
    its stage."""
    from ..reading.exp_refs import list_rows, tree_path

    rows = list_rows(root)
    asked = []
    for address, path in outputs:
        dvcfile, _, stage = address.rpartition(":")  # DVC's "train" is dvc.yaml's
        dvcfile = dvcfile or "dvc.yaml"
        address = f"{dvcfile}:{stage}"  # as a row names its stage
        lock = os.path.join(os.path.dirname(dvcfile), "dvc.lock")
        out = os.path.relpath(path, os.path.join(root, os.path.dirname(dvcfile)))
        asked += [(r, f"{r['sha']}:{tree_path(root, lock)}", stage, out) for r in rows
                  if r.get("stage") == address]
    return [r["name"] for r in rows], asked


def rows_without_data(root: str, outputs: list[tuple[str, str]],
                      in_cache: Callable[[str], bool]) -> tuple[list[str], int]:
    """The rows (names) whose checkpoint output's data ``in_cache`` (an md5)
    says the local cache lacks, and how many rows there are."""
    from ..reading.gitcmd import read_blobs

    names, asked = _row_outs(root, outputs)
    blobs = read_blobs(root, [spec for _, spec, _, _ in asked])
    lacking = [row["name"] for (row, _, stage, out), blob in zip(asked, blobs)
               if (md5 := lock_out_md5(blob, stage, out)) is not None and not in_cache(md5)]
    return list(dict.fromkeys(lacking)), len(names)


def line(lacking: list[str], total: int) -> tuple[bool, str]:
    """(whether all is well, what doctor says) of :func:`rows_without_data`."""
    if not lacking:
        return True, f"rows: the local DVC cache holds the checkpoint data of all {total}"
    named = ", ".join(lacking[:SHOWN]) + (f" and {len(lacking) - SHOWN} more"
                                          if len(lacking) > SHOWN else "")
    return False, (f"rows: the local DVC cache lacks the checkpoint data of {len(lacking)} of "
                   f"{total} ({named}), which `dvc-dali show` lists all the same: `dvc gc` "
                   "removes it (unless given --all-experiments). `dvc exp apply` of such a row "
                   "fails, and so does a resume from it, until `dvc-dali pull <git remote> "
                   "<run>` fetches it; `dvc_dali.load` reads it from a DVC remote that holds it")


def report_rows(report: Callable[[bool, str], None], root: str) -> None:
    """Say which rows' data the local cache lacks (a note: the DVC remote may
    hold it); nothing where no row is recorded."""
    from ..recording import dvc_door, maintenance

    repo: Any = maintenance.repo_at(root)
    try:
        lacking, total = rows_without_data(root, maintenance.checkpoint_outputs(root),
                                           lambda md5: dvc_door.out_in_cache(repo, md5))
    except DvcDaliError as exc:  # git or DVC refused: the other checks still run
        print(f"--   rows: whether the local DVC cache holds their data is not known ({exc})")
        return
    if total:
        ok, text = line(lacking, total)
        if ok:
            report(True, text)
        else:
            print(f"--   {text}")
