"""The on-disk checkpoint format and its crash-safe publication.

    <checkpoint dir>/             the stage's `checkpoint: true` / `persist: true` output
      LATEST                      "<snapshot name> <md5 of its manifest.json>"
      step-000000120-1a2b3c4d/    one complete snapshot
        manifest.json             format, step, versions, pipelines, arrays, digests
        pipelines/<n>.dali        DALI state bytes, one file per pipeline
        arrays/<n>.npy            user arrays, .npy without pickle
        dynamic/<n>.json          DALI dynamic-mode checkpoints

A snapshot is written into `.tmp-*`, fsynced, renamed to `step-*` (atomic),
and only then does LATEST move to it (atomic replace). A crash at any instant
leaves LATEST naming a complete snapshot; the next save removes leftovers.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import arrays as arrays_mod
from .errors import (
    CheckpointCorruptError,
    CheckpointFormatError,
    CheckpointWriteError,
    RankMismatchError,
)

FORMAT = "dvc-dali-checkpoint"
FORMAT_VERSION = 1
LATEST = "LATEST"
MANIFEST = "manifest.json"
_SNAPSHOT_NAME = re.compile(r"^step-\d{9,}-[0-9a-f]{8}$")
_MD5 = re.compile(r"^[0-9a-f]{32}$")
_LATEST_ENTRY = re.compile(r"^(rank-\d{5}/)?step-\d{9,}-[0-9a-f]{8}$")
_MEMBER_PATH = re.compile(r"^(pipelines/[0-9]{5}\.dali|arrays/[0-9]{5}\.npy|"
                          r"dynamic/[0-9]{5}\.json)$")
_FIX = ("restore an earlier checkpoint with `dvc exp apply <row>`, or start over with "
        "`dvc-dali reset`")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_CHUNK = 16 << 20
# From this size on, a file's md5 is computed on a helper thread while this
# one writes and fsyncs it (hashlib and the syscalls release the GIL).
PARALLEL_HASH_BYTES = 4 << 20


def _write_hashed(path: Path, parts: list) -> dict[str, Any]:
    """Write parts (bytes-like) to path and fsync it; its md5 and size.

    MD5, DVC's own hash, of the bytes in memory, so nothing is read back:
    the recorder hands these digests to DVC, which then does not read the
    checkpoint again to cache it."""
    md5 = hashlib.md5()
    size = sum(len(x) for x in parts)

    def digest() -> None:
        for x in parts:
            md5.update(x)

    helper = threading.Thread(target=digest) if size >= PARALLEL_HASH_BYTES else None
    if helper is None:
        digest()
    else:
        helper.start()
    try:
        with open(path, "wb") as fh:
            for x in parts:
                for start in range(0, len(x), _CHUNK):
                    fh.write(x[start:start + _CHUNK])
            fh.flush()
            os.fsync(fh.fileno())
    finally:
        if helper is not None:
            helper.join()
    return {"md5": md5.hexdigest(), "size": size}


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
    data = array.T if header["fortran_order"] else array
    return [buf.getvalue(), memoryview(np.ascontiguousarray(data).reshape(-1)).cast("B")]


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


def write_snapshot(root: Path, step: int, pipelines: dict[str, dict[str, Any]],
                   arrays: dict[str, Any], metadata: dict[str, Any],
                   versions: dict[str, str], run: dict[str, Any] | None = None,
                   dynamic: dict[str, str] | None = None,
                   rank: dict[str, int] | None = None) -> tuple[str, str]:
    """Write one complete snapshot under ``root`` (not yet named by LATEST:
    see :func:`publish`); returns its name and its manifest's md5.

    ``pipelines`` maps a name to {"state": bytes, plus manifest fields};
    ``arrays`` a name to an array or a nest of them (see arrays.py);
    ``dynamic`` a name to a DALI dynamic-mode checkpoint (JSON text).
    """
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    try:
        meta_text = json.dumps({"metadata": metadata, "run": run or {}}, sort_keys=True,
                               allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata and params must be plain JSON (numbers, strings, lists, "
                        f"dicts): {exc}") from None
    name = f"step-{step:09d}-{uuid.uuid4().hex[:8]}"
    tmp = root / f".tmp-{name}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True)
        files: dict[str, dict[str, Any]] = {}

        def put(rel: str, parts: list) -> None:
            (tmp / rel).parent.mkdir(exist_ok=True)
            files[rel] = _write_hashed(tmp / rel, parts)

        manifest_pipes = {}
        for i, (pname, info) in enumerate(sorted(pipelines.items())):
            rel = f"pipelines/{i:05d}.dali"
            put(rel, [info["state"]])
            manifest_pipes[pname] = {"file": rel, **{k: v for k, v in info.items() if k != "state"}}
        leaves: list[tuple[np.ndarray, dict[str, Any]]] = []

        def add_array(host: np.ndarray, info: dict[str, Any]) -> int:
            leaves.append((host, info))
            return len(leaves) - 1

        trees = {name: arrays_mod.flatten(name, value, add_array)
                 for name, value in sorted(arrays.items())}
        array_files = []
        for i, (host, info) in enumerate(leaves):
            rel = f"arrays/{i:05d}.npy"
            put(rel, _npy_parts(host))
            array_files.append({"file": rel, "dtype": host.dtype.str, "shape": list(host.shape),
                                **info})
        manifest_dynamic = {}
        for i, (dname, text) in enumerate(sorted((dynamic or {}).items())):
            rel = f"dynamic/{i:05d}.json"
            put(rel, [text.encode()])
            manifest_dynamic[dname] = {"file": rel}
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "step": step,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "versions": versions,
            "pipelines": manifest_pipes,
            "arrays": trees,
            "array_files": array_files,
            "dynamic": manifest_dynamic,
            **json.loads(meta_text),
            "files": files,
            "rank": rank,
        }
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        put(MANIFEST, [text])
        for sub in {rel.split("/")[0] for rel in files if "/" in rel}:
            _fsync_dir(tmp / sub)
        _fsync_dir(tmp)
        os.rename(tmp, root / name)
        _fsync_dir(root)
    except OSError as exc:
        # A full disk, a file size limit, a read-only directory: the previous
        # checkpoint and LATEST are untouched; drop the partial one now.
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointWriteError(
            f"{getattr(exc, 'filename', None) or tmp}: cannot write the checkpoint "
            f"({exc.strerror or exc}). The previous checkpoint in {root} is intact. Free "
            "disk space or fix the directory's permissions, then save again.") from exc
    return name, files[MANIFEST]["md5"]


def publish(root: Path, entries: list[tuple[str, str]]) -> None:
    """Atomically make LATEST name these snapshots: one line per rank,
    "<snapshot path> <manifest md5>"."""
    latest_tmp = root / f".tmp-{LATEST}-{uuid.uuid4().hex[:8]}"
    try:
        with open(latest_tmp, "w") as fh:
            fh.write("".join(f"{name} {sha}\n" for name, sha in entries))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(latest_tmp, root / LATEST)
        _fsync_dir(root)
    except OSError as exc:
        latest_tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(
            f"{root / LATEST}: cannot update ({exc.strerror or exc}); it still names the "
            "previous checkpoint. Free disk space or fix permissions, then save again.") from exc


def remove_leftovers(root: Path, keep: str) -> None:
    """Remove unfinished and superseded snapshots (orbax-style cleanup)."""
    for entry in root.iterdir():
        if entry.name in (keep, LATEST):
            continue
        if entry.name.startswith(".tmp-") or _SNAPSHOT_NAME.match(entry.name):
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def latest(root: Path) -> list[tuple[str, str]] | None:
    """The snapshots LATEST names (one per rank) with their manifests'
    md5, or None when there is no checkpoint yet. The digest makes an
    edited manifest visible."""
    pointer = root / LATEST
    if not pointer.exists():
        if root.is_dir() and any(_SNAPSHOT_NAME.match(e.name) for e in root.iterdir()):
            raise CheckpointCorruptError(f"{pointer}: missing, but {root} holds snapshots; "
                                         f"the directory was edited by hand: {_FIX}")
        return None
    entries = []
    for line in pointer.read_text(errors="replace").splitlines() or [""]:
        text = line.split()
        if (len(text) != 2 or not _LATEST_ENTRY.match(text[0])
                or not _MD5.match(text[1])):
            raise CheckpointCorruptError(f"{pointer}: does not hold '<snapshot> <manifest "
                                         f"md5>' lines (found {line[:80]!r}): {_FIX}")
        if not (root / text[0] / MANIFEST).is_file():
            raise CheckpointCorruptError(f"{pointer}: names {text[0]}, but "
                                         f"{root / text[0] / MANIFEST} does not exist: {_FIX}")
        entries.append((text[0], text[1]))
    return entries


def _read_member(snap_dir: Path, rel: str, files: dict[str, Any]) -> bytes:
    if not isinstance(rel, str) or not _MEMBER_PATH.match(rel) or rel not in files:
        raise CheckpointCorruptError(f"{snap_dir / MANIFEST}: file entry {rel!r} is not one "
                                     f"this format writes (paths stay inside the snapshot): "
                                     f"{_FIX}")
    path = snap_dir / rel
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path}: missing from the checkpoint: {_FIX}") from None
    want = files[rel]
    if len(data) != want.get("size"):
        raise CheckpointCorruptError(f"{path}: {len(data)} bytes, the manifest says "
                                     f"{want.get('size')} (truncated or overwritten): {_FIX}")
    if hashlib.md5(data).hexdigest() != want.get("md5"):
        raise CheckpointCorruptError(f"{path}: contents do not match the md5 in "
                                     f"{snap_dir / MANIFEST} (corrupted or edited): {_FIX}")
    return data


def read_manifest(snap_dir: Path, md5: str) -> dict[str, Any]:
    path = snap_dir / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{path}: missing: {_FIX}") from None
    if hashlib.md5(raw).hexdigest() != md5:
        raise CheckpointCorruptError(f"{path}: does not match the md5 recorded in "
                                     f"{snap_dir.parent / LATEST} (edited or corrupted): {_FIX}")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise CheckpointCorruptError(f"{path}: not valid JSON ({exc}): {_FIX}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointFormatError(f"{path}: not a dvc-dali manifest (no \"format\": "
                                    f"\"{FORMAT}\"); point dvc-dali at its own checkpoint "
                                    "directory, or start over with `dvc-dali reset`")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointFormatError(f"{path}: format_version {version!r} is newer than this "
                                    f"dvc-dali reads ({FORMAT_VERSION}); upgrade dvc-dali "
                                    "(pip install -U dvc-dali)")
    for key, kind in (("step", int), ("pipelines", dict), ("arrays", dict),
                      ("array_files", list), ("dynamic", dict), ("metadata", dict),
                      ("files", dict)):
        if not isinstance(manifest.get(key), kind):
            raise CheckpointCorruptError(f"{path}: field {key!r} is missing or not a "
                                         f"{kind.__name__}: {_FIX}")
    return manifest


def read_snapshot(root: Path, array_module=None, rank: int = 0,
                  world_size: int = 1) -> Snapshot | None:
    """The latest complete snapshot of ``rank``, every digest checked, or None."""
    entries = latest(root)
    if entries is None:
        return None
    pointer = root / LATEST
    if len(entries) != world_size:
        raise RankMismatchError(
            f"{pointer}: saved by {len(entries)} process(es), this run has {world_size}. "
            f"Resume with {len(entries)} (e.g. torchrun --nproc_per_node {len(entries)}), or "
            "start over with `dvc-dali reset`; resuming with another world size (elastic) is "
            "not supported.")
    found = entries[rank]
    snap_dir = root / found[0]
    manifest = read_manifest(snap_dir, found[1])
    saved = manifest.get("rank") or {"rank": 0, "world_size": 1}
    if not isinstance(saved, dict):
        raise CheckpointCorruptError(f"{snap_dir / MANIFEST}: field 'rank' is not an object: "
                                     f"{_FIX}")
    if (saved.get("rank"), saved.get("world_size")) != (rank, world_size):
        raise RankMismatchError(
            f"{snap_dir / MANIFEST}: holds the state of rank {saved.get('rank')} of "
            f"{saved.get('world_size')}, but rank {rank} of {world_size} is reading it (files "
            "moved between ranks?). Each rank must read its own rank-NNNNN directory: restore "
            f"the checkpoint with `dvc exp apply`, or start over with `dvc-dali reset`.")
    files = manifest["files"]
    snap = Snapshot(snap_dir, manifest)
    for pname, info in manifest["pipelines"].items():
        snap.pipeline_states[pname] = _read_member(snap_dir, info.get("file"), files)
    leaves = []
    for info in manifest["array_files"]:
        rel = info.get("file") if isinstance(info, dict) else None
        data = _read_member(snap_dir, rel, files)
        try:
            leaves.append(np.lib.format.read_array(io.BytesIO(data), allow_pickle=False))
        except ValueError as exc:
            raise CheckpointCorruptError(f"{snap_dir / rel}: not a readable .npy "
                                         f"({exc}): {_FIX}") from None
    for aname, tree in manifest["arrays"].items():
        try:
            snap.arrays[aname] = arrays_mod.unflatten(tree, leaves, manifest["array_files"],
                                                      array_module, aname)
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointCorruptError(f"{snap_dir / MANIFEST}: array entry {aname!r} is "
                                         f"malformed ({exc}): {_FIX}") from None
    for dname, info in manifest["dynamic"].items():
        rel = info.get("file") if isinstance(info, dict) else None
        snap.dynamic_states[dname] = _read_member(snap_dir, rel, files).decode()
    return snap



def file_digests(root: Path) -> dict[Path, str]:
    """md5 of every file of the published snapshot(s), from the manifests
    written with them (snapshots are never modified once published)."""
    out: dict[Path, str] = {}
    for rel, manifest_md5 in latest(root) or []:
        snap_dir = root / rel
        out[snap_dir / MANIFEST] = manifest_md5
        for member, info in read_manifest(snap_dir, manifest_md5)["files"].items():
            if _MEMBER_PATH.match(member):
                out[snap_dir / member] = info["md5"]
    return out
