"""DALI dynamic mode (``nvidia.dali.experimental.dynamic``): its own
``checkpoint.Checkpoint``, on which the script registers readers and RNGs,
saved as JSON text next to the pipelines' states."""

from __future__ import annotations

from typing import Any

from .errors import CheckpointCorruptError


def checkpoint(name: str, saved: str | None = None, where: str = "") -> Any:
    """A new dynamic-mode ``Checkpoint``; with ``saved`` (the text read from
    the snapshot at ``where``), each object registered on it gets its saved
    state back at registration."""
    from nvidia.dali.experimental.dynamic import checkpoint as dyn

    ckpt = dyn.Checkpoint()
    if saved is not None:
        try:
            ckpt.deserialize(saved)
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointCorruptError(
                f"{where}: dynamic-mode state {name!r} is not a DALI dynamic checkpoint "
                f"({exc}); start over with `dvc-dali reset`.") from None
    return ckpt


def serialize(ckpt: Any) -> str:
    """The registered objects' states now, as the text to save."""
    ckpt.collect()
    return ckpt.serialize()
