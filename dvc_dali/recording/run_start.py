"""The params a run trains with, taken when it starts, and the workspace
kept the run's while it trains.

A workspace run holds DVC's experiment lock on the workspace stash queue
until its `dvc exp run` is done with it (guard_workspace): DVC then refuses a second
workspace (or `--temp`) `dvc exp run` before it touches anything. Without
that, the second one stashed the workspace, wrote its -S into params.yaml,
moved refs/exps/exec/*, checked out the outputs dvc.lock named over the
running run's (in the middle of a checkpoint: "not in the DVC cache after
caching it") and only then was refused ("busy"), removing the refs DVC's
own final commit of the first run reads ("'NoneType' object is not
subscriptable"). Other commands may still change params.yaml (an edit,
`dvc exp apply`): the stage's params files are read once, when the run
starts (Checkpointer creation, or the first bare make_checkpoint()), every
row records those, one line says the workspace changed, and when training
ends they are put back, so DVC's own final experiment of the run records
them too.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from ..core import atomic_file, exit_hooks
from ..reading import exp_refs
from ..core.context import RunContext
from ..core.errors import RecordError
from ..reading.exp_refs import Row
from ..core.flat_keys import flat_keys
from ..core.log import logger
from ..core.run import Run
from . import cut_short, dvc_door, pending
from .carry import carry, missed, refuse_lost
from .stage import find_stage, output_at


@dataclass
class RunStart:
    files: dict[str, Optional[bytes]]  # params file (absolute) -> its bytes at the start
    params: dict[str, Any] = field(default_factory=dict)  # "train.lr" -> value
    # deps (dvc.yaml's names) changed since the row the run starts from: its
    # rows branch off as a run of their own, as DVC 2's did (pipeline._lineage)
    changed_deps: list[str] = field(default_factory=list)
    warned: bool = False
    deps: dict[str, Any] = field(default_factory=dict)  # dep path -> (hash, meta) at start
    replaced: bool = False  # another command checked another row out: nothing put back
    # md5 of the workspace's checkpoint brought into this run (for a script
    # that read its state already: the one it should have started from)
    carried: Optional[str] = None
    resumed_row: Optional[Row] = None  # the recorded row the workspace checkpoint is
    # the stage's dvc.lock entry as that row recorded it (None: no row, or unreadable)
    resumed_entry: Optional[dict] = None
    later_rows: list[Row] = field(default_factory=list)  # rows its run recorded after it
    # what a row holds besides the checkpoint (absolute; see core/row_files.py)
    row_files: list[str] = field(default_factory=list)


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def capture(ctx: RunContext, run: Run, out: Optional[str],
            carry_checkpoint: bool | str = False) -> RunStart:
    """Read the stage's params now (once per process); the flattened values
    are the run's params (keys of files other than params.yaml are
    prefixed '<file>:'). ``carry_checkpoint`` "late": the script read its
    state already, only note the checkpoint it missed (carry.missed);
    true: before the checkpoint is read,
    bring the workspace's into a --temp/queued run (see carry.py)."""
    if run.start is not None:
        return run.start
    from .maintenance import repo_at

    cut_short.at_run_start(ctx)  # rows a killed run left half-published
    if ctx.under_exp_run:  # a workspace row killed between its dvc.lock and its ref
        pending.at_run_start(ctx.dvc_root)

    repo = repo_at(os.getcwd())
    stage = find_stage(repo, ctx.stage, out, ctx.stage)
    guard_workspace(ctx, repo)
    _refuse_a_rows_name(ctx)
    checkpoint = output_at(stage, out)
    carried = None
    if carry_checkpoint == "late" and checkpoint is not None:
        carried = missed(ctx, repo, stage, checkpoint)
    elif carry_checkpoint and checkpoint is not None:
        carried = carry(ctx, repo, stage, checkpoint)
    if checkpoint is not None:  # before the script reads its state, or records a row
        refuse_lost(ctx, repo, stage, checkpoint, late=carry_checkpoint == "late")
    start = RunStart({}, carried=carried,
                     row_files=dvc_door.row_held_paths(repo, stage, checkpoint))
    start.resumed_row, start.later_rows = _applied_row(ctx, repo, stage)
    # Under DVC's repo lock: `dvc exp run --temp`/`--queue` started meanwhile
    # stashes the workspace (params.yaml at HEAD for a moment) while holding it.
    dvc_door.lock_repo(repo, ctx.lock_timeout)
    try:
        start.deps = dvc_door.dep_hashes(stage)
        for dep in dvc_door.params_deps(stage):
            start.files[dep.fs_path] = _read(dep.fs_path)
            hash_info, values = dvc_door.params_now(dep)
            start.deps[dep.fs_path] = (hash_info, dep.meta)  # what every row records
            prefix = "" if os.path.basename(dep.fs_path) == "params.yaml" else f"{dep.def_path}:"
            start.params.update(flat_keys(values, prefix))
    finally:
        dvc_door.unlock_repo(repo)
    _find_changed_deps(ctx, repo, stage, start)
    run.start = start
    atexit.register(exit_hooks.this_process_only(_put_params_back, start, repo.root_dir,
                                                 ctx.lock_timeout))
    return start


def pin(run: Run, toplevel: str) -> dict[str, bytes]:
    """The params files changed since the run started (their values in the
    row are the start's already: see known_deps), as {path relative to
    toplevel: bytes at the start}, for the row's commit."""
    start = run.start
    if start is None:
        return {}
    changed = {p: b for p, b in start.files.items() if b is not None and _read(p) != b}
    if changed and not start.warned:
        _warn_changed(changed)
        start.warned = True
    top = os.path.realpath(toplevel)
    return {os.path.relpath(os.path.realpath(p), top): b for p, b in changed.items()}


def _applied_row(ctx: RunContext, repo: Any, stage: Any) -> tuple[Optional[Row], list[Row]]:
    """The row whose outputs the run's dvc.lock names (after `dvc exp apply
    <row>`, or a kill), and the rows its run recorded after it."""
    from . import lockfile, rows

    entry = lockfile.entry_of(stage)
    if not entry or not ctx.dvc_root:
        return None, []
    addr = rows.stage_address(repo.root_dir, stage)
    main_git_dir = exp_refs.git_dirs(ctx.dvc_root)[0]
    digest = exp_refs.outs_digest(entry)
    root = rows.project_address(repo.root_dir, exp_refs.git_dirs(repo.root_dir)[1])
    sha, *_ = rows.find_resume_parent(main_git_dir, ctx.dvc_root, addr, digest,
                                      ctx.baseline_rev, root)
    if sha is None:  # on another commit (one made or checked out since): the row
        # its lineage finds too, so a dependency changed since is said and branches
        sha, *_ = rows.find_resume_parent(main_git_dir, ctx.dvc_root, addr, digest, root=root)
    listed = exp_refs.list_rows(ctx.dvc_root)
    row = next((r for r in listed if r["sha"] == sha), None) if sha else None
    if row is None:
        return None, []
    return row, rows.superseded_by(listed, row)


def known_deps(run: Run) -> dict[str, Any]:
    """The deps' hashes as ``run`` started ({} before start_run)."""
    return run.start.deps if run.start is not None else {}


def _row_entry(ctx: RunContext, repo: Any, stage: Any, sha: str) -> Optional[dict]:
    """The stage's dvc.lock entry as the row ``sha`` recorded it."""
    from . import lockfile

    lock_rel = os.path.relpath(dvc_door.lockfile_path(stage), repo.root_dir)
    try:
        return lockfile.entry_at(exp_refs.git_dirs(ctx.dvc_root)[0], repo.root_dir, sha, lock_rel,
                                 stage.name)
    except Exception:  # unreadable: nothing to compare, so not called unchanged
        return None


def stage_changed_since(start: RunStart) -> bool:
    """Whether the run's params or deps differ from those the row it starts
    from (``start.resumed_row``) recorded: DVC 2 ran a checkpoint stage again
    only when its stage had changed (else "Nothing to do for unchanged
    checkpoint"). An entry that could not be read is not called unchanged."""
    entry = start.resumed_entry
    if entry is None:
        return True
    params: dict[str, Any] = {}
    for path, values in (entry.get("params") or {}).items():
        prefix = "" if os.path.basename(path) == "params.yaml" else f"{path}:"
        params.update(flat_keys(values or {}, prefix))
    return params != start.params or bool(start.changed_deps)


def _changed_deps(entry: dict, stage: Any, start: RunStart) -> list[str]:
    """The deps (as dvc.yaml names them) whose hash differs from ``entry``'s."""
    changed = []
    for dep in entry.get("deps") or []:
        now = start.deps.get(os.path.abspath(os.path.join(stage.wdir, str(dep.get("path")))))
        if now is not None and getattr(now[0], "value", None) != dep.get("md5"):
            changed.append(str(dep.get("path")))
    return changed


def _find_changed_deps(ctx: RunContext, repo: Any, stage: Any, start: RunStart) -> None:
    """A run that starts from a recorded row whose deps (the training code, a
    config file) changed since: its rows branch off (said at its first row,
    :func:`say_changed_deps`, once the pipeline's check let it resume: a
    changed data set is refused there)."""
    row = start.resumed_row
    start.resumed_entry = _row_entry(ctx, repo, stage, row["sha"]) if row is not None else None
    entry = start.resumed_entry  # read once: stage_changed_since compares its params
    start.changed_deps = _changed_deps(entry, stage, start) if entry else []


def say_changed_deps(start: RunStart) -> None:
    """Said at the first row of a run whose deps changed since its row."""
    row = start.resumed_row
    if start.changed_deps and row is not None:
        logger.warning("%s changed since row %s (step %d), the checkpoint this run started "
                       "from: the rows it records are trained with the changed files, so "
                       "they are a run of their own, named by this `dvc exp run`, as DVC 2 "
                       "branched a checkpoint experiment off when its code changed",
                       ", ".join(start.changed_deps), row["name"], row["step"])


def _warn_changed(changed: dict[str, bytes]) -> None:
    logger.warning("%s changed by another command while this run trains; its rows keep the "
                   "params this run started with, and the file gets them back when training "
                   "ends (for DVC's own experiment of this run)",
                   ", ".join(os.path.relpath(p) for p in changed))


def note_replaced(run: Run) -> None:
    """Another command checked another experiment out into the workspace:
    its params stay when this run stops (nothing is put back)."""
    if run.start is not None:
        run.start.replaced = True


def _changed_params(start: RunStart) -> dict[str, bytes]:
    return {p: b for p, b in start.files.items() if b is not None and _read(p) != b}


def _put_params_back(start: RunStart, root: str, lock_timeout: float) -> None:
    """At the end of training: the params files as the run started, so DVC's
    own final commit and dvc.lock of the run record the params it trained
    with, not those another command wrote meanwhile. Nothing to put back
    takes no lock: after a run failed on a full disk, DVC's lock file could
    not be written, and each exit said it could not put back what was intact."""
    if start.replaced or not os.path.isdir(root):  # gone: a queued run's, after `dvc queue
        return  # kill -f` (its line said it 'cannot put back' with 'no DVC repo' at the exit)
    if not _changed_params(start):
        return
    from .maintenance import repo_at

    try:
        repo = repo_at(root)
        dvc_door.lock_repo(repo, lock_timeout)  # not while a command stashes the workspace
    except Exception as exc:
        _say_not_put_back(_changed_params(start), exc)
        return
    try:
        changed = _changed_params(start)
        if changed and not start.warned:
            _warn_changed(changed)
        for path, data in changed.items():
            atomic_file.replace_whole(path, data)
    except OSError as exc:
        _say_not_put_back(_changed_params(start), exc)
    finally:
        dvc_door.unlock_repo(repo)


def _say_not_put_back(changed: dict[str, bytes], exc: BaseException) -> None:
    if changed:
        logger.warning("%s: changed by another command while this run trained, and cannot be "
                       "put back to the params it trained with (%s), so DVC's own experiment "
                       "of this run records the changed ones; its checkpoint rows hold those "
                       "it trained with", ", ".join(os.path.relpath(p) for p in changed), exc)


_GUARD_CMD = ("`dvc exp run` training in this workspace (dvc-dali keeps the workspace its own "
              "until that run ends); wait for it, or queue more with `dvc exp run --queue`")
# Waits for the `dvc exp run` to be done with this entry (it ended, or moved
# on to another stashed entry), then releases its hold (argv: tmp dir,
# hardlink, pid, cmd, where dvc_dali is, DVC's run info file).
_RELEASER = """import sys
sys.path.insert(0, sys.argv[5])
from dvc_dali.recording.dvc_door import release_exp_lock, wait_for_entry_end
import dvc.fs, dvc.repo.experiments.refs, dvc.repo.experiments.utils, dvc.rwlock
wait_for_entry_end(int(sys.argv[3]), sys.argv[6])
release_exp_lock(sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4])
"""


def _refuse_a_rows_name(ctx: RunContext) -> None:
    """`dvc exp run -f -n NAME` where NAME is a recorded row's: DVC would
    replace that row's ref with this run's experiment when the run ends (it
    refuses the name itself only without -f)."""
    name, base = ctx.dvc_exp_name, ctx.baseline_rev
    if not (name and base and ctx.dvc_root):
        return
    ref = f"refs/exps/{base[:2]}/{base[2:]}/{name}"
    git_dir = exp_refs.git_dirs(ctx.dvc_root)[0]
    if any(found == ref for _, found, _, _ in
           exp_refs.iter_checkpoint_refs(git_dir, ctx.dvc_root, ref)):
        raise RecordError(
            f"DVC_EXP_NAME={name!r} (`dvc exp run -n {name}`) is the name of a recorded row on "
            "this baseline: with -f, DVC would replace that row with this run's experiment "
            "when the run ends. Name the run otherwise (`-n <another name>`); nothing was "
            "recorded.")


def guard_workspace(ctx: RunContext, repo: Any) -> None:
    """Hold DVC's experiment lock on the workspace stash queue for the
    workspace `dvc exp run` that runs this stage, until DVC is done with this
    run (a small process releases it then): DVC's own final commit of the run
    comes after training. Released before DVC goes on with an entry a killed
    `dvc exp run` left stashed, else DVC waits on our hold for 3 minutes and
    fails. Not for --temp and queued runs (their own repo)."""
    import psutil

    if not ctx.under_exp_run or not os.path.samefile(repo.root_dir, ctx.dvc_root):
        return
    info_path = dvc_door.workspace_run_info(repo)
    pid = dvc_door.run_info_pid(info_path)
    try:
        ours = pid is not None and pid in {p.pid for p in psutil.Process().parents()}
    except psutil.Error:
        ours = False
    if not ours:
        logger.debug("no workspace `dvc exp run` above this process (pid %s): no hold", pid)
        return
    tmp_dir, hardlink = dvc_door.exp_lock_args(repo)
    try:
        if not dvc_door.hold_exp_lock(tmp_dir, hardlink, pid, _GUARD_CMD):
            logger.debug("DVC's experiment lock stayed held by another command: no hold")
            return
    except Exception as exc:  # a protection, never a reason to stop training
        logger.debug("cannot hold DVC's experiment lock: %s", exc)
        return
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        subprocess.Popen([sys.executable, "-c", _RELEASER, tmp_dir, "1" if hardlink else "0",
                          str(pid), _GUARD_CMD, src, info_path], stdin=subprocess.DEVNULL,
                         # not a stage process: importing dvc_dali does nothing there
                         env={k: v for k, v in os.environ.items() if k != "DVC_STAGE"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError as exc:  # nothing would release it: give it back now
        logger.debug("cannot start the releaser of DVC's experiment lock: %s", exc)
        dvc_door.release_exp_lock(tmp_dir, hardlink, pid, _GUARD_CMD)
