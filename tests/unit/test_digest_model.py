"""The mix64 batch digest's NumPy model (dvc_dali/proof/digest_model.py), the
specification a GPU kernel follows: the same bytes digest the same however
the batch is laid out, and any changed byte, swapped sample, changed shape or
dtype changes it. Checked against a plain-Python reading of its docstring."""

from __future__ import annotations

import numpy as np
import pytest

from dvc_dali.proof import digest_model as dm

MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _words(raw: bytes) -> list[int]:
    raw += b"\0" * ((-len(raw)) % 8)
    return [int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)]


def reference(samples: list[np.ndarray]) -> int:
    """The docstring's arithmetic, in Python integers, one word at a time."""
    def shape(s):
        return "x".join(map(str, s)) if s else "()"

    text = (f"{samples[0].dtype.name}|{len(samples)}|"
            + ";".join(shape(s.shape) for s in samples)).encode()
    h = len(text)
    for w in _words(text):
        h = _mix(((h ^ w) + dm.GOLDEN) & MASK)
    body = 0
    for k, s in enumerate(samples):
        for j, w in enumerate(_words(np.ascontiguousarray(s).tobytes())):
            body = (body + _mix(w ^ _mix(((k << 40) + j + dm.GOLDEN) & MASK))) & MASK
    return _mix(body ^ _mix(h))


RNG = np.random.default_rng(38)
DENSE = RNG.integers(0, 256, (4, 3, 5, 3), dtype=np.uint8)  # 45 bytes a sample: words straddle
RAGGED = [RNG.integers(0, 256, (n, 3), dtype=np.uint8) for n in (1, 7, 2, 9)]


@pytest.mark.parametrize("a, b", [
    (DENSE, list(DENSE)),  # dense, or its samples one by one
    (DENSE, [s.copy() for s in DENSE]),
    (DENSE[:1], [DENSE[0]]),  # one sample
    (np.asfortranarray(DENSE), DENSE),  # laid out otherwise in memory: the same C-order bytes
    (DENSE.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3), DENSE),
    (RAGGED, tuple(RAGGED)),
    (DENSE.astype(np.float32), list(DENSE.astype(np.float32))),
])
def test_the_same_bytes_digest_the_same_however_laid_out(a, b):
    assert dm.digest(a) == dm.digest(b)


def _other(batch):
    return [s.copy() for s in batch]


def _swapped(batch):
    out = _other(batch)
    out[0], out[1] = out[1], out[0]
    return out


@pytest.mark.parametrize("change", [
    "swap", "shape", "dtype", "one more zero byte", "one sample less", "one more sample",
])
def test_a_swapped_sample_or_another_shape_or_dtype_changes_it(change):
    base = list(DENSE)
    other = {
        "swap": lambda: _swapped(base),
        "shape": lambda: [s.reshape(5, 3, 3) for s in base],  # the same bytes
        "dtype": lambda: [s.view(np.int8) for s in base],  # the same bytes
        "one more zero byte": lambda: [np.concatenate([s.reshape(-1), [0]]).astype(np.uint8)
                                       for s in base],  # the padding is no byte
        "one sample less": lambda: base[:-1],
        "one more sample": lambda: base + [np.zeros_like(base[0])],
    }[change]()
    assert dm.digest(other) != dm.digest(base)


def test_any_one_changed_byte_changes_it():
    for batch in (list(DENSE), RAGGED):
        before = dm.digest(batch)
        for k, sample in enumerate(batch):
            for i in range(sample.size):
                for flip in (0x01, 0x80):
                    changed = _other(batch)
                    changed[k].reshape(-1)[i] ^= flip
                    assert dm.digest(changed) != before, (k, i, flip)


def test_identical_samples_swapped_are_the_same_batch():
    twice = [DENSE[0], DENSE[0].copy()]
    assert dm.digest(twice) == dm.digest(_swapped(twice))


@pytest.mark.parametrize("batch", [list(DENSE), RAGGED, [np.float64(1.5)], [np.zeros(0, np.int16)],
                                   [np.arange(17, dtype=">u4")]])
def test_the_model_is_its_docstrings_arithmetic(batch):
    assert dm.digest(batch) == reference([np.asarray(s) for s in batch])


def test_pinned_values():
    """What a kernel must give (changed only with the name, NAME)."""
    assert dm.NAME == "mix64"
    assert dm.hexdigest(np.arange(24, dtype=np.uint8).reshape(2, 3, 4)) == PINNED[0]
    assert dm.hexdigest([np.arange(3, dtype=np.int32), np.arange(5, dtype=np.int32)]) == PINNED[1]


PINNED = ("04b55437c0b1c501", "f82c4c5707a01e61")


def test_refused_batches():
    with pytest.raises(ValueError, match="different dtypes"):
        dm.digest([np.zeros(2, np.uint8), np.zeros(2, np.int8)])
    with pytest.raises(ValueError, match="first axis"):
        dm.digest(np.float32(1))


@pytest.mark.parametrize("samples", [
    [np.arange(12, dtype=np.uint8).reshape(3, 4)] * 2,
    [np.zeros((0,), np.float32), np.ones((5,), np.float32)],
    [],
])
def test_the_hosts_share_completes_a_body_into_the_digest(samples):
    """What device_digest does with a body the kernel summed: the host's
    integer header (header_of_text, mix_int) gives the model's digest."""
    dtype = samples[0].dtype if samples else np.dtype(np.uint8)
    text = dm.header_text(dtype, [s.shape for s in samples])
    assert dm.finish(dm.body(samples), text) == dm.digest(samples)
    assert dm.header_of_text(text) == dm.header(dtype, [s.shape for s in samples])
