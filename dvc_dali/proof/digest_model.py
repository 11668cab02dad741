"""The specification of ``mix64``, a batch digest a GPU kernel can compute in
one pass, as a NumPy model (a pure function): the value a kernel must give.

The digest of GPU batches (device_digest.py: its kernel computes ``body``
on the device, the host folds in ``header`` with :func:`finish`), named
``mix64`` in what is stored: digests of any other name (the host's
``crc32``, the device's earlier ``gwsum1``) are "not verified" against it,
never compared (batch_digests.check).

What it depends on, and nothing else: the dtype, the number of samples and
each one's shape, the bytes of each sample in C order and the order of the
samples. So a batch digests the same however it is laid out (one dense
array whose first axis is the batch, a list of samples of different shapes,
a single sample; contiguous or not), and any changed byte, two samples
swapped, another shape or another dtype change it.

The arithmetic, all modulo 2**64 on unsigned 64-bit integers, nothing read
from a table:

- ``mix(x)``: the splitmix64 finalizer (``x ^= x >> 30; x *= 0xBF58476D1CE4E5B9;
  x ^= x >> 27; x *= 0x94D049BB133111EB; x ^= x >> 31``), a bijection;
- each sample ``k`` (from 0) is cut into 8-byte words, little-endian, the
  last one padded with zero bytes (its length is in the header); word ``j``
  of it (from 0) with value ``w`` contributes
  ``term = mix(w ^ mix(k * 2**40 + j + GOLDEN))``;
- ``body`` is the sum of every term: a sum, so a kernel may add them in any
  order, in any grouping (per thread, per block, an atomic add), and every
  device gets the same value;
- ``header``: ``mix`` folded over the bytes of the text
  ``"<dtype>|<n samples>|<shape 0>;<shape 1>;..."`` (each shape its
  dimensions joined by ``x``, ``()`` for a scalar), 8 bytes a step as above:
  ``h = mix(h ^ word + GOLDEN)``, from ``h = len(text)``;
- the digest: ``mix(body ^ mix(header))``, written as 16 hex digits.

Limits: up to 2**24 samples of up to 2**40 words (8 TiB) each, where
``k * 2**40 + j`` stays below 2**64. Not a cryptographic hash: it tells
accidental changes (a byte, an order, a shape), not a forgery.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

NAME = "mix64"
GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_SAMPLE_SHIFT = 40
MAX_SAMPLES = 1 << (64 - _SAMPLE_SHIFT)


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 values (wrapping arithmetic)."""
    x = np.asarray(x, np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(_M1)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(_M2)
        return x ^ (x >> np.uint64(31))


def _words(data: bytes | np.ndarray) -> np.ndarray:
    """The bytes as little-endian 8-byte words, the last padded with zeros."""
    raw = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data
    pad = (-raw.size) % 8
    if pad:
        raw = np.concatenate([raw, np.zeros(pad, np.uint8)])
    return raw.view("<u8").astype(np.uint64)


def _samples(batch: Any) -> list[np.ndarray]:
    """A dense array (first axis: the batch) or a sequence of samples."""
    if isinstance(batch, (list, tuple)):
        return [np.asarray(s) for s in batch]
    array = np.asarray(batch)
    if array.ndim == 0:
        raise ValueError("a dense batch needs a first axis (the samples)")
    return list(array)


def header_text(dtype: np.dtype, shapes: Sequence[tuple[int, ...]]) -> str:
    def shape(s: tuple[int, ...]) -> str:
        return "x".join(str(d) for d in s) if s else "()"

    return f"{np.dtype(dtype).name}|{len(shapes)}|" + ";".join(shape(s) for s in shapes)


_MASK = (1 << 64) - 1


def mix_int(x: int) -> int:
    """:func:`mix` on one Python int (the host's share of a device digest:
    a few dozen of them a batch, where NumPy scalars cost more)."""
    x ^= x >> 30
    x = (x * _M1) & _MASK
    x ^= x >> 27
    x = (x * _M2) & _MASK
    return x ^ (x >> 31)


def header_of_text(text: str) -> int:
    """``mix`` folded over the header text's 8-byte words, from its length."""
    raw = text.encode()
    raw += b"\0" * (-len(raw) % 8)
    h = len(text.encode())
    for i in range(0, len(raw), 8):
        h = mix_int(((h ^ int.from_bytes(raw[i:i + 8], "little")) + GOLDEN) & _MASK)
    return h


def header(dtype: np.dtype, shapes: Sequence[tuple[int, ...]]) -> int:
    return header_of_text(header_text(dtype, shapes))


def finish(body_value: int, text: str) -> int:
    """The digest from the sum of the terms (``body``, computed elsewhere:
    on the device) and the header text."""
    return mix_int(body_value ^ mix_int(header_of_text(text)))


def body(samples: Sequence[np.ndarray]) -> int:
    """The sum of every word's term, each mixed with its sample and word index."""
    total = np.uint64(0)
    with np.errstate(over="ignore"):
        for k, sample in enumerate(samples):
            words = _words(np.ascontiguousarray(sample).reshape(-1).view(np.uint8))
            keys = (np.uint64(k) << np.uint64(_SAMPLE_SHIFT)) + np.arange(words.size,
                                                                          dtype=np.uint64)
            terms = mix(words ^ mix(keys + np.uint64(GOLDEN)))
            total = total + terms.sum(dtype=np.uint64)
    return int(total)


def digest(batch: Any) -> int:
    """The ``mix64`` digest of one output of a batch: a dense array whose
    first axis is the batch, or a list of samples (of one dtype)."""
    samples = _samples(batch)
    if len(samples) >= MAX_SAMPLES:
        raise ValueError(f"{len(samples)} samples: mix64 takes fewer than {MAX_SAMPLES}")
    dtypes = {s.dtype for s in samples}
    if len(dtypes) > 1:
        raise ValueError(f"samples of different dtypes {sorted(map(str, dtypes))}")
    dtype = dtypes.pop() if dtypes else np.dtype(np.uint8)
    head = mix(np.uint64(header(dtype, [s.shape for s in samples])))
    return int(mix(np.uint64(body(samples)) ^ head))


def hexdigest(batch: Any) -> str:
    return f"{digest(batch):016x}"
