"""Rows as the recorder makes them: a row's name, its lineage line, which
row a run resumes, and publishing its ref into the main repository. The
ref format and the queries both sides use are exp_refs.py's."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import quote

from ..reading import gitcmd
from ..core.errors import RecordError
from ..reading.exp_refs import EXPS_NAMESPACE, LINEAGE_KEY, Row, common_dir, iter_checkpoint_refs
from . import commit


@dataclass(frozen=True)
class Lineage:
    """What a row's commit message says about where it belongs."""

    run: str  # the run's name (the line's "exp=")
    step: int
    parent: Optional[str]
    stage: str  # quoted "<dvc.yaml path>:<name>"
    outs: str  # digest of the stage's dvc.lock outs
    # when its run began (started_token), which tells its run's rows from
    # another run's of the same name; None: not known (an older checkpoint)
    started: Optional[str] = None
    # its DVC project's folder in the git repo (project_address); None: not
    # said (an older release's rows, which any project may resume)
    root: Optional[str] = None

    def line(self) -> str:
        started = f" started={self.started}" if self.started else ""
        root = f" root={self.root}" if self.root else ""
        return (f"{LINEAGE_KEY} exp={self.run} step={self.step} "
                f"parent={self.parent or 'none'} stage={self.stage} outs={self.outs}"
                f"{started}{root}")


def started_token(started: Optional[float]) -> Optional[str]:
    """A run's start as its rows' lineage lines say it: compared as text, so
    a start read back from a checkpoint's manifest names the same run."""
    return None if started is None else f"{started:.6f}"


def stage_address(root_dir: str, stage: Any) -> str:
    return quote(os.path.relpath(stage.path, root_dir) + ":" + stage.name, safe="/:@")


def project_address(root_dir: str, toplevel: str) -> str:
    """Which DVC project of the git repository a row is of: its root's folder
    relative to the repository's top (``.`` at the top), quoted as stage_address.
    The stage address alone is relative to the DVC root: two projects of one
    repository (`dvc init --subdir`) name their stages alike, and share refs."""
    rel = os.path.relpath(os.path.realpath(root_dir), os.path.realpath(toplevel))
    return quote(rel.replace(os.sep, "/"), safe="/:@")


def same_project(row_root: Optional[str], root: Optional[str]) -> bool:
    """Whether a row whose lineage says ``row_root`` is of the project at
    ``root`` (project_address). Pure. A row that says none (an older
    release's) cannot tell, and counts as before."""
    return row_root is None or root is None or row_root == root


def row_name(run_name: str, step: int) -> str:
    return f"{run_name}-step{step}"


def named_by_recorder(row: Row) -> bool:
    """Whether the row has a name the recorder gives (``<run>-step<N>``, or
    that with its commit's ``-<sha[:7]>`` where the name was taken: see
    pipeline._publish), not one `dvc exp rename` gave it. Pure."""
    name = row_name(row["exp"], row["step"])
    return row["name"] in (name, f"{name}-{row['sha'][:7]}")


# git makes a ref through "<name>.lock": a ref's last part of over 250 bytes
# cannot be made on a file system whose names stop at 255
ROW_NAME_MAX = 250


def too_long(run_name: str, step: int) -> str:
    """Why row ``<run_name>-step<step>`` cannot be made ("" where it can):
    a run name DVC accepts failed at its first row, advising to check that
    the repository is writable (found by a sweep)."""
    size = len(row_name(run_name, step).encode())
    if size <= ROW_NAME_MAX:
        return ""
    most = ROW_NAME_MAX - len(f"-step{step}")
    return (f"the run's name ({len(run_name.encode())} bytes: "
            f"{run_name.encode()[:40].decode(errors='replace')}...) is too long for its row at "
            f"step {step}, {row_name('<name>', step)}: git makes no ref name part over "
            f"{ROW_NAME_MAX} bytes. Name the run with at most {most} bytes (`dvc exp run -n`)")


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
        return os.stat(os.path.join(common_dir(git_dir), APPLIED_REF)).st_mtime
    except OSError:
        return None


def find_resume_parent(main_git_dir: str, cwd: str, stage_addr: str, digest: str,
                       baseline: Optional[str] = None, root: Optional[str] = None
                       ) -> tuple[Optional[str], int, Optional[str], Optional[str]]:
    """(sha, step, run name, its run's start: its lineage line's started=, None
    where it says none) of the recorded row whose outputs are the ones this
    run resumed from (see pick_resumed), on ``baseline`` if given, of the
    project ``root`` (project_address; a sibling project's row of the same
    outputs was resumed as this run's parent: found by a sweep);
    (None, 0, None, None) when none."""
    candidates: list[tuple[int, str, int, str]] = []
    applied_sha = None
    started: dict[str, Optional[str]] = {}
    for sha, ref, date, fields in iter_checkpoint_refs(main_git_dir, cwd):
        if (fields.get("outs") != digest or fields.get("stage") != stage_addr
                or not same_project(fields.get("root"), root)):
            continue
        started[sha] = fields.get("started")
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
    return (chosen[1], chosen[2], chosen[3], started[chosen[1]]) if chosen \
        else (None, 0, None, None)


#: How a bare script's first row follows the recorded row its outputs were
#: (first_row_follows): as that row's run continued; in that row's lineage
#: but with a start of its own (whether it resumed that row cannot be told);
#: or as a run of its own (it started over).
CONTINUES, CANNOT_TELL, STARTS_OVER = "continues", "cannot tell", "starts over"


def first_row_follows(step: Optional[int], parent: Optional[str], parent_step: int,
                      resumed: Optional[bool], same_checkpoint: bool) -> str:
    """How a bare script's first row (``resumed`` None) follows the recorded
    row ``parent`` (at ``parent_step``) whose outputs the run started from;
    ``same_checkpoint``: it holds that row's checkpoint unchanged. Pure.

    A script restarted under a finished run's name (`dvc exp run -n a -f`,
    params unchanged) that ignores its state was read as run a continued, and
    retention deleted a's rows (found by sweeps). So: a step before the row's
    starts over; the row's own step continues it only with the row's
    checkpoint unchanged (a resumed loop checkpointing its step at the top;
    a one-row run trained again to that step holds another); no step named
    (make_checkpoint(), `dvc-dali run` over a checkpoint that says none)
    cannot tell a resume from a restart: its rows follow the row, as DVC 2
    chained them, but with a start of their own, so retention never deletes
    a row it cannot attribute (more than N rows may stay: none is lost). A
    Checkpointer knows what it resumed."""
    if resumed is not None or parent is None:
        return CONTINUES
    if step is None:
        return CANNOT_TELL
    if step < parent_step or (step == parent_step and not same_checkpoint):
        return STARTS_OVER
    return CONTINUES


def run_name(dvc_exp_name: str, parent_run: Optional[str], branched: bool) -> str:
    """The run a row belongs to: a resumed run keeps its name and numbering
    (as DVC 2's checkpoint experiments did), whatever `dvc exp run` named
    this invocation; a run that changed params or deps branches off under its own."""
    return parent_run if parent_run and not branched else dvc_exp_name


def _push_ref(sha: str, ref: str, cwd_top: str, main_git_dir: str) -> bool:
    """--temp / queued run: the commit lives in the executor's clone. No hook
    of the main repo runs (a pre-receive or reference-transaction hook
    refused every row): a workspace run's rows and DVC's own experiment refs
    are written without hooks too."""
    args = ["push", "--no-verify", "--quiet",
            "--receive-pack=git -c core.hooksPath=/dev/null receive-pack",
            main_git_dir, f"{sha}:{ref}"]
    for attempt in range(3):  # DVC (dulwich) may prune ref dirs concurrently
        proc = gitcmd.run(args, cwd_top, check=False)
        if proc.returncode == 0:
            return True
        exists = gitcmd.run(["rev-parse", "--verify", "--quiet", ref], main_git_dir,
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


def superseded_by(rows: list[Row], row: Row) -> list[Row]:
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
