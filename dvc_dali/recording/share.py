"""`dvc-dali push` and `dvc-dali pull`: every row of whole runs, with data.

`dvc exp push origin EXP` sends only the experiment's final ref and its
data; DVC 2 pushed every checkpoint. Here all of a run's rows (and DVC's own
experiment ref of that name) move, data first, so a row on the git remote
always has its data on the DVC remote.
"""

from __future__ import annotations

import gc
import shlex
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from ..reading import gitcmd
from ..core.errors import DvcDaliError, RecordError
from ..reading.exp_refs import Row, exp_refs, list_rows
from . import dvc_door
from .remove import select_refs

_PULLED = "refs/dvc-dali-pull"  # fetched here first, to read the rows' lineage
_THEIRS = "refs/dvc-dali-push-check"  # the remote's rows a push compares lineage with


@dataclass(frozen=True)
class Moved:
    exp: str
    rows: int
    refs: int  # rows plus DVC's own experiment refs


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _count(targets, names: Sequence[str]) -> list[Moved]:
    return [Moved(n, sum(t.row for t in targets if t.exp == n),
                  sum(1 for t in targets if t.exp == n)) for n in dict.fromkeys(names)]


def _unknown(targets, names: Sequence[str], where: str, listed: str,
             rows: Sequence[Row] = ()) -> None:
    """Refuse names no run has (``listed``: the command that lists them); a
    row's name is said to be one, with its run's."""
    unknown = [n for n in dict.fromkeys(names) if n not in {t.exp for t in targets}]
    if unknown:
        by_row = {r["name"]: r["exp"] for r in rows}
        hints = "".join(f"; {n} is one checkpoint row of run {by_row[n]}, and a run moves "
                        f"whole: name {by_row[n]}" for n in unknown if n in by_row)
        raise DvcDaliError(f"no run named {', '.join(map(shlex.quote, unknown))} {where}: "
                           f"nothing moved. {listed}{hints}")


def _row_name(target) -> str:
    name = target.ref.rsplit("/", 1)[-1]
    return name if target.row else f"{name} (DVC's experiment)"


def _files(paths: list[str], most: int = 4) -> str:
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return ", ".join(paths[:most]) + more


def _incomplete(targets, missing: dict[str, list[str]], lacking_here: dict[str, list[str]]
                ) -> str:
    """'a-step5 (not in the local DVC cache: checkpoint/..., ...), ...': per
    row, the files the local cache lacks, else those the DVC remote lacks."""
    said = []
    for t in targets:
        if t.sha in lacking_here:
            said.append(f"{_row_name(t)} (not in the local DVC cache: "
                        f"{_files(lacking_here[t.sha])})")
        elif t.sha in missing:
            said.append(f"{_row_name(t)} (not on the DVC remote: {_files(missing[t.sha])})")
    return _files(said, most=8)


def _transfer(repo: Any, shas: list[str], direction: str, dvc_remote: str | None) -> str:
    """DVC's push or fetch of the commits' data; its error ("" when none):
    some files failed, and which rows they hold is checked after it."""
    try:
        dvc_door.transfer_revs(repo, shas, direction, dvc_remote)
    except RecordError as exc:
        return str(exc)
    return ""


def _send_skipped(repo: Any, shas: list[str], dvc_remote: str | None,
                  direction: str = "push") -> str:
    """Move the commits' data again, object by object, with this workspace's
    DVC remote: DVC's own push and fetch read each commit's .dvc/config, so
    they skip ("failed to collect") rows recorded before the remote was set
    up. The error, "" when none; what still lacks is checked after it."""
    try:
        odb = dvc_door.remote_odb(repo, dvc_remote, direction)
        objs = dvc_door.rev_out_hashes(repo, shas)
        if direction == "push":
            dvc_door.upload_objects(repo, odb, objs, set())
        else:
            dvc_door.download_objects(repo, odb, objs)
    except Exception as exc:  # said with the rows that lack it
        return f"{direction} object by object: {type(exc).__name__}: {exc}"
    return ""


@contextmanager
def _unawaited_unsaid() -> Iterator[None]:
    """A DVC remote on S3 that cannot be reached leaves s3fs's coroutines
    unawaited, and Python's warning about each ("RuntimeWarning: coroutine
    'S3FileSystem._exists' was never awaited", with a source line) came before
    the one line saying why nothing moved (found by a sweep). Silenced for the
    transfer only: collected before the filter goes."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
        try:
            yield
        finally:
            gc.collect()


def _push_data(root: str, shas: list[str], dvc_remote: str | None
               ) -> tuple[dict[str, list[str]], dict[str, list[str]], str]:
    """`dvc push` of the commits' data; ({sha: files the DVC remote still
    lacks}, {sha: files of those the local cache lacks too}, DVC's error)."""
    repo = dvc_door.open_repo(root)
    try:
        dvc_door.check_remote(repo, dvc_remote, "push")
        failure = _transfer(repo, shas, "push", dvc_remote)
        try:
            missing = dvc_door.missing_data(repo, shas, "remote", dvc_remote)
            if missing:
                failure = _send_skipped(repo, sorted(missing), dvc_remote) or failure
                missing = dvc_door.missing_data(repo, shas, "remote", dvc_remote)
        except RecordError:
            if failure:
                raise DvcDaliError(failure) from None
            raise
        here = dvc_door.missing_data(repo, sorted(missing), "cache") if missing else {}
    finally:
        repo.close()
    return missing, here, failure


def rejected_rows(porcelain: str) -> list[str]:
    """The row names of the refs ``git push --porcelain`` says it rejected
    because the remote holds another commit there (a line ``!<TAB><src>:<dst>
    <TAB>[rejected] ...``), but those an atomic push left out only because
    another was rejected. A ``[remote rejected]`` one (a hook, a full disk, a
    permission) is no such row: it was said to be one, and the advice was to
    delete the remote's refs (found by a sweep)."""
    return [line.split("\t")[1].rsplit(":", 1)[-1].rsplit("/", 1)[-1]
            for line in porcelain.splitlines()
            if line.startswith("!\t") and line.count("\t") >= 2
            and line.split("\t")[2].startswith("[rejected]")
            and "atomic push failed" not in line]


def remote_refusal(porcelain: str) -> str:
    """Why the remote refused a ref (``[remote rejected] (pre-receive hook
    declined)``: "pre-receive hook declined"); "" when it refused none."""
    for line in porcelain.splitlines():
        status = line.split("\t")[2] if line.startswith("!\t") and line.count("\t") >= 2 \
            else ""
        if status.startswith("[remote rejected]"):
            return status.removeprefix("[remote rejected]").strip(" ()")
    return ""


def _push_refs(root: str, git_remote: str, refspecs: list[str], runs: str,
               dry_run: bool = False) -> None:
    """The rows' refs, all or none (``--atomic``, where the remote can): a
    push half done said it failed, named none of what went, and its remote
    then held a run mixed from two recordings (found by a sweep).
    ``dry_run``: asked before any data moves, so that a git remote that is
    unreachable, refuses this user's pushes or holds other commits under
    these names refuses the push before the data went up without its rows."""
    base = ["push", "--quiet", "--porcelain", *(["--dry-run"] if dry_run else [])]
    proc = gitcmd.run([*base, "--atomic", git_remote, *refspecs], root, check=False,
                      unrunnable=DvcDaliError)
    if proc.returncode != 0 and "atomic" in proc.stderr and "support" in proc.stderr:
        proc = gitcmd.run([*base, git_remote, *refspecs], root, check=False,
                          unrunnable=DvcDaliError)
    if proc.returncode == 0:
        return
    data = ("Nothing was pushed, the data neither" if dry_run
            else "The data is on the DVC remote")
    rejected = rejected_rows(proc.stdout)
    if rejected:
        shown = ", ".join(rejected[:5]) + (", ..." if len(rejected) > 5 else "")
        raise DvcDaliError(
            f"git push to {git_remote}: nothing pushed: {git_remote} holds other commits under "
            f"{shown} (rows of this run recorded elsewhere, by another machine or clone). "
            f"`dvc-dali pull {git_remote} <run>` fetches them to compare; to push these, "
            f"delete those refs there first (`git push {git_remote} --delete <ref>`). {data}.")
    said = gitcmd.reason(proc.stderr or proc.stdout)
    refusal = remote_refusal(proc.stdout)
    said += f" ({refusal})" if refusal and refusal not in said else ""
    raise DvcDaliError(f"git push of {runs} to {git_remote} failed: {said}. {data}; check the "
                       f"git remote (`git ls-remote {git_remote}`), then run the command again.")


def _lineage_root(row: Row, by_sha: dict[str, Row]) -> str | None:
    """The sha of the first row of ``row``'s lineage; None where a parent is
    not among ``by_sha`` (a row pruned or removed above it: unknown)."""
    node, seen = row, set()
    while node["parent"] is not None:
        if node["parent"] not in by_sha or node["sha"] in seen:
            return None
        seen.add(node["sha"])
        node = by_sha[node["parent"]]
    return node["sha"]


def foreign_rows(ours: Sequence[Row], theirs: Sequence[Row]) -> list[Row]:
    """The rows of ``theirs`` (another repository's) that are not in ``ours``
    and belong to a run ``ours`` has (name and baseline) but to another
    recording of it: their lineage starts at no row ours starts at (another
    clone's `dvc exp run -n NAME` on the same commit). Moved beside ours they
    read as one run: `dvc-dali show` lists both under the name, and the
    next run's retention pruned the other's rows, on the remote too (found
    by a sweep). A lineage cut on either side (a row pruned above) is unknown:
    never said foreign."""
    by_sha = {r["sha"]: r for r in [*ours, *theirs]}
    starts: dict[tuple[str, str], set] = {}
    for r in ours:
        starts.setdefault((r["exp"], r["baseline"]), set()).add(_lineage_root(r, by_sha))
    have = {r["sha"] for r in ours}
    found = []
    for r in theirs:
        mine = starts.get((r["exp"], r["baseline"]))
        if r["sha"] in have or not mine or None in mine:
            continue
        start = _lineage_root(r, by_sha)
        if start is not None and start not in mine:
            found.append(r)
    return found


def mixing(foreign: Sequence[Row], git_remote: str, verb: str) -> str:
    """Why ``foreign`` rows (foreign_rows) keep this run's from moving."""
    runs = ", ".join(dict.fromkeys(r["exp"] for r in foreign))
    rows = _files([r["name"] for r in foreign], most=5)
    return (f"{git_remote} holds another recording of run {runs} ({rows}: started "
            f"elsewhere, by another clone or machine, not resumed from this run's rows): "
            f"nothing {verb}; beside this run's rows they would read as one run, and "
            "retention of either would prune the other's rows")


def _refuse_mixing(foreign: Sequence[Row], git_remote: str, verb: str, fix: str) -> None:
    if foreign:
        raise DvcDaliError(f"{mixing(foreign, git_remote, verb)}. {fix}")


def remote_rows(root: str, git_remote: str, listed: Sequence[Row], names: set[str],
                baselines: set[str], env: dict[str, str] | None = None) -> list[Row]:
    """The rows of the runs ``names`` on ``baselines`` that ``git_remote``
    holds and ``listed`` (this clone's) lacks, read from their commits
    (fetched under _THEIRS, then dropped); [] when there are none, or the
    remote cannot be asked (the push then says why)."""
    proc = gitcmd.run(["ls-remote", git_remote, "refs/exps/*"], root, env=env, check=False,
                      unrunnable=DvcDaliError)
    here = {r["sha"] for r in listed}
    unknown = [line.split("\t")[1] for line in proc.stdout.splitlines()
               if "\t" in line and line.split("\t")[0] not in here]
    wanted = {b for b in baselines if any(ref.startswith(f"refs/exps/{b[:2]}/{b[2:]}/")
                                          for ref in unknown)}
    if proc.returncode != 0 or not wanted:
        return []
    try:
        gitcmd.run(["fetch", "--quiet", "--no-tags", git_remote,
                    *(f"+refs/exps/{b[:2]}/{b[2:]}/*:{_THEIRS}/{b[:2]}/{b[2:]}/*"
                      for b in sorted(wanted))], root, env=env, check=False,
                   unrunnable=DvcDaliError)
        return [r for r in list_rows(root, namespace=_THEIRS) if r["exp"] in names]
    finally:
        for ref, sha in _refs_under(root, _THEIRS):
            gitcmd.run(["update-ref", "-d", ref, sha], root, check=False,
                       unrunnable=DvcDaliError)


def push_runs(root: str, git_remote: str, names: Sequence[str],
              dvc_remote: str | None = None) -> list[Moved]:
    """Push every row of the runs ``names``: their data to the DVC remote,
    then their refs to ``git_remote`` (asked first with a dry run, so that a
    remote that cannot take them refuses before the data moves); a ref whose
    data did not all reach the DVC remote is not pushed (DvcDaliError naming
    it, after the others went)."""
    listed = list_rows(root)
    targets = select_refs(listed, names, exp_refs(root))
    _unknown(targets, names, "in this repository", "`dvc-dali show` lists the runs here",
             listed)
    theirs = remote_rows(root, git_remote, listed, {t.exp for t in targets},
                         {t.baseline for t in targets if t.row})
    _refuse_mixing(foreign_rows(listed, theirs), git_remote, "pushed",
                   f"Push to another git remote, or remove those rows from {git_remote} if "
                   f"they are not wanted (`git push {git_remote} --delete "
                   "<ref>`; `dvc-dali pull` into a fresh clone shows them first).")
    runs = ", ".join(map(shlex.quote, dict.fromkeys(names)))
    _push_refs(root, git_remote, [f"{t.sha}:{t.ref}" for t in targets], runs, dry_run=True)
    with _unawaited_unsaid():
        missing, here, failure = _push_data(root, sorted({t.sha for t in targets}), dvc_remote)
    complete = [t for t in targets if t.sha not in missing]
    if complete:
        _push_refs(root, git_remote, [f"{t.sha}:{t.ref}" for t in complete], runs)
    if missing:
        pushed = [f"{_plural(m.rows, 'row')} of {m.exp}" for m in _count(complete, names)
                  if m.refs] or ["nothing"]
        fix = ("fetch the missing files into the DVC cache (`dvc exp pull <git remote> <row>` "
               "from a remote that has them) or train those steps again" if here else
               "the files are in the local DVC cache: fix the DVC remote (`dvc remote list`)")
        raise DvcDaliError(
            f"NOT pushed to {git_remote}: {_incomplete(targets, missing, here)}; a row goes "
            "only once all its data is on the DVC remote" + (f" ({failure})" if failure else "")
            + f". Pushed with their data: "
            f"{', '.join(pushed)}. To push the others, {fix}, then run `dvc-dali push "
            f"{git_remote} {' '.join(dict.fromkeys(names))}` again")
    return _count(targets, names)


def _fetch_data(root: str, shas: list[str], dvc_remote: str | None
                ) -> tuple[dict[str, list[str]], str, str]:
    """`dvc fetch` of the commits' data; ({sha: files the local cache still
    lacks}, DVC's error, "<remote>: <why>" when the DVC remote could not be
    reached, else ""). Unreached, it is not asked again object by object."""
    repo = dvc_door.open_repo(root)
    try:
        with _unawaited_unsaid(), dvc_door.unreached_remotes() as unreached:
            failure = _transfer(repo, shas, "fetch", dvc_remote)
        missing = dvc_door.missing_data(repo, shas, "cache")
        if unreached:
            return missing, failure, f"{dvc_door.remote_name(repo, dvc_remote)}: {unreached[0]}"
        if missing:
            with _unawaited_unsaid():
                failure = _send_skipped(repo, sorted(missing), dvc_remote, "fetch") or failure
            missing = dvc_door.missing_data(repo, shas, "cache")
        return missing, failure, ""
    finally:
        repo.close()


def pull_runs(root: str, git_remote: str, names: Sequence[str],
              dvc_remote: str | None = None) -> list[Moved]:
    """Fetch every row of the runs ``names`` from ``git_remote`` with their
    data from the DVC remote; refs land only once their data is here (the
    others: DvcDaliError naming them, after the complete ones landed)."""
    if dvc_remote is not None:  # one named that is not there: said before git fetches
        repo = dvc_door.open_repo(root)  # (without one, rows whose data is here still come)
        try:
            dvc_door.check_remote(repo, dvc_remote, "fetch")
        finally:
            repo.close()
    proc = gitcmd.run(["fetch", "--quiet", "--no-tags", git_remote, f"+refs/exps/*:{_PULLED}/*"],
                      root, check=False, unrunnable=DvcDaliError)
    try:
        if proc.returncode != 0:
            runs = ", ".join(map(shlex.quote, dict.fromkeys(names)))
            raise DvcDaliError(f"cannot fetch {runs} from git remote {git_remote}: "
                               f"{gitcmd.reason(proc.stderr)}; nothing pulled. Check the "
                               f"remote (`git ls-remote {git_remote}`, `git remote -v`), then "
                               "run the command again")
        fetched = list_rows(root, namespace=_PULLED)
        pulled = [(ref, sha) for ref, sha in _refs_under(root, _PULLED)]
        targets = select_refs(fetched, names, pulled)
        _unknown(targets, names, f"on {git_remote}",
                 f"`dvc exp list {git_remote}` lists the experiments there (a run's rows are "
                 "<run>-step<N>)", fetched)
        _refuse_mixing(foreign_rows(list_rows(root), [r for r in fetched if r["exp"] in names]),
                       git_remote, "pulled", "Pull into a fresh clone to look at them "
                       f"(`git clone`, then `dvc-dali pull {git_remote} <run>`).")
        missing, failure, unreached = _fetch_data(root, sorted({t.sha for t in targets}),
                                                  dvc_remote)
        complete = [t for t in targets if t.sha not in missing]
        done = gitcmd.run(["update-ref", "--stdin"], root, check=False,
                          input=_create_script(root, complete), unrunnable=DvcDaliError)
        if done.returncode != 0:
            raise DvcDaliError(f"git could not create the refs: {done.stderr.strip()}")
    finally:
        for ref, sha in _refs_under(root, _PULLED):
            gitcmd.run(["update-ref", "-d", ref, sha], root, check=False,
                       unrunnable=DvcDaliError)
    if missing:
        _refuse_incomplete(root, git_remote, names, targets, complete, missing, failure,
                           unreached, dvc_remote)
    return _count(targets, names)


def _refuse_incomplete(root: str, git_remote: str, names: Sequence[str], targets, complete,
                       missing: dict[str, list[str]], failure: str, unreached: str,
                       dvc_remote: str | None) -> None:
    """Say which rows did not come for want of their data, and why: no DVC
    remote here, one that cannot be reached, or one that lacks the files."""
    pulled_ok = [f"{_plural(m.rows, 'row')} of {m.exp}" for m in _count(complete, names)
                 if m.refs] or ["nothing"]
    runs = " ".join(dict.fromkeys(names))
    rows = _files([_row_name(t) for t in targets if t.sha in missing], most=8)
    again = f"then run `dvc-dali pull {git_remote} {runs}` again"
    unset = _no_default_remote(root) if dvc_remote is None else ""
    if unset:  # not "not on the DVC remote": there is none here to ask
        raise DvcDaliError(
            f"NOT pulled from {git_remote}: {rows} (their data is not in the local DVC "
            f"cache, and no DVC remote is configured here to fetch it from: {unset}). "
            f"Pulled with their data: {', '.join(pulled_ok)}. Add the DVC remote the "
            f"recording machine pushed to (`dvc remote add -d <name> <url>`), or name it "
            f"with -r, {again}")
    if unreached:  # not "not on the DVC remote": it was not asked
        raise DvcDaliError(
            f"NOT pulled from {git_remote}: cannot reach the DVC remote {unreached}; the "
            f"local DVC cache lacks the data of {rows}. Pulled with their data: "
            f"{', '.join(pulled_ok)}. Check that the DVC remote is up and reachable from "
            f"here (its address and credentials: `dvc remote list`), {again}")
    raise DvcDaliError(
        f"NOT pulled from {git_remote}: {_incomplete(targets, missing, {})}; a row comes "
        "only with all its data" + (f" ({failure})" if failure else "")
        + f". Pulled with their data: "
        f"{', '.join(pulled_ok)}. To pull the others, push their data from the machine "
        f"that recorded them (`dvc-dali push {git_remote} {runs}` there), {again}")


def _no_default_remote(root: str) -> str:
    """Why this project has no default DVC remote (DVC's words); "" when it has one."""
    repo = dvc_door.open_repo(root)
    try:
        dvc_door.check_remote(repo, None, "fetch")
    except DvcDaliError as exc:
        return str(exc).split(". `dvc remote list`")[0]
    finally:
        repo.close()
    return ""


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
    proc = gitcmd.run(["for-each-ref", "--format=%(objectname) %(refname)", namespace], root,
                      check=False, unrunnable=DvcDaliError)
    return [tuple(reversed(line.split(" ", 1))) for line in proc.stdout.splitlines()]

