"""The ``mix64`` digest of GPU batches, computed on the device (the door to
CuPy and CUDA for the batch proof).

One kernel per output per batch: a dense output is its base pointer and
sample size, a ragged one an array of sample pointers and sizes (copied
from pinned memory, asynchronously). The kernel adds every 8-byte word's
term (digest_model: the position is mixed in on the device) into one
64-bit accumulator; the few bytes of result come back to pinned memory by
an asynchronous copy, after which an event is recorded. Everything runs on
a stream of this module's, ordered after DALI's output by an event on the
stream DALI produced it on: nothing waits on the host while launching.
:func:`begin` launches and returns the function that waits for that event
and folds in each output's header (dtype, sample count and shapes), which
the host computes. While recording, the digest thread does both; a resume,
before the batch is handed out: one wait a batch.

Nothing is allocated per batch: the launch buffers (device accumulator,
pinned result and pointer arrays, event) are slots kept in a pool per
process (process_state ``device_digests``), taken at launch and given back
once the result is read, so two recorders never share one in flight; a
slot's ragged arrays grow to the largest batch seen. The value depends only
on the bytes, their order and the sample order, never on the device, the
process or a table: digest_model.py is its specification, and the GPU test
holds the kernel to it.
"""

from __future__ import annotations

import math
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from . import digest_model
from ..core.process_state import STATE

NAME = digest_model.NAME
_THREADS = 256
_WORDS_PER_THREAD = 4  # a thread's share before another block is started
_MAX_BLOCKS_X = 1024
_MAX_BLOCKS_Y = 65535  # CUDA's limit on a grid's y: more samples loop in the kernel

_SOURCE = r"""
typedef unsigned long long u64;
#define GOLDEN 0x9E3779B97F4A7C15ULL

__device__ __forceinline__ u64 mix(u64 x) {
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27; x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

// word j of a sample of nbytes bytes, little-endian, the last one padded with zeros
__device__ __forceinline__ u64 word(const unsigned char* p, u64 j, u64 nbytes) {
    u64 start = j * 8;
    if (start + 8 <= nbytes && (((u64)(p + start)) & 7ULL) == 0)
        return *(const u64*)(p + start);
    u64 w = 0, end = start + 8 < nbytes ? start + 8 : nbytes;
    for (u64 b = start; b < end; ++b) w |= ((u64)p[b]) << (8 * (b - start));
    return w;
}

// ptrs/sizes: one entry a sample (ragged), or 0 (dense: base + k * stride, stride bytes)
extern "C" __global__ void mix64_body(const u64* ptrs, const u64* sizes, u64 base,
                                      u64 stride, unsigned int n, u64* out) {
    u64 acc = 0;
    for (unsigned int k = blockIdx.y; k < n; k += gridDim.y) {
        const unsigned char* p = (const unsigned char*)(ptrs ? ptrs[k] : base + (u64)k * stride);
        u64 nbytes = sizes ? sizes[k] : stride;
        u64 nwords = (nbytes + 7) / 8;
        u64 key = ((u64)k << 40) + GOLDEN;
        for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < nwords;
             j += (u64)gridDim.x * blockDim.x)
            acc += mix(word(p, j, nbytes) ^ mix(key + j));
    }
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if ((threadIdx.x & 31) == 0 && acc) atomicAdd(out, acc);
}
"""


@dataclass
class Output:
    """One GPU output of a batch, as the kernel reads it: ``dtype`` (NumPy's
    name), the samples' ``shapes``, and either ``base`` (a dense output: the
    samples one after the other, ``stride`` bytes each) or ``pointers`` (one
    a sample; their sizes follow from the shapes)."""

    dtype: str
    shapes: list[tuple[int, ...]]
    itemsize: int
    base: int = 0
    stride: int = 0
    pointers: list[int] | None = None


@dataclass
class _Slot:
    """The buffers of one batch in flight on one device."""

    device: int
    acc: Any  # cupy uint64[capacity]: the accumulators, one an output
    result: Any  # numpy view of pinned memory: where they come back
    result_mem: Any
    done: Any  # cupy Event recorded after the copy back
    ready: Any  # cupy Event recorded on DALI's stream, waited for by ours
    ragged: dict[int, tuple[Any, Any, Any, int]] = field(default_factory=dict)
    # output index -> (pinned numpy uint64[2*cap], its memory, cupy uint64[2*cap], cap)


class _Pool:
    """Per process: a stream and the compiled kernel per device, free slots,
    the headers of dense outputs (the same batch after batch)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.streams: dict[int, Any] = {}
        self.kernels: dict[int, Any] = {}
        self.free: dict[tuple[int, int], list[_Slot]] = {}  # (device, capacity) -> slots
        self.headers: dict[tuple[Any, ...], tuple[int, int]] = {}  # -> (text CRC, mix(header))

    def take(self, device: int, outputs: int) -> _Slot:
        import cupy
        import numpy as np

        capacity = max(4, 1 << (outputs - 1).bit_length())
        with self.lock:
            free = self.free.get((device, capacity))
            if free:
                return free.pop()
        mem = cupy.cuda.alloc_pinned_memory(8 * capacity)
        # done: a blocking event, so the thread that waits for it sleeps
        return _Slot(device, cupy.zeros(capacity, cupy.uint64),
                     np.frombuffer(mem, np.uint64, capacity), mem,
                     cupy.cuda.Event(block=True, disable_timing=True),
                     cupy.cuda.Event(block=False, disable_timing=True))

    def give(self, slot: _Slot) -> None:
        with self.lock:
            self.free.setdefault((slot.device, slot.acc.size), []).append(slot)

    def stream(self, device: int) -> Any:
        import cupy

        if device not in self.streams:
            self.streams[device] = cupy.cuda.Stream(non_blocking=True)
            self.kernels[device] = cupy.RawKernel(_SOURCE, "mix64_body")
        return self.streams[device]


def _pool() -> _Pool:
    if STATE.device_digests is None:
        STATE.device_digests = _Pool()
    return STATE.device_digests


def header_text(out: Output) -> str:
    return digest_model.header_text(out.dtype, out.shapes)


def begin(outputs: Sequence[Output], device: int, after: int | None
          ) -> Callable[[], list[str]]:
    """Launch the digests of one batch's GPU ``outputs`` on ``device``,
    ordered after the work DALI queued on stream ``after`` (a handle) so
    far (None: the data is ready on the host's side already). Returns the
    function that waits for them and returns each output's ``<dtype>/<header
    CRC>/mix64:<hex>``."""
    import cupy

    pool = _pool()
    with cupy.cuda.Device(device):  # the digest thread's current device may be another
        stream = pool.stream(device)
        kernel = pool.kernels[device]
        slot = pool.take(device, len(outputs))
        try:
            _launch(slot, kernel, stream, outputs, after)
        except BaseException:
            pool.give(slot)
            raise

    def finish() -> list[str]:
        try:
            slot.done.synchronize()
            bodies = [int(v) for v in slot.result[:len(outputs)]]
        finally:
            pool.give(slot)
        return [_named(out, body) for out, body in zip(outputs, bodies)]

    return finish


def _launch(slot: _Slot, kernel: Any, stream: Any, outputs: Sequence[Output],
            after: int | None) -> None:
    import cupy
    import numpy as np

    runtime = cupy.cuda.runtime
    if after is not None:  # by its handle: no wrapper object a batch
        runtime.eventRecord(slot.ready.ptr, after)
        runtime.streamWaitEvent(stream.ptr, slot.ready.ptr, 0)
    runtime.memsetAsync(slot.acc.data.ptr, 0, 8 * len(outputs), stream.ptr)
    with stream:
        for i, out in enumerate(outputs):
            n = len(out.shapes)
            if n == 0:
                continue
            if n >= digest_model.MAX_SAMPLES:
                raise ValueError(f"{n} samples: mix64 takes fewer than "
                                 f"{digest_model.MAX_SAMPLES}")
            acc = np.uint64(slot.acc.data.ptr + 8 * i)
            if out.pointers is None:
                words = (out.stride + 7) // 8
                args = (np.uint64(0), np.uint64(0), np.uint64(out.base), np.uint64(out.stride),
                        np.uint32(n), acc)
            else:
                sizes = [math.prod(s) * out.itemsize for s in out.shapes]
                words = (max(sizes) + 7) // 8
                dev_ptrs = _stage(slot, stream, i, out.pointers, sizes)
                args = (np.uint64(dev_ptrs), np.uint64(dev_ptrs + 8 * n), np.uint64(0),
                        np.uint64(0), np.uint32(n), acc)
            blocks_x = min(_MAX_BLOCKS_X, max(1, -(-words // (_THREADS * _WORDS_PER_THREAD))))
            kernel((blocks_x, min(n, _MAX_BLOCKS_Y)), (_THREADS,), args)
    runtime.memcpyAsync(slot.result_mem.ptr, slot.acc.data.ptr, 8 * len(outputs),
                        runtime.memcpyDeviceToHost, stream.ptr)
    slot.done.record(stream)


def _stage(slot: _Slot, stream: Any, i: int, pointers: list[int], sizes: list[int]) -> int:
    """A ragged output's sample pointers, then their sizes, on the device
    (from pinned memory, copied asynchronously): the device address of the
    pointers; the slot's arrays grow to the largest batch."""
    import cupy
    import numpy as np

    n = len(pointers)
    host, mem, dev, cap = slot.ragged.get(i, (None, None, None, 0))
    if cap < n:
        cap = max(n, 2 * cap)
        mem = cupy.cuda.alloc_pinned_memory(16 * cap)
        host = np.frombuffer(mem, np.uint64, 2 * cap)
        dev = cupy.empty(2 * cap, cupy.uint64)
        slot.ragged[i] = (host, mem, dev, cap)
    host[:n] = pointers
    host[n:2 * n] = sizes
    cupy.cuda.runtime.memcpyAsync(dev.data.ptr, mem.ptr, 16 * n,
                                  cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
    return dev.data.ptr


def _named(out: Output, body: int) -> str:
    """``mix(body ^ mix(header))``, named; a dense output's header (text CRC,
    mixed value) computed once for its dtype, sample count and shape."""
    key = (out.dtype, len(out.shapes), out.shapes[0]) \
        if out.pointers is None and out.shapes else None
    headers = _pool().headers
    head = headers.get(key) if key is not None else None
    if head is None:
        text = header_text(out)
        head = (zlib.crc32(text.encode()),
                digest_model.mix_int(digest_model.header_of_text(text)))
        if key is not None:
            if len(headers) > 256:  # shapes that keep changing: no growth without bound
                headers.clear()
            headers[key] = head
    value = digest_model.mix_int(body ^ head[1])
    return f"{out.dtype}/{head[0]:08x}/{NAME}:{value:016x}"
