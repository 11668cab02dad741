"""The commit decision of an asynchronous checkpoint across torch.distributed
ranks (pure: no I/O, imports nothing of dvc-dali).

Each rank writes its snapshot of a checkpoint in the background and, once
its files are durable (fsynced, renamed, the directory fsynced), says so
(a `Durable` mark, through torch.distributed's store). Rank 0 asks
:func:`decide` with the marks it has and the ranks it knows dead: record
the checkpoint only when every rank's files of that one step are durable,
wait while a live rank is still writing, fail when a rank died before its
files were durable or the ranks disagree on the step. A row, LATEST and
`dvc exp show` therefore only ever hold every rank's state at one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

WAIT = "wait"
RECORD = "record"
FAIL = "fail"


@dataclass(frozen=True)
class Durable:
    """One rank's files of one checkpoint, durable on disk."""

    step: int
    entry: str  # its snapshot in the checkpoint directory, "rank-NNNNN/step-..."
    sha: str  # its manifest's md5, as LATEST names it


@dataclass(frozen=True)
class Decision:
    action: str  # WAIT, RECORD or FAIL
    entries: tuple[tuple[str, str], ...] = ()  # RECORD: LATEST's lines, in rank order
    message: str = ""  # FAIL: what happened and what to do
    waiting_for: tuple[int, ...] = ()  # WAIT: the ranks not durable yet


def decide(step: int, world_size: int, durable: Mapping[int, Durable],
           dead: frozenset[int] | set[int] = frozenset(), checkpoint: str = "checkpoint",
           unlike: Mapping[int, Setup] | None = None,
           left: frozenset[int] | set[int] = frozenset()) -> Decision:
    """What rank 0 does with checkpoint ``step`` (its own step) now.

    Args:
        step: the step rank 0 checkpointed.
        world_size: the number of ranks.
        durable: the marks received so far, by rank.
        dead: ranks known to have ended (their process is gone); a dead
            rank whose files are durable still counts: its state is whole.
        checkpoint: the checkpoint directory, for the messages.
        unlike: ranks known to checkpoint unlike rank 0 (into another
            directory, or synchronously), with rank 0's own Setup: their
            marks can never come.
        left: ranks that ended normally (their Checkpointer closed, or
            their process exited) without starting this checkpoint: their
            marks can never come either.
    """
    message = mismatch_message(unlike or {}, step)
    if message:
        return Decision(FAIL, message=message)
    message = different_steps(checkpoint, {r: m.step for r, m in durable.items()}, step)
    if message:
        return Decision(FAIL, message=message)
    missing = [r for r in range(world_size) if r not in durable]
    if not missing:
        return Decision(RECORD, entries=tuple((durable[r].entry, durable[r].sha)
                                              for r in range(world_size)))
    return _missing(missing, dead, left, step, world_size, checkpoint,
                    f"before its files of step {step} were durable")


def meet(world_size: int, steps: Mapping[int, int], dead: frozenset[int] | set[int] = frozenset(),
         left: frozenset[int] | set[int] = frozenset(), checkpoint: str = "checkpoint",
         unlike: Mapping[int, Setup] | None = None) -> Decision:
    """What a synchronous rank does before it writes its files of a checkpoint,
    from the steps every rank said it checkpoints there (``steps``, by rank,
    this rank's among them): go on (RECORD) once all said the same step, wait
    for a live rank, fail once a missing rank ended (``dead``: killed;
    ``left``: it ended normally) or checkpoints unlike the others
    (``unlike``, with this rank's own Setup). Every rank then fails alike
    instead of waiting in a collective until the process group's timeout."""
    message = mismatch_message(unlike or {}, min(steps.values()))
    if message:
        return Decision(FAIL, message=message)
    missing = [r for r in range(world_size) if r not in steps]
    if not missing:
        return Decision(FAIL, message=different_steps(checkpoint, dict(steps), steps[0])
                        ) if len(set(steps.values())) > 1 else Decision(RECORD)
    step = steps[min(steps)]
    return _missing(missing, dead, left, step, world_size, checkpoint,
                    f"before it checkpointed step {step}")


def _missing(missing: list[int], dead: frozenset[int] | set[int], left: frozenset[int] | set[int],
             step: int, world_size: int, checkpoint: str, before: str) -> Decision:
    """Fail where a rank that ``missing`` names ended (killed: ``dead``; or
    normally: ``left``), else wait for them."""
    gone = [r for r in missing if r in dead and r not in left]
    if gone:
        return Decision(FAIL, message=(
            f"{checkpoint}: rank {', '.join(map(str, gone))} of {world_size} ended {before}; "
            f"step {step} is not recorded (no row holds part of it) and LATEST still names the "
            "last complete checkpoint. See why that rank ended (its output above), then run "
            "again to resume from the last complete checkpoint."))
    ended = [r for r in missing if r in left]
    if ended:
        return Decision(FAIL, message=left_message(step, ended, world_size, checkpoint))
    return Decision(WAIT, waiting_for=tuple(missing))


def left_message(step: int, ranks: list[int], world_size: int,
                 checkpoint: str = "checkpoint") -> str:
    """What is said when ``ranks`` ended normally without checkpointing ``step``."""
    which = ", ".join(map(str, ranks))
    return (f"{checkpoint}: rank {which} of {world_size} ended (its Checkpointer closed or its "
            f"process exited) without calling make_checkpoint() for step {step}; step {step} "
            "is not recorded (no row holds part of it) and LATEST still names the last "
            "complete checkpoint. Every rank must checkpoint at the same steps: a rank whose "
            "loop ends first (uneven data, another number of steps) ends the run this way.")


def rank_gone_message(step: int, world_size: int, checkpoint: str = "checkpoint") -> str:
    """What a rank other than 0 says when rank 0 ended before recording ``step``."""
    return (f"{checkpoint}: rank 0 of {world_size} ended before it recorded step {step} "
            f"(rank 0 records every rank's checkpoint), so no row holds step {step}: under "
            "`dvc exp run` the next run resumes every rank from the last recorded row, whose "
            f"checkpoint DVC checks out first (LATEST may name step {step} now: its files are "
            "whole but unrecorded). See why rank 0 ended (its output above), then run again.")


def waiting_for_files_message(step: int, ranks: tuple[int, ...], world_size: int,
                              waited: float) -> str:
    """What rank 0 says while it waits long for live ranks' files."""
    which = ", ".join(map(str, ranks))
    return (f"rank 0 of {world_size} has waited {waited:.0f} s for the files of step {step} "
            f"from rank {which}, alive: a rank writing a large state is still being waited "
            "for; one that does not call make_checkpoint at this step (saving on rank 0 "
            "only) is waited for until it does. Call make_checkpoint() at the same step on "
            "every rank.")


def waiting_at_message(step: int, rank: int, ranks: tuple[int, ...], world_size: int,
                       waited: float) -> str:
    """What a synchronous rank says while it waits long for live ranks to
    reach checkpoint ``step``."""
    return (f"rank {rank} of {world_size} has waited {waited:.0f} s for rank "
            f"{', '.join(map(str, ranks))}, alive, to reach the checkpoint of step {step}: "
            "one that does not call make_checkpoint at this step (saving on one rank only) "
            "is waited for until it does, or ends. Call make_checkpoint() at the same step on "
            "every rank.")


def waiting_for_record_message(step: int, rank: int, world_size: int, waited: float) -> str:
    """What a rank other than 0 says while it waits long for the record."""
    return (f"rank {rank} of {world_size} has waited {waited:.0f} s for rank 0 to record step "
            f"{step} (rank 0 is alive: it records once every rank's files are durable, and "
            "a large output takes DVC long to hash); every rank must call make_checkpoint() "
            "at the same step.")


@dataclass(frozen=True)
class Setup:
    """How one rank's Checkpointer checkpoints, as each rank says it in the
    store at its first checkpoint (rank_setup)."""

    directory: str  # resolved (os.path.realpath)
    asynchronous: bool


def format_setup(setup: Setup) -> str:
    return f"{'async' if setup.asynchronous else 'sync'} {setup.directory}"


def parse_setup(text: Optional[str]) -> Optional[Setup]:
    """A Setup as the store holds it (None: not announced)."""
    if not text:
        return None
    mode, directory = text.split(" ", 1)
    return Setup(directory, mode == "async")


def mismatch_message(setups: Mapping[int, Setup], step: int) -> str:
    """Why ranks that checkpoint as ``setups`` say (by rank, some of them) can
    never commit one checkpoint together, or "" when they can."""
    if len({s.directory for s in setups.values()}) > 1:
        return other_directories_message({r: s.directory for r, s in setups.items()}, step)
    if len({s.asynchronous for s in setups.values()}) > 1:
        return mixed_modes_message({r: s.asynchronous for r, s in setups.items()}, step)
    return ""


def mixed_modes_message(asynchronous: Mapping[int, bool], step: int) -> str:
    """What every rank says when some ranks checkpoint asynchronously and
    others synchronously (``asynchronous``: by rank)."""
    found = "; ".join(f"{ranks} {'asynchronously' if mode else 'synchronously'}"
                      for mode, ranks in _ranks_by(asynchronous).items())
    return (f"the ranks checkpoint in different modes ({found}); step {step} is not "
            "recorded. Every rank of a run must build its Checkpointer with the same "
            "asynchronous= (or, leaving it out, the same DVC_DALI_ASYNC): an asynchronous "
            "rank waits in the background for the others' files, a synchronous one for "
            "them all in a collective, and neither would ever come.")


def other_directories_message(directories: Mapping[int, str], step: int) -> str:
    """What every rank says when the ranks' checkpoint directories differ
    (``directories``: by rank, as each resolved its own; some may agree)."""
    found = "; ".join(f"{ranks} into {d}" for d, ranks in _ranks_by(directories).items())
    return (f"the ranks checkpoint into different directories ({found}); step {step} is not "
            "recorded. Every rank of a run must pass the same checkpoint directory to "
            "Checkpointer: each writes its own rank-NNNNN/ under it, and rank 0 names them "
            "all in LATEST, so a resume finds every rank's state.")


def _ranks_by(values: Mapping[int, Any]) -> dict[Any, str]:
    """Each value, the ranks that have it ("rank 1", "ranks 0, 2"), in the
    order of their lowest rank."""
    by_value: dict[Any, list[int]] = {}
    for rank in sorted(values):
        by_value.setdefault(values[rank], []).append(rank)
    return {value: f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}"
            for value, r in by_value.items()}


def parse_durable(text: Optional[str]) -> Optional[Durable]:
    """A mark as the store holds it, "<step> <entry> <sha>" (None: not there)."""
    if not text:
        return None
    step, entry, sha = text.split()
    return Durable(int(step), entry, sha)


def format_durable(mark: Durable) -> str:
    return f"{mark.step} {mark.entry} {mark.sha}"


def different_steps(checkpoint: str, steps: dict[int, int], step: int) -> str:
    """Why a checkpoint of rank 0's ``step`` is refused where other ranks
    (``steps``: rank -> its step) checkpointed other steps; "" where all
    agree. A row holds every rank's state at one step."""
    other = sorted((r, s) for r, s in steps.items() if s != step)
    if not other:
        return ""
    found = ", ".join(f"rank {r} step {s}" for r, s in other)
    return (f"{checkpoint}: the ranks checkpointed different steps (rank 0 step {step}, "
            f"{found}); nothing was recorded for step {step}. Call make_checkpoint() at the "
            "same step on every rank (Checkpointer.should_save answers the same on all).")
