"""Rows: one experiment ref per checkpoint, its name, its lineage line, and
how it is published into the main repository."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional
from urllib.parse import quote, unquote

from ..errors import RecordError
from . import commit
from .cache import CACHE

#: First word of the machine-readable line in every checkpoint commit message.
LINEAGE_KEY = "dvc-dali-checkpoint:"
EXPS_NAMESPACE = "refs/exps"
_LINEAGE_RE = re.compile(r"^" + re.escape(LINEAGE_KEY) + r"\s*(.*)$", re.MULTILINE)


@dataclass(frozen=True)
class Lineage:
    """What a row's commit message says about where it belongs."""

    exp: str
    step: int
    parent: Optional[str]
    stage: str  # quoted "<dvc.yaml path>:<name>"
    outs: str  # digest of the stage's dvc.lock outs

    def line(self) -> str:
        return (f"{LINEAGE_KEY} exp={self.exp} step={self.step} "
                f"parent={self.parent or 'none'} stage={self.stage} outs={self.outs}")


def stage_address(root_dir: str, stage: Any) -> str:
    return quote(os.path.relpath(stage.path, root_dir) + ":" + stage.name, safe="/:@")


def outs_digest(entry: Optional[dict]) -> str:
    """Which outputs a dvc.lock entry names: a row's and a resumed run's match."""
    outs = (entry or {}).get("outs") or []
    blob = json.dumps(outs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def parse_lineage(text: str) -> Optional[dict[str, str]]:
    found = _LINEAGE_RE.findall(text)
    if not found:
        return None
    fields = {}
    for tok in found[-1].split():
        key, sep, val = tok.partition("=")
        if sep:
            fields[key] = val
    return fields if "step" in fields and "exp" in fields else None


def row_name(exp_name: str, step: int) -> str:
    return f"{exp_name}-step{step}"


def git_dirs(path: str) -> tuple[str, str]:
    """(absolute git dir, work tree top level) of the repo holding path."""
    key = os.path.realpath(path)
    if key not in CACHE.git_dirs:
        proc = commit.git(["rev-parse", "--absolute-git-dir", "--show-toplevel"], cwd=path,
                          check=False)
        lines = proc.stdout.split("\n")
        if proc.returncode != 0 or len(lines) < 2:
            raise RecordError(f"'{path}' is not inside a git work tree "
                              f"({proc.stderr.strip()}); run inside `dvc exp run` of a git repo.")
        CACHE.git_dirs[key] = (lines[0].strip(), lines[1].strip())
    return CACHE.git_dirs[key]


def iter_checkpoint_refs(git_dir: str, cwd: str, namespace: str = EXPS_NAMESPACE
                         ) -> Iterator[tuple[str, str, int, dict]]:
    """(sha, ref, commit time, lineage fields) of every dvc-dali row."""
    fmt = "%(objectname)%00%(refname)%00%(committerdate:unix)%00%(contents)%00%00"
    proc = commit.git(["--git-dir", git_dir, "for-each-ref", f"--format={fmt}",
                       namespace], cwd=cwd)
    for rec in proc.stdout.split("\0\0"):
        parts = rec.lstrip("\n").split("\0")
        if len(parts) < 4:
            continue
        sha, ref, date, contents = parts[:4]
        fields = parse_lineage(contents)
        if fields is not None:
            yield sha, ref, int(date or 0), fields


#: DVC's own ref to the row `dvc exp apply` last applied (DVC 3 sets it and no
#: longer reads it): which of several rows with the same outputs was applied.
APPLIED_REF = f"{EXPS_NAMESPACE}/exec/EXEC_APPLY"


def pick_resumed(candidates: list[tuple[int, str, int, str]], applied_sha: Optional[str],
                 applied_at: Optional[float]) -> Optional[tuple[int, str, int, str]]:
    """Which row a run resumes, among the rows whose outputs are the ones it
    starts from: (commit time, sha, step, run) each. Pure.

    Byte-identical outputs (a deterministic script) give several. The row
    `dvc exp apply` applied wins, unless a row with those outputs was
    recorded after it was applied (then that run went on, and its newest
    row is the workspace's); else the newest."""
    if not candidates:
        return None
    newest = max(candidates, key=lambda c: c[:3])
    applied = next((c for c in candidates if c[1] == applied_sha), None)
    if applied is None or applied is newest:
        return newest
    if applied_at is not None and newest[0] <= applied_at:
        return applied
    return newest


def applied_at(git_dir: str) -> Optional[float]:
    """When `dvc exp apply` last wrote its ref (the loose ref's mtime); None
    when it is not a loose file (then the applied row wins only if newest)."""
    try:
        return os.stat(os.path.join(git_dir, APPLIED_REF)).st_mtime
    except OSError:
        return None


def find_resume_parent(main_git_dir: str, cwd: str, stage_addr: str, digest: str,
                       baseline: Optional[str] = None
                       ) -> tuple[Optional[str], int, Optional[str]]:
    """(sha, step, run name) of the recorded row whose outputs are the ones
    this run resumed from (see pick_resumed), on ``baseline`` if given;
    (None, 0, None) when none."""
    candidates: list[tuple[int, str, int, str]] = []
    applied_sha = None
    for sha, ref, date, fields in iter_checkpoint_refs(main_git_dir, cwd):
        if fields.get("outs") != digest or fields.get("stage") != stage_addr:
            continue
        if ref == APPLIED_REF:
            applied_sha = sha
            continue
        parts = ref.split("/")
        if baseline is not None and "".join(parts[2:4]) != baseline:
            continue
        try:
            candidates.append((date, sha, int(fields["step"]), fields["exp"]))
        except ValueError:
            continue
    chosen = pick_resumed(candidates, applied_sha,
                          applied_at(main_git_dir) if applied_sha else None)
    return (chosen[1], chosen[2], chosen[3]) if chosen else (None, 0, None)


def run_name(exp_name: str, parent_run: Optional[str], branched: bool) -> str:
    """The run a row belongs to: a resumed run keeps its name and numbering
    (as DVC 2's checkpoint experiments did), whatever `dvc exp run` named
    this invocation; a run that changed params branches off under its own."""
    return parent_run if parent_run and not branched else exp_name


def _row(sha: str, ref: str, date: int, fields: dict) -> Optional[dict]:
    parts = ref.split("/")
    if len(parts) != 5 or len(parts[2]) != 2:  # DVC's own refs/exps/exec/..., apply/...
        return None
    try:
        step = int(fields["step"])
    except ValueError:
        return None
    parent = fields.get("parent")
    return {
        "name": parts[-1], "ref": ref, "sha": sha, "exp": fields["exp"], "step": step,
        "parent": None if parent in (None, "none") else parent,
        "stage": unquote(fields["stage"]) if "stage" in fields else None,
        "outs": fields.get("outs"), "baseline": "".join(parts[2:4]), "time": date,
    }


def list_rows(dvc_root: str, exp: Optional[str] = None, namespace: str = EXPS_NAMESPACE
              ) -> list[dict]:
    """dvc-dali rows under refs/exps (or ``namespace``, laid out alike) of the
    repo at dvc_root, sorted by (exp, step, time). Each: name, ref, sha, exp,
    step, parent, stage, outs, baseline, time."""
    git_dir, _ = git_dirs(dvc_root)
    rows = []
    for sha, ref, date, fields in iter_checkpoint_refs(git_dir, dvc_root, namespace):
        if exp is None or fields.get("exp") == exp:
            row = _row(sha, ref, date, fields)
            if row is not None:
                rows.append(row)
    rows.sort(key=lambda r: (r["exp"], r["step"], r["time"]))
    return rows


def _push_ref(sha: str, ref: str, cwd_top: str, main_git_dir: str) -> bool:
    """--temp / queued run: the commit lives in the executor's clone."""
    args = ["push", "--no-verify", "--quiet", main_git_dir, f"{sha}:{ref}"]
    for attempt in range(3):  # DVC (dulwich) may prune ref dirs concurrently
        proc = commit.git(args, cwd=cwd_top, check=False)
        if proc.returncode == 0:
            return True
        exists = commit.git(["rev-parse", "--verify", "--quiet", ref], cwd=main_git_dir,
                            check=False)
        if exists.returncode == 0:
            return False
        time.sleep(0.1 * (attempt + 1))
    raise RecordError(
        f"could not create experiment ref '{ref}' in '{main_git_dir}': {proc.stderr.strip()}. "
        f"Check that the repo is writable and no '{ref}.lock' file is left in it.")


def create_row_ref(sha: str, ref: str, cwd_top: str, main_git_dir: str, workspace: bool) -> bool:
    """Create ref -> sha in the main repo; False when the ref already exists
    (a ref is never overwritten)."""
    if workspace:
        return commit.create_ref(cwd_top, ref, sha)
    return _push_ref(sha, ref, cwd_top, main_git_dir)


def superseded_by(rows: list[dict], row: dict) -> list[dict]:
    """The rows its run recorded after ``row``: the same experiment on the
    same baseline, whose lineage leads back to it. Pure."""
    by_sha = {r["sha"]: r for r in rows}
    later = []
    for r in rows:
        if r["exp"] != row["exp"] or r["baseline"] != row["baseline"] or r["step"] <= row["step"]:
            continue
        node, seen = r, set()
        while node is not None and node["sha"] not in seen and node["sha"] != row["sha"]:
            seen.add(node["sha"])
            node = by_sha.get(node["parent"])
        if node is not None and node["sha"] == row["sha"]:
            later.append(r)
    return sorted(later, key=lambda r: (r["step"], r["time"]))
