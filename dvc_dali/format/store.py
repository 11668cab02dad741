"""The on-disk checkpoint format and its crash-safe publication.

    <checkpoint dir>/             the stage's `checkpoint: true` / `persist: true` output
      LATEST                      "<snapshot name> <md5 of its manifest.json>"
      step-000000120-1a2b3c4d/    one complete snapshot
        manifest.json             format, step, versions, pipelines, arrays, digests
        pipelines/<n>.dali        DALI state bytes, one file per pipeline
        arrays/<n>.npy            user arrays of 1 MiB or more, .npy without pickle
        arrays/<n>.pack           the smaller ones, each at its manifest "offset"
        dynamic/<n>.json          DALI dynamic-mode checkpoints

A snapshot is written into `.tmp-*`, fsynced, renamed to `step-*` (atomic),
and only then does LATEST move to it (atomic replace). A crash at any instant
leaves LATEST naming a complete snapshot; the next save removes leftovers.
No file is ever written in place (new files, O_EXCL; LATEST renamed over;
old snapshots unlinked): a checkpoint DVC checked out as links into its
cache (`cache.type symlink` or `hardlink`) is never written through.

Reading treats the directory as input from outside: every file is lstat'ed
before it is opened and must be a regular file of the size the manifest
says (LATEST at most 1 MiB, manifest.json at most 64 MiB), opened with
O_NOFOLLOW | O_NONBLOCK relative to its directory (no symlink anywhere below
the checkpoint directory is followed, no FIFO blocks; but a file that is a
link to a DVC cache object, as DVC checks files out under `cache.type
symlink`, is read from that object, opened the same way: cache_links.py);
the manifest is
parsed with a depth limit (safe_json) and validated whole
(manifest_schema) before anything uses it; each .npy header is checked
against the manifest before its array is allocated (npy).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
import stat
import threading
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import arrays as arrays_mod
from ..core import atomic_file
from . import cache_links, manifest_schema, npy, safe_json
from ..core.errors import (ArgumentTypeError, CheckpointCorruptError, CheckpointWriteError,
                           ConfigError, RankMismatchError)
from ..core.process_state import STATE

FORMAT = manifest_schema.FORMAT
FORMAT_VERSION = manifest_schema.FORMAT_VERSION
PACK_BELOW, PACK_MAX = manifest_schema.PACK_BELOW, manifest_schema.PACK_MAX
_PACK_ALIGN = 64  # where each array in a pack starts: as NumPy aligns its own
LATEST = "LATEST"
MANIFEST = "manifest.json"
# Checked before either is read: both are read whole.
LATEST_MAX_BYTES = 1 << 20  # one ~60-byte line per rank
MANIFEST_MAX_BYTES = 64 << 20  # ~150,000 arrays
_SNAPSHOT_NAME = re.compile(r"^step-\d{9,}-[0-9a-f]{8}$")
_MD5 = manifest_schema.MD5
_LATEST_ENTRY = re.compile(r"^(rank-\d{5}/)?step-\d{9,}-[0-9a-f]{8}$")
_FIX = manifest_schema.FIX
# The largest step (and total_steps) the reader takes (manifest_schema's
# integers: what an off_t holds); the writer refuses more, before any file.
MAX_STEP = (1 << 63) - 1
# Never follow a symlink, never block on a FIFO; fstat then tells what was opened.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


_CHUNK = 16 << 20
# From this size on, a file's md5 is computed on a helper thread while this
# one writes it (hashlib and the syscalls release the GIL).
PARALLEL_HASH_BYTES = 4 << 20


def crc32_function() -> Callable[[Any, int], int]:
    """zlib's crc32 (~4 GB/s here), or the same CRC-32 from ISA-L or zlib-ng
    where either is installed (`isal`, a dependency: ~25 GB/s, carry-less
    multiplication): a 1 GB restore then spends 0.04 s on it, not 0.26 s."""
    global _crc32
    if _crc32 is None:
        _crc32 = zlib.crc32
        for module in ("isal.isal_zlib", "zlib_ng.zlib_ng"):
            try:
                fast = __import__(module, fromlist=["crc32"]).crc32
            except (ImportError, AttributeError):
                continue
            if fast(b"123456789", 0) == zlib.crc32(b"123456789"):  # the same polynomial
                _crc32 = fast
                break
    return _crc32


_crc32: Callable[[Any, int], int] | None = None


class _Crc32:
    """zlib.crc32 with hashlib's update/hexdigest (it releases the GIL too)."""

    def __init__(self) -> None:
        self.value = 0
        self._fn = _crc32 or crc32_function()

    def update(self, data: Any) -> None:
        self.value = self._fn(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


# A member file's digests. Reads check the CRC-32: it catches the same
# accidental damage as md5 at ~8x its speed (a forger recomputes either).
# Under dvc exp run the md5 is computed too, while writing: it is DVC's own
# hash, handed to DVC when the checkpoint is recorded, so DVC does not read
# the files again. (Format 1 files have only an md5, which reads then check.)
HASHERS: dict[str, Callable[[], Any]] = {"md5": hashlib.md5, "crc32": _Crc32}


# From this size on, a file's writeback is started as soon as it is written:
# below it the snapshot's fsyncs follow within a millisecond, and the call
# cost more (~40 us of CPU a file) than it saved.
WRITEBACK_FROM = 1 << 20


def _start_writeback(fd: int, size: int) -> None:
    """Ask the kernel to start writing the file out now (Linux), so the
    fsync at the end of the snapshot finds most of it on disk already."""
    if size >= WRITEBACK_FROM and _sync_file_range is not None:
        _sync_file_range(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE; its errors do not matter


def _libc_sync_file_range() -> Callable[..., int] | None:
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    return fn


_sync_file_range = _libc_sync_file_range()


def _write_all(fd: int, parts: list, crc: _Crc32) -> None:
    """Write parts in order, each CRC'd while in the CPU's cache. Parts below
    _CHUNK go out together in writev calls (a pack of 17 small arrays took
    27 write calls), larger ones a _CHUNK at a time."""
    small: list[memoryview] = []
    for x in parts:
        view = memoryview(x).cast("B")
        if len(view) < _CHUNK:
            crc.update(view)
            small.append(view)
            continue
        _writev_all(fd, small)
        for start in range(0, len(view), _CHUNK):
            chunk = view[start:start + _CHUNK]
            crc.update(chunk)  # while the chunk is in the CPU's cache
            _writev_all(fd, [chunk])
    _writev_all(fd, small)


_IOV_MAX = 1024  # buffers one writev takes (Linux)


def _writev_all(fd: int, views: list[memoryview]) -> None:
    """Write every byte of ``views`` in order, however little each writev
    takes; ``views`` is emptied."""
    i = 0
    while i < len(views):
        written = os.writev(fd, views[i:i + _IOV_MAX])
        if written == 0 and len(views[i]):  # never for a file; not a loop for ever
            raise OSError(errno.EIO, "write wrote nothing")
        while i < len(views) and written >= len(views[i]):
            written -= len(views[i])
            i += 1
        if written:
            views[i] = views[i][written:]
    views.clear()


def _write_unsynced(path: Path, parts: list, digest: str) -> tuple[int, dict[str, Any]]:
    """Write parts (bytes-like) to a new file at path, not yet fsynced; its
    open descriptor, and its size and digests: a CRC-32 always (what a read
    checks), and with ``digest="md5"`` the md5 too (handed to DVC).

    The digests are of the bytes in memory, so nothing is read back."""
    crc = _Crc32()
    md5 = hashlib.md5() if digest == "md5" else None
    size = sum(len(x) for x in parts)

    def hash_md5() -> None:
        for x in parts:
            md5.update(x)

    helper = (threading.Thread(target=hash_md5)
              if md5 is not None and size >= PARALLEL_HASH_BYTES else None)
    if helper is not None:
        helper.start()
    elif md5 is not None:
        hash_md5()
    fd = -1
    try:  # the helper is joined whatever fails, the open included
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        _write_all(fd, parts, crc)
        _start_writeback(fd, size)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    finally:
        if helper is not None:
            helper.join()
    info = {"size": size, "crc32": crc.hexdigest()}
    if md5 is not None:
        info["md5"] = md5.hexdigest()
    return fd, info


def _write_hashed(path: Path, parts: list, digest: str = "md5") -> dict[str, Any]:
    """_write_unsynced, then fsync and close the file."""
    fd, info = _write_unsynced(path, parts, digest)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return info


def _npy_parts(array: np.ndarray) -> list:
    """The .npy format as [header, data], the data a view of the array's own
    memory (np.lib.format.write_array copies it chunk by chunk into a
    non-file writer, several times slower for large arrays)."""
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        array = np.ascontiguousarray(array)
    header = np.lib.format.header_data_from_array_1_0(array)
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, header)
    except ValueError:  # a header too large for format 1.0
        np.lib.format.write_array_header_2_0(buf, header)
    return [buf.getvalue(), _c_bytes(array.T if header["fortran_order"] else array)]


def _c_bytes(array: np.ndarray) -> memoryview:
    """The array's bytes in C order, as bytes: memoryview cannot export
    datetime and some other dtypes."""
    return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _packed_bytes(array: np.ndarray) -> memoryview | None:
    """A small array's bytes in C order, for a pack; None for an array of
    its own (PACK_BELOW bytes or more, Fortran order or a structured dtype,
    which its .npy keeps: a pack's entry names the dtype by ``dtype.str``,
    which for a structured one is only its size, '|V12')."""
    if array.nbytes >= PACK_BELOW or array.dtype.fields is not None or (
            array.flags.f_contiguous and not array.flags.c_contiguous):
        return None
    return _c_bytes(array)


@dataclass(frozen=True)
class Capture:
    """Everything one snapshot holds, as a Checkpointer captured it at a step:
    what :func:`write_capture` writes."""

    step: int
    pipelines: dict[str, dict[str, Any]]  # name -> {"state": bytes, plus manifest fields}
    arrays: dict[str, Any]  # name -> an array or a nest of them (see arrays.py)
    metadata: dict[str, Any]  # the user's JSON
    versions: dict[str, str]  # package -> version, of the writer
    run: dict[str, Any] | None = None  # {"params": ..., "total_steps": ...}
    # name -> a DALI dynamic-mode checkpoint (JSON text), or {"state": that
    # text, plus manifest fields}
    dynamic: dict[str, str | dict[str, Any]] | None = None
    digest: str = "crc32"  # "md5": the member files get an md5 besides their CRC-32


@dataclass
class Snapshot:
    """A complete snapshot read back from disk, digests verified."""

    path: Path
    manifest: dict[str, Any]
    pipeline_states: dict[str, bytes] = field(default_factory=dict)
    arrays: dict[str, Any] = field(default_factory=dict)
    dynamic_states: dict[str, str] = field(default_factory=dict)

    @property
    def step(self) -> int:
        return self.manifest["step"]


class NotJsonError(ArgumentTypeError):
    """``metadata`` or ``params`` a manifest cannot hold: a ConfigError (one
    line, naming the argument), and the TypeError `save` documents."""


def check_step(step: Any, where: str = "step") -> None:
    """A step the reader takes: a Python int from 0 to MAX_STEP (``where``
    names the argument in the message)."""
    # bool is an int to Python; the reader refuses it, so the writer does too
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise ConfigError(f"{where}={step!r}: must be an int from 0 to {MAX_STEP}, the step "
                          "this checkpoint is of (pass int(step) for a NumPy or torch number)")


def _check_step(step: Any, total_steps: Any) -> None:
    check_step(step)
    if total_steps is not None and (type(total_steps) is not int
                                    or not 0 <= total_steps <= MAX_STEP):
        raise ConfigError(f"total_steps={total_steps!r}: must be an int from 0 to {MAX_STEP} "
                          "or None, the run's total number of steps")


def check_json(value: Any, where: str) -> str:
    """``value`` as the JSON text a manifest holds; NotJsonError naming
    ``where`` (the argument) for anything the reader would refuse."""
    try:
        text = json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise NotJsonError(f"{where}={_shown(value)}: not plain JSON ({exc}); {_PLAIN_JSON}"
                           ) from None
    key = _non_str_key(value, where)  # json.dumps wrote {1: ...} as {"1": ...}
    if key is not None:
        raise NotJsonError(f"{key[0]}: the key {key[1]!r} is not a string, and would come back "
                           f"as {str(key[1])!r}; {_PLAIN_JSON}")
    return text


_PLAIN_JSON = ("metadata and params must be plain JSON (numbers, strings, lists, dicts with "
               "string keys; no NaN or infinity): convert it, or save arrays with arrays=")


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except RecursionError:
        return f"<a {type(value).__name__} nested too deep to show>"
    return text if len(text) <= 80 else text[:77] + "..."


def _non_str_key(value: Any, where: str) -> tuple[str, Any] | None:
    """(where, key) of the first dict key that is not a string (JSON makes
    it one), walked without recursion; the value is JSON already (no cycle)."""
    stack = [(value, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    return at, key
                stack.append((item, f"{at}[{key!r}]"))
        elif isinstance(node, (list, tuple)):
            stack.extend((item, f"{at}[{i}]") for i, item in enumerate(node))
    return None


def _meta_text(metadata: dict[str, Any], run: dict[str, Any] | None) -> str:
    """metadata and run as the JSON the manifest will hold; NotJsonError (a
    TypeError) for anything the reader would refuse, before anything is written."""
    try:
        text = json.dumps({"metadata": metadata, "run": run or {}}, sort_keys=True,
                          allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        check_json(metadata, "metadata")  # which one: raised naming it
        check_json((run or {}).get("params"), "params")
        text = check_json({"metadata": metadata, "run": run or {}}, "run")
    if text != STATE.meta_checked:  # a run saves the same params (and metadata) again and again
        if safe_json.depth(text.encode()) > safe_json.MAX_DEPTH - 2:
            raise NotJsonError(f"metadata and params must be plain JSON nested at most "
                               f"{safe_json.MAX_DEPTH - 2} levels deep")
        STATE.meta_checked = text
    return text


def _flatten_arrays(arrays: dict[str, Any]) -> tuple[dict[str, Any], list]:
    """The arrays' JSON trees and their leaves (host array, manifest fields)."""
    leaves: list[tuple[np.ndarray, dict[str, Any]]] = []

    def add_array(host: np.ndarray, info: dict[str, Any]) -> int:
        leaves.append((host, info))
        return len(leaves) - 1

    trees = {name: arrays_mod.flatten(name, value, add_array)
             for name, value in sorted(arrays.items())}
    return trees, leaves


_WRITERS = 4  # member files written (and fsynced) at once
_THREADS_FROM = 4 << 20  # bytes in a snapshot from which its files go to threads


def _writers() -> ThreadPoolExecutor:
    """The writer threads (process_state: a forked child gets its own)."""
    if STATE.write_pool is None:
        STATE.write_pool = ThreadPoolExecutor(_WRITERS, thread_name_prefix="dvc-dali-write")
    return STATE.write_pool


def _each(fn: Callable[..., Any], calls: list[tuple], threaded: bool
          ) -> tuple[list[Any], BaseException | None]:
    """fn(*args) for each of ``calls``, on the writer pool when ``threaded``;
    every call started is finished before this returns. The results (None
    where a call failed or was not made) and the first error."""
    futures = []
    if threaded and len(calls) > 1:
        try:
            pool = _writers()
            for args in calls:
                futures.append(pool.submit(fn, *args))
        except RuntimeError:
            pass  # The interpreter is exiting (an asynchronous save in flight is
            # finished then): concurrent.futures takes no new work; this thread does the rest.
    results: list[Any] = []
    error = None
    for i, args in enumerate(calls):
        if error is not None and i >= len(futures):
            results.append(None)  # not started: nothing more is tried after a failure
            continue
        try:
            results.append(futures[i].result() if i < len(futures) else fn(*args))
        except BaseException as exc:
            results.append(None)
            error = error or exc
    return results, error


def _write_members(tmp: Path, pipelines: dict[str, dict[str, Any]], leaves: list,
                   dynamic: dict[str, str | dict[str, Any]], batch: _Batch) -> dict[str, Any]:
    """Write every member file into ``tmp`` (into ``batch``); the manifest's
    pipelines, array_files and dynamic fields."""
    work: dict[str, list] = {}
    out: dict[str, Any] = {"pipelines": {}, "array_files": [], "dynamic": {}}
    for i, (pname, info) in enumerate(sorted(pipelines.items())):
        rel = f"pipelines/{i:05d}.dali"
        work[rel] = [info["state"]]
        out["pipelines"][pname] = {"file": rel, **{k: v for k, v in info.items()
                                                   if k != "state"}}
    packs: list[list] = []  # the parts of each pack (format 3), in order
    used = 0  # bytes in the last pack
    for i, (host, info) in enumerate(leaves):
        entry = {"dtype": host.dtype.str, "shape": list(host.shape), **info}
        data = _packed_bytes(host)
        if data is None:
            entry["file"] = rel = f"arrays/{i:05d}.npy"
            work[rel] = _npy_parts(host)
        else:
            start = -(-used // _PACK_ALIGN) * _PACK_ALIGN
            if not packs or start + len(data) > PACK_MAX:
                packs.append([])
                used = start = 0
            if start > used:
                packs[-1].append(bytes(start - used))
            entry.update(file=f"arrays/{len(packs) - 1:05d}.pack", offset=start)
            packs[-1].append(data)
            used = start + len(data)
        out["array_files"].append(entry)
    for k, parts in enumerate(packs):
        work[f"arrays/{k:05d}.pack"] = parts
    for i, (dname, value) in enumerate(sorted(dynamic.items())):
        rel = f"dynamic/{i:05d}.json"
        info = value if isinstance(value, dict) else {"state": value}
        work[rel] = [info["state"].encode()]
        out["dynamic"][dname] = {"file": rel, **{k: v for k, v in info.items()
                                                 if k != "state"}}
    for sub in sorted({rel.split("/")[0] for rel in work}):
        (tmp / sub).mkdir()
        batch.dirs.append(tmp / sub)
    batch.write_all(tmp, work)
    return out


class _Batch:
    """A snapshot's files, written now and fsynced together at the end.

    Per-file fsyncs cost one journal commit and one device flush each (a 1 GB
    state of 336 files took 2x as long); fsynced together once all are
    written, the kernel writes them out at once. From _THREADS_FROM bytes on,
    files are written, and fsynced, up to _WRITERS at a time: one file's copy
    and hash overlap another's disk wait (the GIL is released for all
    three); below it, handing them to threads costs more than it overlaps."""

    def __init__(self, digest: str) -> None:
        self.digest = digest
        self.files: dict[str, dict[str, Any]] = {}  # rel: digest and size
        self.dirs: list[Path] = []  # fsynced after the files, with nothing left to commit
        self._fds: list[int] = []
        self._threads = False

    def write_all(self, tmp: Path, work: dict[str, list]) -> None:
        self._threads = sum(len(x) for parts in work.values() for x in parts) >= _THREADS_FROM
        written, error = _each(_write_unsynced, [(tmp / rel, parts, self.digest)
                                                 for rel, parts in work.items()], self._threads)
        for rel, result in zip(work, written):
            if result is not None:  # taken so that close() closes it, also after an error
                self._take(rel, result)
        if error is not None:
            raise error

    def write(self, tmp: Path, rel: str, data: bytes, digest: str) -> dict[str, Any]:
        self._take(rel, _write_unsynced(tmp / rel, [data], digest))
        return self.files[rel]

    def _take(self, rel: str, written: tuple[int, dict[str, Any]]) -> None:
        self._fds.append(written[0])
        self.files[rel] = written[1]

    def sync(self) -> None:
        """fsync every file, then every directory (several at once from 4 MB).

        Each file's writeback was started when it was written, so the first
        fsync commits the journal for all of them and the others find little
        or nothing left to do."""
        for path in self.dirs:
            self._fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        self.dirs = []
        _, error = _each(os.fsync, [(fd,) for fd in self._fds], self._threads)
        if error is not None:
            raise error

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def write_capture(root: Path, capture: Capture,
                  rank: dict[str, int] | None = None) -> tuple[str, str]:
    """Write one complete snapshot of ``capture`` under ``root`` (not yet
    named by LATEST: see :func:`publish`); returns its name and its
    manifest's md5. ``rank``: this process's rank and the world size."""
    step, run = capture.step, capture.run
    _check_step(step, (run or {}).get("total_steps"))
    meta_text = _meta_text(capture.metadata, run)
    trees, leaves = _flatten_arrays(capture.arrays)  # refused values raise before any file
    name = f"step-{step:09d}-{uuid.uuid4().hex[:8]}"
    tmp = root / f".tmp-{name}"
    batch = _Batch(capture.digest)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True)
        members = _write_members(tmp, capture.pipelines, leaves, capture.dynamic or {}, batch)
        version = (FORMAT_VERSION if any("ml_dtype" in info for _, info in leaves)
                   else manifest_schema.WRITTEN_VERSION)
        manifest = {"format": FORMAT, "format_version": version, "step": step,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "versions": capture.versions,
                    **members, "arrays": trees, **json.loads(meta_text),
                    "files": dict(batch.files), "rank": rank}
        # no indent: json's C encoder (indented output is encoded in Python, ~5x slower)
        text = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        manifest_md5 = batch.write(tmp, MANIFEST, text, "md5")["md5"]  # LATEST names it
        batch.dirs.append(tmp)
        batch.sync()  # every file and directory durable before the snapshot is named
        os.rename(tmp, root / name)
        atomic_file.fsync_dir(root)
        _note_written(root, name, tuple(batch.files))
    except OSError as exc:
        # A full disk, a file size limit, a read-only directory: the previous
        # checkpoint and LATEST are untouched; drop the partial one now.
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(
            f"{getattr(exc, 'filename', None) or tmp}: cannot write the checkpoint "
            f"({exc.strerror or exc}). {_after_failed_write(exc, root, rank is not None)}") from exc
    finally:
        batch.close()
    return name, manifest_md5


def _after_failed_write(exc: OSError, root: Path, ranked: bool = False) -> str:
    """What a failed snapshot left and what to do: the previous checkpoint is
    said to be intact only where LATEST still names one (``ranked``: one
    rank's snapshots, in ``rank-NNNNN/``, are named by the LATEST above it:
    found by a sweep)."""
    top = root.parent if ranked else root
    kept = (f"The previous checkpoint in {top} is intact." if (top / LATEST).is_file() else
            f"{top} holds no complete checkpoint.")
    if exc.errno == errno.ENOENT:  # the directory, or the snapshot in the making, went away
        return (f"{kept} A part of {root} was removed while the checkpoint was written: "
                "nothing else may remove or rename files there while a run writes it. "
                "Save again.")
    return f"{kept} Free disk space or fix the directory's permissions, then save again."


def publish(root: Path, entries: list[tuple[str, str]]) -> None:
    """Atomically make LATEST name these snapshots: one line per rank,
    "<snapshot path> <manifest md5>"."""
    latest_tmp = root / f".tmp-{LATEST}-{uuid.uuid4().hex[:8]}"  # remove_leftovers' prefix
    data = "".join(f"{name} {sha}\n" for name, sha in entries)
    try:
        atomic_file.replace_published(root / LATEST, data, tmp=latest_tmp, mode=0o644)
    except OSError as exc:
        raise CheckpointWriteError(
            f"{root / LATEST}: cannot update ({exc.strerror or exc}); it still names the "
            "previous checkpoint. Free disk space or fix permissions, then save again.") from exc


def remove_leftovers(root: Path, keep: str) -> None:
    """Remove unfinished and superseded snapshots (orbax-style cleanup)."""
    with os.scandir(root) as it:
        entries = [e for e in it if e.name not in (keep, LATEST)
                   and (e.name.startswith(".tmp-") or _SNAPSHOT_NAME.match(e.name))]
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if not _remove_written(entry.path):
                shutil.rmtree(entry.path, ignore_errors=True)
        else:
            Path(entry.path).unlink(missing_ok=True)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOTED = 2  # snapshots noted a directory: the newest, and the one it supersedes


def _note_written(root: Path, name: str, files: tuple[str, ...]) -> None:
    """Note a snapshot's members for _remove_written. Only the last _NOTED of
    a directory: another process may remove the older ones (rank 0 removes
    every rank's), and a long run must not grow this."""
    noted = STATE.snapshot_members.setdefault(str(root), {})
    noted[name] = files, tuple(sorted({rel.split("/")[0] for rel in files if "/" in rel}))
    while len(noted) > _NOTED:
        del noted[next(iter(noted))]


def _remove_written(path: str) -> bool:
    """Remove a snapshot this process wrote by the names it wrote (a third of
    rmtree's system calls: no scan, no stat); False where it is not one, or
    holds anything else (rmtree then removes the rest). Relative to
    directories opened without following links, as rmtree does."""
    root, name = os.path.split(path)
    members = STATE.snapshot_members.get(root, {}).pop(name, None)
    if members is None:
        return False
    files, subdirs = members
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return False
    fds = {"": fd}
    try:
        for sub in subdirs:
            fds[sub] = os.open(sub, _DIR_FLAGS, dir_fd=fd)
        for rel in files:
            sub, _, base = rel.rpartition("/")
            os.unlink(base, dir_fd=fds[sub])
        for sub in subdirs:
            os.rmdir(sub, dir_fd=fd)
    except OSError:
        return False
    finally:
        for each in fds.values():
            os.close(each)
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a device"


def _not_plain(path: Path, mode: int, want: str) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"{path}: is {_kind(mode)}, not {want}; dvc-dali writes checkpoints as plain files "
        f"and directories and follows no links out of them (edited or replaced): {_FIX}")


def _lstat(path: Path, name: str, dir_fd: int | None, missing: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointCorruptError(f"{path}: {missing}: {_FIX}") from None


def _open_checked(path: Path, name: str, dir_fd: int | None, flags: int,
                  before: os.stat_result) -> int:
    """open(name) without following a symlink or blocking on a FIFO; the
    fstat must show the inode lstat saw (nothing swapped in between)."""
    try:
        fd = os.open(name, flags | _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise CheckpointCorruptError(f"{path}: cannot open ({exc.strerror or exc}): "
                                     f"{_FIX}") from None
    st = os.fstat(fd)
    if (st.st_ino, st.st_dev, stat.S_IFMT(st.st_mode)) != (
            before.st_ino, before.st_dev, stat.S_IFMT(before.st_mode)):
        os.close(fd)
        raise CheckpointCorruptError(f"{path}: replaced while being read: {_FIX}")
    return fd


def _cached_object(path: Path, name: str, dir_fd: int | None, st: os.stat_result
                   ) -> tuple[str, None, os.stat_result]:
    """The DVC cache object the link ``path`` points to (DVC's checkout under
    `cache.type symlink`): its path and lstat, for _open_file to open in the
    link's stead, without following a further link. Any other link is left
    as it is (refused by the caller); one to a missing object is named."""
    try:
        target = cache_links.cache_target(path, name, dir_fd)
    except OSError:  # gone since the lstat: refused as the link it was
        return name, dir_fd, st
    if target is None:
        return name, dir_fd, st
    try:
        return target, None, os.stat(target, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointCorruptError(cache_links.missing_object(path, target)) from None


def _open_file(path: Path, name: str, dir_fd: int | None, *, size: int | None = None,
               limit: int | None = None, missing: str = "missing from the checkpoint"):
    """A regular file (checked with lstat before it is opened) as an
    unbuffered binary file, and its size: ``size`` exactly, or at most
    ``limit`` bytes."""
    st = _lstat(path, name, dir_fd, missing)
    if stat.S_ISLNK(st.st_mode):
        name, dir_fd, st = _cached_object(path, name, dir_fd, st)
    if not stat.S_ISREG(st.st_mode):
        raise _not_plain(path, st.st_mode, "a regular file")
    if size is not None and st.st_size != size:
        raise CheckpointCorruptError(f"{path}: {st.st_size} bytes, the manifest says {size} "
                                     f"(truncated or overwritten): {_FIX}")
    if limit is not None and st.st_size > limit:
        raise CheckpointCorruptError(f"{path}: {st.st_size} bytes, more than the "
                                     f"{limit >> 20} MiB such a file may hold: {_FIX}")
    fd = _open_checked(path, name, dir_fd, 0, st)
    return open(fd, "rb", buffering=0), st.st_size


def _read_all(fh, size: int, path: Path) -> bytes:
    """Exactly ``size`` bytes (the size fstat gave): never more is read."""
    chunks = []
    while size:
        chunk = fh.read(min(size, 1 << 30))
        if not chunk:
            raise CheckpointCorruptError(f"{path}: shorter than its size (changed while "
                                         f"read): {_FIX}")
        chunks.append(chunk)
        size -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _hasher(want: dict[str, Any]) -> Any:
    """A new hasher for the digest a (validated) ``files`` entry holds."""
    return HASHERS[manifest_schema.digest_name(want)]()


def _check_digest(hasher: Any, want: dict[str, Any], path: Path, snap_dir: Path) -> None:
    name = manifest_schema.digest_name(want)
    if hasher.hexdigest() != want[name]:
        raise CheckpointCorruptError(f"{path}: contents do not match the {name} in "
                                     f"{snap_dir / MANIFEST} (corrupted or edited): {_FIX}")


class _SnapshotFiles:
    """A snapshot directory opened without following symlinks (each path
    component below ``root``), its files opened relative to it (openat):
    nothing swapped in after a check is followed."""

    def __init__(self, root: Path, rel: str) -> None:
        self.root, self.path = Path(root), Path(root) / rel
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        try:  # the root is the user's own path: it may be a symlink
            fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise CheckpointCorruptError(f"{self.path}: cannot open ({exc.strerror or exc}): "
                                         f"{_FIX}") from None
        path = self.root
        for part in rel.split("/"):
            path = path / part
            fd = self._subdir(fd, part, path)  # closes the parent, also on error
        self._fds[""] = fd

    @staticmethod
    def _subdir(parent: int, name: str, path: Path) -> int:
        try:
            st = _lstat(path, name, parent, "missing from the checkpoint")
            if not stat.S_ISDIR(st.st_mode):
                raise _not_plain(path, st.st_mode, "a directory")
            return _open_checked(path, name, parent, os.O_DIRECTORY, st)
        finally:
            os.close(parent)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> _SnapshotFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self, rel: str, **kw):
        """``rel`` (a manifest or member path) opened as _open_file does."""
        sub, _, name = rel.rpartition("/")
        with self._lock:  # files may be opened from several threads (_Leaves.read_all)
            if sub not in self._fds:
                self._fds[sub] = self._subdir(os.dup(self._fds[""]), sub, self.path / sub)
        return _open_file(self.path / rel, name, self._fds[sub], **kw)

    def manifest(self, md5: str) -> dict[str, Any]:
        path = self.path / MANIFEST
        fh, size = self.open(MANIFEST, limit=MANIFEST_MAX_BYTES, missing="missing")
        with fh:
            raw = _read_all(fh, size, path)
        if hashlib.md5(raw).hexdigest() != md5:
            raise CheckpointCorruptError(f"{path}: does not match the md5 recorded in "
                                         f"{self.root / LATEST} (edited or corrupted): "
                                         f"{_FIX}")
        manifest = safe_json.loads(raw, where=str(path), fix=_FIX)
        return manifest_schema.validate(manifest, str(path))

    def member(self, rel: str, want: dict[str, Any]) -> bytes:
        path = self.path / rel
        fh, size = self.open(rel, size=want["size"])
        with fh:
            data = _read_all(fh, size, path)
        hasher = _hasher(want)
        hasher.update(data)
        _check_digest(hasher, want, path, self.path)
        return data

    def array(self, rel: str, want: dict[str, Any], info: dict[str, Any]) -> np.ndarray:
        """The .npy ``rel``, header checked against the manifest's ``info``
        before any memory is allocated, read once into its final array."""
        path = self.path / rel
        fh, size = self.open(rel, size=want["size"])
        hasher = _hasher(want)
        with fh:
            if size >= npy.MAP_FROM:
                # the whole file is read next: ask for all of it at once (one
                # deep queue for the disk instead of readahead's small steps)
                os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
            try:
                array = npy.read(fh, size, info["dtype"], info["shape"], hasher)
            except npy.NpyError as exc:
                raise CheckpointCorruptError(f"{path}: not a readable .npy ({exc}): "
                                             f"{_FIX}") from None
        _check_digest(hasher, want, path, self.path)
        return array


def _read_latest(pointer: Path) -> str:
    fh, size = _open_file(pointer, str(pointer), None, limit=LATEST_MAX_BYTES,
                          missing="missing")
    with fh:
        return _read_all(fh, size, pointer).decode(errors="replace")


def latest(root: Path) -> list[tuple[str, str]] | None:
    """The snapshots LATEST names (one per rank) with their manifests'
    md5, or None when there is no checkpoint yet. The digest makes an
    edited manifest visible."""
    pointer = root / LATEST
    try:
        os.lstat(pointer)
    except (FileNotFoundError, NotADirectoryError):
        if root.is_dir() and any(_SNAPSHOT_NAME.match(e.name) for e in root.iterdir()):
            raise CheckpointCorruptError(f"{pointer}: missing, but {root} holds snapshots; "
                                         f"the directory was edited by hand: {_FIX}") from None
        return None
    entries = []
    for line in _read_latest(pointer).splitlines() or [""]:
        text = line.split()
        if (len(text) != 2 or not _LATEST_ENTRY.match(text[0])
                or not _MD5.match(text[1])):
            raise CheckpointCorruptError(f"{pointer}: does not hold '<snapshot> <manifest "
                                         f"md5>' lines (found {line[:80]!r}): {_FIX}")
        try:
            os.lstat(root / text[0] / MANIFEST)
        except (FileNotFoundError, NotADirectoryError):
            raise CheckpointCorruptError(f"{pointer}: names {text[0]}, but "
                                         f"{root / text[0] / MANIFEST} does not exist: "
                                         f"{_FIX}") from None
        entries.append((text[0], text[1]))
    return entries


def read_manifest(snap_dir: Path, md5: str) -> dict[str, Any]:
    """The manifest of ``snap_dir``, its md5 checked against ``md5`` (from
    LATEST) and validated whole against its schema (manifest_schema.py)."""
    with _SnapshotFiles(snap_dir.parent, snap_dir.name) as snap:
        return snap.manifest(md5)


def _check_rank(manifest: dict[str, Any], where: Path, rank: int, world_size: int) -> None:
    saved = manifest.get("rank") or {"rank": 0, "world_size": 1}
    if (saved["rank"], saved["world_size"]) != (rank, world_size):
        raise RankMismatchError(
            f"{where}: holds the state of rank {saved['rank']} of {saved['world_size']}, but "
            f"rank {rank} of {world_size} is reading it (files moved between ranks?). Each "
            "rank must read its own rank-NNNNN directory: restore the checkpoint with "
            "`dvc exp apply`, or start over with `dvc-dali reset`.")


class _Leaves:
    """The array files, each read (and checked) the first time it is used."""

    def __init__(self, snap: _SnapshotFiles, infos: list[dict[str, Any]],
                 files: dict[str, Any]) -> None:
        self._snap, self._infos, self._files = snap, infos, files
        self._read: dict[int, np.ndarray] = {}
        self._packs: dict[str, bytes] = {}
        self._packs_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._infos)

    def read_all(self) -> None:
        """Every file, several at once: reading one overlaps hashing another
        (both release the GIL); each still goes straight into its array."""
        workers = min(4, os.cpu_count() or 1, len(self))
        if workers < 2:
            for i in range(len(self)):
                self[i]
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers, thread_name_prefix="dvc-dali-read") as pool:
            for _ in pool.map(self.__getitem__, range(len(self))):
                pass  # the first error is raised here

    def __getitem__(self, index: int) -> np.ndarray:
        if index not in self._read:
            info = self._infos[index]
            if "offset" in info:
                self._read[index] = self._unpack(index, info)
            else:
                self._read[index] = self._snap.array(info["file"], self._files[info["file"]],
                                                     info)
        return self._read[index]

    def _unpack(self, index: int, info: dict[str, Any]) -> np.ndarray:
        """Array ``index`` from its pack (read whole and checked once)."""
        rel = info["file"]
        with self._packs_lock:  # read_all asks from several threads
            if rel not in self._packs:
                self._packs[rel] = self._snap.member(rel, self._files[rel])
        data = self._packs[rel]
        dtype, shape = np.dtype(info["dtype"]), info["shape"]
        count = int(np.prod(shape, dtype=object))
        if info["offset"] + count * dtype.itemsize > len(data):
            raise CheckpointCorruptError(
                f"{self._snap.path / MANIFEST}: field 'array_files[{index}]': a {dtype.str} "
                f"array of shape {shape} at offset {info['offset']} ends past the "
                f"{len(data)} bytes of {rel}: {_FIX}")
        return np.frombuffer(data, dtype, count, info["offset"]).reshape(shape).copy()


def _read_arrays(snap: _SnapshotFiles, out: Snapshot, array_module,
                 names: list[str] | None = None) -> None:
    """The arrays ``names`` (default: all), reading only their files."""
    manifest, files = out.manifest, out.manifest["files"]
    leaves = _Leaves(snap, manifest["array_files"], files)
    if names is None:  # every file checked, used or not, as a resume always did
        leaves.read_all()
    for aname, tree in manifest["arrays"].items():
        if names is not None and aname not in names:
            continue
        try:
            out.arrays[aname] = arrays_mod.unflatten(tree, leaves, manifest["array_files"],
                                                     array_module)
        except ValueError as exc:
            raise CheckpointCorruptError(
                f"{snap.path / MANIFEST}: field {manifest_schema.key('arrays', aname)!r} "
                f"cannot be restored ({exc}): {_FIX}") from None


def _read_dynamic(snap: _SnapshotFiles, out: Snapshot) -> None:
    files = out.manifest["files"]
    for dname, info in out.manifest["dynamic"].items():
        data = snap.member(info["file"], files[info["file"]])
        try:
            out.dynamic_states[dname] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointCorruptError(
                f"{snap.path / info['file']}: not UTF-8 text ({exc.reason} at byte "
                f"{exc.start}); a DALI dynamic-mode checkpoint is JSON: {_FIX}") from None


def read_snapshot(root: Path, array_module=None, rank: int = 0,
                  world_size: int = 1) -> Snapshot | None:
    """The latest complete snapshot of ``rank``, every file checked (kind,
    size, digest, the manifest against its schema, each .npy header against
    the manifest) before it is used, or None."""
    entries = latest(root)
    if entries is None:
        return None
    if len(entries) != world_size:
        raise RankMismatchError(
            f"{root / LATEST}: saved by {len(entries)} process(es), this run has {world_size}. "
            f"Resume with {len(entries)} (e.g. torchrun --nproc_per_node {len(entries)}), or "
            "start over with `dvc-dali reset`; resuming with another world size (elastic) is "
            "not supported.")
    rel, md5 = entries[rank]
    with _SnapshotFiles(root, rel) as snap:
        manifest = snap.manifest(md5)
        _check_rank(manifest, snap.path / MANIFEST, rank, world_size)
        out = Snapshot(snap.path, manifest)
        files = manifest["files"]
        for pname, info in manifest["pipelines"].items():
            out.pipeline_states[pname] = snap.member(info["file"], files[info["file"]])
        _read_arrays(snap, out, array_module)
        _read_dynamic(snap, out)
    return out


def read_arrays(root: Path, names: list[str] | None = None, array_module=None,
                rank: int = 0) -> Snapshot:
    """For reading without resuming: the manifest and the arrays ``names``
    (default all) of ``rank``'s latest snapshot, only their files read, every
    check of read_snapshot applied to what is read. No pipeline state."""
    entries = latest(root)
    if entries is None:
        raise CheckpointCorruptError(f"{root}: holds no dvc-dali checkpoint (no {LATEST}); "
                                     "pass the checkpoint output's path, or a row as rev=")
    if not 0 <= rank < len(entries):
        raise RankMismatchError(f"{root / LATEST}: saved by {len(entries)} process(es); "
                                f"there is no rank {rank}")
    rel, md5 = entries[rank]
    with _SnapshotFiles(root, rel) as snap:
        out = Snapshot(snap.path, snap.manifest(md5))
        unknown = sorted(set(names or ()) - set(out.manifest["arrays"]))
        if unknown:
            from ..core.errors import ConfigError

            raise ConfigError(f"{snap.path / MANIFEST}: no arrays named {unknown}; it holds "
                              f"{sorted(out.manifest['arrays'])}")
        _read_arrays(snap, out, array_module, names)
    return out


def needed_files(manifest: dict[str, Any], names: list[str] | None) -> list[str]:
    """The member files reading the arrays ``names`` (default all) opens."""
    infos = manifest["array_files"]
    chosen = [t for n, t in manifest["arrays"].items() if names is None or n in names]
    try:
        used = sorted({i for tree in chosen for i in arrays_mod.leaf_indexes(tree, len(infos))})
    except ValueError:
        used = list(range(len(infos)))  # every file: let the read name what is wrong
    return list(dict.fromkeys(infos[i]["file"] for i in used))  # arrays share packs


def file_digests(root: Path) -> dict[Path, str]:
    """md5 of the files of the published snapshot(s) that have one, from the manifests
    written with them (snapshots are never modified once published)."""
    out: dict[Path, str] = {}
    for rel, manifest_md5 in latest(root) or []:
        snap_dir = root / rel
        out[snap_dir / MANIFEST] = manifest_md5
        with _SnapshotFiles(root, rel) as snap:
            files = snap.manifest(manifest_md5)["files"]
        for member, info in files.items():
            if "md5" in info:  # crc32 files (written outside recording): DVC hashes them
                out[snap_dir / member] = info["md5"]
    return out
