"""`dvc-dali push` and `dvc-dali pull`: every row of whole runs, with data.

`dvc exp push origin EXP` sends only the experiment's final ref and its
data; DVC 2 pushed every checkpoint. Here all of a run's rows (and DVC's own
experiment ref of that name) move, data first, so a row on the git remote
always has its data on the DVC remote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import DvcDaliError
from . import dvc_door
from .remove import _git, exp_refs, select_refs

_PULLED = "refs/dvc-dali-pull"  # fetched here first, to read the rows' lineage


@dataclass(frozen=True)
class Moved:
    exp: str
    rows: int
    refs: int  # rows plus DVC's own experiment refs


def _count(targets, names: Sequence[str]) -> list[Moved]:
    return [Moved(n, sum(t.row for t in targets if t.exp == n),
                  sum(1 for t in targets if t.exp == n)) for n in dict.fromkeys(names)]


def _unknown(targets, names: Sequence[str], where: str) -> None:
    unknown = [n for n in dict.fromkeys(names) if n not in {t.exp for t in targets}]
    if unknown:
        raise DvcDaliError(f"no run named {', '.join(unknown)} {where}: nothing moved. "
                           "`dvc-dali show` lists the runs here")


def push_runs(root: str, git_remote: str, names: Sequence[str],
              dvc_remote: str | None = None) -> list[Moved]:
    """Push every row of the runs ``names``: their data to the DVC remote,
    then their refs to ``git_remote``."""
    from . import list_rows

    targets = select_refs(list_rows(root), names, exp_refs(root))
    _unknown(targets, names, "in this repository")
    repo = dvc_door.open_repo(root)
    try:
        dvc_door.transfer_revs(repo, sorted({t.sha for t in targets}), "push", dvc_remote)
    finally:
        repo.close()
    refspecs = [f"{t.sha}:{t.ref}" for t in targets]
    proc = _git(root, ["push", "--quiet", git_remote, *refspecs])
    if proc.returncode != 0:
        raise DvcDaliError(f"git push to {git_remote} failed: {proc.stderr.strip()}. The data "
                           "is on the DVC remote; run the command again once git can push.")
    return _count(targets, names)


def pull_runs(root: str, git_remote: str, names: Sequence[str],
              dvc_remote: str | None = None) -> list[Moved]:
    """Fetch every row of the runs ``names`` from ``git_remote`` with their
    data from the DVC remote; refs land only once their data is here."""
    from . import list_rows

    proc = _git(root, ["fetch", "--quiet", "--no-tags", git_remote,
                       f"+refs/exps/*:{_PULLED}/*"])
    try:
        if proc.returncode != 0:
            raise DvcDaliError(f"git fetch from {git_remote} failed: {proc.stderr.strip()}")
        fetched = list_rows(root, namespace=_PULLED)
        pulled = [(ref, sha) for ref, sha in _refs_under(root, _PULLED)]
        targets = select_refs(fetched, names, pulled)
        _unknown(targets, names, f"on {git_remote}")
        repo = dvc_door.open_repo(root)
        try:
            dvc_door.transfer_revs(repo, sorted({t.sha for t in targets}), "fetch", dvc_remote)
        finally:
            repo.close()
        script = _create_script(root, targets)
        done = _git(root, ["update-ref", "--stdin"], stdin=script)
        if done.returncode != 0:
            raise DvcDaliError(f"git could not create the refs: {done.stderr.strip()}")
    finally:
        for ref, sha in _refs_under(root, _PULLED):
            _git(root, ["update-ref", "-d", ref, sha])
    return _count(targets, names)


def _create_script(root: str, targets) -> str:
    """git update-ref commands creating the pulled refs; one that exists here
    with another commit is refused (a row is never overwritten)."""
    here = dict(exp_refs(root))
    lines = []
    for t in targets:
        ref = t.ref.replace(_PULLED, "refs/exps", 1)
        if here.get(ref) not in (None, t.sha):
            raise DvcDaliError(f"{ref} exists here with another commit ({here[ref][:7]}, "
                               f"remote {t.sha[:7]}): nothing pulled. Remove or rename the "
                               "local run first (`dvc-dali remove`, `dvc exp rename`).")
        if ref not in here:
            lines.append(f"create {ref} {t.sha}\n")
    return "".join(lines)


def _refs_under(root: str, namespace: str) -> list[tuple[str, str]]:
    proc = _git(root, ["for-each-ref", "--format=%(objectname) %(refname)", namespace])
    return [tuple(reversed(line.split(" ", 1))) for line in proc.stdout.splitlines()]

