"""Experiment refs as dvc-dali writes and reads them: one module for both
sides (the recorder publishes rows, `dvc_dali.rows()`, `load`, `show`,
`remove`, `push` and `pull` read them).

A row is a ref refs/exps/<baseline[:2]>/<baseline[2:]>/<row name> whose
commit message holds one lineage line:

    dvc-dali-checkpoint: exp=<run> step=<N> parent=<sha|none> stage=<dvc.yaml:name> outs=<digest>

and, where known, `started=<seconds since the epoch>`: when the row's run
began (retention tells a run's rows from another's of the same name by it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any, Iterator, Optional, TypedDict
from urllib.parse import unquote

from . import gitcmd
from ..core.errors import DvcDaliError, RecordError
from ..core.process_state import STATE

#: First word of the machine-readable line in every checkpoint commit message.
LINEAGE_KEY = "dvc-dali-checkpoint:"
EXPS_NAMESPACE = "refs/exps"
_LINEAGE_RE = re.compile(r"^" + re.escape(LINEAGE_KEY) + r"\s*(.*)$", re.MULTILINE)


class _Listed(TypedDict):
    name: str  # the row's name: `dvc exp apply <name>`
    ref: str  # refs/exps/<baseline[:2]>/<baseline[2:]>/<name>
    sha: str  # its commit
    exp: str  # its run's name
    step: int
    parent: Optional[str]  # the previous row's commit; None for a run's first row
    stage: Optional[str]  # "<dvc.yaml path>:<stage name>"
    outs: Optional[str]  # digest of the stage's dvc.lock outs (see outs_digest)
    baseline: str  # the commit the run started from
    time: int  # commit time, seconds since the epoch


class Row(_Listed, total=False):
    """One recorded row, as `dvc_dali.rows` gives it: a plain dict
    (``row["step"]``); this is its ``TypedDict``, for type checkers
    (``def pick(rows: list[dvc_dali.Row]) -> dvc_dali.Row``).

    Attributes:
        name: the row's name, ``<run>-step<N>`` (`dvc exp apply <name>`).
        ref: ``refs/exps/<baseline[:2]>/<baseline[2:]>/<name>``.
        sha: its commit.
        exp: its run's name.
        step: the checkpoint's step.
        parent: the previous row's commit; None for a run's first row.
        stage: ``"<dvc.yaml path>:<stage name>"``.
        outs: which outputs it holds (a digest of the stage's ``dvc.lock``
            outs).
        baseline: the commit the run started from.
        time: commit time, seconds since the epoch.
        metrics: the row's DVCLive metrics, flattened: ``train/acc``
            (`rows` only).
        metrics_file: the file they were read from, relative to the DVC
            root: the one its dvc.yaml declares, else
            ``dvclive/metrics.json`` (`rows` only).
        params: its ``params.yaml``, flattened: ``train.lr`` (`rows` only,
            unless ``params=False``).
        dvc_experiments: DVC's own experiments holding the same outputs
            (`rows` only).
    """

    metrics: dict[str, float]  # the row's DVCLive metrics, flattened: "train/acc"
    metrics_file: str  # where they were read, relative to the DVC root
    params: dict[str, Any]  # its params.yaml, flattened: "train.lr"
    dvc_experiments: list[str]  # DVC's own experiments holding the same outputs


def parse_lineage(text: str) -> Optional[dict[str, str]]:
    """The fields of the last lineage line in a commit message; None without one."""
    found = _LINEAGE_RE.findall(text)
    if not found:
        return None
    fields = {}
    for tok in found[-1].split():
        key, sep, val = tok.partition("=")
        if sep:
            fields[key] = val
    return fields if "step" in fields and "exp" in fields else None


def baseline_and_name(ref: str) -> tuple[str, str] | None:
    """(baseline, name) of an experiment ref refs/exps/<b[:2]>/<b[2:]>/<name>;
    None for DVC's bookkeeping refs (refs/exps/exec/..., apply/...)."""
    parts = ref.split("/")
    if len(parts) != 5 or len(parts[2]) != 2:
        return None
    return parts[2] + parts[3], parts[4]


def outs_digest(entry: Optional[dict]) -> str:
    """Which outputs a dvc.lock entry names: a row's and a resumed run's match."""
    outs = (entry or {}).get("outs") or []
    blob = json.dumps(outs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def git_dirs(path: str) -> tuple[str, str]:
    """(absolute git dir, work tree top level) of the repo holding path."""
    key = os.path.realpath(path)
    if key not in STATE.git_dirs:
        proc = gitcmd.run(["rev-parse", "--absolute-git-dir", "--show-toplevel"], path,
                          check=False)
        lines = proc.stdout.split("\n")
        if proc.returncode != 0 or len(lines) < 2:
            _refuse_ownership(proc.stderr, path)
            raise RecordError(f"'{path}' is not inside a git work tree "
                              f"({proc.stderr.strip()}): experiments and their rows live in "
                              "git, so run this in a git repository with a DVC project (`git "
                              "init`, then `dvc init`).")
        STATE.git_dirs[key] = (lines[0].strip(), lines[1].strip())
    return STATE.git_dirs[key]


def common_dir(git_dir: str) -> str:
    """Where a repository's refs live: a linked worktree's git dir
    (.git/worktrees/<name>) names it in its ``commondir`` file; any other
    git dir holds them itself. For files read or globbed directly (ref locks,
    loose refs); git commands given ``git_dir`` find them on their own."""
    try:
        text = Path(git_dir, "commondir").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return git_dir
    return os.path.normpath(os.path.join(git_dir, text)) if text else git_dir


def _refuse_ownership(stderr: str, root: str) -> None:
    """git's safe.directory refusal (a repository owned by another user: a
    mounted volume), which is no damage to repair."""
    if "dubious ownership" not in stderr:
        return
    at = re.search(r"repository at '([^']+)'", stderr)
    raise RecordError(
        f"git refuses to read {root}: it is owned by another user (git's safe.directory "
        "check), so no row can be read or recorded. Run as that user, or trust it with `git "
        f"config --global --add safe.directory {shlex.quote(at.group(1) if at else root)}`")


def tree_path(root: str, path: str) -> str:
    """``path``, relative to ``root`` (a DVC root, which `dvc init --subdir`
    puts below the git work tree's top), as a path in the repository's
    commits: relative to that top."""
    top = git_dirs(root)[1]
    rel = os.path.relpath(os.path.join(os.path.realpath(root), path), os.path.realpath(top))
    return rel.replace(os.sep, "/")


def iter_checkpoint_refs(git_dir: str, cwd: str, namespace: str = EXPS_NAMESPACE
                         ) -> Iterator[tuple[str, str, int, dict[str, str]]]:
    """(sha, ref, commit time, lineage fields) of every dvc-dali row."""
    fmt = "%(objectname)%00%(refname)%00%(committerdate:unix)%00%(contents)%00%00"
    proc = gitcmd.run(["--git-dir", git_dir, "for-each-ref", f"--format={fmt}", namespace],
                      cwd)
    for rec in proc.stdout.split("\0\0"):
        parts = rec.lstrip("\n").split("\0")
        if len(parts) < 4:
            continue
        sha, ref, date, contents = parts[:4]
        fields = parse_lineage(contents)
        if fields is not None:
            yield sha, ref, int(date or 0), fields


def _row(sha: str, ref: str, date: int, fields: dict[str, str]) -> Optional[Row]:
    where = baseline_and_name(ref)
    if where is None:  # DVC's own refs/exps/exec/..., apply/...
        return None
    try:
        step = int(fields["step"])
    except ValueError:
        return None
    parent = fields.get("parent")
    return Row(name=where[1], ref=ref, sha=sha, exp=fields["exp"], step=step,
               parent=None if parent in (None, "none") else parent,
               stage=unquote(fields["stage"]) if "stage" in fields else None,
               outs=fields.get("outs"), baseline=where[0], time=date)


def list_rows(dvc_root: str, exp: Optional[str] = None, namespace: str = EXPS_NAMESPACE
              ) -> list[Row]:
    """dvc-dali rows under refs/exps (or ``namespace``, laid out alike) of the
    repo at dvc_root, sorted by (exp, step, time). Each: name, ref, sha, exp,
    step, parent, stage, outs, baseline, time."""
    return [row for row, _ in rows_and_lineage(dvc_root, exp, namespace)]


def rows_and_lineage(dvc_root: str, exp: Optional[str] = None,
                     namespace: str = EXPS_NAMESPACE) -> list[tuple[Row, dict[str, str]]]:
    """list_rows's rows, each with its lineage line's fields (all of them:
    retention reads ``started``, which no Row holds)."""
    git_dir, _ = git_dirs(dvc_root)
    found = []
    for sha, ref, date, fields in iter_checkpoint_refs(git_dir, dvc_root, namespace):
        if exp is None or fields.get("exp") == exp:
            row = _row(sha, ref, date, fields)
            if row is not None:
                found.append((row, fields))
    found.sort(key=lambda rf: (rf[0]["exp"], rf[0]["step"], rf[0]["time"]))
    return found


def exp_refs(root: str) -> list[tuple[str, str]]:
    """(ref, sha) of every experiment ref under refs/exps.

    Refuses a repository git reads only in part: git skips a broken ref
    with a warning and exit 0, which would otherwise look like no rows.
    """
    proc = gitcmd.run(["for-each-ref", "--format=%(objectname) %(objecttype) %(refname)",
                       EXPS_NAMESPACE], root, check=False, unrunnable=DvcDaliError)
    broken = [line for line in proc.stderr.splitlines() if "broken ref" in line]
    if proc.returncode != 0 and "not a git repository" in proc.stderr:
        raise DvcDaliError(
            f"{root} is not in a git repository, so it has no recorded rows: DVC experiments, "
            "and dvc-dali's rows, are git refs (a DVC project made with `dvc init --no-scm` "
            "has none). Run `git init` and `dvc init` without --no-scm to record rows")
    if proc.returncode != 0:
        _refuse_ownership(proc.stderr, root)
    if proc.returncode != 0 or broken:
        status = f" (exit {proc.returncode})" if proc.returncode else ""
        raise DvcDaliError(
            f"git could not read the experiment refs of {root}{status}: "
            f"{proc.stderr.strip()}. Repair the repository (`git fsck` names what is "
            "damaged), or delete a broken ref with `git update-ref -d <ref>`")
    found = []
    for line in proc.stdout.splitlines():
        sha, _type, ref = line.split(" ", 2)
        if baseline_and_name(ref):
            found.append((ref, sha))
    return found
