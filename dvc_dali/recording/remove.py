"""`dvc-dali remove`: delete whole runs, every checkpoint row of each, as
`dvc exp remove` deletes experiments.

Only refs go. The rows' data stays in the DVC cache until `dvc gc` removes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from ..reading import gitcmd
from ..core.errors import DvcDaliError
from ..core.log import logger
from ..reading.exp_refs import Row, baseline_and_name, exp_refs, list_rows


@dataclass(frozen=True)
class Target:
    """One ref to delete: a checkpoint row, or DVC's own experiment ref."""

    ref: str
    sha: str
    exp: str
    baseline: str
    row: bool  # False: the ref `dvc exp run -n EXP` itself left at the end


@dataclass(frozen=True)
class Removed:
    """What went of one run on one baseline."""

    exp: str
    baseline: str
    rows: int
    dvc_ref: bool


def select_refs(rows: Iterable[Row], names: Iterable[str],
                exp_refs: Iterable[tuple[str, str]] = ()) -> list[Target]:
    """The refs removing the runs ``names`` deletes: every checkpoint row
    (``rows`` as ``list_rows`` gives them) whose lineage names one of them, on
    any baseline, then DVC's own experiment ref of that name among
    ``exp_refs`` ((ref, sha) pairs) that is not itself a checkpoint row."""
    wanted = set(names)
    rows = list(rows)
    targets = [Target(r["ref"], r["sha"], r["exp"], r["baseline"], True)
               for r in rows if r["exp"] in wanted]
    row_refs = {r["ref"] for r in rows}  # a row named like a run is still only a row
    for ref, sha in exp_refs:
        found = baseline_and_name(ref)
        if found and found[1] in wanted and ref not in row_refs:
            targets.append(Target(ref, sha, found[1], found[0], False))
    return targets


def summarize(targets: Sequence[Target]) -> list[Removed]:
    """Per run and baseline, in the order first met: what ``targets`` holds."""
    seen: dict[tuple[str, str], Removed] = {}
    for t in targets:
        old = seen.get((t.exp, t.baseline), Removed(t.exp, t.baseline, 0, False))
        seen[(t.exp, t.baseline)] = Removed(t.exp, t.baseline, old.rows + t.row,
                                            old.dvc_ref or not t.row)
    return list(seen.values())


def continued(rows: Iterable[Row], targets: Sequence[Target]) -> list[tuple[str, str]]:
    """(run, row) for each run not removed that was resumed from a row
    ``targets`` removes: its rows stay, but no longer show where it started
    (DVC 2 kept that history in the continuing experiment's commits)."""
    gone = {t.sha for t in targets if t.row}
    names = {t.exp for t in targets}
    rows = list(rows)
    by_sha = {r["sha"]: r["name"] for r in rows}
    found: dict[str, str] = {}
    for r in rows:
        if r["exp"] not in names and r.get("parent") in gone:
            found.setdefault(r["exp"], by_sha[r["parent"]])
    return sorted(found.items())


def _unknown_message(unknown: list[str], rows: list[Row]) -> str:
    by_row = {r["name"]: r["exp"] for r in rows}
    hints = [f"{n} is one checkpoint row of run {by_row[n]} (`dvc exp remove {n}` removes "
             "just that row)" for n in unknown if n in by_row]
    return (f"no run named {', '.join(unknown)}: nothing removed. `dvc-dali show` lists "
            "the runs" + ("; " + "; ".join(hints) if hints else ""))


def _refuse_runs_in_training(root: str, names: set[str]) -> None:
    """A run a live process is training: its next rows would be parented on
    the rows removed under it."""
    from .maintenance import runs_in_training

    busy = {n: pid for n, pid in runs_in_training(root, lambda: list_rows(root)).items()
            if n in names}
    if busy:
        name, pid = next(iter(busy.items()))
        raise DvcDaliError(f"run {name} is training in process {pid} (it holds the checkpoint "
                           "and records its rows): nothing removed. Stop that run first "
                           "(Ctrl-C, or `dvc queue kill`), then `dvc-dali remove` again.")


def remove_runs(root: str, names: Sequence[str]) -> list[Removed]:
    """Delete every ref of the runs ``names`` in the repository at ``root``, all
    or none: an unknown name removes nothing, and the refs go in one git
    transaction that fails whole if any of them moved meanwhile."""
    refs = exp_refs(root)
    rows = list_rows(root)
    targets = select_refs(rows, names, refs)
    unknown = [n for n in dict.fromkeys(names) if n not in {t.exp for t in targets}]
    if unknown:
        raise DvcDaliError(_unknown_message(unknown, rows))
    _refuse_runs_in_training(root, {t.exp for t in targets})
    for run, row in continued(rows, targets):  # found by a sweep: said nothing
        logger.warning("run %s was resumed from %s: its rows stay, but from now on nothing "
                       "shows where it started (its first steps were trained by the run "
                       "removed)", run, row)
    # `delete <ref> <old sha>`: what `git update-ref -d <ref> <sha>` does per
    # ref, so a ref rewritten since it was listed is left alone.
    script = "".join(f"delete {t.ref} {t.sha}\n" for t in targets)
    proc = gitcmd.run(["update-ref", "--stdin"], root, check=False, input=script,
                      unrunnable=DvcDaliError)
    if proc.returncode != 0:
        raise DvcDaliError(f"git could not delete the refs (exit {proc.returncode}): "
                           f"{proc.stderr.strip()}; nothing was removed, run it again")
    return summarize(targets)
