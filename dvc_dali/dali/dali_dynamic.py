"""DALI dynamic mode (``nvidia.dali.experimental.dynamic``): its own
``checkpoint.Checkpoint``, on which the script registers readers and RNGs,
saved as JSON text next to the pipelines' states; and the readers' batches,
seen as they are yielded and brought to the host for their digests
(batch_digests.py)."""

from __future__ import annotations

from typing import Any, Callable, Iterator

from ..core.errors import CheckpointCorruptError, ConfigError
from ..core.log import logger

_OBSERVED = "_dvc_dali_observed"  # marks a reader's next_epoch already wrapped
DEFAULT_RNG = "dvc_dali.default_rng"  # the key of the thread's default RNG


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


def serialize(ckpt: Any, name: str) -> str:
    """The registered objects' states now, as the text to save."""
    # nothing registered, nothing resumed: DALI's own refusal is a traceback at
    # serialize() (a resumed state's entries are named by collect() below)
    if not ckpt._ops and not ckpt._states:  # noqa: SLF001
        raise ConfigError(f"dynamic-mode checkpoint {name!r}: nothing is registered on it, so "
                          "no reader's position would be saved. Register each reader and RNG "
                          "on ck.dynamic() (register(reader, \"reader\")) before the first "
                          "checkpoint.")
    try:
        ckpt.collect()
    except RuntimeError as exc:  # e.g. a resumed state nothing was registered for
        advice = (" Register each reader and RNG under the name it was saved with, right "
                  "after ck.dynamic() and before the loop, as the run that saved it did (its "
                  "batches are not those of a resume otherwise)."
                  if "no corresponding registered ops" in str(exc) else "")
        raise _refusal(name, exc, "", advice) from None
    return ckpt.serialize()


def _refusal(name: str, exc: Exception, held: str, advice: str) -> ConfigError:
    """DALI's refusal of a registration or a collection, in one line: its
    own words (a KeyError's without their quotes), what the checkpoint holds
    and what to do."""
    said = str(exc).strip('"').rstrip(".")
    return ConfigError(f"dynamic-mode checkpoint {name!r}: {said}{held}.{advice}")


def take_default_rng(ckpt: Any, name: str) -> None:
    """Register this thread's default RNG (what random operators without
    ``rng=`` draw from; ``ndd.random.set_seed`` seeds it) as
    :data:`DEFAULT_RNG`, which gives it its saved state back: unregistered, a
    resume drew the seed's numbers again. Not when the script registered it
    itself; a resumed state saved without it (by an earlier dvc-dali, or
    with ``rng=False``) cannot take it (DALI refuses a name a loaded state
    lacks), and the resume says its random numbers are not the run's."""
    from nvidia.dali.experimental.dynamic import random as dyn_random

    rng = dyn_random.get_default_rng()
    if id(rng) in ckpt._reverse:  # noqa: SLF001 - registered already, under any name
        return
    if ckpt.is_loaded and DEFAULT_RNG not in ckpt._states:  # noqa: SLF001
        logger.warning(
            "dynamic-mode checkpoint %r holds no state of the default RNG (saved by an earlier "
            "dvc-dali, or with rng=False): random operators without rng= draw from the seed "
            "again, so their numbers after this resume are not those of the run it resumes "
            "(the batch digests compare the readers' batches only). For an exact run start "
            "over with `dvc-dali reset`, or give each random operator an rng= registered on "
            "ck.dynamic().", name)
        return
    ckpt.register(rng, DEFAULT_RNG)


def on_readers(ckpt: Any, hook: Callable[[str, Any], None], name: str) -> None:
    """``hook(key, reader)`` after each reader registered on ``ckpt`` from
    now on, under the key ``register`` returns. RNGs are registered on it
    too; they yield no batches (what has ``next_epoch`` is a reader).
    DALI's refusals (a name the resumed state lacks, an object registered
    under a second name) are ConfigErrors naming the saved names."""
    register = ckpt.register

    def registering(op: Any, key: str | None = None) -> str:
        if ckpt._reverse.get(id(op)) == DEFAULT_RNG:  # noqa: SLF001 - taken already
            return DEFAULT_RNG
        if key is not None and ckpt._ops.get(key, op) is not op:  # noqa: SLF001
            # DALI replaces the first silently: its position is not saved, and
            # a resume gives the saved state to whichever registers first
            raise ConfigError(
                f"dynamic-mode checkpoint {name!r}: {key!r} is registered already, with "
                f"another {_kind(ckpt._ops[key])}; a second one under that name would "  # noqa: SLF001
                "replace it, and its position would not be saved. Register each reader and RNG "
                "under a name of its own.")
        try:
            key = register(op, key)
        except (KeyError, RuntimeError) as exc:
            saved = sorted(ckpt._states) if ckpt.is_loaded else []  # noqa: SLF001
            raise _refusal(name, exc, f" (the checkpoint holds {saved})" if saved else "",
                           " Register each reader and RNG once, under the name it was saved "
                           "with.") from None
        if callable(getattr(op, "next_epoch", None)):
            hook(key, op)
        return key

    ckpt.register = registering  # on this instance: DALI's class stays as it is


def _kind(op: Any) -> str:
    return "reader" if callable(getattr(op, "next_epoch", None)) else type(op).__name__


def observe_batches(reader: Any, observe: Callable[[Any], None]) -> None:
    """``observe(batch)`` for each batch (a tuple or dict of ``Batch``; a
    tuple of ``Tensor`` when iterating samples) ``reader.next_epoch`` yields,
    before the caller gets it: a resume refuses a differing batch before the
    step trains on it."""
    next_epoch = reader.next_epoch
    if getattr(next_epoch, _OBSERVED, False):
        return  # the same reader registered again: its batches are seen once

    def observed(*args: Any, **kwargs: Any) -> Iterator[Any]:
        # DALI's own call now, so its argument errors come where they did
        return _each(next_epoch(*args, **kwargs), observe)

    setattr(observed, _OBSERVED, True)
    reader.next_epoch = observed


def _each(batches: Any, observe: Callable[[Any], None]) -> Iterator[Any]:
    try:
        for batch in batches:
            observe(batch)
            yield batch
    finally:
        # a loop that breaks closes DALI's generator now, as it would unwrapped
        close = getattr(batches, "close", None)
        if close is not None:
            close()


def digest_outputs(batch: Any) -> list[Any]:
    """One yielded batch as batch_digests.digest_dynamic takes it: per
    output (a dict's in its order) a GPU one as its TensorListGPU (digested
    on the device, nothing copied; a sample, ``Tensor``, as a batch of one),
    a CPU one as the list of its samples' arrays (:func:`host_outputs`)."""
    from nvidia.dali import backend

    out: list[Any] = []
    for value in _values(batch):
        # the evaluated batch's TensorListGPU: DALI's own object, no copy
        storage = (value.evaluate()._storage  # noqa: SLF001
                   if value.device.device_type == "gpu" else None)
        if isinstance(storage, backend.TensorGPU):
            storage = backend.TensorListGPU([storage], contiguous=False)
        out.append(storage if storage is not None else host_outputs([value])[0])
    return out


def _values(batch: Any) -> list[Any]:
    if isinstance(batch, dict):
        return list(batch.values())
    if isinstance(batch, (tuple, list)):
        return list(batch)
    return [batch]


def host_outputs(batch: Any) -> list[list[Any]]:
    """One yielded batch as host arrays: per output (a dict's in its order)
    the list of its samples, the form batch_digests.digest_arrays takes for
    ragged samples (a reader's encoded files differ in length, and
    ``as_tensor`` refuses those); a sample (``Tensor``) as a batch of one.
    A GPU output is copied to the host; a CPU one is viewed, not copied."""
    import numpy as np

    out = []
    for value in _values(batch):
        host = value.cpu()  # itself when on the CPU
        samples = host.tensors if hasattr(host, "tensors") else [host]
        out.append([np.asarray(sample) for sample in samples])
    return out
