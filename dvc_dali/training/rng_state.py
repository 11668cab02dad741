"""The global random generators a Python training loop draws from, as arrays.

Saved with every checkpoint (unless turned off: ``Checkpointer(rng=False)``
or ``DVC_DALI_RNG=0``): a Restorable (restorable.RandomGenerators) whose
restore only reads and checks the saved state (:func:`check`, at the
Checkpointer's construction), which is set (:meth:`Staged.apply`) at the
loop's resume point, its first read of the checkpoint (``ck.step``,
``ck.arrays``, ``ck.live()``), so its next draw is the one the
uninterrupted run made:

- Python's ``random``: the Mersenne Twister's 625 words (624 and the
  position) and ``gauss_next``;
- NumPy's legacy global generator (``np.random.seed``/``np.random.rand``);
- torch's CPU generator (dropout, ``torch.rand``) and, where CUDA is
  initialised, every CUDA device's;
- Keras's global ``SeedGenerator`` (``keras.random.normal(shape)`` without
  ``seed=``, the Dropout of a layer given no seed), where Keras made it.

Nothing is pickled: the states are one byte array (one file) and plain
numbers, in the checkpoint's arrays under the reserved name :data:`KEY`
(user array names starting with ``~dvc_dali`` are refused; the ``~`` sorts
it after the user's arrays, whose files keep their numbers). A framework is
only touched when it is already imported (``sys.modules``), never imported
for this.
Not saved: generators the user creates (``np.random.default_rng``,
``torch.Generator``, a ``jax.random`` key: the user's arrays; a Keras
layer's own ``SeedGenerator`` is a model variable), CuPy's global generator
(cuRAND does not expose its position), and TensorFlow's stateful
``tf.random.*`` ops without a ``tf.random.Generator`` (their kernels keep
their position).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import numpy as np

from ..core.errors import ArgumentError, CheckpointCorruptError
from ..core.log import logger

#: The checkpoint array holding the generators' states.
KEY = "~dvc_dali.rng"
RESERVED = "~dvc_dali"
_MT_WORDS = 625  # random.getstate()[1]: 624 words and the position
_NP_WORDS = 624


def check_names(arrays: dict[str, Any]) -> None:
    """Refuse user arrays in dvc-dali's own namespace."""
    taken = sorted(n for n in arrays if isinstance(n, str) and n.startswith(RESERVED))
    if taken:
        raise ArgumentError(f"arrays: names starting with {RESERVED!r} are dvc-dali's own "
                            f"({KEY!r} holds the random generators' states); rename {taken}")


def _torch_cuda(torch: Any) -> list[np.ndarray] | None:
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available() or not cuda.is_initialized():
        return None
    return [state.cpu().numpy() for state in cuda.get_rng_state_all()]


def _words(values: Any) -> np.ndarray:
    return np.asarray(values, dtype="<u4")


def capture() -> dict[str, Any]:
    """The states of the global generators of the frameworks loaded now: one
    byte array (one file in the checkpoint) and the numbers that go with it."""
    version, words, gauss_next = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    parts: list[tuple[str, np.ndarray]] = [("python", _words(words)),
                                           ("numpy", _words(numpy_state["state"]["key"]))]
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_rng_state"):
        parts.append(("torch", torch.get_rng_state().numpy()))
        for i, state in enumerate(_torch_cuda(torch) or ()):
            parts.append((f"torch_cuda{i}", state))
    keras = _keras_generator(make=False)
    if keras is not None:
        parts.append(("keras", np.ascontiguousarray(np.asarray(keras.state)).view(np.uint8)))
    return {
        "blob": np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                                for _, a in parts]),
        "parts": [[name, a.dtype.str, int(a.size)] for name, a in parts],
        "python": {"version": version, "gauss_next": gauss_next},
        "numpy": {"bit_generator": numpy_state["bit_generator"],
                  "pos": int(numpy_state["state"]["pos"]),
                  "has_gauss": int(numpy_state["has_gauss"]),
                  "gauss": float(numpy_state["gauss"])}}


def _keras_generator(make: bool) -> Any:
    """Keras's global SeedGenerator (what its random ops without ``seed=``
    draw from), where Keras is imported: the one it made (``make``: made
    now if it made none, as Keras's first such draw would); else None."""
    seeds = sys.modules.get("keras.src.random.seed_generator")
    state = sys.modules.get("keras.src.backend.common.global_state")
    if seeds is None or state is None or not hasattr(seeds, "GLOBAL_SEED_GENERATOR"):
        return None
    if make:
        return seeds.global_seed_generator()
    return state.get_global_attribute(seeds.GLOBAL_SEED_GENERATOR)


def _restore_keras(saved: np.ndarray, where: str) -> None:
    """Keras's global SeedGenerator set to its saved state (made first where
    the resumed process has not drawn from it yet)."""
    generator = _keras_generator(make=True)
    if generator is None:
        logger.debug("%s: Keras is not imported; its generator state is not restored", where)
        return
    now = np.asarray(generator.state)
    if saved.size != now.nbytes:
        raise _bad(where, "keras", f"holds {saved.size} bytes, Keras's generator {now.nbytes}")
    generator.state.assign(saved.view(now.dtype).reshape(now.shape))


def _bad(where: str, field: str, what: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(f"{where}: {KEY}.{field} {what}; start over with `dvc-dali "
                                  "reset`, or resume with Checkpointer(rng=False) / "
                                  "DVC_DALI_RNG=0")


def _split(saved: dict[str, Any], where: str) -> dict[str, np.ndarray]:
    """The blob cut into its named parts, each checked."""
    blob, parts = saved.get("blob"), saved.get("parts")
    if not (isinstance(blob, np.ndarray) and blob.dtype == np.uint8 and blob.ndim == 1):
        raise _bad(where, "blob", "is not a uint8 array")
    if not isinstance(parts, list):
        raise _bad(where, "parts", "is not a list")
    out, offset = {}, 0
    for i, part in enumerate(parts):
        if not (isinstance(part, list) and len(part) == 3 and isinstance(part[0], str)
                and part[1] in ("<u4", "|u1") and type(part[2]) is int and part[2] >= 0):
            raise _bad(where, f"parts[{i}]", "is not [name, '<u4' or '|u1', count]")
        name, dtype, count = part
        size = count * np.dtype(dtype).itemsize
        if offset + size > blob.size:
            raise _bad(where, f"parts[{i}]", f"runs past the blob's {blob.size} bytes")
        out[name] = blob[offset:offset + size].view(dtype).copy()
        offset += size
    if offset != blob.size:
        raise _bad(where, "parts", f"cover {offset} of the blob's {blob.size} bytes")
    return out


def _number(value: Any, kind: type, field: str, where: str) -> Any:
    if type(value) is not kind and not (kind is float and type(value) is int):
        raise _bad(where, field, f"is {str(value)[:40]!r}, expected a {kind.__name__}")
    return value


def _words_of(parts: dict[str, np.ndarray], name: str, count: int, where: str) -> np.ndarray:
    words = parts.get(name)
    if words is None or words.dtype != np.dtype("<u4") or words.size != count:
        raise _bad(where, "parts", f"hold no {count} uint32 words for {name!r}")
    return words


def _python_state(saved: dict[str, Any], words: np.ndarray, where: str) -> tuple:
    """Python's ``random`` state, checked on a generator of its own (the
    global one is not touched)."""
    info = saved.get("python")
    if not isinstance(info, dict):
        raise _bad(where, "python", "is not a mapping")
    gauss = info.get("gauss_next")
    if gauss is not None:
        _number(gauss, float, "python.gauss_next", where)
    version = _number(info.get("version"), int, "python.version", where)
    state = (version, tuple(int(w) for w in words), gauss)
    try:
        random.Random().setstate(state)
    except (ValueError, TypeError) as exc:
        raise _bad(where, "python", f"is not a state of Python's random ({exc})") from None
    return state


def _numpy_state(saved: dict[str, Any], key: np.ndarray, where: str) -> dict[str, Any]:
    """NumPy's legacy global generator's state, checked on a RandomState of
    its own (the global one is not touched)."""
    info = saved.get("numpy")
    if not isinstance(info, dict):
        raise _bad(where, "numpy", "is not a mapping")
    state = {"bit_generator": info.get("bit_generator"),
             "state": {"key": key.astype(np.uint32),
                       "pos": _number(info.get("pos"), int, "numpy.pos", where)},
             "has_gauss": _number(info.get("has_gauss"), int, "numpy.has_gauss", where),
             "gauss": _number(info.get("gauss"), float, "numpy.gauss", where)}
    try:
        np.random.RandomState().set_state(state)
    except (ValueError, TypeError, KeyError) as exc:
        raise _bad(where, "numpy", f"is not a state of NumPy's global generator ({exc})"
                   ) from None
    return state


def _restore_torch(parts: dict[str, np.ndarray], where: str) -> None:
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "set_rng_state"):
        logger.debug("%s: torch is not imported; its saved generator state is not restored",
                     where)
        return
    _set_torch_cpu(torch, torch.set_rng_state, parts, where)
    cuda = [parts[f"torch_cuda{i}"].astype(np.uint8) for i in range(len(parts))
            if f"torch_cuda{i}" in parts]
    if not cuda:
        return
    if not torch.cuda.is_available() or torch.cuda.device_count() != len(cuda):
        logger.warning("%s: the run saved %d CUDA generator state(s), this process sees %s "
                       "CUDA device(s): CUDA random draws (dropout on the GPU) will differ "
                       "from the uninterrupted run's", where, len(cuda),
                       torch.cuda.device_count() if torch.cuda.is_available() else "no")
        return
    torch.cuda.set_rng_state_all([torch.from_numpy(state) for state in cuda])


def _set_torch_cpu(torch: Any, set_state: Any, parts: dict[str, np.ndarray], where: str
                   ) -> None:
    """``set_state`` (torch's global setter, or a Generator's of its own)
    given the saved CPU state; one torch refuses is refused naming it."""
    try:
        set_state(torch.from_numpy(parts["torch"].astype(np.uint8)))
    except RuntimeError as exc:
        raise _bad(where, "torch", f"is not a state of torch's CPU generator ({exc})") from None


class Staged:
    """A saved state, read and checked (:func:`check`), not yet set: :meth:`apply` sets it."""

    def __init__(self, python: tuple, numpy: dict[str, Any], parts: dict[str, np.ndarray],
                 where: str) -> None:
        self.python, self.numpy, self.parts, self.where = python, numpy, parts, where

    def apply(self) -> None:
        """Set the global generators to it (torch's where torch is imported
        now; its state is checked as it is set)."""
        random.setstate(self.python)
        np.random.set_state(self.numpy)
        if "torch" in self.parts:
            _restore_torch(self.parts, self.where)
        if "keras" in self.parts:
            _restore_keras(self.parts["keras"], self.where)


def check(saved: Any, where: str) -> Staged:
    """``saved`` (what :func:`capture` returned, read back) read and checked,
    touching no generator: a damaged state is refused naming its field.
    ``where`` (the manifest) starts every error message."""
    if not isinstance(saved, dict):
        raise _bad(where, "", "is not a mapping of generator states")
    parts = _split(saved, where)
    torch = sys.modules.get("torch")
    if "torch" in parts and torch is not None and hasattr(torch, "Generator"):
        # on a generator of its own; where torch is imported later, as it is set
        _set_torch_cpu(torch, torch.Generator().set_state, parts, where)
    return Staged(_python_state(saved, _words_of(parts, "python", _MT_WORDS, where), where),
                  _numpy_state(saved, _words_of(parts, "numpy", _NP_WORDS, where), where),
                  parts, where)

