"""Whether every torch.distributed rank restored the checkpoint, agreed
before any of them trains.

Each rank restores its own snapshot; one that refuses (a damaged file,
another rank's state, another pipeline) used to end alone while the others
trained on, into a collective that failed with a traceback. Now every rank
says in torch.distributed's own store whether it restored
(``dvc_dali/restored/<directory>/<restart>/<n>/<rank>``: ``n`` numbers this
process's agreeing Checkpointers, which every rank builds in the same
order; a Checkpointer that only reads, on one rank, never agrees and is not
counted), waits for every rank's word (an event of the store, for at most
the process group's timeout), and :func:`decide` says what all do: train,
or refuse with one line naming the ranks that refused and why. Once a
Checkpointer, at its resume point: no collective, nothing per checkpoint,
nothing at all on a fresh start.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from . import distributed
from ..core import errors

_AGREED = itertools.count(1)


@dataclass(frozen=True)
class Refusal:
    """Why one rank could not restore its snapshot."""

    kind: str  # the error's class name, e.g. "CheckpointCorruptError"
    step: Optional[int]  # the step it restores (None: LATEST does not say)
    entry: str  # its snapshot, "checkpoint/rank-00001/step-..." ("": unknown)
    reason: str  # its one-line message


@dataclass(frozen=True)
class Outcome:
    refused: bool
    kind: str = ""  # the error every rank raises: the lowest refusing rank's
    message: str = ""


def format_post(refusal: Optional[Refusal]) -> str:
    """What a rank says in the store: "ok", or its refusal (JSON)."""
    if refusal is None:
        return "ok"
    return json.dumps([refusal.kind, refusal.step, refusal.entry, refusal.reason])


def parse_post(text: str) -> Optional[Refusal]:
    if text == "ok":
        return None
    kind, step, entry, reason = json.loads(text)
    return Refusal(kind, step, entry, reason)


def snapshot_step(entry: str) -> Optional[int]:
    """The step in a snapshot's name ("rank-00001/step-000000006-1a2b3c4d": 6)."""
    found = re.search(r"step-(\d+)", entry)
    return int(found.group(1)) if found else None


def decide(world_size: int, posts: Mapping[int, Optional[Refusal]]) -> Outcome:
    """What every rank does with the restore, from every rank's word
    (``posts``: rank -> None where it restored, else its refusal): train
    when all restored; else every rank refuses with the same line. Where
    every rank refused alike (another world size: the same file, the same
    fix), that line is their own."""
    refusals = {r: posts[r] for r in sorted(posts) if posts[r] is not None}
    if not refusals:
        return Outcome(False)
    first = refusals[min(refusals)]
    if len(refusals) == world_size and len({(p.kind, p.reason)
                                            for p in refusals.values()}) == 1:
        return Outcome(True, first.kind, first.reason)
    said = "; ".join(f"rank {r} of {world_size} could not restore {_what(p)}: "
                     f"{p.reason.rstrip('.')}" for r, p in refusals.items())
    restored = [r for r in sorted(posts) if r not in refusals]
    others = (f"rank {restored[0]} restored its own, but " if len(restored) == 1 else
              f"ranks {', '.join(map(str, restored))} restored theirs, but " if restored
              else "")
    return Outcome(True, first.kind, (
        f"{said}. No rank trains and nothing is recorded ({others}the ranks resume one "
        "checkpoint together)"))


def _what(refusal: Refusal) -> str:
    if refusal.step is None:
        return f"the checkpoint{' ' + refusal.entry if refusal.entry else ''}"
    return f"step {refusal.step}{' from ' + refusal.entry if refusal.entry else ''}"


def silent_message(ranks: list[int], world_size: int, directory: str) -> str:
    """What is said when ``ranks`` said nothing of their restore within the
    process group's timeout (they ended, or hang before their resume point)."""
    which = ", ".join(map(str, ranks))
    return (f"{directory}: rank {which} of {world_size} said nothing of its restore within the "
            "process group's timeout (it ended, or never reached its first read of step or "
            "arrays); no rank trains and nothing is recorded. See that rank's output, then "
            "run again; every rank must build its Checkpointer and pipelines alike.")


def agree(directory: str, rank: int, world_size: int, mine: Optional[Refusal]) -> Outcome:
    """Say this rank's word in the store and wait for every rank's (the
    store's own blocking wait, for at most the process group's timeout).
    A torch whose store dvc-dali cannot reach: this rank's word alone."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restart's keys are new
    prefix = f"dvc_dali/restored/{os.path.realpath(directory)}/{restart}/{next(_AGREED)}/"
    try:
        kv = distributed.KeyValue(prefix)
    except distributed.ConfigError:  # torch without distributed_c10d._get_default_store
        return decide(1, {0: mine})
    kv.set(str(rank), format_post(mine))
    texts = kv.get_all([str(r) for r in range(world_size)], lambda missing: silent_message(
        [int(k) for k in missing], world_size, directory))
    return decide(world_size, {r: parse_post(t) for r, t in enumerate(texts)})


def error_class(kind: str) -> type[errors.DvcDaliError]:
    """The dvc-dali error named ``kind`` (a refusing rank's), raised on every rank."""
    found = getattr(errors, kind, None)
    if isinstance(found, type) and issubclass(found, errors.DvcDaliError):
        return found
    return errors.RankMismatchError
