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


def create(iterator_class: Any, pipes: Sequence[Any], args: Sequence[Any],
           kwargs: dict[str, Any], resumed: bool) -> Any:
    """``iterator_class(pipes, *args, **kwargs)``, made safe to restore into."""
    if resumed:
        # With DALI's default prepare_first_batch=True, a checkpoint taken after
        # an epoch's last batch restores into an iterator that skips that
        # epoch's end.
        kwargs = {**kwargs, "prepare_first_batch": False}
    return iterator_class(list(pipes), *args, **kwargs)


def pipeline_states(iterators: Iterable[Any]) -> dict[int, bytes]:
    """id(pipeline) -> its state with the iterator's counters, for every
    pipeline under one of ``iterators``."""
    states: dict[int, bytes] = {}
    for it in iterators:
        for pipe, state in zip(it._pipes, it.checkpoints()):
            states[id(pipe)] = state
    return states
