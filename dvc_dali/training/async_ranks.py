"""Asynchronous checkpoints across torch.distributed ranks: what each rank's
background thread does with one captured checkpoint.

Every rank writes its snapshot into ``rank-NNNNN/`` (durable: fsynced,
renamed, its directory fsynced) and says so in torch.distributed's own
store (``<n>.<seq>/durable/<rank>``: its step, snapshot and manifest md5,
``n`` this Checkpointer's number in rank_setup, ``seq`` its checkpoint's;
a later Checkpointer of the same directory never reads an earlier one's
keys). Rank
0 waits for every rank's mark of that checkpoint (rank_commit.decide), then
names them all in LATEST, removes what they superseded, records the row,
and says ``<n>.<seq>/done``; every other rank waits for that before its
checkpoint counts as finished (the next one's files must not appear while
rank 0 hashes the directory). Nothing here runs on the training thread and
nothing is a collective: a rank that ended (its directory lock released,
dirlock.holder) is noticed while waiting, and its checkpoint fails with a
message naming the rank and the step, never a partial row; so is a rank
that checkpoints into another directory or synchronously (rank_setup); a
long wait for a live rank is said (_Waiting).

Synchronous ranks use the same keys to meet before each checkpoint's
collectives (:meth:`AsyncRanks.meet`): a rank that never comes to it (its
loop ended, it was killed) is named on every rank waiting, not waited for
in a collective until the process group's timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

from ..format import dirlock, store
from . import distributed, rank_commit, rank_setup
from .rank_commit import Setup
from .rank_setup import Announced
from ..core import exit_hooks
from ..core.errors import CheckpointWriteError
from ..core.log import logger
from ..core.process_state import STATE

LIVENESS_S = 0.5  # how often a waiting rank asks whether the ranks it waits for are alive
# a rank that waits this long for a live one says so, then again every WAITING_AGAIN_S:
# never a silent wait (a rank that does not call make_checkpoint is waited for until it does)
WAITING_S, WAITING_AGAIN_S = 30.0, 300.0
# what a waiting rank reads of another (_seen)
ALIVE, DEAD, LEFT = "alive", "dead", "left"


class AsyncRanks:
    """One Checkpointer's side of the protocol (one per rank)."""

    def __init__(self, path: Path, rank: int, world_size: int, recording: bool = True,
                 asynchronous: bool = True) -> None:
        self.path, self.rank, self.world_size = path, rank, world_size
        self.asynchronous = asynchronous  # False: a synchronous rank meets the others (meet)
        self.recording = recording  # under `dvc exp run`: rank 0 records a row (for the log)
        self.directory = os.path.realpath(path)
        self.kv = distributed.KeyValue(f"dvc_dali/{self.directory}/")
        # how each rank checkpoints, said at its first checkpoint: a rank waited
        # for that never announced itself in this directory is told, by its
        # setup, from one not there yet (one checkpointing elsewhere, or
        # synchronously, would be waited for for ever)
        self.announced: Announced | None = None
        self.seq = 0
        self.timings: dict[str, float] = {}
        if not STATE.ranks_exit_hook_installed:
            STATE.ranks_exit_hook_installed = True
            atexit.register(exit_hooks.this_process_only(_say_exited))
        STATE.live_ranks.add(self)

    def close(self) -> None:
        """Say that this Checkpointer starts no more checkpoints (``<n>/closed/
        <rank>``: how many it started): a rank waiting for one it never starts
        is told it ended (rank_commit.left_message) instead of waiting."""
        if self.announced is not None:
            self.kv.set(f"{self.announced.number}/closed/{self.rank}", str(self.seq))

    def exited(self) -> str:
        """At this process's exit: closed, and the process gone
        (``exited/<rank>``, read for a Checkpointer of it that never checkpointed).
        A rank another waits for at a checkpoint this one never starts: what
        the others refuse, for this rank to say too ("" where none waits)."""
        self.close()
        self.kv.set(f"exited/{self.rank}", str(os.getpid()))
        number = self.announced.number if self.announced else rank_setup.next_number()
        seq = f"{number}.{self.seq + 1}"
        for r in range(self.world_size):
            found = self.kv.get_now(f"{seq}/at/{r}") or rank_commit.parse_durable(
                self.kv.get_now(f"{seq}/durable/{r}"))
            if found is not None:
                step = int(found) if isinstance(found, str) else found.step
                return rank_commit.left_message(step, [self.rank], self.world_size,
                                                str(self.path))
        return ""

    def _announce(self) -> None:
        """At the first checkpoint, on the training thread: in the order of every rank's."""
        if self.announced is not None:
            return
        number = rank_setup.next_number()
        # here, under this Checkpointer's number (the directory lock is held):
        # the lock of one that closed must not read as this rank ended
        self.kv.set(f"{number}/pid/{self.rank}", str(os.getpid()))
        self.announced = Announced(self.rank, Setup(self.directory, self.asynchronous),
                                   self.kv.sibling("dvc_dali/built/"), number)

    def meet(self, step: int) -> None:
        """A synchronous rank, before it writes its files of checkpoint
        ``step``: says it is there (``<n>.<seq>/at/<rank>``) and waits until
        every rank is (then the collectives that write it cannot wait for a
        rank that never comes), or refuses (rank_commit.meet) as soon as a
        rank it waits for ended, checkpoints elsewhere or asynchronously, or
        said another step. Through the store: no collective."""
        self._announce()
        self.seq += 1
        seq = f"{self.announced.number}.{self.seq}"
        self.kv.set(f"{seq}/at/{self.rank}", str(step))
        steps, waiting = {self.rank: step}, _Waiting()
        while True:
            decision = self._met(seq, steps)
            if decision.action == rank_commit.FAIL:
                raise CheckpointWriteError(decision.message)
            if decision.action != rank_commit.WAIT:
                return
            waiting.say(lambda s: rank_commit.waiting_at_message(
                step, self.rank, decision.waiting_for, self.world_size, s))
            self.kv.wait(f"{seq}/at/{decision.waiting_for[0]}", LIVENESS_S)

    def _met(self, seq: str, steps: dict[int, int]) -> rank_commit.Decision:
        """One look at who is at checkpoint ``seq`` (into ``steps``), and who lives."""
        self._read_steps(seq, steps)
        # the ended first, then their word: a rank that said it, then ended, is there
        seen = {r: self._seen(r) for r in range(self.world_size) if r not in steps}
        self._read_steps(seq, steps)
        dead = {r for r, (state, _) in seen.items() if state == DEAD}
        left = {r for r, (state, _) in seen.items() if state == LEFT}
        unlike = {r: s for r, (_, s) in seen.items() if s is not None and r not in steps}
        if unlike:
            unlike[self.rank] = self.announced.setup
        return rank_commit.meet(self.world_size, steps, dead, left, str(self.path), unlike)

    def _read_steps(self, seq: str, steps: dict[int, int]) -> None:
        for r in range(self.world_size):
            if r not in steps:
                found = self.kv.get_now(f"{seq}/at/{r}")
                if found is not None:
                    steps[r] = int(found)

    def job(self, captured: store.Capture, record: Callable[[int, str], None],
            recorded: Callable[[int], None] = lambda step: None) -> Callable[[], None]:
        """The background work for the next checkpoint: ``record(step, LATEST
        text)`` records the row (called on rank 0 only); ``recorded(step)``
        once rank 0 recorded it (called on the other ranks)."""
        self._announce()
        self.seq += 1
        seq = f"{self.announced.number}.{self.seq}"
        return lambda: self._run(seq, captured, record, recorded)

    def _run(self, seq: str, captured: store.Capture, record: Callable[[int, str], None],
             recorded: Callable[[int], None]) -> None:
        t0 = time.perf_counter()
        rank_dir = f"rank-{self.rank:05d}"
        name, sha = store.write_capture(self.path / rank_dir, captured,
                                        rank={"rank": self.rank, "world_size": self.world_size})
        self.timings["save_s"] = time.perf_counter() - t0
        logger.info("rank %d/%d saved step %d in %.1f ms (in the background)", self.rank,
                    self.world_size, captured.step, self.timings["save_s"] * 1000)
        mark = rank_commit.Durable(captured.step, f"{rank_dir}/{name}", sha)
        self.kv.set(f"{seq}/durable/{self.rank}", rank_commit.format_durable(mark))
        if self.rank == 0:
            self._commit(seq, mark, record)
        else:
            self._await_done(seq, captured.step)
            recorded(captured.step)

    def _seen(self, rank: int) -> tuple[str, Setup | None]:
        """(ALIVE, DEAD or LEFT, its setup where unlike this rank's), for
        this rank's checkpoint number ``self.seq``, from one read of its
        announcement here. Announced: it LEFT when it closed before starting
        that checkpoint, else it is DEAD once its lock is free. Not announced:
        it LEFT when its process exited (it never checkpointed here), else it
        has not started yet, or it checkpoints elsewhere or synchronously
        (its setup, said in the store)."""
        number = self.announced.number
        unlike = self.announced.unlike(rank)  # first: synchronous ranks say their pid too
        if unlike is not None:
            return ALIVE, unlike
        if self.kv.get_now(f"{number}/pid/{rank}") is not None:
            closed = self.kv.get_now(f"{number}/closed/{rank}")
            if closed is not None and int(closed) < self.seq:
                return LEFT, None
            return (DEAD if dirlock.holder(self.path, rank) is None else ALIVE), None
        if self.kv.get_now(f"exited/{rank}") is not None:
            return LEFT, None
        return ALIVE, None

    def _commit(self, seq: str, mark: rank_commit.Durable,
                record: Callable[[int, str], None]) -> None:
        t0, step = time.perf_counter(), mark.step
        decision = self._all_durable(seq, mark)
        self.timings["wait_ranks_s"] = time.perf_counter() - t0
        done = f"{seq}/done"
        if decision.action == rank_commit.FAIL:
            self.kv.set(done, "error " + decision.message)
            raise CheckpointWriteError(decision.message)
        t1 = time.perf_counter()
        try:
            store.publish(self.path, list(decision.entries))
            store.remove_leftovers(self.path, keep="")
            for entry, _ in decision.entries:  # what each rank's new snapshot superseded
                rank_dir, name = entry.split("/")
                store.remove_leftovers(self.path / rank_dir, keep=name)
            record(step, (self.path / store.LATEST).read_text(encoding="utf-8"))
        except BaseException as exc:
            self.kv.set(done, f"error step {step} was not recorded by rank 0: "
                              f"{type(exc).__name__}: {exc}")
            raise
        self.timings["record_s"] = time.perf_counter() - t1
        self.kv.set(done, "ok")
        logger.info("rank 0/%d committed step %d: every rank's files durable %.1f ms after its "
                    "own; LATEST written%s in %.1f ms", self.world_size, step,
                    self.timings["wait_ranks_s"] * 1000,
                    " and the row recorded" if self.recording else "",
                    self.timings["record_s"] * 1000)

    def _all_durable(self, seq: str, own: rank_commit.Durable) -> rank_commit.Decision:
        """Rank 0 (its own files durable: ``own``) waits until every rank's
        files of checkpoint ``seq`` are durable, or one rank ended before
        (rank_commit.decide)."""
        step, marks = own.step, {0: own}
        waiting = _Waiting()
        while True:
            self._read_marks(seq, marks)  # all there (the usual case): no liveness asked
            seen = {}
            if len(marks) < self.world_size:
                # the dead first, then their marks: a rank that marked, then died, counts
                seen = {r: self._seen(r) for r in range(self.world_size) if r not in marks}
                self._read_marks(seq, marks)
            dead = {r for r, (state, _) in seen.items() if state == DEAD}
            left = {r for r, (state, _) in seen.items() if state == LEFT}
            unlike = {r: s for r, (_, s) in seen.items() if s is not None and r not in marks}
            if unlike:  # directories named as each rank resolved its own
                unlike[0] = self.announced.setup
            decision = rank_commit.decide(step, self.world_size, marks, dead, str(self.path),
                                          unlike, left)
            if decision.action != rank_commit.WAIT:
                if decision.action == rank_commit.FAIL:
                    logger.error("%s", decision.message)
                return decision
            waiting.say(lambda s: rank_commit.waiting_for_files_message(
                step, decision.waiting_for, self.world_size, s))
            self.kv.wait(f"{seq}/durable/{decision.waiting_for[0]}", LIVENESS_S)

    def _read_marks(self, seq: str, marks: dict[int, rank_commit.Durable]) -> None:
        """Into ``marks``: the durable marks of checkpoint ``seq`` set since."""
        for r in range(self.world_size):
            if r not in marks:
                found = rank_commit.parse_durable(self.kv.get_now(f"{seq}/durable/{r}"))
                if found is not None:
                    marks[r] = found

    def _await_done(self, seq: str, step: int) -> None:
        """A rank other than 0: until rank 0 recorded (or gave up) checkpoint ``seq``."""
        t0 = time.perf_counter()
        done = f"{seq}/done"
        waiting = _Waiting()
        while not self.kv.wait(done, LIVENESS_S):
            waiting.say(lambda s: rank_commit.waiting_for_record_message(
                step, self.rank, self.world_size, s))
            state, theirs = self._seen(0)
            if theirs is not None:
                message = rank_commit.mismatch_message(
                    {0: theirs, self.rank: self.announced.setup}, step)
                logger.error("%s", message)
                raise CheckpointWriteError(message)
            if state == LEFT:
                message = rank_commit.left_message(step, [0], self.world_size, str(self.path))
                logger.error("%s", message)
                raise CheckpointWriteError(message)
            if state == DEAD:
                if self.kv.get_now(done) is not None:
                    break
                message = rank_commit.rank_gone_message(step, self.world_size, str(self.path))
                logger.error("%s", message)
                raise CheckpointWriteError(message)
        self.timings["wait_record_s"] = time.perf_counter() - t0
        answer = self.kv.get_now(done) or ""
        if answer != "ok":
            raise CheckpointWriteError(answer.removeprefix("error "))


class _Waiting:
    """When a wait for a live rank is said: at WAITING_S, then every WAITING_AGAIN_S."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.next = WAITING_S

    def say(self, message: Callable[[float], str]) -> None:
        waited = time.monotonic() - self.start
        if waited >= self.next:
            logger.warning("%s", message(waited))
            self.next = waited + WAITING_AGAIN_S


def _say_exited() -> None:
    """At exit (after the saves in flight finished): each AsyncRanks of this
    process says it ended, so no rank waits for ever for one that never
    checkpoints again. The store may be gone already (its host ended: rank
    0, where no launcher holds it), which torch says in C++ frames on stderr:
    silenced, as there is nobody left to tell."""
    said = []
    with _stderr_silenced():
        for ranks in list(STATE.live_ranks):
            try:
                said.append(ranks.exited())
            except Exception:  # noqa: BLE001 (nobody left to tell)
                pass
    for message in filter(None, said):
        logger.error("%s", message)


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """File descriptor 2 on /dev/null (at exit: the saves in flight are done)."""
    try:
        sys.stderr.flush()
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)

