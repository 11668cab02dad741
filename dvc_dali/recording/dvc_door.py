"""The one door to DVC's internals.

Every ``import dvc`` / ``dvc_data`` of the recorder is here, each behind a
small function, so a DVC release that moves a private helper breaks one
file. DVC is imported lazily: importing it costs about a second.
Tested against the DVC range pyproject.toml declares.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import logging
import os
import time
from typing import Any, Iterator

from ..core.checkpoint_outputs import checkpoint_outputs
from ..core.errors import DvcDaliError, RecordError
from ..core.log import logger


def shown_address(stage: Any) -> str:
    """The stage as `dvc exp run` and `dvc pull` take it from the repository's
    root (DVC's own ``addressing`` is relative to the current directory,
    which in a stage's process is its ``wdir``)."""
    path = os.path.relpath(stage.path, stage.repo.root_dir)
    return stage.name if path == "dvc.yaml" else f"{path}:{stage.name}"


def find_root(start: str) -> str:
    from dvc.repo import Repo

    try:
        return Repo.find_root(start)
    except Exception as exc:
        raise RecordError(
            f"no DVC repo (.dvc directory) at or above the working directory '{start}': "
            f"{exc}. Run the training command as a stage of `dvc exp run`.") from exc


def open_repo(root: str) -> Any:
    from dvc.repo import Repo

    try:
        return Repo(root)
    except Exception as exc:
        raise RecordError(f"cannot open the DVC repo at '{root}': {exc}. Run the training "
                          "command through `dvc exp run`.") from exc


def cache_dir(root: str) -> str:
    """The local cache directory of the DVC repo at root."""
    from dvc.repo import Repo

    with Repo(root) as repo:
        return repo.cache.local_cache_dir


def named_stages(repo: Any) -> list[Any]:
    """The pipeline stages of every dvc.yaml, parsed afresh."""
    repo._reset()  # noqa: SLF001 - drop DVC's parsed index: dvc.yaml may have changed
    try:
        return [s for s in repo.index.stages if getattr(s, "name", None)]
    except Exception as exc:
        raise RecordError(f"cannot load the stages of the DVC repo '{repo.root_dir}': {exc}. "
                          f"{_fix_file(getattr(exc, 'path', None))}") from exc


def _fix_file(path: Any) -> str:
    """What to do about the file DVC could not read (its error's ``path``)."""
    name = os.path.basename(str(path)) if path else "dvc.yaml"
    restore = (f" (`git checkout -- {path}` restores the committed one)"
               if name in ("dvc.lock", "params.yaml") else "")
    if name == "dvc.lock":  # a kill cuts it short: the rows hold what it named
        restore = (" (cut short by a kill? `dvc-dali doctor` names the row to put back with "
                   f"`dvc exp apply`; `git checkout -- {path}` restores the committed one)")
    return f"Fix {path or name}{restore}; `dvc stage list` shows the problem."


def declared_checkpoint_outs(stage: Any) -> set[str]:
    """Output paths a stage declares `checkpoint: true` in its dvc.yaml (in
    outs, metrics or plots: the rule is checkpoint_outputs.py's)."""
    raw = (stage.dvcfile.stages.stages_data or {}).get(stage.name) or {}
    return {out.path for out in checkpoint_outputs(raw)}


def lockfile_path(stage: Any) -> str:
    return stage.dvcfile._lockfile.path  # noqa: SLF001 - DVC exposes no public accessor


def stage_files(repo: Any, stage: Any) -> list[str]:
    """Absolute paths a normal `dvc exp run` commit would stage, as far as
    they follow from dvc.yaml (the stage's files, top-level metrics, params
    and plots, the outputs' .gitignore files)."""
    from dvc.repo.experiments.executor.base import BaseExecutor
    from dvc.stage.utils import _get_stage_files

    cwd = os.getcwd()
    paths = [os.path.join(cwd, p) for p in _get_stage_files(stage)]
    paths += [os.path.join(repo.root_dir, p)
              for p in BaseExecutor._get_top_level_paths(repo)]  # noqa: SLF001
    paths += [os.path.join(os.path.dirname(o.fs_path), ".gitignore")
              for o in stage.outs if o.use_scm_ignore and o.is_in_repo]
    return paths


def row_held_paths(repo: Any, stage: Any, checkpoint: Any) -> list[str]:
    """Absolute paths of what a row holds besides the checkpoint output
    ``checkpoint``: the stage's other outputs, metrics and plots, and
    dvc.yaml's top-level metrics and plots."""
    paths = {o.fs_path for o in stage.outs if o is not checkpoint}
    try:
        from dvc.repo.metrics.show import _collect_top_level_metrics

        top = [*_collect_top_level_metrics(repo), *repo.index._plot_sources]  # noqa: SLF001
    except Exception as exc:  # DVC's internals moved: the stage's own files still count
        logger.debug("top-level metrics and plots not found: %s", exc)
        top = []
    paths.update(os.path.join(repo.root_dir, p) for p in top)
    return sorted(paths)


def take_new_gitignores(repo: Any) -> list[str]:
    """The .gitignore files DVC wrote while saving outputs (relative to cwd)."""
    files = list(repo.scm_context.files_to_track)
    repo.scm_context.files_to_track = set()
    if files:
        # scmrepo caches the ignore rules it read, so at the next checkpoint it
        # would find the output not ignored and append it again: read afresh.
        repo.scm._reset()  # noqa: SLF001
    return files


def lock_repo(repo: Any, timeout_s: float) -> None:
    """Take DVC's repo lock, waiting while another DVC command (dvc push,
    gc, exp apply...) holds it: training waits instead of dying."""
    from dvc.lock import LockError

    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            repo.lock.lock()  # DVC itself retries for a few seconds
            return
        except LockError as exc:
            if time.monotonic() > deadline:
                raise RecordError(
                    f"DVC repo lock '{repo.lock.lockfile}' stayed held by another DVC command "
                    f"for {timeout_s:.0f} s; the checkpoint was not recorded (its files are "
                    "intact). Wait for that command, or remove the lock file if no DVC process "
                    "is running; DVC_DALI_LOCK_TIMEOUT sets the wait.") from exc
            if not said:
                logger.info("waiting for the DVC repo lock (%s), held by another DVC command, "
                            "to record the checkpoint", repo.lock.lockfile)
                said = True
            time.sleep(0.5)


def unlock_repo(repo: Any) -> None:
    repo.lock.unlock()
    repo.state.close()  # reopened on use; other DVC processes share it


def dep_hashes(stage: Any) -> dict[str, tuple[Any, Any]]:
    """{path: (hash, meta)} of the stage's deps other than params, hashed now
    (a data directory of 10^5 files costs seconds: done once per run)."""
    from dvc.dependency.base import DependencyDoesNotExistError

    found = {}
    params = params_deps(stage)
    for dep in stage.deps:
        if dep in params:
            continue
        try:
            dep.save()
        except DependencyDoesNotExistError:
            continue
        found[dep.fs_path] = (dep.hash_info, dep.meta)
    return found


def _save_outs(stage: Any, untracked: set[str]) -> None:
    """stage.save_outs, without DVC's check that an output is not tracked by
    git for outputs in ``untracked`` (checked earlier in this run): that
    check reads the whole git index in Python, 64 % of a checkpoint at 10^4
    tracked files. Their .gitignore entry is still ensured, as DVC does."""
    skipped = [o for o in stage.outs if o.use_scm_ignore and o.fs_path in untracked]
    for out in skipped:  # an instance attribute over the method, removed below
        out.ignore = functools.partial(out.repo.scm_context.ignore, out.fspath)
    try:
        stage.save_outs(allow_missing=True)
    finally:
        for out in skipped:
            del out.ignore
    untracked.update(o.fs_path for o in stage.outs if o.use_scm_ignore and o.hash_info)


def save_stage(stage: Any, known_deps: dict[str, tuple[Any, Any]],
               untracked: set[str] | None = None) -> None:
    """Hash deps, params and outputs into the stage, as `dvc commit` would;
    deps in known_deps take the hash they had when the run started (the run
    used them as they were then), the others are hashed now. ``untracked``:
    outputs already found not tracked by git in this run (updated here)."""
    from dvc.dependency.base import DependencyDoesNotExistError

    try:
        for dep in stage.deps:
            if dep.fs_path in known_deps:
                dep.hash_info, dep.meta = known_deps[dep.fs_path]
                continue
            try:
                dep.save()
            except DependencyDoesNotExistError:
                pass
        # Outputs written only at the end of training (the final model) may not
        # exist yet; the persisted checkpoint output must (checked by the caller).
        _save_outs(stage, set() if untracked is None else untracked)
        # No run-cache entry: it would register an intermediate output as the result.
        stage.md5 = stage.compute_md5()
    except Exception as exc:
        raise RecordError(f"saving stage '{shown_address(stage)}' failed: {exc}. Check that its "
                          "dependencies and params exist.") from exc


def seed_md5s(repo: Any, digests: dict[str, str]) -> None:
    """Hand DVC's state database md5s computed while the files were written,
    so caching does not read them again (entries keyed on inode/mtime/size)."""
    from dvc_data.hashfile.hash_info import HashInfo

    if digests:
        repo.state.save_many([(path, HashInfo("md5", md5), None)
                              for path, md5 in digests.items()], repo.fs)


def cache_output(out: Any, hardlink: bool) -> None:
    """Put an output in the cache without touching the workspace; with
    hardlink, its files are linked into the cache instead of copied."""
    from dvc_data.hashfile.transfer import transfer

    if not hardlink:
        out.commit(relink=False)  # never link files that may change into the cache
        return
    staging, _, obj = out._build(out.cache, out.fs_path, out.fs, out.hash_name,  # noqa: SLF001
                                 ignore=out.dvcignore)
    transfer(staging, out.cache, {obj.hash_info}, shallow=False, hardlink=True)


class _Failures(logging.Handler):
    """(oid, error) of each object a DVC transfer failed to copy."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[tuple[str, BaseException]] = []

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and record.args:
            self.found.append((str(record.args[0]), exc))


def transfer_failures() -> contextlib.AbstractContextManager[list[tuple[str, BaseException]]]:
    """DVC's transfers log a file they fail to copy ("failed to transfer",
    the error attached) and go on without raising: the (oid, error) of each
    logged while inside (any thread's: the caller tells which are its own)."""
    return _watching("dvc_data.hashfile.transfer", _Failures())


class _Unreached(logging.Filter):
    """Keeps DVC's "failed to connect to s3 (...)" records: their errors."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("failed to connect to"):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        self.found.append(" ".join(str(exc or record.getMessage()).split()))
        return False


def unreached_remotes() -> contextlib.AbstractContextManager[list[str]]:
    """DVC's fetch logs a DVC remote it cannot reach ("ERROR: failed to
    connect to s3 (...)", on the terminal before dvc-dali's own line) and goes
    on: kept off the terminal while inside, each such error (its text) handed
    to the caller, who says it once, with what to do."""
    return _watching("dvc_data.index.fetch", _Unreached())


@contextlib.contextmanager
def _watching(name: str, watcher: Any) -> Iterator[list[Any]]:
    """``watcher`` on DVC's logger ``name`` while inside (a Handler sees its
    records; a Filter may also keep them off the terminal): yields what it
    found (its ``found``)."""
    log = logging.getLogger(name)
    handler = isinstance(watcher, logging.Handler)
    (log.addHandler if handler else log.addFilter)(watcher)
    try:
        yield watcher.found
    finally:
        (log.removeHandler if handler else log.removeFilter)(watcher)


def remote_name(repo: Any, name: str | None) -> str:
    """The DVC remote a command uses: ``name``, else the default's name."""
    return name or str(repo.config["core"].get("remote") or "(the default)")


def first_cache_type(out: Any) -> str | None:
    return next(iter(out.cache.cache_types), None)


def lock_entry(stage: Any) -> dict:
    from dvc.stage.serialize import to_single_stage_lockfile

    return to_single_stage_lockfile(stage)


def parse_yaml(text: str, path: str) -> Any:
    from dvc.utils.serialize import parse_yaml_for_update

    return parse_yaml_for_update(text, path)


def lockfile_problem(path: str) -> str | None:
    """Why DVC would refuse to read this dvc.lock (its own YAML parser and
    schema); None where it reads it, or where there is none."""
    from dvc.schema import COMPILED_LOCKFILE_SCHEMA

    try:
        with open(path, encoding="utf-8") as fobj:
            text = fobj.read()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    try:
        COMPILED_LOCKFILE_SCHEMA(parse_yaml(text, path) or {})
    except Exception as exc:  # DVC's YAML errors and voluptuous's, by DVC version
        return " ".join(str(exc).split()) or type(exc).__name__
    return None


def dump_yaml(data: Any) -> str:
    from dvc.utils.serialize import dumps_yaml

    return dumps_yaml(data)


def exp_ref(baseline: str, name: str) -> str:
    from dvc.repo.experiments.refs import ExpRefInfo

    return str(ExpRefInfo(baseline, name))


def check_row_name(repo: Any, baseline: str, name: str) -> None:
    from dvc.repo.experiments.refs import ExpRefInfo
    from dvc.repo.experiments.utils import check_ref_format

    try:
        check_ref_format(repo.scm, ExpRefInfo(baseline, name))
    except Exception as exc:
        raise RecordError(f"checkpoint name '{name}' is not a valid git ref name ({exc}). "
                          "Pass a name without spaces, '/', '~', '^', ':' or '..'.") from exc


def params_deps(stage: Any) -> list[Any]:
    """The stage's `params:` dependencies (one per params file)."""
    from dvc.dependency.param import ParamsDependency

    return [d for d in stage.deps if isinstance(d, ParamsDependency)]


def params_now(dep: Any) -> tuple[Any, dict[str, Any]]:
    """(hash DVC would record, flattened values) of a params dependency now."""
    try:
        return dep.get_hash(), dep.read_params(flatten=True)
    except Exception as exc:
        raise RecordError(f"cannot read the params of '{dep}': {exc}. Fix the file so "
                          "`dvc params diff` can read it.") from exc


def checkout_dir(repo: Any, dir_md5: str, dest: str) -> None:
    """Materialize a directory output from the local cache into dest."""
    from dvc_data.hashfile.checkout import checkout
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    odb = repo.cache.local
    try:
        tree = Tree.load(odb, HashInfo("md5", dir_md5))
        checkout(dest, repo.fs, tree, odb, quiet=True)
        _unlink_from_cache(odb, dest)
    except Exception as exc:
        raise RecordError(
            f"the checkpoint to resume ({dir_md5}) is not complete in the DVC cache "
            f"{odb.path} ({type(exc).__name__}: {exc}). Fetch it with `dvc pull` or `dvc exp "
            "pull <remote> <row>`, or start over with `dvc-dali reset`.") from exc


def _unlink_from_cache(odb: Any, dest: str) -> None:
    """Turn the files a checkout linked to the cache (`cache.type` hardlink or
    symlink) into copies of their own, as DVC unprotects a persisted output
    before a run: the run writes there, and a write through a link would
    rewrite the cached object, and so every row that holds it."""
    odb.unprotect(dest)


def checkout_out(repo: Any, md5: str, dest: str) -> None:
    """Materialize an output from the local cache into dest: a directory
    (md5 ending in .dir) as checkout_dir does, a file copied (not linked: the
    run rewrites it, and the cache copy must stay intact)."""
    if md5.endswith(".dir"):
        checkout_dir(repo, md5, dest)
        return
    import shutil

    src = repo.cache.local.oid_to_path(md5)
    if not os.path.isfile(src):
        raise RecordError(
            f"the checkpoint to resume ({md5}) is not in the DVC cache {repo.cache.local.path}. "
            "Fetch it with `dvc pull` or `dvc exp pull <remote> <row>`, or start over with "
            "`dvc-dali reset`.")
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    shutil.copyfile(src, dest + ".dvc-dali-tmp")
    os.replace(dest + ".dvc-dali-tmp", dest)


def out_in_cache(repo: Any, md5: str) -> bool:
    """Whether an output (a directory and all its files, or a file) is in the
    local cache."""
    if md5.endswith(".dir"):
        return dir_in_cache(repo, md5)
    return os.path.isfile(repo.cache.local.oid_to_path(md5))


def auto_push_remote(repo: Any) -> str | None:
    """The git remote DVC's experiment auto-push targets, read as DVC reads
    it (env DVC_EXP_AUTO_PUSH / DVC_EXP_GIT_REMOTE over `exp.auto_push` /
    `exp.git_remote`, default 'origin'); None when auto-push is off."""
    from dvc.env import DVC_EXP_AUTO_PUSH, DVC_EXP_GIT_REMOTE
    from dvc.utils import env2bool

    exp = repo.config.get("exp", {})
    if not env2bool(DVC_EXP_AUTO_PUSH, exp.get("auto_push", False)):
        return None
    return os.getenv(DVC_EXP_GIT_REMOTE, exp.get("git_remote", "origin"))


def check_push_remotes(repo: Any, git_remote: str) -> str:
    """Raise RecordError unless the git remote and the default DVC remote
    are usable; returns the DVC remote's URL, for messages."""
    try:
        repo.scm.validate_git_remote(git_remote)
        odb = repo.cloud.get_remote_odb(command="push")
        return odb.fs.unstrip_protocol(odb.path)
    except Exception as exc:
        raise RecordError(
            f"experiment auto-push is on ({_set_by('DVC_EXP_AUTO_PUSH', 'exp.auto_push')}) but "
            f"cannot push rows: {exc}. Fix the git remote '{git_remote}' ("
            f"{_set_by('DVC_EXP_GIT_REMOTE', 'exp.git_remote')}; `git remote -v`) and the "
            "default DVC remote (`dvc remote list`), or turn auto-push off ("
            f"{_off()}).") from None


def _set_by(variable: str, option: str) -> str:
    """Where a setting came from, for the refusal: the environment variable
    (which wins over the config, and which the config's fix would not
    change), else the config option (found by a sweep)."""
    value = os.environ.get(variable)
    return f"{variable}={value!r}" if value is not None else f"`dvc config {option}`"


def _off() -> str:
    if os.environ.get("DVC_EXP_AUTO_PUSH") is not None:  # DVC reads 1, y or true in it as on
        return "unset DVC_EXP_AUTO_PUSH or set it to 0"
    return "`dvc config exp.auto_push false`"


def _cached(outs: Any) -> list[Any]:
    """The hash infos of the outputs DVC caches that have one (a HashInfo
    is false without a value)."""
    return [out.hash_info for out in outs if out.use_cache and out.hash_info]


def cached_out_hashes(stage: Any) -> list[Any]:
    """The hash infos of the stage's cached outputs, as just recorded."""
    return _cached(stage.outs)


def row_cached_out_hashes(stage: Any) -> list[Any]:
    """The hash infos of every cached output a row's dvc.lock names: the
    stage's, as just recorded, and the other stages' (its data, made by
    another stage) as locked. A row pushed with its data has them all, as
    `dvc exp push` would push them."""
    others = [info for s in stage.repo.index.stages
              if getattr(s, "name", None) and s.addressing != stage.addressing
              for info in _cached(s.outs)]
    return cached_out_hashes(stage) + others


def check_remote(repo: Any, name: str | None, command: str) -> None:
    """Refuse a DVC remote that is not configured (an unknown name, or no
    default) before anything moves, in DVC's words."""
    try:
        repo.cloud.get_remote_odb(name=name, command=command)
    except Exception as exc:
        said = " ".join(str(exc).split())  # DVC's text breaks lines
        raise DvcDaliError(f"DVC remote {name or '(the default)'}: {said}. `dvc remote list` "
                           "names this project's DVC remotes; give one with -r, or set the "
                           "default with `dvc remote default <name>`. Nothing was changed."
                           ) from None


def transfer_revs(repo: Any, revs: list[str], direction: str, remote: str | None = None
                  ) -> None:
    """`dvc push`/`dvc fetch` of what the commits' dvc.lock files name (every
    cached output, as DVC's own commands decide), not the workspace's."""
    try:
        if direction == "push":
            repo.push(revs=revs, workspace=False, remote=remote)
        else:
            repo.fetch(revs=revs, workspace=False, remote=remote)
    except Exception as exc:
        # the caller says what moved and what did not: not "nothing changed"
        raise RecordError(f"dvc {direction} of {len(revs)} row(s) failed: "
                          f"{str(exc).rstrip('.')}; check the DVC remote (`dvc remote list`)"
                          ) from None


def dir_in_cache(repo: Any, dir_md5: str) -> bool:
    """Whether a directory output and all its files are in the local cache."""
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    odb = repo.cache.local
    try:
        tree = Tree.load(odb, HashInfo("md5", dir_md5))
    except Exception:
        return False
    return all(odb.exists(oid.value) for _, _, oid in tree)


def tree_listing(repo: Any, dir_md5: str) -> dict[str, str] | None:
    """{relative path: md5} of a directory object in the local cache; None
    when it is not there."""
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    try:
        tree = Tree.load(repo.cache.local, HashInfo("md5", dir_md5))
    except Exception:
        return None
    return {"/".join(key): oid.value for key, _, oid in tree}


def dir_listing(repo: Any, path: str) -> dict[str, str]:
    """{relative path: md5} of a directory now (DVC's state spares the
    files it hashed before)."""
    from dvc_data.hashfile.build import build

    _, _, tree = build(repo.cache.local, path, repo.fs, "md5", state=repo.state)
    return {"/".join(key): oid.value for key, _, oid in tree}


def _listing(hash_info: Any, odbs: list[Any]) -> Any:
    """The Tree of a directory object from the first of ``odbs`` that has it."""
    from dvc_data.hashfile.tree import Tree

    for odb in odbs:
        try:
            return Tree.load(odb, hash_info)
        except Exception:  # not in this one (or unreadable): try the next
            continue
    return None


def _rev_files(repo: Any, odbs: list[Any]) -> list[tuple[str, str]]:
    """(path, md5) of every cached file the current revision's dvc.lock names
    (a directory's listing, then its files)."""
    files = []
    for out in repo.index.outs:
        info = out.hash_info
        if not (out.use_cache and info):
            continue
        path = str(out.def_path)
        files.append((f"{path}/ (the whole directory)" if info.isdir else path, info.value))
        if info.isdir:
            tree = _listing(info, odbs)
            files += [("/".join((path, *key)), oid.value) for key, _, oid in (tree or [])]
    return files


def _present(odb: Any, oids: list[str]) -> set[str]:
    """The oids ``odb`` holds: a stat each for a local directory (DVC's own
    check of a local cache may read and hash the files), else DVC's query."""
    if odb.fs.protocol == "local":
        return {oid for oid in oids if odb.fs.exists(odb.oid_to_path(oid))}
    return set(odb.oids_exist(oids))


def missing_data(repo: Any, revs: list[str], where: str, remote: str | None = None
                 ) -> dict[str, list[str]]:
    """{rev: paths of the cached files its dvc.lock names that ``where`` lacks:
    "remote" (the DVC remote ``remote``, default the default one) or "cache"
    (the local cache)}; revs that lack nothing are left out."""
    try:
        odb = (repo.cache.local if where == "cache"
               else repo.cloud.get_remote_odb(name=remote, command="push"))
        odbs = [repo.cache.local, odb]
        wanted = {rev: _rev_files(repo, odbs)
                  for rev in repo.brancher(revs=list(revs), workspace=False, sha_only=True)}
        present = _present(odb, sorted({m for fs in wanted.values() for _, m in fs}))
    except Exception as exc:
        raise RecordError(f"cannot check the data of {len(revs)} row(s) on the DVC "
                          f"{where}: {exc}. Check the DVC remote (`dvc remote list`) and run "
                          "the command again.") from None
    found = {rev: [p for p, m in files if m not in present] for rev, files in wanted.items()}
    return {rev: paths for rev, paths in found.items() if paths}


def remote_odb(repo: Any, name: str | None = None, command: str = "push") -> Any:
    """The DVC remote's object database (``name``, else the default; its fs
    and credentials, as `dvc push` opens them, from this workspace's config);
    kept by the row pusher across rows."""
    return repo.cloud.get_remote_odb(name=name, command=command)


def rev_out_hashes(repo: Any, revs: list[str]) -> list[Any]:
    """The hash infos of every cached output the commits' dvc.lock files name."""
    found = []
    for _ in repo.brancher(revs=list(revs), workspace=False, sha_only=True):
        found += _cached(repo.index.outs)
    return found


def download_objects(repo: Any, odb: Any, objs: list[Any]) -> None:
    """Copy from ``odb`` into the local cache what it lacks of the objects:
    the directories' listings first (they name the files), then the files."""
    cache = repo.cache.local

    def fetch(md5s: list[str]) -> None:
        want = [m for m in dict.fromkeys(md5s) if not os.path.isfile(cache.oid_to_path(m))]
        there = _present(odb, want)
        send = [m for m in want if m in there]
        if send:
            cache.add([odb.oid_to_path(m) for m in send], odb.fs, send, check_exists=False)

    fetch([o.value for o in objs if o.isdir])
    files = [o.value for o in objs if not o.isdir]
    for obj in objs:
        if obj.isdir:
            files += [oid.value for _, _, oid in (_listing(obj, [cache]) or [])]
    fetch(files)


def upload_objects(repo: Any, odb: Any, objs: list[Any], known: set[str]) -> dict[str, list[str]]:
    """Copy to ``odb`` the objects it lacks, from the local cache: every
    directory's files first, then the listings, so that a listing on the
    remote means its files are there. ``known``: md5s already on the remote
    (skipped; those found or sent are added). Returns {output md5: its md5s
    in neither the local cache nor the remote} for the outputs that cannot
    go; raises on a failed transfer. Not `repo.push`/`cloud.push`: no repo
    lock, no index walk, no per-call status set-up (~15 ms a row)."""
    cache = repo.cache.local
    parts: dict[str, list[str]] = {}  # output md5 -> its md5s (files, then listing)
    for obj in objs:
        if obj.value in parts:
            continue
        md5s = []
        if obj.isdir and obj.value not in known:
            tree = _listing(obj, [cache, odb])
            md5s = [oid.value for _, _, oid in (tree or [])]
        parts[obj.value] = [*md5s, obj.value]
    wanted = [m for m in dict.fromkeys(m for ms in parts.values() for m in ms) if m not in known]
    known.update(_present(odb, wanted))
    gone = {m for m in wanted if m not in known and not os.path.isfile(cache.oid_to_path(m))}
    lacking = {out: [m for m in ms if m in gone] for out, ms in parts.items()
               if any(m in gone for m in ms)}
    for listings in (False, True):  # the files, then the directories' listings
        send = [m for m in wanted if m not in known and m not in gone
                and (m not in lacking if listings else not m.endswith(".dir"))
                and (m.endswith(".dir") == listings)]
        if send:
            odb.add([cache.oid_to_path(m) for m in send], cache.fs, send, check_exists=False)
            arrived = _present(odb, send)  # checked on the remote, not assumed
            known.update(arrived)
            if len(arrived) < len(send):
                raise OSError(f"{len(send) - len(arrived)} file(s) did not reach the DVC "
                              "remote")
    return lacking


# DVC's experiment lock (.dvc/tmp/exps/rwlock) on the workspace stash queue
# (refs/exps/stash): a workspace or `--temp` `dvc exp run` takes it for
# writing (without waiting) before it stashes the workspace, then checks out
# its own state over it; while a reader holds it, DVC refuses that run before
# touching anything ("'refs/exps/stash' is busy, it is being blocked by: ...").
# `dvc exp run --queue` (its own stash) and `dvc queue start` never take it.

def _exp_lock_parts(tmp_dir: str, hardlink: bool):
    from dvc.fs import localfs
    from dvc.repo.experiments.refs import WORKSPACE_STASH
    from dvc.repo.experiments.utils import EXEC_TMP_DIR

    path = os.path.join(tmp_dir, EXEC_TMP_DIR)
    os.makedirs(path, exist_ok=True)
    return path, localfs, WORKSPACE_STASH


def executor_dirs(repo: Any) -> list[str]:
    """The directories DVC runs `--temp` and queued experiments in, each a
    project of its own (TempDirExecutor: a temporary directory made under
    .dvc/tmp/exps/standalone/ for `--temp`, under .dvc/tmp/exps/ for a
    queued run), those that hold a dvc.yaml yet."""
    from dvc.repo.experiments.utils import EXEC_TMP_DIR

    if not repo.tmp_dir:
        return []
    top = os.path.join(repo.tmp_dir, EXEC_TMP_DIR)
    found = glob.glob(os.path.join(top, "tmp*")) + glob.glob(
        os.path.join(top, "standalone", "tmp*"))
    return sorted(d for d in found if os.path.isfile(os.path.join(d, "dvc.yaml")))


def workspace_run_info(repo: Any) -> str | None:
    """The file where DVC records the pid of the workspace `dvc exp run`
    while it runs one queue entry (.dvc/tmp/exps/run/workspace/workspace.json):
    written before the entry's stage runs, removed after DVC's final commit
    of that entry, before it takes the next stashed entry. None where this
    DVC has none (then nothing is held)."""
    try:
        queue = repo.experiments.workspace_queue
        return queue._proc_info_path(queue._EXEC_NAME)  # noqa: SLF001
    except Exception:
        return None


def run_info_pid(path: str | None) -> int | None:
    """The pid that file names; None if it is absent or unreadable."""
    import json

    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return int(json.load(fh)["pid"])
    except Exception:
        return None


def wait_for_entry_end(pid: int, info_path: str, poll_s: float = 0.25) -> None:
    """Return once the workspace `dvc exp run` ``pid`` is done with the entry
    it runs now: the process ended, or its run info no longer names it (DVC
    removed it after that entry's final commit and may go on with another
    entry a killed run left stashed, for which it takes the lock itself)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        while True:
            try:
                proc.wait(timeout=poll_s)
                return
            except psutil.TimeoutExpired:
                if run_info_pid(info_path) != pid:
                    return
    except psutil.Error:
        return


def exp_lock_args(repo: Any) -> tuple[str, bool]:
    """(repo tmp dir, hardlink_lock) for hold_exp_lock/release_exp_lock."""
    return repo.tmp_dir, bool(repo.config["core"].get("hardlink_lock", False))


def hold_exp_lock(tmp_dir: str, hardlink: bool, pid: int, cmd: str, timeout_s: float = 10
                  ) -> bool:
    """Register ``pid`` as a reader of DVC's experiment lock on the
    workspace stash queue; False when a writer held it for ``timeout_s``."""
    from dvc.lock import LockError
    from dvc.rwlock import _acquire_read, _check_blockers, _edit_rwlock

    path, fs, name = _exp_lock_parts(tmp_dir, hardlink)
    info = {"pid": pid, "cmd": cmd}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with _edit_rwlock(path, fs, hardlink) as lock:
                _check_blockers(path, lock, info, mode="write", waiters=[name])
                _acquire_read(lock, info, [name])
            return True
        except LockError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def release_exp_lock(tmp_dir: str, hardlink: bool, pid: int, cmd: str) -> None:
    """Undo hold_exp_lock (nothing if it is not held)."""
    from dvc.rwlock import _edit_rwlock

    path, fs, name = _exp_lock_parts(tmp_dir, hardlink)
    info = {"pid": pid, "cmd": cmd}
    with _edit_rwlock(path, fs, hardlink) as lock:
        readers = lock["read"].get(name) or []
        if info in readers:
            readers.remove(info)
        if not readers:
            lock["read"].pop(name, None)
        if not lock["read"]:
            del lock["read"]
