"""DALI's framework iterators (PyTorch ``DALIGenericIterator`` and
``DALIClassificationIterator``, JAX's ``DALIGenericIterator``).

They share one interface: ``it._pipes`` (the pipelines, in order) and
``it.checkpoints()`` (one state per pipeline). A pipeline under an iterator
is saved through it: ``pipe.checkpoint()`` would lose the iterator's epoch
counters.
"""

from __future__ import annotations

# This module is one of the doors to DALI (tests/unit/test_dali_boundary.py):
# reaching DALI objects' private attributes is the doors' job, no other module's.
# ruff: noqa: SLF001

from collections.abc import Iterable, Sequence
from typing import Any

from ..core.errors import ConfigError

# Set on a pipeline while `create` builds an iterator over it, and after.
_OWN = "_dvc_dali_own_iterator"


def refuse_other_iterators(pipe: Any, name: str) -> None:
    """A DALI iterator built over ``pipe`` other than by :func:`create`
    (``DALIGenericIterator(pipe, ...)`` as DALI's tutorials do) is refused
    at its construction: it keeps the epoch's counters (``last_batch_policy``,
    the epoch's end) that ``pipe.checkpoint()`` does not hold, so a resume
    would hand out other batches while the pipeline's own digests match.
    Every DALI iterator asks its pipelines for a state with its counters
    (``_get_checkpoint(iterator_data=...)``) when it is made."""
    original = pipe._get_checkpoint

    def _get_checkpoint(iterator_data: str = "") -> Any:
        if iterator_data and not getattr(pipe, _OWN, False):
            raise ConfigError(
                f"pipeline {name!r}: a DALI iterator was built over it directly; its epoch "
                "counters would not be saved, so a resume would hand out other batches. Build "
                f"it with ck.iterator(<the iterator class>, pipe, ...) instead.")
        return original(iterator_data)

    pipe._get_checkpoint = _get_checkpoint  # on this instance: DALI's class stays as it is


def create(iterator_class: Any, pipes: Sequence[Any], args: Sequence[Any],
           kwargs: dict[str, Any], resumed: bool) -> Any:
    """``iterator_class(pipes, *args, **kwargs)``, made safe to restore into,
    with ``prepare_first_batch=False`` whether ``resumed`` or not. With
    DALI's default (True), a checkpoint taken after an epoch's last batch
    restores into an iterator that skips that epoch's end; and in a fresh
    run an iterator first used after a checkpoint (a validation's) has
    pulled its first batch before it, so the batch digests after it were
    counted one batch ahead of those a resume pulls: an exact resume was
    refused as a mismatch. The batches are the same either way."""
    kwargs = {**kwargs, "prepare_first_batch": False}
    for pipe in pipes:
        setattr(pipe, _OWN, True)
    return iterator_class(list(pipes), *args, **kwargs)


def pipeline_states(iterators: Iterable[Any]) -> dict[int, bytes]:
    """id(pipeline) -> its state with the iterator's counters, for every
    pipeline under one of ``iterators``."""
    states: dict[int, bytes] = {}
    for it in iterators:
        for pipe, state in zip(it._pipes, it.checkpoints()):
            states[id(pipe)] = state
    return states
