"""Hostile checkpoints: the toolkit of tests/integration/test_hostile_checkpoints.py.

A checkpoint written by dvc-dali's own writer (the pristine one), an oracle
that reads its files back independently, and the ways to forge it as an
attacker would while keeping its digests consistent: manifest fields
edited (hypothesis strategies and fixed edits, deep nesting written
straight into the JSON), member files swapped for other bytes, .npy files
of another dtype, shape or header, 5 GB sparse files, FIFOs, directories,
symlinks out of the snapshot; then the manifest's md5s and LATEST's md5 of
the manifest recomputed. Opening one is bounded in time, Python/NumPy
allocations and file descriptors (``bounded``).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import hashlib
import io
import json
import math
import os
import shutil
import signal
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import hypothesis
import numpy as np
import pytest
from hypothesis import HealthCheck, currently_in_test_context
from hypothesis import strategies as st

import dvc_dali
from dvc_dali.format import store
from dvc_dali.core.errors import CheckpointCorruptError, DvcDaliError

from tests.helpers import pipelines

TIME_BOUND_S = 5.0
MEMORY_BOUND = 32 << 20  # the checkpoint under attack holds < 100 KB
HUGE = 5 << 30
SETTINGS = dict(deadline=None, database=None, print_blob=True,
                suppress_health_check=list(HealthCheck))


# -- the checkpoints under attack ------------------------------------------------
DESCRIPTION = {"batch_size": 4, "seed": 7, "data": {"reader.file_root": "0" * 40},
               "operators": {"reader": {"type": "readers__File", "inputs": [],
                                        "args": {"random_shuffle": True, "shard_id": 0}},
                             "angle": {"type": "random__Uniform", "inputs": [],
                                       "args": {"range": [-45.0, 45.0]}}}}


def user_arrays() -> dict[str, Any]:
    values: dict[str, Any] = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        # first by name, and in Fortran order: arrays/00000.npy (the others share a pack)
        "a_fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "big_endian": np.arange(3, dtype=">i4"),
        "scalar": np.float64(2.5),
        "empty": np.zeros((0, 3)),
        "state": {"layers": [np.ones(2), (1, 2.5, float("nan"), None, "s", True)],
                  3: {"m": np.zeros((2, 2), np.int8)}},
    }
    torch = torch_or_none()
    if torch is not None:
        values["t"] = {"bf16": torch.arange(4, dtype=torch.bfloat16), "i": torch.arange(3)}
    return values


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def write_store_checkpoint(root: Path) -> None:
    """A checkpoint written by dvc-dali's own writer: two pipelines (state
    bytes only need to be bytes here), nested arrays, a dynamic-mode text."""
    pipes = {name: {"state": f"\x0a\x03{name} fake DALI state".encode(),
                    "description": DESCRIPTION, "fingerprint": "0" * 40, "iter": 3,
                    "epoch_idx": 0} for name in ("train", "val")}
    name, md5 = store.write_capture(root, store.Capture(
        7, pipes, user_arrays(), {"lr": 0.1, "note": "x"}, {"dvc_dali": "test"},
        run={"params": {"lr": 0.1}, "total_steps": 10},
        dynamic={"dyn": '{"reader": {"pos": 3}}'}))
    store.publish(root, [(name, md5)])


# -- reading the files back, as the oracle -------------------------------------------
def snap_dir(root: Path) -> Path:
    return root / (root / store.LATEST).read_text().split()[0]


def load_manifest(root: Path) -> dict:
    return json.loads((snap_dir(root) / store.MANIFEST).read_bytes())


def host_bits(value: Any, info: dict) -> np.ndarray:
    """A restored leaf as the NumPy array its .npy holds."""
    if type(value).__module__.startswith("torch"):
        view = info.get("torch_view")
        return (value.view(getattr(torch_or_none(), view)) if view else value).numpy()
    return np.asarray(value)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return (a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes(order="A") == b.tobytes(order="A"))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def matches_tree(value: Any, tree: dict, leaves: list, infos: list) -> bool:
    """``value`` is what ``tree`` (the manifest's) describes, leaves from np.load."""
    (kind, body), = tree.items()
    if kind == "array":
        return same(host_bits(value, infos[body]), leaves[body])
    if kind == "dict":
        return (isinstance(value, dict) and len(value) == len(body)
                and all(matches_tree(value[k], sub, leaves, infos) for k, _, sub in body))
    if kind in ("list", "tuple"):
        return (type(value).__name__ == kind and len(value) == len(body)
                and all(matches_tree(v, sub, leaves, infos) for v, sub in zip(value, body)))
    return same(value, float(body) if kind == "float" else body)


def leaf_on_disk(folder: Path, info: dict) -> np.ndarray:
    """An array as its file holds it: its own .npy, or its bytes in a pack."""
    if "offset" not in info:
        return np.load(folder / info["file"], allow_pickle=False)
    count = int(np.prod(info["shape"], dtype=object))
    return np.frombuffer((folder / info["file"]).read_bytes(), np.dtype(info["dtype"]), count,
                         info["offset"]).reshape(info["shape"])


def check_correct(snap: store.Snapshot, root: Path) -> None:
    """What was read is what the files on disk say (read here independently)."""
    folder = snap_dir(root)
    manifest = load_manifest(root)
    assert same(snap.manifest, manifest)
    for name, info in manifest["pipelines"].items():
        assert snap.pipeline_states[name] == (folder / info["file"]).read_bytes()
    for name, info in manifest["dynamic"].items():
        assert snap.dynamic_states[name] == (folder / info["file"]).read_text("utf-8")
    infos = manifest["array_files"]
    leaves = [leaf_on_disk(folder, info) for info in infos]
    assert snap.arrays.keys() == manifest["arrays"].keys()
    for name, tree in manifest["arrays"].items():
        assert matches_tree(snap.arrays[name], tree, leaves, infos), name


# -- hostile edits -------------------------------------------------------------------
class Deep:
    """A value nested ``levels`` deep, written straight into the JSON text
    (json.dumps itself would hit the recursion limit)."""

    def __init__(self, levels: int, bracket: str = "[") -> None:
        self.levels, self.bracket = levels, bracket

    def text(self) -> str:
        if self.bracket == "[":
            return "[" * self.levels + "]" * self.levels
        return '{"a":' * self.levels + "0" + "}" * self.levels

    def __repr__(self) -> str:
        return f"Deep({self.levels}, {self.bracket!r})"


def dumps(manifest: Any) -> bytes:
    deep: dict[str, Deep] = {}

    def marker(value: Any) -> str:
        if isinstance(value, Deep):
            deep[f"@@deep{len(deep)}@@"] = value
            return f"@@deep{len(deep) - 1}@@"
        raise TypeError(type(value))

    text = json.dumps(manifest, default=marker)
    for mark, value in deep.items():
        text = text.replace(json.dumps(mark), value.text())
    return text.encode()


HOSTILE_VALUES = [None, 0, -1, "", [], {}, True, False, 1e308, -1e308, float("inf"),
                  float("-inf"), float("nan"), "Infinity", "NaN", 2 ** 64, -(2 ** 63), 0.5,
                  "../../outside", "/etc/passwd", "arrays/../x.npy", "arrays/00001.npy",
                  "pipelines/00001.dali", "dynamic/00000.json", "|O", "<f8", ">f8", "torch",
                  "jax", "cupy", "load", "int64", "x" * 300, ["a", "str", {"value": 1}],
                  {"array": 0}, {"array": 99}, {"dict": [[1, "str", {"value": 0}]]},
                  {"rank": 0, "world_size": 1}, {"rank": 1, "world_size": 2},
                  Deep(300), Deep(100_000), Deep(300, "{"), Deep(100_000, "{")]
JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-3, 40)
                       | st.floats(allow_nan=True) | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def field_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += field_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += field_paths(v, prefix + (i,))
    return out


def apply_edit(manifest: Any, edit: tuple) -> Any:
    """One (op, path, value) edit; a path an earlier edit removed is skipped."""
    op, path, value = edit
    if not path:
        return value if op == "set" else manifest
    node = manifest
    try:
        for part in path[:-1]:
            node = node[part]
        last = path[-1]
        if op == "set":
            node[last] = value
        elif op == "delete":
            del node[last]
        elif op == "rename" and isinstance(node, dict):
            node[value] = node.pop(last)
    except (KeyError, IndexError, TypeError):
        pass
    return manifest


def edits_for(manifest: dict):
    paths = field_paths(manifest)
    value = st.sampled_from(HOSTILE_VALUES) | JSONISH
    return st.lists(st.tuples(st.just("set"), st.sampled_from(paths), value)
                    | st.tuples(st.just("delete"), st.sampled_from(paths), st.none())
                    | st.tuples(st.just("rename"), st.sampled_from(paths),
                                st.sampled_from(["../x", "arrays/00099.npy", "", "w", "0"])),
                    min_size=1, max_size=3)


def publish_manifest(root: Path, raw: bytes, folder: Path | None = None) -> None:
    """Write manifest bytes and make LATEST's md5 match them."""
    folder = folder or snap_dir(root)
    (folder / store.MANIFEST).write_bytes(raw)
    (root / store.LATEST).write_text(f"{folder.name} {hashlib.md5(raw).hexdigest()}\n")


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def huge_header_npy() -> bytes:
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (10000000, 10000000), }"
    header = header.ljust(118) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + b"\0" * 8


def pickled_object_npy() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    return buf.getvalue()


# Content swaps: new bytes for a file, its manifest entry's md5 and size
# recomputed (and for the huge-header .npy the array_files entry made to agree).
CONTENT = {
    "empty": lambda old: b"",
    "garbage": lambda old: b"\xff\xfe garbage " * 7,
    "truncated": lambda old: old[: len(old) // 2],
    "non_utf8": lambda old: b"\xff\xfe\xfd" + old,
    "npy_dtype": lambda old: npy_bytes(np.arange(4, dtype=np.int64)),
    "npy_shape": lambda old: npy_bytes(np.arange(4.0).reshape(2, 2)),
    "npy_huge_header": lambda old: huge_header_npy(),
    "npy_object": lambda old: pickled_object_npy(),
}
# Kind swaps: the path becomes something other than what was written.
# "sparse_huge_sized" also makes the manifest say 5 GB for a .npy or a .pack.
KINDS = ("sparse_huge", "sparse_huge_sized", "fifo", "directory", "symlink_out", "missing")


def read_manifest_or_none(root: Path, folder: Path) -> dict | None:
    """The manifest as the test itself may read it (never a FIFO or 5 GB)."""
    path = folder / store.MANIFEST
    if not path.is_file() or path.is_symlink() or path.stat().st_size > (1 << 20):
        return None
    try:
        manifest = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) else None


def fix_entry(root: Path, folder: Path, rel: str, size: int, md5: str,
              array_entry: dict | None = None) -> None:
    """Make the manifest agree with a swapped file, then LATEST with the manifest."""
    manifest = read_manifest_or_none(root, folder)
    try:
        manifest["files"][rel] = {"md5": md5, "size": size}
        for info in manifest["array_files"] if array_entry else []:
            if info["file"] == rel:
                info.update(array_entry)
    except (KeyError, TypeError, IndexError):
        return  # an edit already broke what this would fix
    publish_manifest(root, dumps(manifest), folder)


def target_path(root: Path, folder: Path, target: str) -> Path:
    return root / store.LATEST if target == store.LATEST else folder / target


def swap_content(root: Path, folder: Path, target: str, kind: str) -> bool:
    """Replace a file's bytes; returns whether opening must now fail."""
    path = target_path(root, folder, target)
    if target == "." or not path.is_file() or path.is_symlink():
        return False
    data = CONTENT[kind](path.read_bytes())
    path.write_bytes(data)
    if target == store.LATEST:
        return True
    if target == store.MANIFEST:
        publish_manifest(root, data, folder)
        return True
    huge = {"dtype": "<f8", "shape": [10**7, 10**7]} if kind == "npy_huge_header" else None
    fix_entry(root, folder, target, len(data), hashlib.md5(data).hexdigest(), huge)
    if target.endswith(".npy"):
        return True  # none of these is the array the manifest describes
    if target.endswith(".json"):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return True
    return False  # a .dali file is only bytes to the store


def swap_kind(outside: Path, path: Path, kind: str) -> bool:
    """Replace what is at ``path``; returns whether opening must now fail."""
    if not os.path.lexists(path) or not path.parent.is_dir() or path.parent.is_symlink():
        return False  # an earlier swap took it (or its directory) away
    if kind == "symlink_out":
        moved = outside / f"moved-{len(os.listdir(outside))}-{path.name}"
        shutil.move(path, moved)
        os.symlink(moved, path)
        return True
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    if kind.startswith("sparse_huge"):
        with open(path, "wb") as fh:
            fh.truncate(HUGE)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    return True


def apply_swaps(root: Path, outside: Path, swaps: list[tuple[str, str]]) -> bool:
    """The 5 GB sizes in the manifest first, then one content swap (both
    rewrite the manifest and LATEST), then the kind swaps (which read
    nothing); returns whether opening must now fail."""
    folder = snap_dir(root)
    kinds = [(t, k) for t, k in swaps if k not in CONTENT]
    for target, kind in kinds:
        if kind == "sparse_huge_sized" and target.endswith((".npy", ".pack")):
            fix_entry(root, folder, target, HUGE, "0" * 32)
    must_fail = False
    for target, kind in [(t, k) for t, k in swaps if k in CONTENT][:1]:
        must_fail |= swap_content(root, folder, target, kind)
    for target, kind in kinds:
        must_fail |= swap_kind(outside, target_path(root, folder, target), kind)
    return must_fail


def emptied(root: Path) -> bool:
    """Whether the swaps left the directory as before any checkpoint: no
    LATEST and no snapshot (what `read_snapshot` answers with None)."""
    return not os.path.lexists(root / store.LATEST) and not any(
        name.startswith("step-") for name in os.listdir(root))


def swap_targets(root: Path) -> list[str]:
    members = sorted(load_manifest(root)["files"])
    subdirs = sorted({m.split("/")[0] for m in members})
    npys = [m for m in members if m.endswith(".npy")]
    return [store.LATEST, store.MANIFEST, ".", *subdirs, *members, *npys]


SWAPS = st.sampled_from(sorted(CONTENT) + list(KINDS))


def event(text: str) -> None:
    """hypothesis.event() inside a property test (its statistics), else nothing."""
    if currently_in_test_context():
        hypothesis.event(text)


# -- the bounds ------------------------------------------------------------------------
class Timeout(Exception):
    pass


@contextlib.contextmanager
def bounded(what: str, check_fds: bool = True):
    """Fail if the body takes TIME_BOUND_S or more (a hang is interrupted at
    twice that), allocates more than MEMORY_BOUND, or leaks a descriptor."""
    def alarm(signum, frame):
        raise Timeout(f"{what}: still running after {2 * TIME_BOUND_S} s")

    gc.collect()  # an earlier test's garbage is closed now, not inside the body
    fds = _open_fds()
    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 2 * TIME_BOUND_S)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert elapsed < TIME_BOUND_S, f"{what}: took {elapsed:.1f} s"
    assert peak < MEMORY_BOUND, f"{what}: allocated {peak >> 20} MiB"
    if check_fds:
        leaked = {fd: target for fd, target in _open_fds().items() if fds.get(fd) != target}
        assert not leaked, f"{what}: leaked file descriptors {leaked}"


def _open_fds() -> dict[str, str]:
    """Each open descriptor and what it points at: one the body opened and
    left open shows as new, one another object's finalizer closed does not."""
    found = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            found[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # listdir's own descriptor, closed already
    return found


def open_store(root: Path, must_fail: bool, what: str) -> store.Snapshot | None:
    """read_snapshot under the bounds: a DvcDaliError, or data checked correct."""
    snap = None
    with bounded(what):
        try:
            snap = store.read_snapshot(root)
        except DvcDaliError as exc:
            assert str(exc).startswith(str(root)), f"{what}: message names no file: {exc}"
            event(f"refused: {type(exc).__name__}: {cause(exc)}")
            return None
    assert not must_fail, f"{what}: read without an error"
    check_correct(snap, root)
    event("read back, data checked")
    return snap


def cause(exc: Exception) -> str:
    """The kind of refusal, for hypothesis' statistics (no paths, no values)."""
    text = str(exc).split(": ", 1)[1]
    for word in ("field", "is a", "bytes, the manifest says", "not a readable .npy",
                 "not valid JSON", "JSON nested", "missing", "does not hold", "md5",
                 "not UTF-8", "more than", "does not exist", "not a dvc-dali manifest",
                 "holds the state of rank", "format_version"):
        if word in text:
            return word
    return text[:30]


@contextlib.contextmanager
def copy_of(src: Path):
    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        (work / "outside").mkdir()
        shutil.copytree(src, work / "ckpt", symlinks=True)
        yield work / "ckpt", work / "outside"
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- what the tests run ----------------------------------------------------------------
def draw_edits(data, root: Path, manifest: dict) -> list:
    """Draw at most one set of manifest edits and publish the edited manifest
    (digests recomputed); the edits drawn."""
    edits = data.draw(st.lists(edits_for(manifest), max_size=1), label="edits")
    if edits:
        edited = copy.deepcopy(manifest)
        for edit in edits[0]:
            edited = apply_edit(edited, edit)
        publish_manifest(root, dumps(edited))
    return edits


class DaliCase(dict):
    def __init__(self, **kw: Any) -> None:
        super().__init__(kw)

    def __repr__(self) -> str:  # hypothesis prints it with every failure
        return f"DaliCase({self['root']})"


def open_checkpointer(dali: dict, root: Path, must_fail: bool, what: str) -> None:
    """Checkpointer(path) and the pipeline's restore: a DvcDaliError, or
    the batch an untouched checkpoint (or a fresh start) gives."""
    with bounded(what, check_fds=False):  # a Checkpointer holds its lock's descriptor
        try:
            ck = dvc_dali.Checkpointer(root, params={"lr": 0.1}, total_steps=10)
        except DvcDaliError as exc:
            event(f"refused by Checkpointer(): {type(exc).__name__}: {cause(exc)}")
            return
        try:
            got = pipelines.outputs_of(ck.pipeline("train", dali["fn"], **dali["kw"]))
        except DvcDaliError as exc:
            event(f"refused by .pipeline(): {type(exc).__name__}: {cause(exc)}")
            return
        finally:
            ck.close()
    assert not must_fail, f"{what}: opened without an error"
    # a checkpoint that holds no entry for the pipeline: it starts from its
    # beginning, as one registered after the checkpoint was written does
    # (restorable's ``lacks``, said); an edit that deletes the entry leaves that
    restored = ck.resumed and "train" in (load_manifest(root).get("pipelines") or {})
    want = dali["restored"] if restored else dali["fresh"]
    assert len(got) == len(want) and all(same(a, b) for a, b in zip(got, want)), what
    event("restored, batch checked" if restored else "fresh start, batch checked")


def refused(root: Path, match: str, error: type = CheckpointCorruptError) -> str:
    """read_snapshot under the bounds must raise ``error`` matching ``match``."""
    with bounded(f"reading {root}"):
        with pytest.raises(error, match=match) as err:
            store.read_snapshot(root)
    return str(err.value)


def swap_npy(root: Path, rel: str, data: bytes, **entry: Any) -> None:
    (snap_dir(root) / rel).write_bytes(data)
    fix_entry(root, snap_dir(root), rel, len(data), hashlib.md5(data).hexdigest(),
              entry or None)


def field_path(manifest: dict, dotted: str) -> tuple:
    """'files.arrays/00000.npy.size' -> ('files', 'arrays/00000.npy', 'size')."""
    parts: list = []
    node: Any = manifest
    rest = dotted
    while rest:
        if isinstance(node, dict):
            name = max((k for k in node if rest == k or rest.startswith(k + ".")), key=len)
        else:
            name = int(rest.split(".")[0])
        parts.append(name)
        node = node[name]
        rest = rest[len(str(name)) + 1:]
    return tuple(parts)


def as_host(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: as_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(as_host(v) for v in value)
    if type(value).__module__.startswith("torch"):
        return (str(value.dtype), value.view(torch_or_none().int16).numpy()
                if value.dtype == torch_or_none().bfloat16 else value.numpy())
    return value


def write_dali_state(root: Path, data: bytes) -> None:
    rel = "pipelines/00000.dali"
    (snap_dir(root) / rel).write_bytes(data)
    fix_entry(root, snap_dir(root), rel, len(data), hashlib.md5(data).hexdigest())


def ld(data: bytes) -> bytes:
    """protobuf length prefix + data."""
    out, n = b"", len(data)
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n >> 7 else 0)])
        n >>= 7
        if not n:
            return out + data
