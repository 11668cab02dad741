"""The record pipeline: a running ``dvc exp run`` stage's checkpoints as DVC 3 experiments.

DVC 3 removed checkpoint experiments. Called from inside the stage command
while ``dvc exp run`` runs, :func:`record` turns the stage's current outputs
into one row of ``dvc exp show``, in named steps:

    find the stage        stage.py       (once per process; again if dvc.yaml changes)
    cache the outputs     outputs.py     (md5s handed over, hard links where allowed)
    write the lock entry  lockfile.py    (a rerun resumes from what dvc.lock names)
    build the commit      commit.py      (in-process, parented on the baseline;
                          row_tree.py    a later row's tree from the last one's)
    name and link the row rows.py        (lineage line: run, step, parent row)
    publish               rows.py        (a ref in the main repo, never overwritten)
    push the row          auto_push.py   (only with DVC's experiment auto-push)
    apply retention       retention.py

without touching the user's HEAD, index or files other than dvc.lock. All of
DVC's internals are behind dvc_door.py; per-process lookups live in
process_state.py (STATE), and what belongs to the run in its Run (core/run.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple, Optional

from ..reading import exp_refs
from ..core import exit_hooks
from ..core.context import RunContext
from ..core.errors import RecordError
from ..reading.exp_refs import LINEAGE_KEY, list_rows
from ..core.log import logger
from ..core.record_request import RecordRequest, Retention
from ..core import row_files
from ..core import run as runs
from ..core.process_state import STATE
from ..core.run import Run
from . import (auto_push, commit, dvc_door, held, lockfile, outputs, pending, retention, rows,
               run_start)
from .maintenance import check_stage, checkpoint_outputs, repo_at, reset_stage
from .rows import Lineage
from .stage import checkpoint_output

__all__ = ["LINEAGE_KEY", "RecordRequest", "RecordResult", "Retention", "check_stage",
           "checkpoint_outputs", "list_rows", "record", "record_and_prune", "record_request",
           "reset_stage", "start_bare_run", "start_before_first_row", "start_run"]


def _dvc_exp_name(ctx: RunContext) -> str:
    """This invocation's DVC experiment name: DVC_EXP_NAME, or exp-<baseline[:7]>
    when DVC gives none. A row's run keeps the name of the run it resumed
    (rows.run_name), which may be another."""
    return ctx.dvc_exp_name or f"exp-{ctx.baseline_rev[:7]}"


def start_run(ctx: RunContext, out: Optional[str], before_reading: bool = False) -> Run:
    """Check the stage and take the params the run trains with, before its
    first step (``run.start.params``, flattened: "train.lr": 0.1); returns
    the run. ``before_reading``: called before the checkpoint is read (a
    Checkpointer), so a --temp or queued run can get the workspace's
    checkpoint first."""
    check_stage(ctx, out)
    auto_push.start(ctx.dvc_root, _dvc_exp_name(ctx))
    run = runs.of(ctx)
    run_start.capture(ctx, run, out, carry_checkpoint=before_reading)
    return run


def too_long_for_rows(ctx: RunContext, total_steps: Optional[int]) -> str:
    """Why this run's name cannot name its rows up to ``total_steps`` ("" where
    it can, or the steps are not known: then each row is checked)."""
    if not isinstance(total_steps, int) or isinstance(total_steps, bool):
        return ""
    return rows.too_long(_dvc_exp_name(ctx), max(total_steps, 0))


def start_bare_run(ctx: RunContext, out: Optional[str], late: bool = False) -> bool:
    """start_run for a script that reads its checkpoint itself (a bare
    make_checkpoint() port, `dvc-dali run`'s child), before it reads it: the
    workspace's checkpoint carried into a --temp/queued run, and DVC 2's
    "Nothing to do for unchanged checkpoint" for an applied row its run went
    on from. True when the rows branch off as a run of their own (trained
    again on purpose, DVC_DALI_RETRAIN=1). ``late``: called at the first
    make_checkpoint(), the script having read its state already (a stage
    without `checkpoint: true`, where `import dvc_dali` did not start it)."""
    run = runs.of(ctx)
    if run.branched is None:
        run.branched = _start_bare_run(ctx, run, out, late)
    elif out is not None and out not in run.checked_outs:
        # started by `import dvc_dali`, from the declared output: a path named
        # since (`dvc-dali run --checkpoint`, make_checkpoint's) must be it too
        check_stage(ctx, out)
        run.checked_outs.add(out)
    return run.branched


def start_before_first_row(ctx: RunContext, out: Optional[str], bare: bool) -> bool:
    """At this process's first make_checkpoint(), once (the one run-start guard,
    with start_bare_run's): a stage DVC 3 cannot resume is refused before any
    row. ``bare``: a script without a Checkpointer (start_bare_run, late);
    else the Checkpointer's start_run again. True when the rows branch off
    as a run of their own (see start_bare_run)."""
    if bare:
        return start_bare_run(ctx, out, late=True)
    run = runs.of(ctx)
    if run.branched is None:
        start_run(ctx, out)
        run.branched = False
    return False


def _start_bare_run(ctx: RunContext, run: Run, out: Optional[str], late: bool) -> bool:
    from ..core.errors import UnchangedCheckpointError

    check_stage(ctx, out)
    auto_push.start(ctx.dvc_root, _dvc_exp_name(ctx))
    start = run_start.capture(ctx, run, out, carry_checkpoint="late" if late else True)
    if late and start.carried:  # it trained from step 0 though there was one to resume
        raise RecordError(
            "this --temp/queued run started without the workspace's checkpoint (DVC does not "
            "carry it), and the script read its state before dvc_dali could bring it: declare "
            "the checkpoint output `checkpoint: true` in dvc.yaml (then `import dvc_dali` "
            "brings it first), or commit dvc.lock; nothing was recorded")
    row, later = start.resumed_row, start.later_rows
    if row is None or not later:
        return False
    if run_start.stage_changed_since(start):
        return False
    if ctx.retrain:
        return True
    names = [r["name"] for r in later]
    raise UnchangedCheckpointError(
        f"the workspace holds row {row['name']} (step {row['step']}), and its run went on from "
        f"it: {', '.join(names)} already hold that training. Nothing to do for an unchanged "
        f"checkpoint. Continue from the last with `dvc exp apply {names[-1]}`, change a param "
        "(`dvc exp run -S ...`) to branch off, or train it again on purpose with "
        "DVC_DALI_RETRAIN=1.")


def data_changes(ctx: RunContext, data_path: str) -> list[str]:
    """The first files added, removed or changed in ``data_path`` since the row
    the workspace's dvc.lock names ([] when that cannot be told)."""
    from . import changed_files
    from .stage import find_stage

    try:
        repo = repo_at(os.getcwd())
        stage = find_stage(repo, ctx.stage, None, ctx.stage)
        return changed_files.describe(repo, stage, ctx.dvc_root, data_path)
    except Exception as exc:  # only an explanation: never hide the refusal it explains
        logger.debug("cannot tell which files of %s changed: %s", data_path, exc)
        return []


def superseding_rows(run: Run, step: int) -> tuple[Optional[str], list[str]]:
    """When ``run`` resumes a recorded row at ``step`` (after `dvc exp apply`)
    that its run went on from: (that row's name, the later rows' names)."""
    start = run.start
    row = start.resumed_row if start is not None else None
    if row is None or row["step"] != step:
        return None, []
    return row["name"], [r["name"] for r in start.later_rows]


def row_after(run: Run, step: int) -> Optional[dict]:
    """The row its run recorded after the row ``run`` resumes (applied, at
    ``step``): its commit holds the batch digests of the batches after it
    (None if none; batch_digests.from_rows reads them: the proof is not the
    recorder's)."""
    start = run.start
    row = start.resumed_row if start is not None else None
    if row is None or row["step"] != step or not start.later_rows:
        return None
    return next((r for r in start.later_rows if r.get("parent") == row["sha"]),
                start.later_rows[0])


@dataclasses.dataclass(frozen=True)
class RecordResult:
    """What :func:`record` published."""

    ref: str  # full ref, refs/exps/<b[:2]>/<b[2:]>/<name>
    name: str  # row name, usable with `dvc exp apply`
    sha: str  # commit sha
    step: int
    run_name: str  # the run the row belongs to (see rows.run_name)
    parent: Optional[str]  # previous checkpoint commit of this lineage
    baseline: str
    workspace: bool  # True: workspace run; False: --temp / queued run
    lockfile: str  # absolute path of the dvc.lock that was written
    duration_s: float
    phases: dict[str, float]  # seconds per step, for benchmarks
    objects: tuple[Any, ...] = ()  # DVC's hash infos of the cached outputs, for the pusher
    run_started: Optional[str] = None  # when its run began (its lineage line's started=)


@dataclasses.dataclass
class _Where:
    """Which repositories this recording touches."""

    dvc_root: str  # the main repo (DVC_ROOT)
    baseline: str
    dvc_exp_name: str  # see _dvc_exp_name
    git_dir: str  # this run's repo: the workspace, or a --temp/queue clone
    toplevel: str
    main_git_dir: str
    workspace: bool
    repo: Any  # dvc Repo of this run's repo
    run: Run  # the run this process trains


def _locate(ctx: RunContext) -> _Where:
    if not ctx.under_exp_run:
        raise RecordError("recording needs env DVC_ROOT and DVC_EXP_BASELINE_REV, set by "
                          "`dvc exp run` for the stage command; run training with `dvc exp "
                          "run` (plain `dvc repro` records nothing).")
    if not os.path.isdir(os.path.join(ctx.dvc_root, ".dvc")):
        raise RecordError(f"DVC_ROOT='{ctx.dvc_root}' is not a DVC repo (no .dvc directory). "
                          "Unset DVC_ROOT or run through `dvc exp run`.")
    root = dvc_door.find_root(os.getcwd())
    git_dir, toplevel = exp_refs.git_dirs(root)
    main_git_dir, _ = exp_refs.git_dirs(ctx.dvc_root)
    where = _Where(ctx.dvc_root, ctx.baseline_rev, _dvc_exp_name(ctx),
                   git_dir, toplevel, main_git_dir, os.path.samefile(git_dir, main_git_dir),
                   repo_at(root), runs.of(ctx))
    if not where.workspace:
        _check_shared_cache(where)
    return where


def _check_shared_cache(where: _Where) -> None:
    """--temp/queued runs must write into the main repo's cache."""
    key = os.path.realpath(where.dvc_root)
    if key not in STATE.main_cache_dirs:
        STATE.main_cache_dirs[key] = dvc_door.cache_dir(where.dvc_root)
    mine, main = where.repo.cache.local_cache_dir, STATE.main_cache_dirs[key]
    if os.path.realpath(mine) != os.path.realpath(main):
        raise RecordError(f"this run's DVC cache '{mine}' is not the cache of DVC_ROOT "
                          f"'{where.dvc_root}' ('{main}'), so recorded checkpoints could not be "
                          "applied there. Set `cache.dir` of the executor repo to the main cache.")


def _check_name(where: _Where, name: str) -> None:
    if len(name.encode()) > rows.ROW_NAME_MAX:
        raise RecordError(f"checkpoint name '{name[:40]}...' is {len(name.encode())} bytes: git "
                          f"makes no ref name part over {rows.ROW_NAME_MAX} bytes. Name the run "
                          "(`dvc exp run -n`) or the row shorter")
    if name == where.dvc_exp_name:
        raise RecordError(f"checkpoint name '{name}' equals the experiment name (env "
                          "DVC_EXP_NAME); `dvc exp run` could then not create its own ref. "
                          "Pass another name.")
    dvc_door.check_row_name(where.repo, where.baseline, name)


class _Phases(dict):
    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        t = time.perf_counter()
        yield
        self[phase] = time.perf_counter() - t


def _say_ignored_outputs(where: _Where, stg: Any) -> None:
    """Uncached outputs (DVCLive's metrics and plots) that git ignores (a
    global excludes file's `dvclive/`) are in no row, as in no commit of
    DVC's: said once, since show, keep_best and --best then find no metric."""
    key = f"{where.toplevel}\0{stg.addressing}"
    if key in STATE.said_ignored:
        return
    STATE.said_ignored.add(key)
    outs = [o.fs_path for o in stg.outs if not o.use_cache and o.is_in_repo]
    found = commit.ignored(where.toplevel, _relative_paths(outs, where.toplevel), where.baseline)
    if found:
        logger.warning("%s: uncached output of stage '%s' that git ignores, so no row "
                       "holds it: `dvc-dali show`, keep_best and --best find no metric in it. "
                       "Stop ignoring it (`git check-ignore -v %s` names the rule)",
                       ", ".join(found), dvc_door.shown_address(stg), found[0])


def _say_best_alone(keep: Retention) -> None:
    """keep_best only spares the best row from keep_last's pruning: alone it
    does nothing, which a setting must not do silently. Said once."""
    if keep.keep_best is None or keep.keep_last is not None or STATE.said_best_alone:
        return
    STATE.said_best_alone = True
    logger.warning("keep_best %r (DVC_DALI_KEEP_BEST, keep_best= or --keep-best) does nothing "
                   "without keep_last (DVC_DALI_KEEP_LAST, keep_last= or --keep-last): every "
                   "row is kept. Set keep_last to N to keep the last N rows and the best, or "
                   "leave keep_best out", keep.keep_best)


def _relative_paths(paths: list[str], toplevel: str) -> list[str]:
    """The existing ones of paths, relative to toplevel, each once."""
    out: list[str] = []
    top = os.path.realpath(toplevel)
    for p in paths:
        p = os.path.realpath(os.path.abspath(p))
        rel = os.path.relpath(p, top)
        if os.path.lexists(p) and not rel.startswith("..") and rel not in out:
            out.append(rel)
    return out


def _params_changed(where: _Where, parent: str, lock_rel: str, stage_name: str,
                    new_entry: dict) -> bool:
    """Whether the params in dvc.lock differ from the parent row's, as DVC 2
    branched a resumed checkpoint experiment off when they did."""
    try:
        old = lockfile.entry_at(where.main_git_dir, where.toplevel, parent, lock_rel, stage_name)
    except Exception:
        return False  # unreadable: the run goes on, not branched off
    def canonical(entry: Any) -> str:  # order-insensitive: both are ordered maps
        return json.dumps((entry or {}).get("params"), sort_keys=True, default=str)
    return canonical(old) != canonical(new_entry)


def _follows(where: _Where, request: RecordRequest, entries: tuple[Optional[dict], dict],
             checkpoint: Optional[str], parent: Optional[str], step: int,
             run: Optional[str]) -> str:
    """How a first row follows the row ``parent`` (rows.first_row_follows),
    said where it is not as that row's run continued. ``entries``: the
    stage's dvc.lock entry before the row and the row's; ``checkpoint``: the
    checkpoint output's path as dvc.lock names it."""
    before = lockfile.out_md5(entries[0], checkpoint) if checkpoint else None
    same = before is not None and before == lockfile.out_md5(entries[1], checkpoint)
    follows = rows.first_row_follows(request.step, parent, step, request.resumed, same)
    name = rows.row_name(run or where.dvc_exp_name, step)
    if follows == rows.STARTS_OVER:
        logger.info("step %d %s row %s (step %d) the workspace held: a new run, which "
                    "leaves that run's rows alone", request.step,
                    "comes before" if request.step < step else "holds another checkpoint than",
                    name, step)
    elif follows == rows.CANNOT_TELL:
        logger.info("the checkpoint names no step, so whether this run resumed row %s (step "
                    "%d) or started over cannot be told: its rows follow that row, and "
                    "retention (keep_last) leaves the rows recorded before this run alone; "
                    "make_checkpoint(step) names it", name, step)
    return follows


def _lineage(where: _Where, stage_addr: str, old_entry: Optional[dict], new_entry: dict,
             request: RecordRequest, lock_rel: str = "dvc.lock", stage_name: str = "",
             checkpoint: Optional[str] = None) -> Lineage:
    """Where the row hangs: after this process's previous row, else after the
    recorded row whose outputs this run resumed from, in that row's run
    (see _follows; ``checkpoint``: the checkpoint output's dvc.lock path)."""
    key = (os.path.realpath(where.main_git_dir), where.dvc_exp_name, stage_addr)
    root = rows.project_address(where.repo.root_dir, where.toplevel)
    if key not in where.run.tips:
        parent, step, run, parent_started = (rows.find_resume_parent(
            where.main_git_dir, where.toplevel, stage_addr, exp_refs.outs_digest(old_entry),
            root=root) if old_entry else (None, 0, None, None))
        follows = _follows(where, request, (old_entry, new_entry), checkpoint, parent, step,
                           run)
        if follows == rows.STARTS_OVER:
            parent, step, run = None, 0, None
        # a dependency changed since the row it starts from: DVC 2 branched too
        branched = request.branched or bool(getattr(where.run.start, "changed_deps", None))
        if branched and where.run.start is not None:
            run_start.say_changed_deps(where.run.start)
        if parent and request.resumed is None:  # a bare port: its params tell
            branched = branched or _params_changed(where, parent, lock_rel, stage_name,
                                                   new_entry)
        where.run.tips[key] = (parent, step, rows.run_name(where.dvc_exp_name, run, branched))
        where.run.started[key] = _run_started(request, parent, parent_started,
                                              branched or follows == rows.CANNOT_TELL)
    parent, last_step, run = where.run.tips[key]
    return Lineage(run, last_step + 1 if request.step is None else request.step, parent,
                   stage_addr, exp_refs.outs_digest(new_entry), where.run.started.get(key), root)


def _run_started(request: RecordRequest, parent: Optional[str],
                 parent_started: Optional[str], own: bool) -> Optional[str]:
    """When the run a process's first row belongs to began: the Checkpointer's
    (its manifest's), else the row it continues says, else now: a bare script
    (make_checkpoint(), `dvc-dali run`) starting a run of its own here, or
    one that cannot tell whether it continues (``own``, as when it branched
    off; one that restarted a finished run under its name once counted that
    run's rows as its own, and retention deleted them: found by sweeps)."""
    if request.run_started is not None:
        return rows.started_token(request.run_started)
    if parent and not own:  # None where that row does not say (an older release's)
        return parent_started
    return rows.started_token(time.time())


def _candidates(where: _Where, sha: str, row: str, named: bool) -> list[str]:
    """The refs a row may be published as, in order: its name, then (unless
    named by the caller) a suffixed one when that ref exists."""
    return [dvc_door.exp_ref(where.baseline, cand)
            for cand in ([row] if named else [row, f"{row}-{sha[:7]}"])]


def _publish(where: _Where, sha: str, refs: list[str]) -> tuple[str, str]:
    """(ref, row name) published: the first of refs that does not exist yet."""
    for ref in refs:
        if rows.create_row_ref(sha, ref, where.toplevel, where.main_git_dir, where.workspace):
            return ref, ref.rsplit("/", 1)[1]
    raise RecordError(f"experiment ref '{refs[-1]}' already exists in '{where.main_git_dir}'. "
                      "Pass another name or remove the old experiment with `dvc exp remove`.")


def _save_stage(where: _Where, stage: Any, phases: _Phases) -> None:
    """Hash the stage into itself: deps and params as the run started, the
    outputs as they are now (the checkpoint just written)."""
    with phases.timed("save"):
        outputs.seed_digests(where.repo, stage)
        dvc_door.save_stage(stage, run_start.known_deps(where.run), STATE.untracked_outs)
        outputs.require_persisted(stage)


def _prepare(where: _Where, ctx: RunContext, request: RecordRequest, phases: _Phases) -> tuple:
    """What needs no repo lock: the stage (once per process) and, when the
    run's deps and params were taken at its start, hashing its outputs. DVC
    commands of other runs wait for the lock only 3 s: it is held briefly."""
    stg, stage_paths = _find(where, request.stage or ctx.stage, request.out, ctx.stage, phases)
    if request.expect_latest is not None:
        outputs.require_latest(stg, request.out, request.expect_latest)
    if run_start.known_deps(where.run):  # else params.yaml is read, which DVC may be rewriting
        _save_stage(where, stg, phases)
    return stg, stage_paths


def _commit_row(where: _Where, stg: Any, stage_paths: list[str], request: RecordRequest,
                phases: _Phases) -> RecordResult:
    """Under DVC's repo lock: cache, dvc.lock, commit, ref."""
    t0 = time.perf_counter()
    lock_path = dvc_door.lockfile_path(stg)
    lock_data = lockfile.current(lock_path)
    old_entry = lockfile.stage_entry(lock_data, stg.name)
    if lockfile.replaced(lock_path, stg.name, old_entry):
        _refuse_replaced(where, stg, request)
    if not run_start.known_deps(where.run):
        _save_stage(where, stg, phases)
    pinned = run_start.pin(where.run, where.toplevel)
    with phases.timed("cache"):
        outputs.cache_outputs(stg)
    with phases.timed("lockfile"):
        entry = dvc_door.lock_entry(stg)
        lock_before = lockfile.before_write(lock_path, stg.name)
        new_data, text = lockfile.with_entry(lock_data, stg.name, entry)
    lock = _LockWrite(lock_path, new_data, old_entry, entry, lock_before, text)
    # the row's commit holds the dvc.lock it writes, before the file is written
    pinned = {**pinned, os.path.relpath(os.path.realpath(lock_path),
                                        os.path.realpath(where.toplevel)): text.encode("utf-8")}
    with exit_hooks.signals_held():  # dvc.lock to the ref: whole, or not begun
        return _write_row(where, stg, stage_paths, request, phases, lock, pinned, t0)


class _LockWrite(NamedTuple):
    """A row's dvc.lock entry, and what the file held before it."""

    path: str
    data: Any  # the file's contents with the row's entry
    old_entry: Any  # the stage's entry before
    entry: Any  # the row's
    before: Any  # lockfile.before_write's: the file as it was, to put back
    text: str  # the file with the row's entry, as written


@contextmanager
def _lock_put_back_on_failure(where: _Where, lock: _LockWrite,
                              request: RecordRequest) -> Iterator[None]:
    """dvc.lock written, its row not yet published: a failure puts the file
    back, else it would name a checkpoint no row holds and the next run
    would resume from it as a run of its own (its rows' lineage cut)."""
    try:
        yield
    except Exception as exc:
        try:
            lockfile.put_back(lock.before)
        except OSError as put_exc:
            kept = where.run.kept
            undo = (f"`dvc exp apply {kept[1]}`" if kept
                    else "`dvc exp apply` of the run's last row (`dvc-dali show` lists them)")
            said = str(exc).rstrip(".")
            raise RecordError(
                f"{said}. Also, {lock.path} could not be put back ({put_exc}): it names the "
                f"checkpoint of step {request.step}, which no row holds; run {undo} before "
                "the next `dvc exp run`.") from exc
        raise


def _write_row(where: _Where, stg: Any, stage_paths: list[str], request: RecordRequest,
               phases: _Phases, lock: _LockWrite, pinned: Any, t0: float) -> RecordResult:
    """The commit, dvc.lock, the ref and the held note of one row, in this
    order: a kill at any instant leaves the row whole or not begun (see
    pending.py), a failure dvc.lock naming the last row."""
    lineage, sha = _build_commit(where, stg, stage_paths, request, phases, lock, pinned)
    if request.held_files:
        _refuse_files_written_since(request)
    refs = _candidates(where, sha, request.name or rows.row_name(lineage.run, lineage.step),
                       bool(request.name))
    lock_rel = os.path.relpath(lock.path, where.repo.root_dir)
    if where.workspace:
        pending.write(where.repo.root_dir, lock_rel, stg.name, {
            "sha": sha, "name": refs[0].rsplit("/", 1)[1], "step": lineage.step, "refs": refs,
            "outs": lineage.outs, "after": _tip_name(where, lineage)})
    with phases.timed("lockfile"):
        _write_lock(where, stg, lock, request, lock_rel)
    with _lock_put_back_on_failure(where, lock, request), phases.timed("publish"):
        ref, row = _publish(where, sha, refs)
    if where.workspace:  # which row the workspace's checkpoint is, should DVC delete it
        # the held note before the pending one goes: a kill between them
        # leaves the pending note, from which the next start writes it
        held.write(where.repo.root_dir, lock_rel, stg.name, row, lineage.step, lock.entry)
        pending.clear(where.repo.root_dir, lock_rel, stg.name)
    where.run.tips[(os.path.realpath(where.main_git_dir), where.dvc_exp_name, lineage.stage)] = (
        sha, lineage.step, lineage.run)
    where.run.kept = (lineage.step, row)  # before a Ctrl-C held meanwhile is delivered
    return RecordResult(ref, row, sha, lineage.step, lineage.run, lineage.parent,
                        where.baseline, where.workspace, lock.path,
                        time.perf_counter() - t0, dict(phases),
                        tuple(dvc_door.row_cached_out_hashes(stg)), lineage.started)


def _tip_name(where: _Where, lineage: Lineage) -> str:
    """The row this one follows, by name ("" for a run's first)."""
    kept = where.run.kept
    return kept[1] if lineage.parent and kept else ""


def _write_lock(where: _Where, stg: Any, lock: _LockWrite, request: RecordRequest,
                lock_rel: str) -> None:
    """The workspace dvc.lock naming the row; a write that fails (a full disk)
    is one line, the file as it was (replaced whole or not at all), with
    what resumes the run (a --temp or queued run's row applied first)."""
    try:
        lockfile.write_entry(lock.path, lock.data, stg.name, lock.entry, lock.text)
    except OSError as exc:
        if where.workspace:
            pending.clear(where.repo.root_dir, lock_rel, stg.name)
        step = f"step {request.step}" if request.step is not None else "this checkpoint"
        kept = where.run.kept
        again = exit_hooks.next_command(kept[1] if kept else None, not where.workspace)
        raise RecordError(
            f"cannot write {lock.path} ({exc}), so {step} is not recorded; dvc.lock still names "
            "the last recorded row. Free disk space there (or lift the file-size limit, fix "
            f"its permissions), then {again}.") from exc


def _build_commit(where: _Where, stg: Any, stage_paths: list[str], request: RecordRequest,
                  phases: _Phases, lock: _LockWrite, pinned: Any) -> tuple[Lineage, str]:
    """The row's lineage and commit (holding the dvc.lock it names, pinned)."""
    with phases.timed("commit"):
        ckpt = checkpoint_output(stg, request.out)
        lineage = _lineage(where, rows.stage_address(where.repo.root_dir, stg),
                           None if request.resumed is False else lock.old_entry, lock.entry,
                           request, os.path.relpath(lock.path, where.toplevel), stg.name,
                           ckpt.def_path if ckpt is not None else None)
        first = (request.message.strip()
                 or f"dvc-dali checkpoint {where.dvc_exp_name} step {lineage.step}")
        paths = stage_paths + [os.path.join(os.getcwd(), p)
                               for p in dvc_door.take_new_gitignores(where.repo)]
        _say_ignored_outputs(where, stg)
        sha = commit.build_commit(where.toplevel, _relative_paths(paths, where.toplevel),
                                  where.baseline, f"{first}\n\n{lineage.line()}\n", pinned)
    return lineage, sha


def _refuse_files_written_since(request: RecordRequest) -> None:
    """An asynchronous checkpoint's row, its commit built: the other files it
    holds must be those of its step, unchanged since make_checkpoint (see
    core/row_files.py); else the row is refused (and dvc.lock, put back,
    names the last row again)."""
    roots, before = request.held_files
    written = row_files.changed(before, row_files.restamp(before, roots))
    if not written:
        return
    named = ", ".join(os.path.relpath(p) for p in written[:3])
    more = f" and {len(written) - 3} more" if len(written) > 3 else ""
    raise RecordError(
        f"{named}{more}: written after make_checkpoint({request.step}) returned, before its row "
        "was recorded (asynchronous=True), so that row would hold a later step's files; step "
        f"{request.step} is not recorded, its checkpoint files are intact. Write what a row "
        "holds besides the checkpoint (metrics, plots, other outputs) before make_checkpoint, "
        "and after `ck.wait()` when a checkpoint may be in flight (the Live of `ck.live()` "
        "waits by itself), or checkpoint synchronously (unset DVC_DALI_ASYNC, "
        "asynchronous=False) where something else writes them (a framework's logger).")


def _refuse_replaced(where: _Where, stg: Any, request: RecordRequest) -> None:
    """dvc.lock was rewritten by another command since this run's last row:
    the outputs were checked out with it, and DVCLive's files (which DVCLive
    appends to) are another row's now; no row may hold them."""
    run_start.note_replaced(where.run)
    tip = where.run.tips.get((os.path.realpath(where.main_git_dir), where.dvc_exp_name,
                          rows.stage_address(where.repo.root_dir, stg)))
    last = rows.row_name(tip[2], tip[1]) if tip and tip[0] else None
    step = f"step {request.step}" if request.step is not None else "this checkpoint"
    after = (f"its rows up to {last} are intact: `dvc exp apply {last}` then `dvc exp run` "
             "resumes it" if last else "`dvc exp run` starts it again")
    raise RecordError(
        f"{dvc_door.lockfile_path(stg)}: stage '{dvc_door.shown_address(stg)}' was changed by "
        "another command while this run trained (`dvc exp apply`, `git checkout`, `git "
        "stash`?), which checked out another experiment's outputs and DVCLive files into the "
        "workspace, so "
        f"{step} is not recorded and this run stops; {after}.")


def _record(ctx: RunContext, request: RecordRequest) -> RecordResult:
    t0 = time.perf_counter()
    phases = _Phases()
    with phases.timed("open"):
        where = _locate(ctx)
        _check_name(where, request.name or rows.row_name(where.dvc_exp_name, request.step or 0))
    try:
        stg, stage_paths = _prepare(where, ctx, request, phases)
        dvc_door.lock_repo(where.repo, ctx.lock_timeout)
        try:
            result = _commit_row(where, stg, stage_paths, request, phases)
        finally:
            dvc_door.unlock_repo(where.repo)
    except BaseException:
        STATE.forget_files()  # look everything up afresh next time
        raise
    return dataclasses.replace(result, duration_s=time.perf_counter() - t0)


def _find(where: _Where, target: Optional[str], out: Optional[str], env_stage: Optional[str],
          phases: _Phases):
    from .stage import cached_stage

    with phases.timed("stage"):
        return cached_stage(where.repo, target, out, env_stage)


def record(step: Optional[int] = None, *, ctx: Optional[RunContext] = None,
           stage: Optional[str] = None, name: Optional[str] = None, message: str = "",
           out: Optional[str] = None, expect_latest: Optional[str] = None,
           resumed: Optional[bool] = None, branched: bool = False) -> RecordResult:
    """Record the current stage outputs as one experiment row (see module doc):
    :func:`record_request` with a RecordRequest of these fields.

    step: training step, in the row name and the lineage line; None: one
        more than the previous checkpoint of this run (or the one it resumed).
    stage: stage address; default env DVC_STAGE, else the single stage
        whose outputs cover ``out`` (or with persist outputs in the cwd).
    name: row (experiment ref) name; default ``f"{DVC_EXP_NAME}-step{step}"``.
    message: first line of the commit message.
    expect_latest: the checkpoint's LATEST as the caller just wrote it; a
        directory changed since (by another command) is refused, not recorded.
    resumed: False when the run started fresh (it then has no parent row).
    branched: the run resumed with changed params; its rows are a new run
        (named after DVC_EXP_NAME), not the resumed row's run continued.
    """
    return record_request(ctx or RunContext.from_environ(), RecordRequest(
        step, stage, name, message, out, expect_latest, resumed, branched))


def record_request(ctx: RunContext, request: RecordRequest) -> RecordResult:
    """Record the row ``request`` asks for, one recording at a time per process."""
    if request.step is not None:  # a NumPy or torch integer names the row as an int
        request = dataclasses.replace(request, step=int(request.step))
    with STATE.record_lock:
        return _record(ctx, request)


def record_and_prune(ctx: RunContext, request: RecordRequest,
                     keep: Retention = Retention()) -> RecordResult:
    """Record one row, log it, then apply retention to its run's rows."""
    result = record_request(ctx, request)
    runs.of(ctx).kept = (result.step, result.name)  # for an interruption's last line
    logger.info("recorded %s (step %d, %.0f ms)", result.name, result.step,
                result.duration_s * 1000)
    logger.debug("recording %s: %s", result.name,
                 ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in result.phases.items()))
    pusher = auto_push.pusher()
    if pusher is not None:
        pusher.push(result.name, result.ref, result.sha, list(result.objects), result.run_name)
    _say_best_alone(keep)
    for name, sha in retention.prune(ctx.dvc_root, result.run_name, result.baseline,
                                     result.ref, keep.keep_last, keep.keep_best,
                                     result.run_started):
        if pusher is not None:
            pusher.forget(dvc_door.exp_ref(result.baseline, name), name, sha)
    return result
