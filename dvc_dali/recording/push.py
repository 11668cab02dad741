"""Each recorded row pushed as soon as it is recorded, when DVC's experiment
auto-push is configured (DVC 3 itself pushes only after `dvc exp run` ends:
after a preemption nothing would be on any remote).

One background thread per process pushes the rows one at a time, in order:
first the row's cached outputs to the default DVC remote, then its git ref
to the git remote, so a row visible on the git remote always has its data.
A failed push is retried with backoff and reported once; training never
waits for it. At exit the rows still queued are pushed, or listed with the
command that pushes them.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import threading
import time
from typing import Any, Optional

from ..log import logger
from . import commit, dvc_door

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)


def backoff(failures: int) -> float:
    """Seconds before the next try after ``failures`` failed ones."""
    return BACKOFF_S[min(failures, len(BACKOFF_S)) - 1] if failures > 0 else 0.0


@dataclasses.dataclass
class Job:
    ref: str
    name: str  # row name; "" for a deletion
    sha: str = ""  # "" deletes the remote ref (retention pruned the row)
    objs: list[Any] = dataclasses.field(default_factory=list)
    failures: int = 0


class Unpushable(OSError):
    """A row whose data is in neither the local cache nor the DVC remote:
    trying again cannot push it."""


def _git_env() -> dict[str, str]:
    # never a credential prompt from a background thread
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0"}


def push_ref(dvc_root: str, remote: str, sha: str, ref: str) -> None:
    """The ref to the git remote (never forced: a row is never overwritten)."""
    commit.git(["push", "--quiet", "--no-verify", remote, f"{sha}:{ref}"], cwd=dvc_root,
               env=_git_env())


def delete_ref(dvc_root: str, remote: str, ref: str) -> None:
    proc = commit.git(["push", "--quiet", "--no-verify", remote, f":{ref}"], cwd=dvc_root,
                      env=_git_env(), check=False)
    if proc.returncode != 0 and "remote ref does not exist" not in proc.stderr:
        raise OSError(proc.stderr.strip() or f"git push exited {proc.returncode}")


class Pusher:
    """The background pusher of one run."""

    def __init__(self, dvc_root: str, git_remote: str, exp_name: str) -> None:
        self.dvc_root, self.git_remote, self.exp_name = dvc_root, git_remote, exp_name
        self._cond = threading.Condition()
        self._todo: list[Job] = []
        self._pushed: list[str] = []  # row names, in order
        self._dropped: list[str] = []  # rows whose data is gone: never pushed
        self._closing = False
        self._failures = 0  # failed tries in all
        self._repo: Any = None  # opened in the worker thread, used only there
        self._thread = threading.Thread(target=self._run, name="dvc-dali-push", daemon=True)
        self._thread.start()
        # At exit, before concurrent.futures refuses new work (its own hook,
        # registered at its import, runs after ours): DVC's push uses it.
        import concurrent.futures.thread  # noqa: F401

        getattr(threading, "_register_atexit", atexit.register)(self.close)

    # -- the training side -------------------------------------------------
    def push(self, name: str, ref: str, sha: str, objs: list[Any], exp: str = "") -> None:
        with self._cond:
            self.exp_name = exp or self.exp_name  # a resumed run's rows keep its name
            self._todo.append(Job(ref, name, sha, list(objs)))
            self._cond.notify_all()

    def forget(self, ref: str, name: str) -> None:
        """Retention pruned a row: drop it from the queue, or delete it on the
        remote if it went there (its data stays until `dvc gc`)."""
        with self._cond:
            queued = [j for j in self._todo[1:] if j.ref == ref and j.sha]
            for job in queued:
                self._todo.remove(job)
            if not queued:
                self._todo.append(Job(ref, "", ""))
            for done in (self._pushed, self._dropped):
                if name in done:
                    done.remove(name)
            self._cond.notify_all()

    def unpushed(self) -> list[str]:
        with self._cond:
            return self._dropped + [j.name for j in self._todo if j.sha]

    def is_pushed(self, name: str) -> bool:
        with self._cond:
            return name in self._pushed

    def wait(self, timeout: Optional[float]) -> bool:
        """Until every queued row is pushed (True), or ``timeout`` seconds, or
        (no timeout) until a push fails once more; False when rows are left."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            failures = self._failures
            self._cond.notify_all()  # a row waiting out its backoff is tried at once
            while self._todo and not (deadline is None and self._failures > failures):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(left)
            return not self._todo

    def close(self, timeout: Optional[float] = None) -> list[str]:
        """Finish (see :meth:`wait`), stop, and say what was left; the names."""
        if self._closing:
            return self.unpushed()
        self.wait(timeout)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        left = self.unpushed()
        if left:
            logger.warning("not pushed to %s: %s; push them with `dvc-dali push %s %s`",
                           self.git_remote, ", ".join(left), self.git_remote, self.exp_name)
        return left

    # -- the worker ----------------------------------------------------------
    def _run(self) -> None:
        try:  # below the training's priority (Linux: per thread; git inherits it)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while True:
            with self._cond:
                while not self._todo and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                job = self._todo[0]
            try:
                self._do(job)
            except Unpushable as exc:  # the rows after it still go
                logger.warning("%s", exc)
                with self._cond:
                    self._dropped.append(job.name)
            except Exception as exc:  # any other failure is retried: training must go on
                self._failed(job, exc)
                continue
            with self._cond:
                self._todo.remove(job)
                if job.sha and job.name not in self._dropped:
                    self._pushed.append(job.name)
                self._cond.notify_all()

    def _do(self, job: Job) -> None:
        if not job.sha:
            delete_ref(self.dvc_root, self.git_remote, job.ref)
            return
        t0 = time.perf_counter()
        if self._repo is None:
            self._repo = dvc_door.open_repo(self.dvc_root)
        failed = dvc_door.push_objects(self._repo, job.objs)
        if failed:
            raise OSError(f"{failed} file(s) of the row did not reach the DVC remote")
        self._check_arrived(job)
        push_ref(self.dvc_root, self.git_remote, job.sha, job.ref)
        logger.info("pushed %s to %s (%.0f ms)", job.name, self.git_remote,
                    (time.perf_counter() - t0) * 1000)

    def _check_arrived(self, job: Job) -> None:
        """DVC's push skips, with a warning only, files missing from the local
        cache: a row goes to the git remote only once all its data is on the
        DVC remote."""
        lacking = dvc_door.objects_missing(self._repo, job.objs, "remote")
        if not lacking:
            return
        gone = [md5 for md5 in dvc_door.objects_missing(self._repo, job.objs, "cache")
                if md5 in lacking]
        if gone:
            raise Unpushable(
                f"{job.name} NOT pushed to {self.git_remote}: {len(gone)} of its files are in "
                f"neither the local DVC cache nor the DVC remote (md5 {', '.join(gone[:3])}"
                f"{', ...' if len(gone) > 3 else ''}); `dvc-dali push {self.git_remote} "
                f"{self.exp_name}` names them; the rows after it are still pushed")
        raise OSError(f"{len(lacking)} file(s) of the row did not reach the DVC remote")

    def _failed(self, job: Job, exc: Exception) -> None:
        with self._cond:
            job.failures += 1
            self._failures += 1
            self._cond.notify_all()
            if job.failures == 1:
                logger.warning("push of %s to %s failed (%s); retrying in the background, "
                               "training goes on", job.name or job.ref, self.git_remote,
                               str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self._repo = None  # a fresh connection next time
            self._cond.wait(backoff(job.failures))


_PUSHER: Optional[Pusher] = None


def pusher() -> Optional[Pusher]:
    return _PUSHER


def start(dvc_root: str, exp_name: str) -> Optional[Pusher]:
    """Check DVC's auto-push settings before the first training step; start
    the pusher when they are on. A misconfigured remote raises RecordError."""
    global _PUSHER
    if _PUSHER is not None:
        return _PUSHER
    repo = dvc_door.open_repo(dvc_root)
    try:
        remote = dvc_door.auto_push_remote(repo)
        if remote is None:
            return None
        dvc_door.check_push_remotes(repo, remote)
    finally:
        repo.close()
    proc = commit.git(["ls-remote", "--quiet", remote, "refs/exps/nonexistent"],
                      cwd=dvc_root, env=_git_env(), check=False)
    if proc.returncode != 0:
        from ..errors import RecordError

        raise RecordError(f"experiment auto-push is on, but the git remote '{remote}' cannot "
                          f"be reached: {proc.stderr.strip()}. Fix it (`git remote -v`) or "
                          "turn auto-push off (`dvc config exp.auto_push false`).")
    _PUSHER = Pusher(dvc_root, remote, exp_name)
    return _PUSHER


def settle(timeout: float) -> str:
    """Before a preempted process exits: wait up to ``timeout`` seconds for
    the rows in flight; what to add to the exit line ("" without auto-push)."""
    p = _PUSHER
    if p is None:
        return ""
    in_time = p.wait(timeout)
    left = p.unpushed() if in_time else p.close(0)
    if not left:
        return f", pushed to {p.git_remote}"
    why = "(files missing from the local DVC cache)" if in_time else \
        f"within {timeout:.0f} s (DVC_DALI_PUSH_GRACE)"
    return (f", NOT pushed to {p.git_remote} {why}: {len(left)} row(s) left; push them with "
            f"`dvc-dali push {p.git_remote} {p.exp_name}`")
