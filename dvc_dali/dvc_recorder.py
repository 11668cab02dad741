"""Record checkpoints of a running ``dvc exp run`` stage as DVC 3 experiments.

DVC 3 removed checkpoint experiments. This module brings back the part that
matters: called from inside the stage command (same process as the training
loop) while ``dvc exp run`` is running, :func:`record_checkpoint` caches the
stage outputs, writes the workspace ``dvc.lock`` (so a rerun resumes from the
checkpoint) and publishes one experiment ref per checkpoint, one row of
``dvc exp show``, without touching the user's HEAD, index or files.

All coupling to DVC internals lives in this module, and DVC is imported
lazily inside functions (importing it is slow).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote, unquote

__all__ = [
    "LINEAGE_KEY",
    "RecordResult",
    "RecorderError",
    "in_dvc_exp_run",
    "list_checkpoint_rows",
    "record_checkpoint",
]

#: First word of the machine-readable line in every checkpoint commit message.
LINEAGE_KEY = "dvc-dali-checkpoint:"

_EXPS_NAMESPACE = "refs/exps"


from . import gitcommit
from .errors import RecorderError
from .gitcommit import git as _git
from .gitcommit import sweep_leftovers as _sweep_leftovers


@dataclasses.dataclass(frozen=True)
class RecordResult:
    """What :func:`record_checkpoint` published."""

    ref: str  # full ref, refs/exps/<b[:2]>/<b[2:]>/<name>
    name: str  # experiment (row) name, usable with `dvc exp apply`
    sha: str  # commit sha
    step: int
    exp_name: str  # DVC_EXP_NAME of the running experiment
    parent: Optional[str]  # previous checkpoint commit of this lineage
    baseline: str
    workspace: bool  # True: workspace run; False: --temp / queued run
    lockfile: str  # absolute path of the dvc.lock that was written
    duration_s: float
    phases: dict[str, float]  # seconds per phase, for benchmarks


def in_dvc_exp_run() -> bool:
    """True when running as the command of a stage under ``dvc exp run``."""
    return bool(os.environ.get("DVC_ROOT")) and bool(
        os.environ.get("DVC_EXP_BASELINE_REV")
    )


# --------------------------------------------------------------------------
# per-process state: an opened Repo per root, git dirs, lineage tips
# --------------------------------------------------------------------------

_REPOS: dict[str, Any] = {}
_GIT_DIRS: dict[str, tuple[str, str]] = {}  # path -> (git dir, toplevel)
# lineage tip per (main git dir, experiment, stage): (commit sha, step)
_TIPS: dict[tuple[str, str, str], tuple[Optional[str], int]] = {}
_MAIN_CACHE: dict[str, str] = {}
# per (root, stage, out, cwd): (watched files, their stamp, stage, static paths)
_STAGES: dict[tuple, tuple[list[str], tuple, Any, list[str]]] = {}
_LOCKS: dict[str, tuple[tuple, Any]] = {}  # dvc.lock path -> (stamp, data written)
_CALL_LOCK = threading.Lock()


def _git_dirs(path: str) -> tuple[str, str]:
    """(absolute git dir, work tree top level) of the repo holding path."""
    key = os.path.realpath(path)
    if key not in _GIT_DIRS:
        proc = _git(
            ["rev-parse", "--absolute-git-dir", "--show-toplevel"],
            cwd=path,
            check=False,
        )
        lines = proc.stdout.split("\n")
        if proc.returncode != 0 or len(lines) < 2:
            raise RecorderError(
                f"dvc_dali: '{path}' is not inside a git work tree "
                f"({proc.stderr.strip()}); run inside `dvc exp run` of a git repo."
            )
        _GIT_DIRS[key] = (lines[0].strip(), lines[1].strip())
    return _GIT_DIRS[key]


def _open_repo(root: str):
    from dvc.repo import Repo

    repo = _REPOS.get(root)
    if repo is None:
        try:
            repo = Repo(root)
        except Exception as exc:
            raise RecorderError(
                f"dvc_dali: cannot open the DVC repo at '{root}': {exc}. "
                "Run the training command through `dvc exp run`."
            ) from exc
        _REPOS[root] = repo
    return repo


def _find_dvc_root(start: str) -> str:
    from dvc.repo import Repo

    try:
        return Repo.find_root(start)
    except Exception as exc:
        raise RecorderError(
            f"dvc_dali: no DVC repo (.dvc directory) at or above the working "
            f"directory '{start}': {exc}. Run the training command as a stage "
            "of `dvc exp run`."
        ) from exc


# --------------------------------------------------------------------------
# stage lookup
# --------------------------------------------------------------------------


def _find_stage(repo, target: Optional[str], out: Optional[str]):
    cwd = os.path.realpath(os.getcwd())
    try:
        stages = [s for s in repo.index.stages if getattr(s, "name", None)]
    except Exception as exc:
        raise RecorderError(
            f"dvc_dali: cannot load the stages of the DVC repo '{repo.root_dir}': "
            f"{exc}. Fix dvc.yaml (`dvc stage list` shows the problem)."
        ) from exc

    if target:
        path, _, name = target.rpartition(":")
        cands = [s for s in stages if s.name == name]
        if path:
            want = os.path.normpath(path)
            cands = [
                s
                for s in cands
                if os.path.normpath(s.path).endswith(os.sep + want)
                or os.path.normpath(s.path) == os.path.abspath(want)
            ]
        if len(cands) > 1:  # the command runs in the stage's wdir
            by_wdir = [s for s in cands if os.path.realpath(s.wdir) == cwd]
            cands = by_wdir or cands
        if len(cands) > 1:
            root_file = os.path.join(repo.root_dir, "dvc.yaml")
            cands = [s for s in cands if s.path == root_file] or cands
        if len(cands) == 1:
            return cands[0]
        where = ", ".join(s.addressing for s in cands) or "none"
        origin = (
            "env DVC_STAGE"
            if target == os.environ.get("DVC_STAGE")
            else "the stage= argument"
        )
        raise RecorderError(
            f"dvc_dali: stage '{target}' (from {origin}) "
            f"matches {len(cands)} stages in the DVC repo '{repo.root_dir}' "
            f"(candidates: {where}). Pass stage='<dvc.yaml path>:<name>' to "
            "record_checkpoint()."
        )

    if out:
        want = os.path.realpath(os.path.abspath(out))
        cands = [
            s
            for s in stages
            if any(
                os.path.realpath(o.fs_path) == want
                or want.startswith(os.path.realpath(o.fs_path) + os.sep)
                for o in s.outs
            )
        ]
    else:
        cands = [
            s
            for s in stages
            if os.path.realpath(s.wdir) == cwd and any(o.persist for o in s.outs)
        ]
    if len(cands) == 1:
        return cands[0]
    raise RecorderError(
        f"dvc_dali: env DVC_STAGE is not set and {len(cands)} stages of "
        f"'{repo.root_dir}' have "
        f"{'an output covering ' + repr(out) if out else 'persist outputs in ' + repr(cwd)}"
        f" ({', '.join(s.addressing for s in cands) or 'none'}). "
        "Pass stage='<name>' to record_checkpoint() (DVC >= 3.49 sets DVC_STAGE)."
    )


# --------------------------------------------------------------------------
# dvc.lock
# --------------------------------------------------------------------------


def _outs_digest(entry: Optional[dict]) -> str:
    outs = (entry or {}).get("outs") or []
    blob = json.dumps(outs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _read_lock(path: str) -> tuple[str, Any]:
    from dvc.utils.serialize import parse_yaml_for_update

    try:
        with open(path, encoding="utf-8") as fobj:
            text = fobj.read()
    except FileNotFoundError:
        return "", {}
    try:
        return text, parse_yaml_for_update(text, path) or {}
    except Exception as exc:
        raise RecorderError(
            f"dvc_dali: '{path}' is not valid YAML ({exc}). Restore it with "
            f"`git checkout -- {os.path.basename(path)}` or delete it."
        ) from exc


def _write_atomic(path: str, text: str) -> None:
    _sweep_leftovers(f"{path}.dvc-dali-*.tmp")
    tmp = f"{path}.dvc-dali-{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fobj:
        fobj.write(text)
        fobj.flush()
        os.fsync(fobj.fileno())
    os.replace(tmp, path)


# --------------------------------------------------------------------------
# git plumbing
# --------------------------------------------------------------------------


def _static_stage_paths(repo, stage) -> list[str]:
    """Absolute paths a normal `dvc exp run` commit would stage, as far as
    they follow from dvc.yaml (the stage's files, top-level metrics, params
    and plots)."""
    from dvc.repo.experiments.executor.base import BaseExecutor
    from dvc.stage.utils import _get_stage_files

    cwd = os.getcwd()
    paths = [os.path.join(cwd, p) for p in _get_stage_files(stage)]
    paths += [
        os.path.join(repo.root_dir, p)
        for p in BaseExecutor._get_top_level_paths(repo)
    ]
    paths += [
        os.path.join(os.path.dirname(o.fs_path), ".gitignore")
        for o in stage.outs
        if o.use_scm_ignore and o.is_in_repo
    ]
    return paths


def _stage_paths(repo, static: list[str], toplevel: str) -> list[str]:
    """The existing ones of static plus the .gitignore files Output.save()
    just wrote, relative to toplevel."""
    cwd = os.getcwd()
    paths = static + [os.path.join(cwd, p) for p in repo.scm_context.files_to_track]
    repo.scm_context.files_to_track = set()
    out: list[str] = []
    top = os.path.realpath(toplevel)
    for p in paths:
        p = os.path.realpath(os.path.abspath(p))
        if not os.path.lexists(p):
            continue
        rel = os.path.relpath(p, top)
        if rel == ".." or rel.startswith(".." + os.sep) or rel in out:
            continue
        out.append(rel)
    return out


def _stamp(paths: list[str]) -> tuple:
    """What changes when any of paths is rewritten."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def _stage_for(repo, target: Optional[str], out: Optional[str]):
    """(stage, static paths) of the checkpointing stage, looked up once per
    process and again only when its dvc.yaml or params.yaml change: the
    lookup parses every dvc.yaml and costs more than the rest of recording a
    small checkpoint. `dvc exp run` itself does not reread them either."""
    key = (repo.root_dir, target, out, os.getcwd())
    hit = _STAGES.get(key)
    if hit is not None and _stamp(hit[0]) == hit[1]:
        return hit[2], hit[3]
    repo._reset()  # drop DVC's parsed index
    watched = [os.path.join(repo.root_dir, "dvc.yaml"), os.path.join(repo.root_dir, "params.yaml")]
    before = _stamp(watched)
    stg = _find_stage(repo, target, out)
    watched += [stg.path, os.path.join(os.path.dirname(stg.path), "params.yaml")]
    before += _stamp(watched[2:])
    static = _static_stage_paths(repo, stg)
    _STAGES[key] = (watched, before, stg, static)
    return stg, static


def _lock_data(path: str) -> Any:
    """dvc.lock parsed; what this process wrote last while the file is unchanged."""
    hit = _LOCKS.get(path)
    if hit is not None and _stamp([path]) == hit[0]:
        return hit[1]
    return _read_lock(path)[1]


def _publish(
    sha: str, ref: str, cwd_top: str, main_git_dir: str, workspace: bool
) -> bool:
    """Create ref -> sha in the main repo; False when the ref already exists."""
    if workspace:
        return gitcommit.create_ref(cwd_top, ref, sha)
    # --temp / queued run: the commit lives in the executor's clone
    args = ["push", "--no-verify", "--quiet", main_git_dir, f"{sha}:{ref}"]
    for attempt in range(3):  # DVC (dulwich) may prune ref dirs concurrently
        proc = _git(args, cwd=cwd_top, check=False)
        if proc.returncode == 0:
            return True
        exists = _git(
            ["rev-parse", "--verify", "--quiet", ref], cwd=main_git_dir, check=False
        )
        if exists.returncode == 0:
            return False
        time.sleep(0.1 * (attempt + 1))
    raise RecorderError(
        f"dvc_dali: could not create experiment ref '{ref}' in '{main_git_dir}': "
        f"{proc.stderr.strip()}. Check that the repo is writable and no "
        f"'{ref}.lock' file is left in it."
    )


# --------------------------------------------------------------------------
# lineage
# --------------------------------------------------------------------------

_LINEAGE_RE = re.compile(r"^" + re.escape(LINEAGE_KEY) + r"\s*(.*)$", re.MULTILINE)


def _parse_lineage(text: str) -> Optional[dict[str, str]]:
    found = _LINEAGE_RE.findall(text)
    if not found:
        return None
    fields = {}
    for tok in found[-1].split():
        key, sep, val = tok.partition("=")
        if sep:
            fields[key] = val
    return fields if "step" in fields and "exp" in fields else None


def _iter_ckpt_refs(git_dir: str, cwd: str):
    fmt = "%(objectname)%00%(refname)%00%(committerdate:unix)%00%(contents)%00%00"
    proc = _git(
        ["--git-dir", git_dir, "for-each-ref", f"--format={fmt}", _EXPS_NAMESPACE],
        cwd=cwd,
    )
    for rec in proc.stdout.split("\0\0"):
        parts = rec.lstrip("\n").split("\0")
        if len(parts) < 4:
            continue
        sha, ref, date, contents = parts[:4]
        fields = _parse_lineage(contents)
        if fields is None:
            continue
        yield sha, ref, int(date or 0), fields


def _find_resume_parent(
    main_git_dir: str, cwd: str, stage_addr: str, digest: str
) -> tuple[Optional[str], int]:
    """(sha, step) of the newest recorded checkpoint whose outputs are the
    ones this run resumed from; (None, 0) when there is none."""
    best: tuple[int, str, int] = (-1, "", 0)
    for sha, _ref, date, fields in _iter_ckpt_refs(main_git_dir, cwd):
        if fields.get("outs") == digest and fields.get("stage") == stage_addr:
            try:
                step = int(fields["step"])
            except ValueError:
                continue
            best = max(best, (date, sha, step))
    return (best[1] or None), best[2]


# --------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------


def record_checkpoint(
    step: Optional[int] = None,
    *,
    stage: Optional[str] = None,
    name: Optional[str] = None,
    message: str = "",
    out: Optional[str] = None,
) -> RecordResult:
    """Record the current stage outputs as one experiment row (see module doc).

    step: training step, in the row name and the lineage line; None: one
        more than the previous checkpoint of this run (or the one it resumed).
    stage: stage address; default env DVC_STAGE, else the single stage
        whose outputs cover ``out`` (or with persist outputs in the cwd).
    name: row (experiment ref) name; default ``f"{DVC_EXP_NAME}-step{step}"``.
    message: first line of the commit message.
    """
    with _CALL_LOCK:  # one record at a time per process
        return _record(step, stage=stage, name=name, message=message, out=out)


def _record(
    step: Optional[int],
    *,
    stage: Optional[str],
    name: Optional[str],
    message: str,
    out: Optional[str],
) -> RecordResult:
    t0 = time.perf_counter()
    phases: dict[str, float] = {}
    from dvc.lock import LockError
    from dvc.repo.experiments.refs import ExpRefInfo
    from dvc.repo.experiments.utils import check_ref_format
    from dvc.stage.serialize import to_single_stage_lockfile
    from dvc.utils.serialize import dumps_yaml

    if not in_dvc_exp_run():
        raise RecorderError(
            "dvc_dali: record_checkpoint() needs env DVC_ROOT and "
            "DVC_EXP_BASELINE_REV, set by `dvc exp run` for the stage command; "
            "run training with `dvc exp run` (plain `dvc repro` records nothing)."
        )
    step = None if step is None else int(step)
    dvc_root = os.environ["DVC_ROOT"]
    baseline = os.environ["DVC_EXP_BASELINE_REV"]
    exp_name = os.environ.get("DVC_EXP_NAME") or f"exp-{baseline[:7]}"
    if not os.path.isdir(os.path.join(dvc_root, ".dvc")):
        raise RecorderError(
            f"dvc_dali: DVC_ROOT='{dvc_root}' is not a DVC repo (no .dvc "
            "directory). Unset DVC_ROOT or run through `dvc exp run`."
        )

    root = _find_dvc_root(os.getcwd())
    git_dir, toplevel = _git_dirs(root)
    main_git_dir, _ = _git_dirs(dvc_root)
    workspace = os.path.samefile(git_dir, main_git_dir)
    repo = _open_repo(root)
    if not workspace:
        _check_shared_cache(repo, dvc_root)
    phases["open"] = time.perf_counter() - t0

    row = name or f"{exp_name}-step{0 if step is None else step}"
    if row == exp_name:
        raise RecorderError(
            f"dvc_dali: checkpoint name '{row}' equals the experiment name "
            "(env DVC_EXP_NAME); `dvc exp run` could then not create its own "
            "ref. Pass another name=."
        )
    try:
        check_ref_format(repo.scm, ExpRefInfo(baseline, row))
    except Exception as exc:
        raise RecorderError(
            f"dvc_dali: checkpoint name '{row}' is not a valid git ref name "
            f"({exc}). Pass a name without spaces, '/', '~', '^', ':' or '..'."
        ) from exc

    _lock_repo(repo, LockError)
    try:
        t = time.perf_counter()
        stg, static_paths = _stage_for(repo, stage or os.environ.get("DVC_STAGE"), out)
        stage_addr = quote(
            os.path.relpath(stg.path, repo.root_dir) + ":" + stg.name, safe="/:@"
        )
        lock_path = stg.dvcfile._lockfile.path
        lock_data = _lock_data(lock_path)
        old_entry = (lock_data.get("stages") or {}).get(stg.name)
        _seed_hashes(repo, stg)
        try:
            # Outputs written only at the end of training (the final model)
            # may not exist yet; the persisted checkpoint output must.
            stg.save(allow_missing=True, run_cache=False)
        except Exception as exc:
            raise RecorderError(
                f"dvc_dali: saving stage '{stg.addressing}' failed: {exc}. Check "
                "that its dependencies and params exist."
            ) from exc
        missing = [str(o) for o in stg.outs if o.persist and not o.hash_info]
        if missing:
            raise RecorderError(
                f"dvc_dali: persisted output(s) {', '.join(missing)} of stage "
                f"'{stg.addressing}' do not exist; write the checkpoint (e.g. "
                "Checkpointer.save) before signalling make_checkpoint()."
            )
        phases["save"] = time.perf_counter() - t

        t = time.perf_counter()
        for o in stg.outs:
            if o.use_cache and o.hash_info:
                _commit_out(o, stg)
        phases["cache"] = time.perf_counter() - t

        t = time.perf_counter()
        entry = to_single_stage_lockfile(stg)
        if not lock_data:
            lock_data = {"schema": "2.0"}
        if lock_data.get("stages") is None:
            lock_data["stages"] = {}
        lock_data["stages"][stg.name] = entry
        _write_atomic(lock_path, dumps_yaml(lock_data))
        _LOCKS[lock_path] = (_stamp([lock_path]), lock_data)
        phases["lockfile"] = time.perf_counter() - t

        t = time.perf_counter()
        tip_key = (os.path.realpath(main_git_dir), exp_name, stage_addr)
        if tip_key not in _TIPS:
            _TIPS[tip_key] = (
                _find_resume_parent(
                    main_git_dir, toplevel, stage_addr, _outs_digest(old_entry)
                )
                if old_entry
                else (None, 0)
            )
        parent, last_step = _TIPS[tip_key]
        if step is None:
            step = last_step + 1
            row = name or f"{exp_name}-step{step}"
        lineage = (
            f"{LINEAGE_KEY} exp={exp_name} step={step} "
            f"parent={parent or 'none'} stage={stage_addr} "
            f"outs={_outs_digest(entry)}"
        )
        first = message.strip() or f"dvc-dali checkpoint {exp_name} step {step}"
        paths = _stage_paths(repo, static_paths, toplevel)
        sha = gitcommit.build_commit(toplevel, paths, baseline, f"{first}\n\n{lineage}\n")
        phases["commit"] = time.perf_counter() - t

        t = time.perf_counter()
        candidates = [row] if name else [row, f"{row}-{sha[:7]}"]
        ref = ""
        for cand in candidates:  # an existing ref is never overwritten
            ref_info = ExpRefInfo(baseline, cand)
            if _publish(sha, str(ref_info), toplevel, main_git_dir, workspace):
                ref, row = str(ref_info), cand
                break
        if not ref:
            raise RecorderError(
                f"dvc_dali: experiment ref '{ExpRefInfo(baseline, candidates[-1])}' "
                f"already exists in '{main_git_dir}'. Pass another name= or "
                "remove the old experiment with `dvc exp remove`."
            )
        phases["publish"] = time.perf_counter() - t
        _TIPS[tip_key] = (sha, step)
    except BaseException:
        _STAGES.clear()  # look everything up afresh next time
        _LOCKS.clear()
        raise
    finally:
        repo.lock.unlock()
        repo.state.close()  # reopened on use; other DVC processes share it

    return RecordResult(
        ref=ref,
        name=row,
        sha=sha,
        step=step,
        exp_name=exp_name,
        parent=parent,
        baseline=baseline,
        workspace=workspace,
        lockfile=lock_path,
        duration_s=time.perf_counter() - t0,
        phases=phases,
    )


def _is_checkpoint_dir(o) -> bool:
    """Whether output o is a dvc-dali checkpoint directory (store.py's format)."""
    from . import store

    return os.path.isfile(os.path.join(o.fs_path, store.LATEST))


def _commit_out(o, stg) -> None:
    """Put an output in the cache without touching the workspace. Snapshot
    files of a checkpoint directory are never modified once published, so
    where cache.type starts with hardlink they are linked into the cache,
    not copied (the bytes are not written twice); anything else is copied
    (or reflinked), as DVC would."""
    from dvc_data.hashfile.transfer import transfer

    first = next(iter(o.cache.cache_types), None)
    try:
        if first != "hardlink" or not _is_checkpoint_dir(o):
            o.commit(relink=False)  # never link files that may change into the cache
        else:
            staging, _, obj = o._build(o.cache, o.fs_path, o.fs, o.hash_name,
                                       ignore=o.dvcignore)
            transfer(staging, o.cache, {obj.hash_info}, shallow=False, hardlink=True)
    except Exception as exc:  # removed or changed while it was being cached
        raise RecorderError(
            f"dvc_dali: caching output '{o}' of stage '{stg.addressing}' failed: "
            f"{type(exc).__name__}: {exc}. Nothing was recorded for this checkpoint; make "
            "sure nothing else writes or deletes that output during training.") from exc
    # A row must never name outputs the cache cannot check out again.
    if not o.cache.exists(o.hash_info.value):
        raise RecorderError(
            f"dvc_dali: output '{o}' of stage '{stg.addressing}' (md5 {o.hash_info.value}) "
            f"is not in the DVC cache {o.cache.path} after caching it; nothing was "
            "recorded. Check the cache directory's free space and permissions.")


def _seed_hashes(repo, stg) -> None:
    """Hand DVC the md5 of each checkpoint file, computed while it was
    written, so caching it does not read it all again. DVC's state keys each
    entry on the file's inode, mtime and size, and a snapshot is never
    modified once published."""
    from dvc_data.hashfile.hash_info import HashInfo

    from . import store
    from .errors import DvcDaliError

    items = []
    for o in stg.outs:
        if not (o.use_cache and o.hash_name == "md5" and _is_checkpoint_dir(o)):
            continue
        try:
            digests = store.file_digests(Path(o.fs_path))
        except DvcDaliError:
            continue  # damaged: let DVC hash what is there
        items += [(os.fspath(path), HashInfo("md5", md5), None) for path, md5 in digests.items()]
    if items:
        repo.state.save_many(items, repo.fs)


def _lock_repo(repo, lock_error) -> None:
    """Take DVC's repo lock, waiting while another DVC command (dvc push,
    gc, exp apply...) holds it: training waits instead of dying. Bounded by
    DVC_DALI_LOCK_TIMEOUT seconds (default 3600)."""
    limit = float(os.environ.get("DVC_DALI_LOCK_TIMEOUT", "3600"))
    deadline = time.monotonic() + limit
    said = False
    while True:
        try:
            repo.lock.lock()  # DVC itself retries for a few seconds
            return
        except lock_error as exc:
            if time.monotonic() > deadline:
                raise RecorderError(
                    f"dvc_dali: DVC repo lock '{repo.lock.lockfile}' stayed held by another "
                    f"DVC command for {limit:.0f} s; the checkpoint was not recorded (its "
                    "files are intact). Wait for that command, or remove the lock file if "
                    "no DVC process is running; DVC_DALI_LOCK_TIMEOUT sets the wait."
                ) from exc
            if not said:
                print(f"dvc-dali: waiting for the DVC repo lock ({repo.lock.lockfile}), held "
                      "by another DVC command, to record the checkpoint", file=sys.stderr)
                said = True
            time.sleep(0.5)


def _check_shared_cache(repo, dvc_root: str) -> None:
    """--temp/queued runs must write into the main repo's cache."""
    from dvc.repo import Repo

    key = os.path.realpath(dvc_root)
    if key not in _MAIN_CACHE:
        with Repo(dvc_root) as main:
            _MAIN_CACHE[key] = main.cache.local_cache_dir
    mine = repo.cache.local_cache_dir
    if os.path.realpath(mine) != os.path.realpath(_MAIN_CACHE[key]):
        raise RecorderError(
            f"dvc_dali: this run's DVC cache '{mine}' is not the cache of "
            f"DVC_ROOT '{dvc_root}' ('{_MAIN_CACHE[key]}'), so recorded "
            "checkpoints could not be applied there. Set `cache.dir` of the "
            "executor repo to the main cache."
        )


def list_checkpoint_rows(dvc_root: str, exp_name: Optional[str] = None) -> list[dict]:
    """Checkpoint refs recorded under refs/exps of the repo at dvc_root.

    Each row: name, ref, sha, exp, step, parent, stage, outs, baseline, time.
    Sorted by (exp, step, time).
    """
    git_dir, _ = _git_dirs(dvc_root)
    rows = []
    for sha, ref, date, fields in _iter_ckpt_refs(git_dir, dvc_root):
        if exp_name is not None and fields.get("exp") != exp_name:
            continue
        parts = ref.split("/")
        if len(parts) != 5 or len(parts[2]) != 2:  # DVC's own refs/exps/exec/..., apply/...
            continue
        try:
            step = int(fields["step"])
        except ValueError:
            continue
        parent = fields.get("parent")
        rows.append(
            {
                "name": parts[-1],
                "ref": ref,
                "sha": sha,
                "exp": fields["exp"],
                "step": step,
                "parent": None if parent in (None, "none") else parent,
                "stage": unquote(fields["stage"]) if "stage" in fields else None,
                "outs": fields.get("outs"),
                "baseline": "".join(parts[2:4]) if len(parts) == 5 else None,
                "time": date,
            }
        )
    rows.sort(key=lambda r: (r["exp"], r["step"], r["time"]))
    return rows


_STAGE_FIX = """\
    outs:
      - {path}:
          persist: true      # DVC 3 deletes other outputs before a run
    always_changed: true     # else DVC 3 skips an unchanged stage"""


def check_stage(checkpoint_path: str, stage: Optional[str] = None) -> None:
    """Refuse, before any training step, a stage that DVC 3 cannot resume.

    DVC 3 ignores ``checkpoint: true``: it deletes the output before each run
    and skips a stage whose deps did not change. Resuming needs the
    checkpoint output ``persist: true`` and the stage ``always_changed: true``.
    """
    dvc_root = os.environ.get("DVC_ROOT", "")
    if dvc_root and not os.path.isdir(os.path.join(dvc_root, ".dvc")):
        raise RecorderError(
            f"DVC_ROOT={dvc_root!r} is not a DVC repository (no .dvc directory), so no "
            "checkpoint could be recorded. Run training through `dvc exp run` in the "
            "repository, or unset DVC_ROOT to train without recording.")
    root = _find_dvc_root(os.getcwd())
    repo = _open_repo(root)
    stg = _find_stage(repo, stage or os.environ.get("DVC_STAGE"), checkpoint_path)
    want = os.path.realpath(os.path.abspath(checkpoint_path))
    out = next((o for o in stg.outs if os.path.realpath(o.fs_path) == want
                or want.startswith(os.path.realpath(o.fs_path) + os.sep)), None)
    rel = os.path.relpath(want, os.path.realpath(stg.wdir))
    problems = []
    if out is None:
        problems.append(f"'{rel}' is not one of its outputs")
    elif not out.persist:
        problems.append(f"output '{out.def_path}' is not `persist: true`, so DVC 3 deletes "
                        "it before every run and training would never resume")
    if not stg.always_changed:
        problems.append("it is not `always_changed: true`, so DVC 3 skips it when no "
                        "dependency changed instead of resuming")
    if problems:
        raise RecorderError(
            f"{os.path.relpath(stg.path, repo.root_dir)}: stage '{stg.name}' cannot resume "
            f"from checkpoints under DVC 3: {'; and '.join(problems)}. Declare it as:\n"
            + _STAGE_FIX.format(path=out.def_path if out else rel)
        )


def _metric_at(git_dir: str, cwd: str, sha: str, metrics_file: str, metric: str):
    proc = _git(["--git-dir", git_dir, "show", f"{sha}:{metrics_file}"], cwd=cwd, check=False)
    if proc.returncode != 0:
        return None
    try:
        node: Any = json.loads(proc.stdout)
        for part in re.split(r"[/.]", metric):
            node = node[part]
        return float(node)
    except (ValueError, KeyError, TypeError):
        return None


def apply_retention(exp_name: str, keep_last: Optional[int] = None,
                    keep_best: Optional[str] = None,
                    metrics_file: str = "dvclive/metrics.json") -> list[str]:
    """Delete checkpoint rows of ``exp_name`` beyond the last ``keep_last``
    (by step), sparing the best by ``keep_best`` ("train/acc:max" or
    "loss:min"). Only refs go: the data stays in the cache until `dvc gc`.
    Returns the names of the removed rows."""
    if not keep_last:
        return []
    dvc_root = os.environ["DVC_ROOT"]
    git_dir, _ = _git_dirs(dvc_root)
    rows = list_checkpoint_rows(dvc_root, exp_name)
    keep = {r["ref"] for r in rows[-keep_last:]}
    if keep_best:
        metric, _, mode = keep_best.partition(":")
        if mode not in ("max", "min", ""):
            raise RecorderError(f"dvc_dali: keep_best={keep_best!r}: the mode after ':' must "
                                "be max or min, e.g. 'train/acc:max'")
        scored = [(v, r["ref"]) for r in rows
                  if (v := _metric_at(git_dir, dvc_root, r["sha"], metrics_file, metric))
                  is not None]
        if scored:
            keep.add((min if mode == "min" else max)(scored)[1])
    removed = []
    for r in rows:
        if r["ref"] not in keep:
            _git(["--git-dir", git_dir, "update-ref", "-d", r["ref"], r["sha"]], cwd=dvc_root)
            removed.append(r["name"])
    return removed


def reset_stage(stage: Optional[str] = None, root: Optional[str] = None) -> list[str]:
    """Start over: delete the stage's dvc-dali checkpoint outputs and its
    dvc.lock entry, so the next `dvc exp run` does not check them out again
    (DVC 2's `dvc exp run --reset`). Recorded rows are kept. Returns what
    was removed."""
    from dvc.utils.serialize import dumps_yaml

    repo = _open_repo(_find_dvc_root(root or os.getcwd()))
    try:
        stages = [s for s in repo.index.stages if getattr(s, "name", None)]
    finally:
        repo._reset()
    if stage:
        stages = [s for s in stages if s.name == stage or s.addressing == stage]
        if not stages:
            raise RecorderError(f"dvc_dali: no stage '{stage}' in {repo.root_dir}; "
                                "`dvc stage list` shows the stages")
    removed: list[str] = []
    for stg in stages:
        outs = [o for o in stg.outs if o.persist
                and os.path.isfile(os.path.join(o.fs_path, "LATEST"))]
        if not outs:
            continue
        for o in outs:
            shutil.rmtree(o.fs_path)
            removed.append(os.path.relpath(o.fs_path, repo.root_dir))
        lock_path = stg.dvcfile._lockfile.path
        _, data = _read_lock(lock_path)
        if (data.get("stages") or {}).pop(stg.name, None) is not None:
            _write_atomic(lock_path, dumps_yaml(data))
            removed.append(f"{os.path.relpath(lock_path, repo.root_dir)}:{stg.name}")
    if not removed and stage:
        raise RecorderError(f"dvc_dali: stage '{stage}' has no persisted dvc-dali checkpoint "
                            "to reset (no output with a LATEST file)")
    return removed


def checkpoint_outputs(root: str) -> list[tuple[str, str]]:
    """(stage, output path) for every output declared `checkpoint: true` or
    holding a dvc-dali checkpoint, for `dvc-dali doctor`."""
    repo = _open_repo(_find_dvc_root(root))
    found = []
    try:
        for stg in repo.index.stages:
            if not getattr(stg, "name", None):
                continue
            raw = (stg.dvcfile.stages.stages_data or {}).get(stg.name) or {}
            declared = {next(iter(o)) for o in raw.get("outs", [])
                        if isinstance(o, dict) and (next(iter(o.values())) or {}).get(
                            "checkpoint")}
            for o in stg.outs:
                if o.def_path in declared or os.path.isfile(os.path.join(o.fs_path, "LATEST")):
                    found.append((stg.addressing, o.fs_path))
    finally:
        repo._reset()
    return found
