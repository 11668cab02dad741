"""Proof at runtime: the batches a resumed pipeline produces are compared
with the ones the run it continues produced.

From each checkpoint on, every batch a registered pipeline hands out
(``pipe.run()``, and the framework iterators, which call
``share_outputs()``) is digested: per output its dtype, a CRC-32 of its
samples' shapes and a digest of its bytes named by its algorithm (HOST,
``crc32``: CRC-32 of the host bytes; on a GPU DEVICE, ``mix64``: one
kernel an output, device_digest.py, so nothing is copied to the host).
So is every batch a DALI dynamic-mode reader registered on
``Checkpointer.dynamic()`` yields from ``next_epoch`` (stream
``"<Checkpoint name>/<reader name>"``, :func:`dynamic_stream`): a CPU
output viewed on the host and digested with :func:`digest_arrays`, a GPU
output digested on the device like a pipeline's (:func:`begin`), before
the loop gets it.
RNGs registered there yield no batches; what is drawn with them follows
from their restored state. At most ``DVC_DALI_VERIFY_BATCHES`` batches after
each checkpoint (default: all of them); ``0``: none, and the pipelines and
readers are left unwrapped.

Streams that are not DALI pipelines hand their batches in themselves
(:meth:`Recorder.track`, :meth:`Recorder.observe`, digested with
:func:`digest_arrays`): a TensorFlow ``tf_dataset``, whose pipeline runs
inside TensorFlow, out of Python's sight, ends in a map node of dvc-dali's
(dali_tf.py) that hands each element, after the user's ``transform`` (what
the training step gets), to ``observe`` as host arrays when the consumer
takes it: under eager iteration and inside Keras's ``tf.function`` alike.
A mismatch raised there is raised in a thread of TensorFlow's, which hands
the consumer an error of its own; :attr:`Recorder.failure` keeps the
mismatch, and the dataset's iterators and the Keras callback raise it
instead.

Where they go:
- as each batch is produced, one JSON line appended (no fsync) to a
  companion file named by the checkpoint's batch-log id, outside the
  checkpoint output (DVC hashes that): ``<DVC root>/.dvc/tmp/dvc-dali/
  batches/<id>.jsonl`` (for `--temp` and queued runs the workspace's, so a
  later run there finds it), or beside the checkpoint directory outside DVC;
  so a run killed between two checkpoints leaves them for the resume, which
  also looks where they were written before a `.dvc` appeared above the
  checkpoint (:func:`companion_dirs`);
- into the next checkpoint's manifest (each pipeline entry's ``batches``:
  the id of the checkpoint they follow and the first MANIFEST_MAX digests,
  so a long interval does not grow every manifest; a dynamic-mode reader's
  in its Checkpoint's entry of the manifest's ``dynamic`` part, ``batches``
  by reader name: :func:`records`, which the Checkpointer merges into the
  manifest through restorable.BatchProof), so a resume of an earlier row
  (after `dvc exp apply`, on another machine after `dvc exp pull`) finds
  them in the row that came next.

A resume compares each re-produced batch with its digest before it is
returned, so the training step never sees a batch that differs: a mismatch
is a :class:`BatchMismatchError` naming the pipeline (or reader), the step,
what differs and what changed since. ``DVC_DALI_INEXACT=1`` continues on
purpose, saying once that the run is no longer exact; from the difference on
the run writes nothing more into the resumed checkpoint's segment (shared by
every resume from it, which must still be compared with the run it
continues), and its next save starts a fresh one. Where no digest exists
(a run killed right after its checkpoint), nothing is said and the batches
are recorded.

Each comparison ends as one of MATCHED, DIFFERS (the refusal) or
NOT_VERIFIED (:func:`check`): digests of two algorithms (a host CRC and a
device sum, an older or later algorithm), a digest that failed when it was
recorded or now, or one that cannot be read, tell nothing, and are neither a
refusal nor a proof. When a stream's digests run out (or at the next save)
the resume says once which (:func:`summary`): the proof only where every
batch matched. A digest that raises while recording is recorded as
``failed:<exception type>`` (said once a stream), never dropped.

While recording (no digest to compare with), a pipeline's host outputs are
hashed on the training thread before the batch is handed out, and the
batch's line is written then: a consumer may write into them in place (the
PyTorch iterators hand out tensors that share DALI's memory, and a step's
``x.sub_(mean)`` is common), so a digest taken after the hand-over could
hash the step's bytes, and a resume be refused for a false "differs" (found
by a sweep: the digest thread hashed a batch the step had zeroed; on 2
cores that DALI keeps busy this costs about what the digest thread did,
benchmark 16). A ``tf_dataset``'s elements, NumPy views of TensorFlow's
tensors (never written), are hashed on the digest thread while the step
trains, one at a time (the next waits for it, so a kill loses at most the
last element's digest). A GPU pipeline's batches go there in groups while
they come fast (GROUP_MAX, GROUP_WINDOW_S: one launch of the kernel for a
group's GPU outputs, ordered after what DALI has queued on their streams by
then, which includes them, and one wait; their host outputs are hashed at
the hand-in), so a kill loses the digests of at most the batches of the
last two windows (10 ms each); where they come slowly, of the last batch.
On an H200 that costs ~0.1 ms of CPU a batch on the digest thread (0.3 ms
one batch a launch) and ~6 us on the training thread
(docs/design/benchmarks.md). A training step's in-place write into a GPU
output before the kernel reads it is not ordered after it: README's "Not
supported yet". The legacy executor (``exec_dynamic=False``) reuses output
buffers, so there a GPU batch too is digested at once, as it is for
dynamic-mode readers.
"""

from __future__ import annotations

import atexit
import errno
import json
import math
import os
import queue
import stat
import threading
import time
import uuid
import weakref
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..core import plain_file
from ..core.errors import BatchMismatchError
from ..core.log import logger
from ..core.process_state import STATE

KEY = "batches"  # a pipeline entry's manifest field
ALL = -1  # DVC_DALI_VERIFY_BATCHES unset: every batch between two checkpoints
COMPANION = Path(".dvc") / "tmp" / "dvc-dali" / "batches"
# What an output's digest is named by (``<dtype>/<shapes CRC>/<name>:<hex>``):
# the name stands for the whole recipe (dtype spelling, shapes encoding, the
# bytes' digest), and changes whenever any of it changes, so that a digest of
# another recipe is "not verified", never compared.
HOST = "crc32"  # CRC-32 (zlib's polynomial) of the host bytes, samples in order
DEVICE = "mix64"  # digest_model's sum of mixed 8-byte words, on the device (device_digest.py)
# Digests written before the name was stored (dvc-dali up to 8b32b7a): ``c<8
# hex>``'s bytes digest is the one HOST names (unchanged), ``g<16 hex>`` the
# device's weighted sum of 32-bit words, named GWSUM1 from then until mix64
# replaced it; so they are read as those (and are "not verified" against
# mix64, never compared). Their shapes field is not HOST's, always: before
# a998e95 it was the CRC of repr(tl.shape()) for every batch, where a dense
# batch's is now that of "<n>x<sample shape>"; so an unnamed digest's other
# shapes show no difference (a resume across that upgrade refused exact
# batches: found by sweep V), its other bytes do.
GWSUM1 = "gwsum1"
LEGACY = {"c": HOST, "g": GWSUM1}
FAILED = "failed:"  # a batch whose digest raised: ["failed:<exception type>"]
MANIFEST_MAX = 1000  # digests a manifest holds a pipeline (the first after the checkpoint)
_KEEP_LOGS = 200  # companion files kept (the newest): a few KB each
_PRUNE_EVERY = 50  # checkpoints between two prunings (a listing of up to 250 names)
_ID_CHARS = set("0123456789abcdef")
# Reading a companion file: a batch's line is ~60 bytes an output, so a
# segment's file is a few MB in practice; a longer line is none dvc-dali
# wrote, and no more than _COMPANION_MAX is read, so a huge file cannot take
# the memory. What is not read is not compared: never a false match.
_LINE_MAX = 1 << 20
_COMPANION_MAX = 64 << 20
# Recording a GPU pipeline's batches: while they come fast, they are handed
# to the digest thread in groups, so that the Python work of a launch and a
# wait is shared by a group, one launch for all of it (measured on an H200:
# the digest thread's CPU a batch 290 -> 100 us, the training thread's
# 13 -> 6 us). A group holds at most GROUP_MAX batches, sized so that at
# most GROUP_BYTES of outputs are held past their hand-over (group_size),
# and goes once its first batch is GROUP_WINDOW_S old; a batch that comes
# more than GROUP_WINDOW_S after the one before goes at once, with those
# waiting. So a kill loses at most the digests of the batches of the last
# two windows (a group waiting, one in flight; 2 * GROUP_MAX at most), and
# of the last batch alone where they come slowly. A CPU pipeline's batches
# are hashed before they are handed out (above), and so are a GPU batch's
# host outputs, at the hand-in.
GROUP_MAX = 16
GROUP_BYTES = 32 << 20
GROUP_WINDOW_S = 0.01
GROUP_ON_CPU = False  # the tests' switch: the grouped path with a CPU pipeline's batches


def group_goes(waiting: int, group_max: int, age_s: float, gap_s: float) -> bool:
    """Whether the group waiting (``waiting`` batches, the newest included,
    its first ``age_s`` old, the newest ``gap_s`` after the one before) goes
    to the digest thread now."""
    return waiting >= group_max or age_s >= GROUP_WINDOW_S or gap_s > GROUP_WINDOW_S


def group_size(bytes_per_batch: float) -> int:
    """How many batches the next group may hold, from the bytes the last
    group's outputs held a batch (none known: as many as allowed)."""
    if bytes_per_batch <= 0:
        return GROUP_MAX
    return max(1, min(GROUP_MAX, int(GROUP_BYTES // bytes_per_batch)))


# what can explain a dynamic-mode reader's other batch: dynamic mode saves no
# description of its readers nor digests of their data to name a change from
UNDESCRIBED = ("a dynamic-mode reader's data and arguments are not described in the "
               "checkpoint: a data file changed (even with its size and mtime kept), added or "
               "removed, another reader argument or the code around the reader would do this")


# -- digests -----------------------------------------------------------------
def _crc(data: Any, value: int = 0) -> int:
    global _crc32
    if _crc32 is None:  # looked up once: a resume pays this before each batch
        from ..format.store import (  # ISA-L's where installed (a dependency): ~6x zlib's
            crc32_function,
        )

        _crc32 = crc32_function()
    return _crc32(data, value)


_crc32: Callable[[Any, int], int] | None = None


def _host_digest(tensor_list: Any) -> tuple[str, int]:
    """One host output's digest (``<dtype>/<shapes CRC>/crc32:<hex>``: the
    CRC-32 of its samples' bytes in order) and its size in bytes. A dense
    batch is one buffer and one shape, its prefix looked up by them: no
    per-sample Python work, which each batch pays."""
    if tensor_list.is_dense_tensor():
        dense = tensor_list.as_tensor()
        try:  # the shape from the buffer: one call into DALI fewer
            view = memoryview(dense)
            shape, data = view.shape, view.cast("B")
        except (TypeError, ValueError):
            shape, data = tuple(dense.shape()), _host_view(dense)
        key = (tensor_list.dtype, shape)
        prefix = _PREFIXES.get(key)
        if prefix is None:
            if len(_PREFIXES) >= 4096:  # a stream of ever-new shapes: kept bounded
                _PREFIXES.clear()
            prefix = _PREFIXES[key] = _prefix(
                tensor_list.dtype, f"{shape[0]}x{tuple(shape[1:])}" if shape else "()")
        return f"{prefix}{_crc(data):08x}", data.nbytes
    value = size = 0
    for part in tensor_list:
        view = _host_view(part)
        value = _crc(view, value)
        size += view.nbytes
    shapes = repr(tensor_list.shape())
    return f"{_prefix(tensor_list.dtype, shapes)}{value:08x}", size


def _prefix(dtype: Any, shapes: str) -> str:
    """``<dtype>/<CRC-32 of the shapes' text>/crc32:`` of a host output."""
    return f"{_dtype_name(dtype)}/{zlib.crc32(shapes.encode()):08x}/{HOST}:"


_PREFIXES: dict[Any, str] = {}  # a dense host output's prefix, by (dtype, shape)


def _host_view(part: Any) -> memoryview:
    """The bytes of a host sample or batch, in order, without a copy where
    it is contiguous (DALI's CPU tensors: the buffer protocol); none where a
    dimension is 0 (a view with a 0 in its shape cannot be cast)."""
    try:
        view = memoryview(part)
    except (TypeError, ValueError):
        view = None
    if view is None or not view.c_contiguous:
        import numpy as np

        view = memoryview(np.ascontiguousarray(np.asarray(part)))
    return view.cast("B") if view.nbytes else memoryview(b"")


def _on_device(tensor_list: Any) -> bool:
    return type(tensor_list).__name__ == "TensorListGPU"


# DALI's type names (DALIDataType, lower case) where NumPy spells them otherwise
_NUMPY_NAMES = {"float": "float32"}


def _device_output(tl: Any) -> Any:
    """A DALI TensorListGPU as the mix64 kernel reads it: a dense one by its
    base pointer (no per-sample Python), a ragged one by its samples'."""
    import numpy as np

    from .device_digest import Output

    name = _dtype_name(tl.dtype)
    dtype = np.dtype(_NUMPY_NAMES.get(name, name))
    if tl.is_dense_tensor():
        dense = tl.as_tensor()
        shape = tuple(dense.shape())
        sample = tuple(shape[1:])
        return Output(dtype.name, [sample] * (shape[0] if shape else 0), dtype.itemsize,
                      base=dense.data_ptr(), stride=dtype.itemsize * math.prod(sample))
    shapes = [tuple(s) for s in tl.shape()]
    return Output(dtype.name, shapes, dtype.itemsize,
                  pointers=[tl[i].data_ptr() for i in range(len(shapes))])


def begin(outputs: Sequence[Any]) -> Callable[[], list[str]]:
    """Start one batch's digest: its GPU outputs' kernels are launched now,
    ordered after what DALI has queued on their stream so far, which
    includes them (device_digest.py, DEVICE); the function returned waits
    for them, once, hashes the host outputs and returns the batch's digests
    (:func:`digest`'s form). The batch must stay alive until it has
    returned."""
    finish = begin_group([outputs])
    return lambda: finish()[0][0]


def begin_group(batches: Sequence[Sequence[Any]]
                ) -> Callable[[], tuple[list[list[str]], int]]:
    """:func:`begin` for several batches at once: one launch a device for
    all their GPU outputs. The function returned gives each batch's digests
    and the bytes they held (the digest thread sizes its next group by
    them)."""
    batches = [list(b) for b in batches]
    pending, device_bytes = _launch_devices(batches)

    def finish() -> tuple[list[list[str]], int]:
        out = [[""] * len(outputs) for outputs in batches]
        for at, done in pending:
            for (b, i), value in zip(at, done()):
                out[b][i] = value
        return out, device_bytes + _host_rest(batches, out)

    return finish


_Launched = list[tuple[list[tuple[int, int]], Callable[[], list[str]]]]


def _launch_devices(batches: list[list[Any]]) -> tuple[_Launched, int]:
    """The GPU outputs' kernels, one launch a device: ((batch, output)
    places, its finish) a device, and the bytes they read."""
    places: dict[int, list[tuple[int, int]]] = {}  # device -> (batch, output)
    for b, outputs in enumerate(batches):
        for i, tl in enumerate(outputs):
            if _on_device(tl):
                places.setdefault(tl.device_id(), []).append((b, i))
    if not places:
        return [], 0
    from . import device_digest

    pending: _Launched = []
    nbytes = 0
    for device, at in places.items():
        outs = [_device_output(batches[b][i]) for b, i in at]
        nbytes += sum(out.nbytes for out in outs)
        after = _streams_of([batches[b][i] for b, i in at], device)
        pending.append((at, device_digest.begin(outs, device, after)))
    return pending, nbytes


def _host_rest(batches: list[list[Any]], out: list[list[str]]) -> int:
    """The host outputs' digests into ``out`` (where empty); their bytes."""
    nbytes = 0
    for b, outputs in enumerate(batches):
        for i, tl in enumerate(outputs):
            if not out[b][i]:
                out[b][i], size = tl.result() if isinstance(tl, _Hashed) else _host_digest(tl)
                nbytes += size
    return nbytes


class _Hashed:
    """A host output of a batch waiting in a group, hashed when it was handed
    in (:func:`_host_digest`'s result, or the error it raised, raised again
    where the group is digested: the group is then marked failed)."""

    def __init__(self, tensor_list: Any) -> None:
        try:
            self._value: tuple[str, int] | None = _host_digest(tensor_list)
            self._error: Exception | None = None
        except Exception as exc:  # noqa: BLE001 (raised with the group's digest)
            self._value, self._error = None, exc

    def result(self) -> tuple[str, int]:
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value


_UNKNOWN = object()


def _streams_of(tensor_lists: Sequence[Any], device: int) -> list[int]:
    """The CUDA streams DALI produced these outputs on (the kernels are
    ordered after each); none where their data is ready for the host
    already. A DALI without the ``stream`` attribute: the device is
    synchronized first."""
    streams = [getattr(tl, "stream", _UNKNOWN) for tl in tensor_lists]
    if any(s is _UNKNOWN for s in streams):
        import cupy

        with cupy.cuda.Device(device):
            cupy.cuda.runtime.deviceSynchronize()
        return []
    return [s for s in streams if s is not None]  # device_digest keeps each once


def digest(outputs: Sequence[Any]) -> list[str]:
    """One batch: per output ``<dtype>/<shapes CRC>/<bytes digest>``, its
    bytes digested on the host (HOST) or, for a GPU output, on the device
    (DEVICE, see :func:`begin`); waits for the device."""
    if not any(_on_device(tl) for tl in outputs):  # a resume pays this before each batch
        return [_host_digest(tl)[0] for tl in outputs]
    return begin(outputs)()


def _dtype_name(dtype: Any) -> str:
    """DALI's ``DALIDataType.UINT8`` as ``uint8`` (looked up once a type)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).rsplit(".", 1)[-1].lower()
    return name


_DTYPE_NAMES: dict[Any, str] = {}


def digest_arrays(outputs: Sequence[Any]) -> list[str]:
    """One batch of host arrays, in the same form as :func:`digest`: each
    output an array whose first axis is the batch, or a list of per-sample
    arrays (ragged samples)."""
    import numpy as np

    out = []
    for output in outputs:
        if isinstance(output, (list, tuple)):
            samples = [np.asarray(s) for s in output]
            shapes = [s.shape for s in samples]
        else:
            samples = [np.asarray(output)]
            shapes = [samples[0].shape[1:]] * (samples[0].shape[0] if samples[0].ndim else 1)
        value = 0
        for s in samples:
            value = _crc(_host_view(s), value)
        dtype = samples[0].dtype.name if samples else "none"
        out.append(f"{dtype}/{zlib.crc32(repr(shapes).encode()):08x}/{HOST}:{value:08x}")
    return out


# -- the decision: matched, differs or not verified ---------------------------
MATCHED, DIFFERS, NOT_VERIFIED = "matched", "differs", "not verified"
OTHER_ALGORITHM = "recorded by another digest algorithm"
OLDER_SHAPES = "recorded by an older dvc-dali, which wrote sample shapes another way"
UNREADABLE = "a recorded digest is unreadable"
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_")
_HEX = set("0123456789abcdef")
# The hex digits each algorithm's value is written with (a hand-edited one of
# another width is unreadable, not "other bytes"); the shapes field: 8.
_WIDTHS = {HOST: 8, DEVICE: 16, GWSUM1: 16}
_SHAPES_WIDTH = 8


@dataclass(frozen=True)
class Check:
    """How one batch's comparison ended: ``outcome`` one of MATCHED, DIFFERS,
    NOT_VERIFIED; ``lines``: what differs (DIFFERS), or why it could not be
    told (NOT_VERIFIED: one reason)."""

    outcome: str
    lines: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return self.lines[0] if self.lines else ""


def failed_marker(exc: BaseException) -> list[str]:
    """What stands for a batch whose digest raised: its exception's type."""
    return [f"{FAILED}{type(exc).__name__}"]


def _failed(batch: Any) -> str | None:
    """The exception type of a failed-digest marker; None for a digest."""
    if isinstance(batch, list) and len(batch) == 1 and isinstance(batch[0], str) \
            and batch[0].startswith(FAILED):
        return batch[0][len(FAILED):] or "an error"
    return None


def parse_output(output: str) -> tuple[str, str, str, str] | None:
    """(dtype, shapes CRC, algorithm, value) of one output's digest: the
    named form ``<dtype>/<8 hex>/<algorithm>:<hex>``, or the unnamed one
    dvc-dali wrote before digests named their algorithm (``c<hex>``: CRC-32,
    ``g<hex>``: the device sum; LEGACY). None when it is neither (``-``,
    anything forged, a value or shapes field of a width no run wrote):
    nothing can be told from it."""
    parts = output.split("/") if isinstance(output, str) else []
    if len(parts) != 3:
        return None
    dtype, shapes, data = parts
    name, sep, value = data.partition(":")
    if not sep:
        name, value = LEGACY.get(data[:1], ""), data[1:]
    if not name or set(name) - _NAME_CHARS or not value or set(value) - _HEX:
        return None
    if len(shapes) != _SHAPES_WIDTH or set(shapes) - _HEX \
            or len(value) != _WIDTHS.get(name, len(value)):
        return None
    return dtype, shapes, name, value


def check(want: list[str] | None, got: list[str] | None) -> Check:
    """One batch: its digest recorded by the run being resumed (``want``;
    None: none was recorded) and the one of the batch produced now (``got``).

    DIFFERS only where a difference is shown: another number of outputs, or an
    output whose two digests are of the same algorithm and tell another dtype,
    other shapes (not an unnamed older digest's: LEGACY) or other bytes.
    NOT_VERIFIED where nothing can be told: no digest recorded, a digest that
    failed (then or now), one that cannot be read (a record of no output, or
    of another number of outputs one of which cannot be read, shows no
    difference either: no run wrote it), or two digests of different
    algorithms (a host CRC and a device sum, an older or newer algorithm:
    their values are not comparable, and neither are their dtype and shape
    fields). MATCHED only where every output's two digests are of one
    algorithm and equal."""
    if want is None:
        return Check(NOT_VERIFIED, ("no digest was recorded for it",))
    then, now = _failed(want), _failed(got) if got is not None else "an error"
    if then is not None:
        return Check(NOT_VERIFIED, (f"its digest failed while it was recorded ({then})",))
    if now is not None:
        return Check(NOT_VERIFIED, (f"its digest failed now ({now})",))
    if want == got and all(parse_output(g) for g in got):  # a resume's usual case: one parse
        return Check(MATCHED)
    if len(want) != len(got):
        if not want or not all(parse_output(w) for w in want):  # no record a run wrote
            return Check(NOT_VERIFIED, (UNREADABLE,))
        return Check(DIFFERS, (f"{len(got)} outputs where {len(want)} were produced",))
    outputs = [_output(i, a, b) for i, (a, b) in enumerate(zip(want, got))]
    lines = tuple(what for outcome, what in outputs if outcome == DIFFERS)
    if lines:
        return Check(DIFFERS, lines)
    unverified = [what for outcome, what in outputs if outcome == NOT_VERIFIED]
    return Check(NOT_VERIFIED, (unverified[0],)) if unverified else Check(MATCHED)


def _output(i: int, want: str, got: str) -> tuple[str, str]:
    """(outcome, what differs or why not verified) of output ``i``."""
    a, b = parse_output(want), parse_output(got)
    if a is None or b is None:
        return NOT_VERIFIED, UNREADABLE
    if a[2] != b[2]:
        return NOT_VERIFIED, OTHER_ALGORITHM
    if a[0] != b[0]:
        return DIFFERS, f"output {i}: dtype {a[0]} -> {b[0]}"
    if a[1] != b[1] and ":" not in want.rpartition("/")[2]:  # unnamed: see LEGACY
        if a[3] != b[3]:
            return DIFFERS, f"output {i}: same dtype, other bytes"
        return NOT_VERIFIED, OLDER_SHAPES
    if a[1] != b[1]:
        return DIFFERS, f"output {i}: sample shapes differ"
    if a[3] != b[3]:
        return DIFFERS, f"output {i}: same dtype and shapes, other bytes"
    return MATCHED, ""


def differences(want: list[str], got: list[str]) -> list[str]:
    """What differs between two batch digests, output by output (empty where
    :func:`check` finds no difference: matched or not verified)."""
    found = check(want, got)
    return list(found.lines) if found.outcome == DIFFERS else []


def _range(unit: str, first: int, last: int) -> str:
    plural = unit + ("es" if unit.endswith("h") else "s")
    return f"{unit} {first}" if first == last else f"{plural} {first}-{last}"


def outcomes(checks: Sequence[Check], first: int, unit: str = "batch") -> str:
    """The comparisons of consecutive batches (the first numbered ``first``)
    by outcome, in order: 'batches 1-2 not verified (recorded by another
    digest algorithm); batches 3-5 matched'."""
    groups: list[list[Any]] = []  # [first, last, what]
    for i, c in enumerate(checks):
        what = c.outcome if c.outcome != NOT_VERIFIED else f"not verified ({c.reason})"
        if groups and groups[-1][2] == what:
            groups[-1][1] = first + i
        else:
            groups.append([first + i, first + i, what])
    return "; ".join(f"{_range(unit, a, b)} {what}" for a, b, what in groups)


def summary(kind: str, name: str, step: int, checks: Sequence[Check]) -> tuple[bool, str]:
    """The one line a resume says of a stream's compared batches, the first
    ``checks`` after the checkpoint at ``step``: (whether every one matched,
    the line). Only where every batch matched is it the proof; otherwise the
    batches are named by outcome, with the reason each was not verified.
    Batches are counted, not named by step: a stream may give several a
    step, or one every few (a validation's): 'steps 3-15' was said of 13
    batches in 8 steps (found by a sweep)."""
    label, n = f"{kind} {name!r}", len(checks)
    these = (f"the batch after the checkpoint at step {step}" if n == 1 else
             f"the {n} batches after the checkpoint at step {step}")
    if all(c.outcome == MATCHED for c in checks):
        verb = "is the one" if n == 1 else "are those"
        return True, (f"{label}: {these} {verb} the run it resumes produced (batch digests)")
    return False, (f"{label}: batch digests of {these}: {outcomes(checks, 1)}; so this "
                   "resume is not proven exact")


# -- where they are kept -----------------------------------------------------
def companion_dir(checkpoint: Path, environ: dict[str, str] | None = None) -> Path:
    """Outside the checkpoint output, in the repository the run belongs to:
    DVC_ROOT's (the workspace of a `--temp` or queued run) where it is a DVC
    repository (else its `.dvc` would be made, and the folder read as a
    DVC repository from then on), else the nearest DVC repository's, else
    beside the checkpoint directory."""
    from ..core.context import repo_root

    env = os.environ if environ is None else environ
    root = env.get("DVC_ROOT")
    if not (root and (Path(root) / ".dvc").is_dir()):
        root = repo_root(Path(checkpoint).resolve().parent)
    if root:
        return Path(root) / COMPANION
    return _beside(Path(checkpoint).resolve())


def _beside(checkpoint: Path) -> Path:
    """Where a checkpoint outside any DVC repository keeps its companion files."""
    from ..format.dirlock import short_name

    return checkpoint.parent / f".{short_name(checkpoint.name)}.dvc-dali-batches"


def companion_dirs(checkpoint: Path, environ: dict[str, str] | None = None) -> list[Path]:
    """Where a resume looks for a checkpoint's companion file: first
    :func:`companion_dir` (where this run writes), then where the run that
    wrote the checkpoint did before a `.dvc` appeared or went above it
    (`dvc init --subdir`, a monorepo made around the project: found by a
    sweep): each DVC repository above the checkpoint, and beside it. A file
    found there is the checkpoint's own: it is named by its batch-log id."""
    where = Path(checkpoint).resolve()
    places = [companion_dir(checkpoint, environ)]
    places += [parent / COMPANION for parent in where.parents if (parent / ".dvc").is_dir()]
    places.append(_beside(where))
    return list(dict.fromkeys(places))


def _valid_id(log_id: Any) -> bool:
    return isinstance(log_id, str) and len(log_id) == 32 and set(log_id) <= _ID_CHARS


MISSING = "is missing"  # CompanionLog.problem of a file that is not there
# CompanionLog.problem of a file whose last line has no newline: every line
# dvc-dali writes ends in one (a line and its newline are one write), so it
# was cut short (a full disk, a crash) or written by something else; a resume
# cuts it before appending (_cut_torn_line), so it is never compared either
NO_LINE = ("holds no complete line (it has no newline: its first line was cut short, or it "
           "is no file dvc-dali wrote)")
CUT_SHORT = ("ends in an incomplete line (no newline: the last line was cut short, or it is "
             "damaged)")


@dataclass(frozen=True)
class CompanionLog:
    """What a companion file yields: ``found``, {stream: [batch digest, ...]}
    in order from the first; ``problem``, why some or all of it could not be
    read ("" when nothing was skipped; MISSING; "is a symbolic link", "is
    not a regular file": not read; lines that do not parse or are out of
    order; NO_LINE, CUT_SHORT: a last line without its newline)."""

    found: dict[str, list[list[str]]]
    problem: str = ""
    path: Path | None = None  # the file read (MISSING: where it was looked for first)
    looked: tuple[Path, ...] = ()  # MISSING from find_log: each directory looked in


def find_log(directories: Sequence[Path], log_id: str) -> CompanionLog:
    """The companion file of checkpoint ``log_id`` read from the first of
    ``directories`` (:func:`companion_dirs`) that holds one; MISSING where
    none does, naming each directory looked in."""
    for directory in directories:
        log = read_log(directory, log_id)
        if log.problem != MISSING:
            return log
    first = directories[0] / f"{log_id}.jsonl" if directories else None
    return CompanionLog({}, MISSING, first, tuple(directories))


def read_companion(directory: Path, log_id: str) -> dict[str, list[list[str]]]:
    """{pipeline: [batch digest, ...]} appended for checkpoint ``log_id``
    (:func:`read_log`'s ``found``)."""
    return read_log(directory, log_id).found


def read_log(directory: Path, log_id: str) -> CompanionLog:
    """The companion file of checkpoint ``log_id``: its digests in order, and
    what of it could not be read. What is not read is not compared: never a
    false match, and said (``problem``)."""
    if not _valid_id(log_id):
        return CompanionLog({}, MISSING)
    path = directory / f"{log_id}.jsonl"
    found: dict[str, list[list[str]]] = {}
    bad = first_bad = whole = 0
    torn = False
    lines = _Lines(path)
    for number, line in enumerate(lines, 1):
        if not line.endswith(b"\n"):  # the last: never taken, even where it parses
            torn = True
        elif not _take(found, line):
            bad += 1
            first_bad = first_bad or number
        whole += not torn
    problem = lines.problem
    if bad and not problem:
        problem = (f"has {bad} line(s) that do not parse or are out of order (the first: line "
                   f"{first_bad})")
    elif torn and not problem:
        problem = CUT_SHORT if whole else NO_LINE
    return CompanionLog(found, problem, path)


def _take(found: dict[str, list[list[str]]], line: bytes) -> bool:
    """One line into ``found``: whether it was a digest of the next batch of its stream."""
    try:
        rec = json.loads(line)
        name, index, value = rec["p"], rec["i"], rec["d"]
    except (ValueError, TypeError, KeyError, RecursionError):
        return False
    batches = found.get(str(name), [])
    if type(index) is not int or index != len(batches) or not isinstance(value, list):
        return False  # out of order, a gap, another type: never a digest of another batch
    found[str(name)] = batches
    batches.append([str(v) for v in value])
    return True


class _Lines:
    """The lines of a companion file if it is a regular file (a device, a
    FIFO, a directory or a link is never read), up to the first longer than
    _LINE_MAX and at most _COMPANION_MAX bytes in all; ``problem`` says why
    it stopped short (after iteration)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.problem = ""

    def __iter__(self) -> Iterator[bytes]:
        try:
            opened = plain_file.open_regular(self.path)
        except FileNotFoundError:
            self.problem = MISSING
            return
        except plain_file.Unreadable as exc:
            self.problem = (f"is {exc.why} (not read)" if exc.why in (
                plain_file.LINK, plain_file.NOT_REGULAR) else f"cannot be read ({exc.why})")
            return
        with opened as f:
            yield from self._read(f)

    def _read(self, f: Any) -> Iterator[bytes]:
        left = _COMPANION_MAX
        try:
            while left > 0:
                line = f.readline(min(_LINE_MAX + 1, left))
                if not line:
                    return
                if len(line) > _LINE_MAX:
                    self.problem = "has a line longer than 1 MB (it and those after not read)"
                    return
                left -= len(line)
                yield line
            if f.read(1):
                self.problem = "is longer than 64 MB (the rest not read)"
        except OSError as exc:
            self.problem = f"cannot be read ({exc.strerror or exc})"


def dynamic_stream(checkpoint: str, reader: str) -> str:
    """The stream name of reader ``reader`` registered on dynamic-mode
    Checkpoint ``checkpoint`` (Checkpointer.dynamic's name)."""
    return f"{checkpoint}/{reader}"


def streams_of(manifest: dict[str, Any]) -> set[str]:
    """The streams a checkpoint recorded digests for (each has a record)."""
    return {name for name, rec in _records(manifest) if isinstance(rec, dict)}


def _records(manifest: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(stream, its ``batches`` record) for each pipeline entry and each
    dynamic-mode reader (under its Checkpoint's entry: ``batches`` maps the
    reader's name to its record)."""
    for name, entry in (manifest.get("pipelines") or {}).items():
        if isinstance(entry, dict):
            yield name, entry.get(KEY)
    for dname, entry in (manifest.get("dynamic") or {}).items():
        readers = entry.get(KEY) if isinstance(entry, dict) else None
        if isinstance(readers, dict):
            for reader, rec in readers.items():
                yield dynamic_stream(dname, reader), rec


def from_manifest(manifest: dict[str, Any], log_id: str) -> dict[str, list[list[str]]]:
    """The digests a later checkpoint's manifest holds for the batches after
    checkpoint ``log_id``, by stream (pipeline or dynamic-mode reader)."""
    found = {}
    for name, rec in _records(manifest):
        if isinstance(rec, dict) and rec.get("previous") == log_id:
            found[name] = [list(b) for b in rec.get("digests") or []]
    return found


def from_rows(path: str, candidates: Iterable[dict[str, Any]], log_id: str,
              repo: str | None = None) -> dict[str, list[list[str]]]:
    """The digests for the batches after checkpoint ``log_id``, from the
    first of the ``candidates`` rows whose manifest holds them: where they
    are when the companion file is not (another machine, after `dvc exp
    pull`)."""
    from ..reading.loading import load

    for row in candidates:
        try:
            manifest = load(path, rev=row, repo=repo, names=[]).manifest
        except Exception as exc:  # noqa: BLE001 (evidence: a row not read proves nothing)
            logger.debug("batch digests of %s not read: %s", row.get("name"), exc)
            continue
        found = from_manifest(manifest, log_id)
        if found:
            return found
    return {}


def log_id_of(manifest: dict[str, Any]) -> str | None:
    """The batch-log id of a checkpoint (the same for each of its streams)."""
    for _name, rec in _records(manifest):
        if isinstance(rec, dict) and _valid_id(rec.get("log")):
            return rec["log"]
    return None


def records(recorder: Recorder, pipelines: Iterable[str],
            readers: dict[str, tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """At a save (one :meth:`Recorder.checkpoint`: one new segment), the
    ``batches`` field of each manifest entry it annotates, by manifest part
    and entry: ``{"pipelines": {pipeline: record}, "dynamic": {Checkpoint
    name: {reader name: record}}}``. A pipeline's record goes in its own
    entry; a dynamic-mode reader's (``readers``: stream -> (Checkpoint name,
    reader name)) in its Checkpoint's entry, by reader name: the manifest's
    ``dynamic`` part holds what is saved of dynamic mode, and a reader is no
    pipeline. Only streams tracked get one."""
    entries: dict[str, dict[str, Any]] = {name: {} for name in pipelines}
    streams: dict[str, dict[str, Any]] = {stream: {} for stream in readers}
    recorder.checkpoint({**entries, **streams})
    out: dict[str, dict[str, Any]] = {
        "pipelines": {name: entry[KEY] for name, entry in entries.items() if KEY in entry},
        "dynamic": {}}
    for stream, entry in streams.items():
        if KEY in entry:
            dname, reader = readers[stream]
            out["dynamic"].setdefault(dname, {})[reader] = entry[KEY]
    return out


def _new_log_id() -> str:
    """32 hex digits: the time (ns) first, so names sort in creation order."""
    return f"{time.time_ns():016x}{uuid.uuid4().hex[:16]}"


def _prune(directory: Path) -> None:
    """The oldest companion files beyond the newest _KEEP_LOGS go: ordered by
    name (the id's time), one listdir, no stat a file (it runs at each save)."""
    try:
        logs = sorted(n for n in os.listdir(directory) if n.endswith(".jsonl"))
        for old in logs[:-_KEEP_LOGS]:
            (directory / old).unlink(missing_ok=True)
    except OSError:
        pass


# -- the recorder --------------------------------------------------------------
class _DigestThread:
    """The thread of a process that digests batches while they train: jobs
    run in the order they were handed in. Handing one in is a put on a
    C queue and the wake-up of this thread (about 10 us of the training
    thread on a busy 2-core machine; a ThreadPoolExecutor's submit, with
    its Future and locks, measured 20-30). At the interpreter's exit the
    jobs handed in are finished first (:meth:`drain`)."""

    NAME = "dvc-dali-batch-digest"

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=self.NAME, daemon=True)
        self._thread.start()
        # recorders whose GPU batches may wait in a group: handed over at a drain
        self.recorders: weakref.WeakSet[Recorder] = weakref.WeakSet()
        atexit.register(self.drain)

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception as exc:  # noqa: BLE001 (a digest is evidence, not a reason to fail)
                logger.warning("a batch digest was not recorded (%s)", exc)
            del job  # not kept while waiting: it holds its Recorder (and its open file)

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait for the jobs handed in so far, the groups waiting in recorders
        handed over first (not in a forked child, where the thread does not
        exist); False if they took longer than
        ``timeout``. The thread then holds none of them."""
        if not self._thread.is_alive():
            return True
        for recorder in list(self.recorders):
            recorder.hand_over()
        done = threading.Event()
        self._jobs.put(done.set)
        return done.wait(timeout)


def _digest_thread() -> _DigestThread:
    if STATE.digest_pool is None:
        STATE.digest_pool = _DigestThread()
    return STATE.digest_pool


@dataclass
class Costs:
    """What a Recorder's digests cost, for benchmark 16: ``batches`` seen;
    ``caller_s``: wall seconds spent on the thread that produced them (the
    training thread: the wrapper's work after DALI returned, a comparison,
    a wait for the previous digest); ``background``: batches digested on
    the digest thread, ``background_cpu_s`` the CPU seconds it spent on
    them (digest, companion line); ``groups``: how many launches the
    grouped (GPU) batches took."""

    batches: int = 0
    caller_s: float = 0.0
    background: int = 0
    background_cpu_s: float = 0.0
    groups: int = 0  # GPU groups handed to the digest thread


class _Expected:
    """The digests a resume compares with, per pipeline, until they run out."""

    def __init__(self, batches: dict[str, list[list[str]]], step: int, why: Callable[[str], str],
                 where: str) -> None:
        self.batches = batches
        self.step = step
        self.why = why  # pipeline name -> what changed since, for the message
        self.where = where


class Recorder:
    """The batch digests of one Checkpointer's streams: its DALI pipelines
    (:meth:`watch`), and the TF datasets and dynamic-mode readers that hand
    their batches in (:meth:`track`, :meth:`observe`)."""

    def __init__(self, directory: Path, limit: int, inexact: bool,
                 elsewhere: Sequence[Path] = ()) -> None:
        self.directory = directory  # where its segments' companion files go
        # where else a resumed segment's may be, written before a `.dvc`
        # appeared or went above the checkpoint (companion_dirs)
        self.elsewhere = tuple(elsewhere)
        self.limit = limit  # batches digested after each checkpoint; ALL; 0: off
        self.inexact = inexact
        self.log_id: str | None = None  # the checkpoint the batches follow
        self._held: set[str] = set()  # the streams that checkpoint holds
        self._done: dict[str, list[list[str]]] = {}  # this segment's first digests
        self._recorded: dict[str, int] = {}  # this segment's digests so far
        self._count: dict[str, int] = {}
        self._kinds: dict[str, str] = {}  # stream -> what a message calls it
        self._expected: _Expected | None = None
        # the companion file, open for appending from its segment's start
        # until the segment ends (an open and a close a batch cost ~60 us of
        # CPU on a loaded machine); opened by the digest thread right after
        # the save, so a save does not pay it; None: not open yet, or the
        # manifest only
        self._log: _Companion | None = None
        self._log_path: Path | None = None  # where it goes; None: the manifest only
        self._lock = threading.Lock()
        # held from a batch's (or group's) hand-over to the digest thread until
        # its digests are appended: one at a time, appended in order
        self._busy = threading.Lock()
        self._flushing = threading.Lock()  # a group handed over by one thread at a time
        self._pending: list[tuple[str, int, Any]] = []  # a GPU group waiting for its hand-over
        self._group_max = 1  # until a group's bytes are known
        self._last = float("-inf")  # when the last grouped batch was handed in
        self._first = 0.0  # when the group waiting began
        self._grouped: dict[str, bool] = {}  # stream -> its batches go in groups
        self.costs = Costs()
        self._checks: dict[str, list[Check]] = {}  # a resume's comparisons, until said
        self._failures_said: set[str] = set()  # streams whose failed digest was said
        self._companion_said = False  # that the companion file could not be written
        self._segments = 0  # checkpoints so far: the companion files are pruned every few
        # DVC_DALI_INEXACT=1 past a difference: nothing more goes into the segment
        self._diverged = False
        # the mismatch :meth:`observe` raised last: where it was raised in a
        # thread of TensorFlow's, the caller gets TF's error and raises this
        self.failure: BatchMismatchError | None = None

    @property
    def on(self) -> bool:
        return self.limit != 0

    def resume(self, log_id: str | None, batches: dict[str, list[list[str]]], step: int,
               why: Callable[[str], str], where: str, held: Iterable[str],
               log_dir: Path | None = None) -> None:
        """Continue the segment after the resumed checkpoint, which holds the
        streams ``held``: compare with what it recorded (``batches``, of those
        streams), append what it did not, to its companion file in
        ``log_dir`` (where it was found; default: :attr:`directory`)."""
        if not self.on or log_id is None:
            return
        self.log_id = log_id
        self._held = set(held)
        batches = {name: b for name, b in batches.items() if name in self._held}
        self._done = {name: list(b[:MANIFEST_MAX]) for name, b in batches.items()}
        self._recorded = {name: len(b) for name, b in batches.items()}
        self._expected = _Expected(batches, step, why, where)
        self._checks = {}
        self._diverged = False
        self._start_log(log_dir)
        if batches:
            _say_at_exit(self)

    def say_compared(self) -> None:
        """Say what the resume compared of each stream whose recorded
        digests did not run out (a close, a save, the interpreter's exit)."""
        for name in list(self._checks):
            self._say(name)

    def watch(self, name: str, pipe: Any, dynamic_executor: bool) -> None:
        """Digest each batch ``pipe`` returns from ``outputs()`` and
        ``share_outputs()`` (``run()`` and the iterators go through them);
        ``dynamic_executor``: the batches stay valid while referenced, so a
        GPU batch's kernel may be launched later, in a group."""
        if not self.track(name):
            return
        if not dynamic_executor:  # else decided at its first batch (_grouped_stream)
            self._grouped[name] = False
        for method in ("outputs", "share_outputs"):
            original = getattr(pipe, method)
            setattr(pipe, method, self._wrapped(name, original))

    def track(self, name: str, kind: str = "pipeline") -> bool:
        """Digest the batches of stream ``name`` (handed in by :meth:`observe`
        unless :meth:`watch` wraps its pipeline); False when digests are off."""
        if not self.on:
            return False
        self._kinds[name] = kind
        self._count.setdefault(name, 0)
        self._done.setdefault(name, [])
        return True

    def _wrapped(self, name: str, original: Callable[..., Any]) -> Callable:
        def produce(*args: Any, **kwargs: Any) -> Any:
            outputs = original(*args, **kwargs)
            self._on_batch(name, outputs, deferred=False)
            return outputs

        return produce

    def observe(self, name: str, batch: Sequence[Any],
                digest_of: Callable[[Any], list[str]], deferred: bool = False) -> None:
        """One batch of a tracked stream (``digest_of(batch)``: its digest),
        compared when resuming, before it is used; else recorded, at once or,
        ``deferred`` (nothing writes into the batch's arrays while referenced:
        a TensorFlow element's), on the digest thread."""
        if not self.on:
            return
        try:
            self._on_batch(name, batch, deferred, digest_of)
        except BatchMismatchError as exc:
            self.failure = exc
            raise

    def _on_batch(self, name: str, outputs: Any, deferred: bool,
                  digest_of: Callable[[Any], list[str]] | None = None) -> None:
        start = time.perf_counter()
        try:
            self._batch(name, outputs, deferred, digest_of)
        finally:
            self.costs.batches += 1
            self.costs.caller_s += time.perf_counter() - start

    def _batch(self, name: str, outputs: Any, deferred: bool,
               digest_of: Callable[[Any], list[str]] | None) -> None:
        index = self._count[name]
        if digest_of is None and self._grouped_stream(name, outputs) \
                and self._records(name, index):
            self._count[name] = index + 1
            self._hand_in(name, index, outputs)
            return
        # No batch is handed out before the digests of those before it are
        # written, past the limit too: a kill then loses at most the digests
        # in flight (or waiting in a group), never one a later batch followed.
        self._settle()
        self._count[name] = index + 1
        if self._skipped(name, index):
            return
        digest_of = digest if digest_of is None else digest_of
        expected = self._expected_of(name)
        if index < len(expected):
            self._compare(name, index, expected, outputs, digest_of)
        elif deferred:
            self._in_background(name, index, lambda: digest_of(outputs))
        else:
            self._append(name, index, self._digest(name, index, lambda: digest_of(outputs)))

    def _skipped(self, name: str, index: int) -> bool:
        """Batch ``index`` of ``name`` is neither compared nor recorded: before
        the first checkpoint, a stream that checkpoint does not hold
        (registered after it: a resume from it starts the stream afresh, so
        its batches there are not those a resume compares), past a difference
        let through, past the limit."""
        return (self.log_id is None or name not in self._held or self._diverged
                or (self.limit != ALL and index >= self.limit))

    def _records(self, name: str, index: int) -> bool:
        """Batch ``index`` of ``name`` is to be recorded (not compared, not skipped)."""
        return not self._skipped(name, index) and index >= len(self._expected_of(name))

    def _expected_of(self, name: str) -> list[list[str]]:
        """The recorded digests a resume compares ``name``'s batches with."""
        return self._expected.batches.get(name, []) if self._expected else []

    def _grouped_stream(self, name: str, outputs: Sequence[Any]) -> bool:
        """A pipeline with a GPU output: its batches go in groups (looked at once)."""
        grouped = self._grouped.get(name)
        if grouped is None:
            grouped = self._grouped[name] = GROUP_ON_CPU or any(_on_device(o) for o in outputs)
            if grouped:  # so that the interpreter's exit hands its group waiting over
                _digest_thread().recorders.add(self)
        return grouped

    def _hand_in(self, name: str, index: int, outputs: Any) -> None:
        """A GPU batch joins the group waiting, its host outputs hashed now
        (a step may write into them once it has them); the group goes to the
        digest thread once full or a window old, or at once when this batch
        came late."""
        held = [o if _on_device(o) else _Hashed(o) for o in outputs]
        now = time.perf_counter()
        with self._lock:
            if not self._pending:
                self._first = now
            self._pending.append((name, index, held))
            waiting = len(self._pending)
        gap, self._last = now - self._last, now
        if group_goes(waiting, self._group_max, now - self._first, gap):
            self.hand_over()

    def hand_over(self) -> None:
        """The group waiting goes to the digest thread, once the one before is
        done (when full, at a save, a wait, a close and the interpreter's
        exit: :meth:`_DigestThread.drain`)."""
        with self._flushing:
            with self._lock:
                group, self._pending = self._pending, []
            if not group:
                return
            self._busy.acquire()
            try:
                _digest_thread().submit(lambda: self._background_group(group))
            except BaseException:
                self._busy.release()
                raise

    def _background_group(self, group: list[tuple[str, int, Any]]) -> None:
        start = time.thread_time()
        try:
            try:
                values, nbytes = begin_group([outputs for _, _, outputs in group])()
                self._group_max = group_size(nbytes / len(group))
            except Exception as exc:  # noqa: BLE001 (a digest is evidence, not a reason to fail)
                values = [self._failed(name, index, exc) for name, index, _ in group]
            self._append_all([(name, index, value)
                              for (name, index, _), value in zip(group, values)])
        finally:
            self.costs.background += len(group)
            self.costs.groups += 1
            self.costs.background_cpu_s += time.thread_time() - start
            self._busy.release()

    def _compare(self, name: str, index: int, expected: list[list[str]], outputs: Any,
                 digest_of: Callable[[Any], list[str]]) -> None:
        """Resuming: batch ``index`` against its recorded digest, before it is used."""
        try:
            got = digest_of(outputs)
        except Exception as exc:  # noqa: BLE001 (nothing told: not verified, said)
            logger.debug("batch digest of %r failed: %r", name, exc)
            got = failed_marker(exc)
        found = check(expected[index], got)
        self._check(name, index, found)
        if self._expected is None:  # DVC_DALI_INEXACT=1: said; the segment left
            return
        self._checks.setdefault(name, []).append(found)
        if found.outcome == NOT_VERIFIED and _failed(got) is None:
            self._replace(name, index, got)
        if index + 1 == len(expected):
            self._say(name)

    def _say(self, name: str) -> None:
        """Said once for a stream, when its recorded digests run out (or at
        the next save): which batches matched, which were not verified and
        why; only where all matched, the proof."""
        checks = self._checks.pop(name, [])
        if not checks or self._expected is None:
            return
        proven, line = summary(self._kinds.get(name, "pipeline"), name,
                               self._expected.step, checks)
        (logger.info if proven else logger.warning)("%s", line)

    def _replace(self, name: str, index: int, value: list[str]) -> None:
        """A batch not verified: the next checkpoint's manifest gets this
        run's digest of it (the batch this run trained on), of the current
        algorithm, in place of the one that could not be compared."""
        with self._lock:
            done = self._done.get(name, [])
            if index < len(done):
                done[index] = value

    def _digest(self, name: str, index: int, compute: Callable[[], list[str]]) -> list[str]:
        """A batch's digest while recording; one that raises is recorded as
        failed (a resume says that batch is not verified), said once a stream."""
        try:
            return compute()
        except Exception as exc:  # noqa: BLE001 (a digest is evidence, not a reason to fail)
            return self._failed(name, index, exc)

    def _failed(self, name: str, index: int, exc: Exception) -> list[str]:
        with self._lock:
            first = name not in self._failures_said
            self._failures_said.add(name)
        if first:
            logger.warning(
                "%s %r: the digest of batch %d after the last checkpoint failed (%s: %s); "
                "it is recorded as failed, so a resume from that checkpoint will say that "
                "batch is not verified (said once: later failures are recorded the same "
                "way)", self._kinds.get(name, "pipeline"), name, index + 1,
                type(exc).__name__, exc)
        return failed_marker(exc)

    def _check(self, name: str, index: int, found: Check) -> None:
        if found.outcome != DIFFERS:
            return
        diff = list(found.lines)
        exp = self._expected
        step = exp.step + index + 1
        changed = exp.why(name)
        kind = self._kinds.get(name, "pipeline")
        if self.inexact:
            logger.warning("%s %r produced another batch %d after the checkpoint at step "
                           "%d than the run it resumes (%s); continuing on purpose "
                           "(DVC_DALI_INEXACT=1): this run is no longer exact", kind, name,
                           index + 1, exp.step, "; ".join(diff))
            self._expected = None  # said once; nothing more is compared
            self._leave_segment(name, index)
            return
        self._checks.clear()  # the refusal is what is said (not the batches before it, at close)
        raise BatchMismatchError(
            f"{kind} {name!r}: batch {index + 1} after the checkpoint at step {exp.step} "
            f"({exp.where}; step {step} where it gives one batch a step) differs from the one "
            f"the run it resumes produced, so the training would not be exact; refused before "
            f"it trains on it:\n  " + "\n  ".join(diff) + f"\n  since then: {changed}\n"
            "Restore what changed (the data with `dvc checkout`, the DALI "
            "version, the pipeline code) to resume, or start over with `dvc-dali reset`; to "
            "continue on purpose, knowing the run is no longer exact, set DVC_DALI_INEXACT=1.")

    def _leave_segment(self, name: str, index: int) -> None:
        """DVC_DALI_INEXACT=1, batch ``index`` of ``name`` differs: this run no
        longer produces what followed the resumed checkpoint, so it writes
        nothing more into that segment (its companion file is read by every
        later resume from the checkpoint), and the next manifest's record of
        it keeps only the batches produced before the difference. The next
        save starts a fresh segment."""
        self.leave_segment({name: index})

    def leave_segment(self, cut: dict[str, int] | None = None) -> None:
        """The run left the resumed checkpoint's segment on purpose: at batch
        ``cut[name]`` of a stream whose batch differed, or where each stream
        is now (a data change let through when a pipeline is restored, before
        its first batch: DVC_DALI_INEXACT=1). Its later batches would
        otherwise be appended as those that followed the checkpoint, and an
        exact resume from it be refused for the data it put back (found by a
        sweep)."""
        cut = cut or {}
        with self._lock:
            self._diverged = True
            self._close_log()
            for stream, done in self._done.items():
                del done[cut.get(stream, self._count.get(stream, 0)):]

    def _settle(self) -> None:
        """Hand the group waiting over and wait for the digests in flight (one
        batch's or one group's), so the digests are appended in order."""
        if not self._pending and not self._busy.locked():  # nothing in flight: a resume's case
            return
        self.hand_over()
        with self._busy:
            pass

    def _in_background(self, name: str, index: int, compute: Callable[[], list[str]]) -> None:
        """Hand the batch's digest to the digest thread, once the previous one
        is done (almost always already: a digest takes a fraction of a step)."""
        self._busy.acquire()
        try:
            _digest_thread().submit(lambda: self._background(name, index, compute))
        except BaseException:
            self._busy.release()
            raise

    def _background(self, name: str, index: int, compute: Callable[[], list[str]]) -> None:
        start = time.thread_time()
        try:
            self._append(name, index, self._digest(name, index, compute))
        finally:
            self.costs.background += 1
            self.costs.background_cpu_s += time.thread_time() - start
            self._busy.release()

    def _append(self, name: str, index: int, value: list[str]) -> None:
        self._append_all([(name, index, value)])

    def _append_all(self, entries: list[tuple[str, int, list[str]]]) -> None:
        """Batches' digests, in order: into the manifest's record and the
        companion file (one write for them all)."""
        lines = []
        with self._lock:
            for name, index, value in entries:
                if index != self._recorded.get(name, 0):
                    continue  # out of order: never (one in flight, settled at each checkpoint)
                self._recorded[name] = index + 1
                done = self._done.setdefault(name, [])
                if len(done) < MANIFEST_MAX:
                    done.append(value)
                lines.append(json.dumps({"p": name, "i": index, "d": value}) + "\n")
            log = self._opened() if lines else None
            if log is not None:
                try:
                    log.write("".join(lines).encode())
                except OSError as exc:
                    where = self._log_path
                    self._close_log()  # the manifest still gets them
                    self._companion_failed(exc, where)

    def _start_log(self, directory: Path | None = None) -> None:
        """The segment's companion file, to be made by the digest thread
        (:meth:`_make_log`), or by the segment's first line; a resumed one
        goes on in ``directory``, where it was found."""
        self._close_log()
        self._log_path = (directory or self.directory) / f"{self.log_id}.jsonl"

    def _make_log(self, path: Path | None) -> None:
        """The companion file of the segment a save began, made on the digest
        thread: opened while the segment lasts; made empty where it ended
        already (a close or another save right after it: no batch followed)."""
        if path is None:
            return
        with self._lock:
            if self._log_path == path:
                self._opened()
                return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            _Companion(path, self).close()
        except OSError:
            pass  # as for no file: the resume says its digests were not found

    def _opened(self) -> _Companion | None:
        """The companion file open for appending; None when it cannot be (said once)."""
        if self._log is None and self._log_path is not None:
            try:
                self._log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log = _Companion(self._log_path, self)
            except OSError as exc:
                where, self._log_path = self._log_path, None
                self._companion_failed(exc, where)
        return self._log

    def _companion_failed(self, exc: OSError, path: Path | None) -> None:
        """Said once a process: the digests after a checkpoint live only in
        the next one's manifest, so a resume after a kill cannot compare."""
        if self._companion_said:
            return
        self._companion_said = True
        logger.warning("batch digests cannot be kept in %s (%s): a run killed before its next "
                       "checkpoint will resume unverified; fix that directory's permissions "
                       "or free space", path.parent if path else self.directory, exc)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        self._log_path = None

    def wait(self) -> None:
        """Wait for the digest in flight (at a close)."""
        self._settle()

    def close(self) -> None:
        """Wait for the digest in flight, say what a resume compared whose
        digests did not run out (a run ending before its next save), and
        close the companion file."""
        self._settle()
        self.say_compared()
        with self._lock:
            self._close_log()

    def checkpoint(self, entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """At a save: the digests since the previous checkpoint go into each
        pipeline's manifest entry, and a new segment begins."""
        if not self.on:
            return entries
        self._settle()
        self.say_compared()  # compared, the digests not run out: said now
        with self._lock:
            new_id = _new_log_id()
            for name, entry in entries.items():
                if name in self._count:
                    entry[KEY] = {"log": new_id, "previous": self.log_id,
                                  "digests": self._done.get(name, [])
                                  if self.log_id is not None else []}
            self.log_id = new_id
            self._held = set(self._count)  # a stream registered later waits for the next
            self._done = {name: [] for name in self._count}
            self._recorded = dict.fromkeys(self._count, 0)
            self._count = dict.fromkeys(self._count, 0)
            self._expected = None
            self._diverged = False
            self._start_log()
            path = self._log_path
        # made now, empty, off the training thread (jobs run in order, so
        # before the segment's first line): a resume then tells a checkpoint
        # no batch followed (an empty file) from digests lost (no file)
        _digest_thread().submit(lambda: self._make_log(path))
        if self._segments % _PRUNE_EVERY == 0:
            directory = self.directory  # off the training thread: an unlink takes ~0.5 ms here
            _digest_thread().submit(lambda: _prune(directory))
        self._segments += 1
        return entries


def _say_at_exit(recorder: Recorder) -> None:
    """A resume that ends before its recorded digests ran out, without a
    save or ``close()`` (the README's scripts call neither at their end),
    said nothing of what it compared (found by a sweep): at the
    interpreter's exit, each such Recorder says it (not in a child forked
    later, whose Recorders are its parent's)."""
    if not STATE.resumed_hook_installed:
        from ..core import exit_hooks

        STATE.resumed_hook_installed = True
        atexit.register(exit_hooks.this_process_only(_say_all))
    STATE.resumed_recorders.add(recorder)


def _say_all() -> None:
    for recorder in list(STATE.resumed_recorders):
        recorder.say_compared()


def digest_dynamic(outputs: Sequence[Any]) -> list[str]:
    """A dynamic-mode batch (dali_dynamic.digest_outputs): a host output, the
    list of its samples' arrays, as :func:`digest_arrays` digests it; a GPU
    output (a TensorListGPU) on the device, as :func:`digest` does."""
    gpu = [o for o in outputs if _on_device(o)]
    on_device = iter(begin(gpu)() if gpu else [])
    on_host = iter(digest_arrays([o for o in outputs if not _on_device(o)]))
    return [next(on_device) if _on_device(o) else next(on_host) for o in outputs]


class _Companion:
    """A segment's companion file, open for appending: each line one
    O_APPEND write (no fsync: a kill loses no line written); closed at the
    next segment, at the Checkpointer's close, or when its Recorder is
    collected, so none is left open."""

    def __init__(self, path: Path, owner: Any) -> None:
        # a FIFO, a link (ELOOP), a directory or a device there is refused,
        # not written through nor waited on (read too: _cut_torn_line)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
                     | os.O_NOFOLLOW, 0o644)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        os.set_blocking(fd, True)
        self.fd = fd
        self._finalizer = weakref.finalize(owner, os.close, self.fd)
        _cut_torn_line(fd)

    def write(self, line: bytes) -> None:
        os.write(self.fd, line)

    def close(self) -> None:
        self._finalizer()


def _cut_torn_line(fd: int) -> None:
    """A segment continued by a resume: its file's last line, torn by the
    kill (no newline: read_log ignores it), is cut, so the first line
    appended starts a line of its own instead of ending the torn one (one
    line neither parses, and the later ones read as out of order: found by a
    sweep). Where no newline is near the end (no file dvc-dali wrote), a
    newline is written first instead."""
    size = os.fstat(fd).st_size
    if not size:
        return
    start = max(0, size - _LINE_MAX - 1)
    tail = os.pread(fd, size - start, start)
    if tail.endswith(b"\n"):
        return
    cut = tail.rfind(b"\n")
    if cut < 0 and start > 0:
        os.write(fd, b"\n")
    else:
        os.ftruncate(fd, start + cut + 1)


# a tf_dataset's transform= runs in TensorFlow, whose random state the
# checkpoint of the iterator does not hold
TF_RANDOM = ("a random operation in tf_dataset(transform=) (tf.random.*, or a shuffle "
             "or map drawing without a seed: its state is not saved)")


def what_changed(saved_versions: dict[str, Any], now_versions: dict[str, Any],
                 data_lines: Iterable[str], causes: Sequence[str] = ()) -> str:
    """'DALI 2.4.0 -> 2.3.0; data ...', and where the data's listing cannot
    tell, the causes that remain (a version change may not be the one);
    ``causes``: more of them, of this kind of stream. dvc-dali's own version
    is named where it changed: an upgrade may digest batches another way."""
    parts = [f"{label} {saved_versions[key]} -> {now_versions.get(key)}"
             for key, label in (("dali", "DALI"), ("dvc_dali", "dvc-dali"))
             if saved_versions.get(key) and saved_versions[key] != now_versions.get(key)]
    data = list(data_lines)
    if not data:
        same_dali = not parts or not parts[0].startswith("DALI ")
        unchanged = ("the DALI version, the data files' names and sizes and the pipeline's "
                     "description are unchanged" if same_dali else "the data files' names "
                     "and sizes and the pipeline's description are unchanged")
        more = "".join(f", {cause}" for cause in causes)
        data = [f"{unchanged}; a file rewritten in place with its old size, a changed "
                f"external_source callable, plugin or custom operator, another kind of "
                f"device{more}, or the training step writing into the batch in place would do "
                "this"]
    return "; ".join(parts + data)
