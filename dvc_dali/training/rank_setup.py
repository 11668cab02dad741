"""Every rank says in torch.distributed's store how its n-th checkpointing
Checkpointer checkpoints (directory, asynchronous or not), so ranks that
could never commit one checkpoint together refuse at the first checkpoint
instead of waiting for ever: an asynchronous rank reads the others' while
it waits (async_ranks), a synchronous one reads them all at its first save.

The n counts this process's Checkpointers under torch.distributed in the
order of their first checkpoint, which every rank of a run makes in the
same order; a Checkpointer built to read only (on one rank, say) is not
counted.
"""

from __future__ import annotations

import itertools

from . import distributed, rank_commit
from ..core.errors import ConfigError
from .rank_commit import Setup

_BUILT = itertools.count(1)


def next_number() -> int:
    """The number of this process's next checkpointing Checkpointer."""
    return next(_BUILT)


class Announced:
    """This rank's announcement, and the others' as they read now."""

    def __init__(self, rank: int, setup: Setup, kv: distributed.KeyValue | None = None,
                 number: int | None = None) -> None:
        self.rank, self.setup = rank, setup
        self.kv = kv or distributed.KeyValue("dvc_dali/built/")
        self.number = next_number() if number is None else number
        self.kv.set(f"{rank}/{self.number}", rank_commit.format_setup(setup))

    def of(self, rank: int) -> Setup | None:
        """``rank``'s (None: its n-th Checkpointer has not checkpointed yet)."""
        return rank_commit.parse_setup(self.kv.get_now(f"{rank}/{self.number}"))

    def unlike(self, rank: int) -> Setup | None:
        """``rank``'s, where it differs from this rank's."""
        theirs = self.of(rank)
        return theirs if theirs not in (None, self.setup) else None

    def all(self, world_size: int) -> dict[int, Setup]:
        """Every rank's, waiting for each to be said (as a collective would)."""
        return {r: rank_commit.parse_setup(self.kv.get(f"{r}/{self.number}"))
                for r in range(world_size)}


def synchronous_setups(rank: int, world_size: int, setup: Setup) -> dict[int, Setup]:
    """Every rank's, for a synchronous rank's first save, this one's said
    first: through the store, where asynchronous ranks say theirs too; with
    a torch that gives no store (where no rank can be asynchronous) through
    a collective."""
    try:
        return Announced(rank, setup).all(world_size)
    except ConfigError:  # torch without distributed_c10d._get_default_store
        texts = distributed.all_gather(rank_commit.format_setup(setup))
        return {r: rank_commit.parse_setup(text) for r, text in enumerate(texts)}
