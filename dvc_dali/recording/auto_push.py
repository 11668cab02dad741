"""Each recorded row pushed as soon as it is recorded, when DVC's experiment
auto-push is configured (DVC 3 itself pushes only after `dvc exp run` ends:
after a preemption nothing would be on any remote).

One background thread per process pushes the rows in order: first the
rows' cached outputs to the default DVC remote, then their git refs to the
git remote, so a row visible on the git remote always has its data. Rows
recorded while a push is under way go together in the next one (one data
transfer, one `git push`); the DVC repo and remote are opened once, and
objects already on the remote are remembered, not asked for again. Pushes
are spaced so that the pusher takes at most CPU_SHARE of one core: after a
push that took C seconds of CPU (this thread and git's processes), the next
starts C / CPU_SHARE seconds after it began (at most MAX_GAP_S), with every
row recorded meanwhile; a row recorded after a quiet spell goes at once,
and anyone waiting for the rows (exit, preemption) cuts the gap short.
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
from typing import Any, Optional, Sequence

from ..reading import gitcmd
from ..core import exit_hooks
from ..core.log import logger
from ..core.process_state import STATE
from . import dvc_door

BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
MAX_BATCH = 256  # rows in one push at most (one `git push` command line)
CPU_SHARE = 0.005  # of one core, at most, spent pushing while training goes on
MAX_GAP_S = 10.0  # between the starts of two pushes, at most


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
    # a deletion's: the commit the remote must hold under the ref (last: the
    # rows' jobs are made positionally, Job(ref, name, sha, objs))
    expect: str = ""


def _git_env() -> dict[str, str]:
    # never a credential prompt from a background thread
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0"}


def push_refs(dvc_root: str, remote: str, refs: list[tuple[str, str]],
              leases: Sequence[tuple[str, str]] = ()) -> float:
    """The refs [(sha, ref)] to the git remote in one `git push` (sha "":
    delete the ref, only where the remote holds the commit ``leases``
    [(ref, sha)] name for it), never forced (a row is never overwritten).
    Returns git's CPU seconds."""
    code, err, cpu = gitcmd.run_counting_cpu(
        ["push", "--quiet", "--no-verify", "--no-recurse-submodules",
         *(f"--force-with-lease={ref}:{sha}" for ref, sha in leases if sha), remote,
         *(f"{sha}:{ref}" for sha, ref in refs)], dvc_root, _git_env())
    if code != 0:
        raise OSError(err.strip() or f"git push exited {code}")
    return cpu


def remote_refs(dvc_root: str, remote: str, refs: list[str]) -> dict[str, str]:
    """{ref: sha} of those of ``refs`` the git remote holds."""
    found: dict[str, str] = {}
    for at in range(0, len(refs), MAX_BATCH):
        proc = gitcmd.run(["ls-remote", remote, *refs[at:at + MAX_BATCH]], cwd=dvc_root,
                          env=_git_env(), check=False)
        if proc.returncode != 0:
            raise OSError(proc.stderr.strip() or f"git ls-remote exited {proc.returncode}")
        for line in proc.stdout.splitlines():
            sha, _, ref = line.partition("\t")
            if ref in refs:
                found[ref] = sha
    return found


def push_ref(dvc_root: str, remote: str, sha: str, ref: str) -> None:
    """The ref to the git remote (never forced: a row is never overwritten)."""
    push_refs(dvc_root, remote, [(sha, ref)])


def _held_otherwise(ref: str, remote: str) -> str:
    name = ref.rsplit("/", 1)[-1]
    return f"{name} on {remote} holds another commit than this repository's {name}"


class Pusher:
    """The background pusher of one run."""

    def __init__(self, dvc_root: str, git_remote: str, run_name: str) -> None:
        self.dvc_root, self.git_remote, self.run_name = dvc_root, git_remote, run_name
        self._cond = threading.Condition()
        self._todo: list[Job] = []
        self._pushed: list[str] = []  # row names, in order
        self._dropped: list[str] = []  # rows whose data is gone: never pushed
        self._closing = False
        self._failures = 0  # failed tries in all
        self._repo: Any = None  # opened in the worker thread, used only there
        self._odb: Any = None  # the DVC remote's object database, likewise
        self._known: set[str] = set()  # md5s on the DVC remote, found or sent
        self._inflight: list[Job] = []  # the batch being pushed now
        self._next_at = 0.0  # monotonic time before which no push starts (see CPU_SHARE)
        # the run's rows recorded before this process that the git remote
        # lacks were looked for (_catch_up): a resumed run's first push
        self._caught_up = False
        self._mine: set[str] = set()  # the refs of the rows this process recorded
        self._waiting = 0  # callers of wait(): no spacing while someone waits
        self._apart = False  # the remote holds another recording of this run: none go
        self.stats = {"rows": 0, "pushes": 0, "cpu_s": 0.0}  # this thread + git's CPU
        self._thread = threading.Thread(target=self._run, name="dvc-dali-push", daemon=True)
        self._thread.start()
        # At exit, before concurrent.futures refuses new work (its own hook,
        # registered at its import, runs after ours): DVC's push uses it.
        import concurrent.futures.thread  # noqa: F401

        getattr(threading, "_register_atexit", atexit.register)(
            exit_hooks.this_process_only(self.close))

    # -- the training side -------------------------------------------------
    def push(self, name: str, ref: str, sha: str, objs: list[Any], run_name: str = "") -> None:
        with self._cond:
            self.run_name = run_name or self.run_name  # a resumed run's rows keep its name
            self._mine.add(ref)
            if self._apart:  # said once (_keep_apart); listed at exit
                self._dropped.append(name)
                return
            self._todo.append(Job(ref, name, sha, list(objs)))
            self._cond.notify_all()

    def forget(self, ref: str, name: str, sha: str) -> None:
        """Retention pruned a row (commit ``sha``): drop it from the queue, or
        delete it on the remote if it went there (its data stays until `dvc
        gc`), only where the remote still holds that commit under its name."""
        with self._cond:
            queued = [j for j in self._todo if j.ref == ref and j.sha
                      and not any(j is k for k in self._inflight)]
            for job in queued:
                self._todo.remove(job)
            # never the remote's refs when they are another recording's rows
            if not queued and not self._apart:
                self._todo.append(Job(ref, "", "", expect=sha))
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
            self._waiting += 1
            self._cond.notify_all()  # a row waiting out its backoff or gap is tried at once
            try:
                while self._todo and not (deadline is None and self._failures > failures):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._cond.wait(left)
            finally:
                self._waiting -= 1
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
                           self.git_remote, ", ".join(left), self.git_remote, self.run_name)
        return left

    # -- the worker ----------------------------------------------------------
    def _run(self) -> None:
        try:  # below the training's priority (Linux: per thread; git inherits it)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:  # the catch-up first
                try:
                    self._catch_up()
                except Exception as exc:  # retried as a push is
                    self._failed(self._todo[0] if self._todo else Job("", self.run_name), exc)
                continue
            started = time.monotonic()
            cpu0 = time.thread_time()
            try:
                pushed, dropped, git_cpu = self._do(batch)
            except Exception as exc:  # any failure is retried: training must go on
                self._failed(batch[0], exc)
                continue
            finally:
                self.stats["cpu_s"] += time.thread_time() - cpu0
            cpu = time.thread_time() - cpu0 + git_cpu
            with self._cond:
                self._next_at = started + min(cpu / CPU_SHARE, MAX_GAP_S)
                if "first_cpu_s" not in self.stats:  # opening the repo and remote
                    self.stats.update(first_cpu_s=cpu, first_rows=len(pushed))
                self.stats["cpu_s"] += git_cpu
                self.stats["rows"] += len(pushed)
                for job in batch:
                    if any(job is j for j in self._todo):
                        self._todo.remove(job)
                self._dropped += [j.name for j in dropped]
                self._pushed += [j.name for j in pushed]
                self._inflight = []
                self._cond.notify_all()

    def _take(self) -> list[Job] | None:
        """The next batch, once due; [] for the catch-up before the first
        one; None once closing."""
        with self._cond:
            while not self._closing and not (
                    self._todo and (self._waiting or time.monotonic() >= self._next_at)):
                self._cond.wait(max(self._next_at - time.monotonic(), 0.001)
                                if self._todo else None)
            if self._closing:
                return None
            batch = self._next_batch() if self._caught_up else []
            self._inflight = batch
            return batch

    def _catch_up(self) -> None:
        """Once, before the first push: the rows of this run recorded before
        this process that the git remote lacks go first. A process killed
        before its pusher sent them (rows come faster than MAX_GAP_S apart)
        left them behind, and the resumed run pushed only its own (found by
        a sweep). A row the remote holds with another commit (recorded
        elsewhere) is left alone, and said."""
        from ..reading.exp_refs import list_rows

        with self._cond:
            queued, name = {j.ref for j in self._todo}, self.run_name
        listed = list_rows(self.dvc_root, name)
        if self._keep_apart(listed):
            return
        rows = [r for r in listed if r["ref"] not in queued and r["name"] not in self._pushed]
        there = remote_refs(self.dvc_root, self.git_remote, [r["ref"] for r in rows])
        other = [r["name"] for r in rows if there.get(r["ref"], r["sha"]) != r["sha"]]
        rows = [r for r in rows if r["ref"] not in there]
        if rows and self._repo is None:
            self._repo, self._odb = dvc_door.open_repo(self.dvc_root), None
        jobs = [Job(r["ref"], r["name"], r["sha"], dvc_door.rev_out_hashes(self._repo, [r["sha"]]))
                for r in rows]
        if other:
            logger.warning("%s on %s: another commit under that name (recorded elsewhere); "
                           "left alone", ", ".join(other), self.git_remote)
        with self._cond:
            # a row this process recorded while the remote was asked is its own
            # (queued, or pushed by now), not one recorded before it
            jobs = [j for j in jobs if j.ref not in self._mine]
            self._todo[:0] = jobs
            self._caught_up = True
            self._cond.notify_all()
        if jobs:
            logger.info("%s of %s recorded before this process, not on %s: pushed first",
                        ", ".join(j.name for j in jobs), name, self.git_remote)

    def _keep_apart(self, listed: list) -> bool:
        """True when the git remote holds another recording of this run (rows
        of its name and baseline another clone started): then none of this
        run's rows go, and that is said once; they went in beside the
        other's, and the next run's retention pruned the other's rows there
        (found by a sweep). `dvc-dali push` refuses them likewise."""
        from ..reading.exp_refs import list_rows
        from .share import foreign_rows, mixing, remote_rows

        theirs = remote_rows(self.dvc_root, self.git_remote, list_rows(self.dvc_root),
                             {self.run_name}, {r["baseline"] for r in listed}, _git_env())
        foreign = foreign_rows(listed, theirs)
        if not foreign:
            return False
        with self._cond:
            self._apart = self._caught_up = True
            self._dropped += [j.name for j in self._todo if j.sha]
            self._todo = [j for j in self._todo if not j.sha]
            self._cond.notify_all()
        logger.warning("rows of %s NOT pushed: %s", self.run_name,
                       mixing(foreign, self.git_remote, "pushed"))
        return True

    def _next_batch(self) -> list[Job]:
        """The jobs queued (rows and deletions), up to a second one of a ref."""
        batch: list[Job] = []
        for job in self._todo[:MAX_BATCH]:
            if any(job.ref == j.ref for j in batch):
                break
            batch.append(job)
        return batch

    def _do(self, batch: list[Job]) -> tuple[list[Job], list[Job], float]:
        """(rows pushed, rows dropped: data gone, git's CPU seconds)."""
        t0 = time.perf_counter()
        deletions = [(j.ref, j.expect) for j in batch if not j.sha]
        batch = [j for j in batch if j.sha]
        if not batch:
            return [], [], self._git(deletions, [])
        if self._repo is None:
            self._repo = dvc_door.open_repo(self.dvc_root)
            self._odb = None
        if self._odb is None:
            self._odb = dvc_door.remote_odb(self._repo)
        lacking = dvc_door.upload_objects(self._repo, self._odb,
                                          [o for job in batch for o in job.objs], self._known)
        pushed, dropped = [], []
        for job in batch:
            gone = [md5 for o in job.objs for md5 in lacking.get(o.value, [])]
            if not gone:
                pushed.append(job)
                continue
            dropped.append(job)  # the rows after it still go
            logger.warning(
                "%s NOT pushed to %s: %d of its files are in neither the local DVC cache nor "
                "the DVC remote (md5 %s%s); `dvc-dali push %s %s` names them; the rows after "
                "it are still pushed", job.name, self.git_remote, len(gone),
                ", ".join(gone[:3]), ", ..." if len(gone) > 3 else "", self.git_remote,
                self.run_name)
        git_cpu = self._git(deletions, [(j.sha, j.ref) for j in pushed])
        logger.info("pushed %s to %s (%.0f ms)", ", ".join(j.name for j in pushed) or "nothing",
                    self.git_remote, (time.perf_counter() - t0) * 1000)
        return pushed, dropped, git_cpu

    def _git(self, deletions: list[tuple[str, str]], refs: list[tuple[str, str]]) -> float:
        """One `git push` of the rows' refs and the deletions [(ref, the
        commit it must hold)]; git's CPU."""
        if not (refs or deletions):
            return 0.0
        self.stats["pushes"] += 1
        try:
            return push_refs(self.dvc_root, self.git_remote,
                             refs + [("", ref) for ref, _ in deletions], deletions)
        except OSError:
            if not deletions:
                raise
        # a lease that failed (another commit under the name), or an older git
        # refusing to delete a ref the remote lacks: see what the remote holds
        held = remote_refs(self.dvc_root, self.git_remote, [ref for ref, _ in deletions])
        other = [ref for ref, sha in deletions if held.get(ref) not in (None, sha)]
        if other:
            logger.warning("%s: retention left it there (another recording's row, or one "
                           "recorded again elsewhere; `dvc-dali show` there lists it)",
                           "; ".join(_held_otherwise(ref, self.git_remote) for ref in other))
        left = [(ref, sha) for ref, sha in deletions if held.get(ref) == sha]
        if not (refs or left):
            return 0.0
        return push_refs(self.dvc_root, self.git_remote,
                         refs + [("", ref) for ref, _ in left], left)

    def _failed(self, job: Job, exc: Exception) -> None:
        with self._cond:
            self._inflight = []
            job.failures += 1
            self._failures += 1
            self._cond.notify_all()
            if job.failures == 1:
                logger.warning("push of %s to %s failed (%s); retrying in the background, "
                               "training goes on", job.name or job.ref, self.git_remote,
                               str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self._repo = self._odb = None  # a fresh connection next time
            self._known.clear()
            self._cond.wait(backoff(job.failures))


def pusher() -> Optional[Pusher]:
    return STATE.pusher


def start(dvc_root: str, run_name: str) -> Optional[Pusher]:
    """Check DVC's auto-push settings before the first training step; start
    the pusher when they are on. A misconfigured remote raises RecordError."""
    if STATE.pusher is not None:
        return STATE.pusher
    repo = dvc_door.open_repo(dvc_root)
    try:
        remote = dvc_door.auto_push_remote(repo)
        if remote is None:
            return None
        dvc_door.check_push_remotes(repo, remote)
    finally:
        repo.close()
    proc = gitcmd.run(["ls-remote", "--quiet", remote, "refs/exps/nonexistent"],
                      cwd=dvc_root, env=_git_env(), check=False)
    if proc.returncode != 0:
        from ..core.errors import RecordError

        raise RecordError(f"experiment auto-push is on, but the git remote '{remote}' cannot "
                          f"be reached: {proc.stderr.strip()}. Fix it (`git remote -v`) or "
                          "turn auto-push off (`dvc config exp.auto_push false`).")
    STATE.pusher = Pusher(dvc_root, remote, run_name)
    return STATE.pusher


def settle(timeout: float) -> str:
    """Before a preempted process exits: wait up to ``timeout`` seconds for
    the rows in flight; what to add to the exit line ("" without auto-push)."""
    p = STATE.pusher
    if p is None:
        return ""
    in_time = p.wait(timeout)
    left = p.unpushed() if in_time else p.close(0)
    if not left:
        return f", pushed to {p.git_remote}"
    why = "(files missing from the local DVC cache)" if in_time else \
        f"within {timeout:.0f} s (DVC_DALI_PUSH_GRACE)"
    return (f", NOT pushed to {p.git_remote} {why}: {len(left)} row(s) left; push them with "
            f"`dvc-dali push {p.git_remote} {p.run_name}`")
