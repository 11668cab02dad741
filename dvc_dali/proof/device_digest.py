"""The ``mix64`` digest of GPU batches, computed on the device (the door to
CuPy and CUDA for the batch proof).

One kernel launch for any number of outputs, of one batch or of several
(the digest thread hands in a group of batches at once, so that its
Python work a launch is shared by them): each output is a row of a table
of descriptors (a dense output: its base pointer and sample size; a ragged
one: the device address of its sample pointers and sizes), which travels
with the ragged outputs' pointers and sizes in one asynchronous copy from
pinned memory. The kernel adds every 8-byte word's term (digest_model: the
position is mixed in on the device) into the output's 64-bit accumulator;
the accumulators come back to pinned memory by an asynchronous copy, after
which an event is recorded. Everything runs on a stream of this module's,
ordered after DALI's outputs by an event on each stream DALI produced them
on: nothing waits on the host while launching. :func:`begin` launches and
returns the function that waits for that event and folds in each output's
header (dtype, sample count and shapes), which the host computes. While
recording, the digest thread does both; a resume, before the batch is
handed out: one wait a batch.

Nothing is allocated per batch: the launch buffers (device accumulators,
pinned result and table, events) are slots kept in a pool per process
(process_state ``device_digests``), taken at launch and given back once the
result is read, so two recorders never share one in flight; a slot's table
grows to the largest launch seen. The value depends only on the bytes,
their order and the sample order, never on the device, the process, the
grouping or a table of constants: digest_model.py is its specification,
and the GPU test holds the kernel to it.
"""

from __future__ import annotations

import functools
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
MAX_OUTPUTS = 65535  # CUDA's limit on a grid's z: one output a z
_ROW = 6  # words of a descriptor

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

// table: one row of 6 words an output (blockIdx.z): the device addresses of its
// samples' pointers and sizes (ragged) or 0, 0; its base and sample size in bytes
// (dense: sample k at base + k * stride); its sample count; its accumulator's index
extern "C" __global__ void mix64_body(const u64* table, u64* acc) {
    const u64* row = table + 6 * (u64)blockIdx.z;
    const u64* ptrs = (const u64*)row[0];
    const u64* sizes = (const u64*)row[1];
    u64 base = row[2], stride = row[3], n = row[4];
    u64 sum = 0;
    for (u64 k = blockIdx.y; k < n; k += gridDim.y) {
        const unsigned char* p = (const unsigned char*)(ptrs ? ptrs[k] : base + k * stride);
        u64 nbytes = sizes ? sizes[k] : stride;
        u64 nwords = (nbytes + 7) / 8;
        u64 key = (k << 40) + GOLDEN;
        for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < nwords;
             j += (u64)gridDim.x * blockDim.x)
            sum += mix(word(p, j, nbytes) ^ mix(key + j));
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if ((threadIdx.x & 31) == 0 && sum) atomicAdd(acc + row[5], sum);
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

    @functools.cached_property
    def sizes(self) -> list[int]:
        """Each sample's bytes (a ragged output's: computed once, read by the
        launch's table and by the group's byte count)."""
        if self.pointers is None:
            return [self.stride] * len(self.shapes)
        return [math.prod(s) * self.itemsize for s in self.shapes]

    @property
    def nbytes(self) -> int:
        if self.pointers is None:
            return self.stride * len(self.shapes)
        return sum(self.sizes)


@dataclass
class _Slot:
    """The buffers of one launch in flight on one device."""

    device: int
    acc: Any  # cupy uint64[capacity]: the accumulators, one an output
    result: Any  # numpy view of pinned memory: where they come back
    result_mem: Any
    done: Any  # cupy Event recorded after the copy back
    ready: list[Any] = field(default_factory=list)  # Events recorded on DALI's streams
    table: tuple[Any, Any, Any, int] | None = None
    # the descriptors and ragged pointers: (pinned numpy uint64[cap], its memory,
    # cupy uint64[cap], cap)


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
                     cupy.cuda.Event(block=True, disable_timing=True))

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


def _streams(after: int | Sequence[int] | None) -> list[int]:
    if after is None:
        return []
    return [after] if isinstance(after, int) else list(dict.fromkeys(after))


def begin(outputs: Sequence[Output], device: int, after: int | Sequence[int] | None
          ) -> Callable[[], list[str]]:
    """Launch the digests of GPU ``outputs`` on ``device`` (of one batch or of
    several: one launch), ordered after the work DALI queued so far on the
    stream(s) ``after`` (handles; None or none: the data is ready on the
    host's side already). Returns the function that waits for them and
    returns each output's ``<dtype>/<header CRC>/mix64:<hex>``."""
    import cupy

    if len(outputs) > MAX_OUTPUTS:
        raise ValueError(f"{len(outputs)} outputs in one launch: at most {MAX_OUTPUTS}")
    pool = _pool()
    with cupy.cuda.Device(device):  # the digest thread's current device may be another
        stream = pool.stream(device)
        kernel = pool.kernels[device]
        slot = pool.take(device, max(1, len(outputs)))
        try:
            _launch(slot, kernel, stream, outputs, _streams(after))
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


@dataclass
class _Table:
    """A launch's descriptors (``rows``), then the ragged outputs' pointers
    and sizes (``extra``); a ragged row's first two words hold the offsets
    (in words, from the table's start) of its pointers and sizes until they
    are made device addresses (the rows starting at ``ragged``)."""

    rows: list[int]
    extra: list[int]
    ragged: list[int]
    words: int  # the largest sample's
    samples: int  # the most of an output


def _table(outputs: Sequence[Output]) -> _Table:
    rows: list[int] = []
    ragged: list[int] = []
    extra: list[int] = []
    words = samples = 0
    after_rows = _ROW * len(outputs)
    for i, out in enumerate(outputs):
        n = len(out.shapes)
        if n >= digest_model.MAX_SAMPLES:
            raise ValueError(f"{n} samples: mix64 takes fewer than {digest_model.MAX_SAMPLES}")
        samples = max(samples, n)
        if out.pointers is None:
            rows += [0, 0, out.base, out.stride, n, i]
            words = max(words, (out.stride + 7) // 8)
            continue
        sizes = out.sizes
        at = after_rows + len(extra)
        ragged.append(len(rows))
        rows += [at, at + n, 0, 0, n, i]
        extra += list(out.pointers) + sizes
        words = max([words] + [(s + 7) // 8 for s in sizes])
    return _Table(rows, extra, ragged, words, samples)


def _launch(slot: _Slot, kernel: Any, stream: Any, outputs: Sequence[Output],
            after: list[int]) -> None:
    import cupy
    import numpy as np

    runtime = cupy.cuda.runtime
    for k, handle in enumerate(after):  # by their handles: no wrapper object a batch
        while len(slot.ready) <= k:
            slot.ready.append(cupy.cuda.Event(block=False, disable_timing=True))
        runtime.eventRecord(slot.ready[k].ptr, handle)
        runtime.streamWaitEvent(stream.ptr, slot.ready[k].ptr, 0)
    m = len(outputs)
    runtime.memsetAsync(slot.acc.data.ptr, 0, 8 * max(m, 1), stream.ptr)
    table = _table(outputs)
    if m and table.samples:
        dev = _staged(slot, stream, table)
        blocks_x = min(_MAX_BLOCKS_X,
                       max(1, -(-table.words // (_THREADS * _WORDS_PER_THREAD))))
        with stream:
            kernel((blocks_x, min(table.samples, _MAX_BLOCKS_Y), m), (_THREADS,),
                   (np.uint64(dev), np.uint64(slot.acc.data.ptr)))
    runtime.memcpyAsync(slot.result_mem.ptr, slot.acc.data.ptr, 8 * max(m, 1),
                        runtime.memcpyDeviceToHost, stream.ptr)
    slot.done.record(stream)


def _staged(slot: _Slot, stream: Any, table: _Table) -> int:
    """The table on the device (from pinned memory, copied asynchronously),
    its address; the slot's table grows to the largest launch."""
    import cupy
    import numpy as np

    rows, extra = table.rows, table.extra
    total = len(rows) + len(extra)
    host, mem, dev, cap = slot.table or (None, None, None, 0)
    if cap < total:
        cap = max(total, 2 * cap, 64)
        mem = cupy.cuda.alloc_pinned_memory(8 * cap)
        host = np.frombuffer(mem, np.uint64, cap)
        dev = cupy.empty(cap, cupy.uint64)
        slot.table = (host, mem, dev, cap)
    base = dev.data.ptr
    for r in table.ragged:
        rows[r], rows[r + 1] = base + 8 * rows[r], base + 8 * rows[r + 1]
    host[:len(rows)] = rows
    host[len(rows):total] = extra
    cupy.cuda.runtime.memcpyAsync(base, mem.ptr, 8 * total,
                                  cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
    return base


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
