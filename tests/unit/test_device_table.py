"""The table one launch of the mix64 kernel reads (device_digest._table):
walked by a plain-Python reading of the kernel over host memory, it gives
digest_model's value for every output, whatever outputs share the launch
(dense, ragged, empty, of several batches); how many batches a GPU
group may hold and when it goes (batch_digests.group_size, group_goes). Runs without a GPU."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from dvc_dali.proof import batch_digests, device_digest, digest_model

GOLDEN = digest_model.GOLDEN
MASK = (1 << 64) - 1


def _walk(table, outputs) -> list[int]:
    """What the kernel adds into each accumulator: for each row, each
    sample k, each word j: mix(word ^ mix(k * 2**40 + j + GOLDEN)), the
    sample's bytes read at the addresses the row gives (here: host memory)."""
    words = table.rows + table.extra
    acc = [0] * len(outputs)
    for r in range(0, len(table.rows), 6):
        ptrs, sizes, base, stride, n, out = words[r:r + 6]
        for k in range(n):
            # a ragged row holds offsets into the table until staged on the device
            p = words[ptrs + k] if r in table.ragged else base + k * stride
            nbytes = words[sizes + k] if r in table.ragged else stride
            raw = ctypes.string_at(p, nbytes) if nbytes else b""
            raw += b"\0" * (-len(raw) % 8)
            for j in range(len(raw) // 8):
                w = int.from_bytes(raw[8 * j:8 * j + 8], "little")
                key = ((k << 40) + j + GOLDEN) & MASK
                acc[out] = (acc[out] + digest_model.mix_int(w ^ digest_model.mix_int(key))) & MASK
    return acc


def _dense(array: np.ndarray) -> device_digest.Output:
    sample = array.shape[1:]
    return device_digest.Output(array.dtype.name, [sample] * array.shape[0], array.itemsize,
                                base=array.ctypes.data,
                                stride=array.itemsize * math.prod(sample))


def _ragged(samples: list[np.ndarray]) -> device_digest.Output:
    return device_digest.Output(samples[0].dtype.name if samples else "uint8",
                                [s.shape for s in samples],
                                samples[0].itemsize if samples else 1,
                                pointers=[s.ctypes.data for s in samples])


rng = np.random.default_rng(5)
CROPS = [rng.integers(0, 256, (4, 6, 6, 3), dtype=np.uint8) for _ in range(3)]
DECODED = [rng.integers(0, 256, (5 + i, 3 + i, 3), dtype=np.uint8) for i in range(4)]
ODD = [rng.integers(0, 256, (i,), dtype=np.uint8) for i in (0, 1, 7, 9, 17)]
FLOATS = rng.random((3, 5), dtype=np.float32)


@pytest.mark.parametrize("case", [
    "one dense batch", "three batches, dense", "ragged", "ragged with empty samples",
    "dense and ragged of two batches", "no samples", "empty samples",
])
def test_the_table_gives_the_model_value_of_each_output(case):
    batches = {
        "one dense batch": [CROPS[0]],
        "three batches, dense": CROPS,
        "ragged": [DECODED],
        "ragged with empty samples": [ODD],
        "dense and ragged of two batches": [CROPS[0], DECODED, FLOATS, ODD[1:]],
        "no samples": [np.zeros((0, 4), np.uint8), CROPS[1]],
        "empty samples": [np.zeros((3, 0), np.uint8)],
    }[case]
    outputs = [_ragged(b) if isinstance(b, list) else _dense(b) for b in batches]
    table = device_digest._table(outputs)  # noqa: SLF001 (what the kernel reads)
    bodies = _walk(table, outputs)
    for batch, body in zip(batches, bodies):
        samples = batch if isinstance(batch, list) else list(batch)
        assert body == digest_model.body(samples), case
    assert table.samples == max(len(o.shapes) for o in outputs)


def test_a_launch_of_too_many_samples_is_refused():
    big = device_digest.Output("uint8", [(1,)] * digest_model.MAX_SAMPLES, 1, base=8, stride=1)
    with pytest.raises(ValueError, match="mix64 takes fewer than"):
        device_digest._table([big])  # noqa: SLF001


@pytest.mark.parametrize("bytes_per_batch, size", [
    (0, batch_digests.GROUP_MAX),  # none known (host outputs of no size)
    (384 << 10, batch_digests.GROUP_MAX),  # benchmark 16's 32 x 64x64x3 crops
    (batch_digests.GROUP_BYTES // 4, 4),
    (batch_digests.GROUP_BYTES, 1),
    (10 * batch_digests.GROUP_BYTES, 1),  # a batch larger than the bound still goes
])
def test_group_size(bytes_per_batch, size):
    assert batch_digests.group_size(bytes_per_batch) == size


W = batch_digests.GROUP_WINDOW_S


@pytest.mark.parametrize("waiting, group_max, age, gap, goes", [
    (1, 16, 0.0, float("inf"), True),  # the first batch of a run: alone
    (1, 16, 0.0, W / 10, False),  # fast: it waits for the next ones
    (5, 16, W / 2, W / 10, False),
    (16, 16, W / 2, W / 10, True),  # full
    (1, 1, 0.0, 0.0, True),  # bytes unknown yet, or a batch over the bound
    (3, 16, W, W / 10, True),  # the window is over: a kill loses little
    (3, 16, W / 2, 2 * W, True),  # a slow batch takes those waiting with it
])
def test_when_a_group_goes(waiting, group_max, age, gap, goes):
    assert batch_digests.group_goes(waiting, group_max, age, gap) == goes
