"""Checkpoint directories crafted as an attacker would, digests kept consistent.

A checkpoint is input from outside (a `dvc exp apply` of someone's row, a
copied directory). Each manifest field is replaced by null, 0, -1, "", [],
{}, true, 1e308, Infinity, deep nesting...; member files, LATEST, the
manifest and the snapshot's directories are swapped for 5 GB sparse files,
FIFOs, directories, symlinks out of the snapshot, .npy files of another
dtype or shape or with a header declaring 10**7 x 10**7 elements; then the
manifest's md5s and LATEST's md5 of the manifest are recomputed. Opening must
give the right data or a documented error (a DvcDaliError), within
TIME_BOUND_S per example and MEMORY_BOUND of Python/NumPy allocations
(tracemalloc peak); the 5 GB and 10**7 x 10**7 cases also run in a child
process under RLIMIT_AS (its address space at start + 512 MiB).

Property tests run DVC_DALI_HOSTILE_EXAMPLES examples (300 by default; the
long mode sets 10000) at the store level, and half of that through
``dvc_dali.Checkpointer`` with a real DALI pipeline.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import hypothesis
import numpy as np
import pytest
from hypothesis import HealthCheck, currently_in_test_context, given, settings
from hypothesis import strategies as st

import dvc_dali
from dvc_dali import store
from dvc_dali.errors import CheckpointCorruptError, DvcDaliError

from tests.helpers import REPO, pipelines

EXAMPLES = int(os.environ.get("DVC_DALI_HOSTILE_EXAMPLES", "300"))
DALI_EXAMPLES = max(20, EXAMPLES // 2)
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
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "big_endian": np.arange(3, dtype=">i4"),
        "scalar": np.float64(2.5),
        "empty": np.zeros((0, 3)),
        "state": {"layers": [np.ones(2), (1, 2.5, float("nan"), None, "s", True)],
                  3: {"m": np.zeros((2, 2), np.int8)}},
    }
    torch = _torch()
    if torch is not None:
        values["t"] = {"bf16": torch.arange(4, dtype=torch.bfloat16), "i": torch.arange(3)}
    return values


def _torch():
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
    name, md5 = store.write_snapshot(
        root, 7, pipes, user_arrays(), {"lr": 0.1, "note": "x"}, {"dvc_dali": "test"},
        run={"params": {"lr": 0.1}, "total_steps": 10},
        dynamic={"dyn": '{"reader": {"pos": 3}}'})
    store.publish(root, [(name, md5)])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "ckpt"
    write_store_checkpoint(root)
    return root


# -- reading the files back, as the oracle -------------------------------------------
def snap_dir(root: Path) -> Path:
    return root / (root / store.LATEST).read_text().split()[0]


def load_manifest(root: Path) -> dict:
    return json.loads((snap_dir(root) / store.MANIFEST).read_bytes())


def host_bits(value: Any, info: dict) -> np.ndarray:
    """A restored leaf as the NumPy array its .npy holds."""
    if type(value).__module__.startswith("torch"):
        view = info.get("torch_view")
        return (value.view(getattr(_torch(), view)) if view else value).numpy()
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
    leaves = [np.load(folder / info["file"], allow_pickle=False) for info in infos]
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


def _pickled_object_npy() -> bytes:
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
    "npy_object": lambda old: _pickled_object_npy(),
}
# Kind swaps: the path becomes something other than what was written.
# "sparse_huge_sized" also makes the manifest say 5 GB for a .npy.
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
        if kind == "sparse_huge_sized" and target.endswith(".npy"):
            fix_entry(root, folder, target, HUGE, "0" * 32)
    must_fail = False
    for target, kind in [(t, k) for t, k in swaps if k in CONTENT][:1]:
        must_fail |= swap_content(root, folder, target, kind)
    for target, kind in kinds:
        must_fail |= swap_kind(outside, target_path(root, folder, target), kind)
    return must_fail


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

    fds = len(os.listdir("/proc/self/fd"))
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
        assert len(os.listdir("/proc/self/fd")) == fds, f"{what}: leaked a file descriptor"


def open_store(root: Path, must_fail: bool, what: str) -> store.Snapshot | None:
    """read_snapshot under the bounds: a DvcDaliError, or data checked correct."""
    snap = None
    with bounded(what):
        try:
            snap = store.read_snapshot(root)
        except DvcDaliError as exc:
            assert str(exc).startswith(str(root)), f"{what}: message names no file: {exc}"
            event(f"refused: {type(exc).__name__}: {_cause(exc)}")
            return None
    assert not must_fail, f"{what}: read without an error"
    check_correct(snap, root)
    event("read back, data checked")
    return snap


def _cause(exc: Exception) -> str:
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


# -- property tests ----------------------------------------------------------------------
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


@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_hostile_store_checkpoints(pristine, data):
    manifest = load_manifest(pristine)
    with copy_of(pristine) as (root, outside):
        edits = draw_edits(data, root, manifest)
        swaps = data.draw(st.lists(st.tuples(st.sampled_from(swap_targets(pristine)), SWAPS),
                                   max_size=2 if edits else 3, min_size=0 if edits else 1),
                          label="swaps")
        # After an edit a swapped file may no longer be named by the manifest:
        # then only "right data or a documented error" is asserted.
        must_fail = apply_swaps(root, outside, swaps) and not edits
        open_store(root, must_fail, f"edits {edits} swaps {swaps}")


@pytest.fixture(scope="module")
def dali_pristine(data_dir, tmp_path_factory) -> dict:
    """A checkpoint written by Checkpointer with a real DALI pipeline, and
    the batch a restore from it yields (and a fresh start's)."""
    root = tmp_path_factory.mktemp("dali") / "ckpt"
    fn_, kw = pipelines.make("rotate", str(data_dir))["train"]
    ck = dvc_dali.Checkpointer(root, params={"lr": 0.1}, total_steps=10)
    pipe = ck.pipeline("train", fn_, **kw)
    for _ in range(3):
        pipe.run()
    ck.save(3, arrays={"w": np.arange(4.0), "opt": {0: [np.ones(2)], "lr": 0.1}},
            metadata={"lr": 0.1})
    ck.close()
    fresh = dvc_dali.Checkpointer(root, resume=False)
    first = pipelines.outputs_of(fresh.pipeline("train", fn_, **kw))
    fresh.close()
    return DaliCase(root=root, fn=fn_, kw=kw, restored=pipelines.outputs_of(pipe), fresh=first)


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
            event(f"refused by Checkpointer(): {type(exc).__name__}: {_cause(exc)}")
            return
        try:
            got = pipelines.outputs_of(ck.pipeline("train", dali["fn"], **dali["kw"]))
        except DvcDaliError as exc:
            event(f"refused by .pipeline(): {type(exc).__name__}: {_cause(exc)}")
            return
        finally:
            ck.close()
    assert not must_fail, f"{what}: opened without an error"
    want = dali["restored"] if ck.resumed else dali["fresh"]
    assert len(got) == len(want) and all(same(a, b) for a, b in zip(got, want)), what
    event("restored, batch checked" if ck.resumed else "fresh start, batch checked")


@settings(max_examples=DALI_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_hostile_checkpoints_through_checkpointer(dali_pristine, data):
    src = dali_pristine["root"]
    manifest = load_manifest(src)
    with copy_of(src) as (root, outside):
        edits = draw_edits(data, root, manifest)
        swaps = data.draw(st.lists(st.tuples(st.sampled_from(swap_targets(src)), SWAPS),
                                   max_size=1, min_size=0 if edits else 1), label="swaps")
        must_fail = apply_swaps(root, outside, swaps) and not edits
        open_checkpointer(dali_pristine, root, must_fail, f"edits {edits} swaps {swaps}")


# -- one test per input class ------------------------------------------------------------
@pytest.fixture
def ckpt(pristine):
    with copy_of(pristine) as (root, outside):
        yield root, outside


def refused(root: Path, match: str, error: type = CheckpointCorruptError) -> str:
    """read_snapshot under the bounds must raise ``error`` matching ``match``."""
    with bounded(f"reading {root}"):
        with pytest.raises(error, match=match) as err:
            store.read_snapshot(root)
    return str(err.value)


MEMBERS = ["pipelines/00000.dali", "arrays/00000.npy", "dynamic/00000.json"]


@pytest.mark.parametrize("rel", MEMBERS)
def test_sparse_5gb_member_is_not_read(ckpt, rel):
    root, outside = ckpt
    apply_swaps(root, outside, [(rel, "sparse_huge")])
    refused(root, f"{rel}: {HUGE} bytes, the manifest says \\d+ \\(truncated")


def test_sparse_5gb_npy_the_manifest_agrees_with_is_not_read(ckpt):
    root, outside = ckpt
    apply_swaps(root, outside, [("arrays/00000.npy", "sparse_huge_sized")])
    refused(root, "arrays/00000.npy: not a readable .npy \\(no .npy magic")


@pytest.mark.parametrize("rel", [store.LATEST, store.MANIFEST, *MEMBERS])
def test_fifo_does_not_hang(ckpt, rel):
    root, outside = ckpt
    apply_swaps(root, outside, [(rel, "fifo")])
    refused(root, f"{rel}: is a FIFO, not a regular file")


@pytest.mark.parametrize("rel", [store.LATEST, store.MANIFEST, *MEMBERS])
def test_directory_in_place_of_a_file(ckpt, rel):
    root, outside = ckpt
    apply_swaps(root, outside, [(rel, "directory")])
    refused(root, f"{rel}: is a directory, not a regular file")


@pytest.mark.parametrize("size", [HUGE, store.LATEST_MAX_BYTES + 1])
def test_latest_over_1_mib_is_not_read(ckpt, size):
    root, _ = ckpt
    line = (root / store.LATEST).read_bytes()
    with open(root / store.LATEST, "wb") as fh:
        fh.write(line)
        fh.truncate(size)
    refused(root, f"LATEST: {size} bytes, more than the 1 MiB")


def test_manifest_over_64_mib_is_not_read(ckpt):
    root, _ = ckpt
    with open(snap_dir(root) / store.MANIFEST, "r+b") as fh:
        fh.truncate(1 << 30)  # its md5 in LATEST stays: nothing may read 1 GB to find out
    refused(root, "manifest.json: 1073741824 bytes, more than the 64 MiB")


def _swap_npy(root: Path, rel: str, data: bytes, **entry: Any) -> None:
    (snap_dir(root) / rel).write_bytes(data)
    fix_entry(root, snap_dir(root), rel, len(data), hashlib.md5(data).hexdigest(),
              entry or None)


def test_npy_header_declaring_10e7_by_10e7_is_not_allocated(ckpt):
    root, _ = ckpt
    _swap_npy(root, "arrays/00000.npy", huge_header_npy(), dtype="<f8", shape=[10**7, 10**7])
    refused(root, "not a readable .npy \\(shape \\(10000000, 10000000\\) of <f8 needs "
            "800000000000000 data bytes, the file has 8\\)")


@pytest.mark.parametrize("array,says", [
    (np.arange(12, dtype=np.float64).reshape(3, 4), "holds dtype <f8 shape \\(3, 4\\)"),
    (np.arange(12, dtype=np.float32), "holds dtype <f4 shape \\(12,\\)"),
    (np.arange(12, dtype=np.float32).reshape(3, 4).astype(">f4"), "holds dtype >f4"),
], ids=["dtype", "shape", "byte order"])
def test_npy_other_than_the_manifest_says(ckpt, array, says):
    root, _ = ckpt
    infos = load_manifest(root)["array_files"]
    rel = next(i["file"] for i in infos if i["dtype"] == "<f4" and i["shape"] == [3, 4])
    _swap_npy(root, rel, npy_bytes(array))
    refused(root, f"{rel}: not a readable .npy \\({says}.*the manifest says <f4 shape \\(3, 4\\)")


def test_npy_of_python_objects_is_not_unpickled(ckpt):
    root, _ = ckpt
    _swap_npy(root, "arrays/00000.npy", _pickled_object_npy())
    refused(root, "arrays/00000.npy: not a readable .npy")


@pytest.mark.parametrize("where", ["whole", "metadata", "arrays.w"])
def test_manifest_nested_100000_levels(ckpt, where):
    root, _ = ckpt
    manifest = load_manifest(root)
    if where == "whole":
        raw = Deep(100_000, "{").text().encode()
    else:
        raw = dumps(apply_edit(manifest, ("set", tuple(where.split(".")), Deep(100_000))))
    publish_manifest(root, raw)
    refused(root, "manifest.json: JSON nested 1000\\d\\d levels deep, more than the 256")


def test_manifest_nested_300_levels_in_the_arrays_tree(ckpt):
    """Within the JSON limit, the tree's own limit (64) names the field."""
    root, _ = ckpt
    tree: dict = {"array": 0}
    for _ in range(80):
        tree = {"list": [tree]}
    publish_manifest(root, dumps(apply_edit(load_manifest(root), ("set", ("arrays", "w"),
                                                                   tree))))
    refused(root, "field 'arrays.w.list\\[0\\].*' nested deeper than 64 levels")


FIELDS = ["step", "format_version", "files", "files.arrays/00000.npy",
          "files.arrays/00000.npy.size", "files.arrays/00000.npy.crc32", "pipelines",
          "pipelines.train", "pipelines.train.file", "pipelines.train.description",
          "pipelines.train.description.operators", "pipelines.train.iter", "array_files",
          "array_files.0", "array_files.0.file", "array_files.0.shape",
          "array_files.0.shape.0", "array_files.0.dtype", "array_files.0.kind", "arrays",
          "arrays.w", "arrays.w.array", "arrays.state.dict.0", "dynamic", "dynamic.dyn",
          "dynamic.dyn.file", "metadata", "run", "run.params", "run.total_steps", "rank",
          "versions", "created"]
VALUES = [None, 0, -1, "", [], {}, True, 1e308, float("inf"), "Infinity"]


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


@pytest.mark.parametrize("value", VALUES, ids=repr)
@pytest.mark.parametrize("field", FIELDS)
def test_field_replaced_by_another_type(ckpt, field, value):
    """Every field, each value: the data or a documented error naming the field."""
    root, _ = ckpt
    manifest = load_manifest(root)
    path = field_path(manifest, field)
    publish_manifest(root, dumps(apply_edit(manifest, ("set", path, value))))
    snap = open_store(root, False, f"{field} = {value!r}")
    if snap is None:
        return
    # what is read back is what the files say (checked), and the field held a
    # value that field may hold:
    assert field in ("metadata", "run.params", "created", "versions", "rank",
                     "run.total_steps", "arrays.w.array", "pipelines.train.iter",
                     "array_files.0.shape.0", "step") or value in ({}, None), (field, value)


@pytest.mark.parametrize("value", [-5, True, False, 1.0, "3", None])
def test_step_must_be_a_non_negative_int(ckpt, value):
    root, _ = ckpt
    publish_manifest(root, dumps(apply_edit(load_manifest(root), ("set", ("step",), value))))
    refused(root, "manifest.json: field 'step' is ")


def test_dynamic_state_not_utf8(ckpt):
    root, _ = ckpt
    _swap_npy(root, "dynamic/00000.json", b'{"reader": "\xff\xfe"}')
    refused(root, "dynamic/00000.json: not UTF-8 text \\(invalid start byte at byte 12\\)")


@pytest.mark.parametrize("rel", [store.LATEST, store.MANIFEST, ".", "arrays", "pipelines",
                                 "dynamic", *MEMBERS])
def test_symlink_out_of_the_snapshot_is_not_followed(ckpt, rel):
    """The link points at an identical copy: following it would "work"."""
    root, outside = ckpt
    apply_swaps(root, outside, [(rel, "symlink_out")])
    name = snap_dir(root).name if rel == "." else rel
    refused(root, f"{name}: is a symlink, not a (regular file|directory)")


def test_todays_checkpoint_reads_back_exactly(pristine):
    snap = open_store(pristine, False, "pristine")
    assert snap.step == 7 and snap.dynamic_states == {"dyn": '{"reader": {"pos": 3}}'}
    want = user_arrays()
    for name, value in want.items():
        got = snap.arrays[name]
        assert same(_as_host(got), _as_host(value)), name


def _as_host(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _as_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_as_host(v) for v in value)
    if type(value).__module__.startswith("torch"):
        return (str(value.dtype), value.view(_torch().int16).numpy()
                if value.dtype == _torch().bfloat16 else value.numpy())
    return value


# -- the memory bound, for allocations tracemalloc does not see --------------------------
CHILD = """
import resource, sys
from pathlib import Path
from dvc_dali import store
from dvc_dali.errors import DvcDaliError
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
size = int(status["VmSize"].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), size + (512 << 20)))
try:
    store.read_snapshot(Path(sys.argv[1]))
except DvcDaliError as exc:
    print(type(exc).__name__, exc)
"""


@pytest.mark.parametrize("case", ["sparse_npy_sized", "huge_header", "manifest_1gb",
                                  "latest_5gb"])
def test_huge_inputs_under_rlimit_as(ckpt, case):
    """In a child whose address space may grow by 512 MiB only: a 5 GB or
    3.6 TiB allocation would die with MemoryError instead of the error."""
    root, outside = ckpt
    if case == "sparse_npy_sized":
        apply_swaps(root, outside, [("arrays/00000.npy", "sparse_huge_sized")])
    elif case == "huge_header":
        _swap_npy(root, "arrays/00000.npy", huge_header_npy(), dtype="<f8",
                  shape=[10**7, 10**7])
    elif case == "manifest_1gb":
        with open(snap_dir(root) / store.MANIFEST, "r+b") as fh:
            fh.truncate(1 << 30)
    else:
        with open(root / store.LATEST, "r+b") as fh:
            fh.truncate(HUGE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(root)], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("CheckpointCorruptError " + str(root)), proc.stdout


# -- through the Checkpointer, with a real DALI pipeline ---------------------------------
CK_FIELDS = ["run", "run.params", "run.total_steps", "step", "metadata",
             "pipelines.train.description", "pipelines.train.description.operators",
             "pipelines.train.description.operators.reader",
             "pipelines.train.description.operators.reader.args",
             "pipelines.train.description.batch_size", "array_files.0.shape"]


@pytest.mark.parametrize("value", VALUES, ids=repr)
@pytest.mark.parametrize("field", CK_FIELDS)
def test_checkpointer_field_replaced_by_another_type(dali_pristine, field, value):
    """The run-params check, the pipeline description's comparison and the
    array loader get only values of the types they expect."""
    with copy_of(dali_pristine["root"]) as (root, _):
        manifest = load_manifest(root)
        publish_manifest(root, dumps(apply_edit(manifest, ("set", field_path(manifest, field),
                                                           value))))
        open_checkpointer(dali_pristine, root, False, f"{field} = {value!r}")


def _dali_state_with(root: Path, data: bytes) -> None:
    rel = "pipelines/00000.dali"
    (snap_dir(root) / rel).write_bytes(data)
    fix_entry(root, snap_dir(root), rel, len(data), hashlib.md5(data).hexdigest())


def _ld(data: bytes) -> bytes:
    """protobuf length prefix + data."""
    out, n = b"", len(data)
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n >> 7 else 0)])
        n >>= 7
        if not n:
            return out + data


DALI_STATES = {
    "operator name is a varint": b"\x0a\x02\x08\x05",
    "pipeline data is a varint": b"\x12\x02\x08\x05",
    "pipeline data nested 100000 levels": b"\x12" + _ld(b"\x0a" + _ld(b"[" * 100_000
                                                                     + b"]" * 100_000)),
    "iter is Infinity": b"\x12" + _ld(b"\x0a" + _ld(b'{"iter": Infinity, "epoch_idx": 0}')),
}


@pytest.mark.parametrize("state", list(DALI_STATES))
def test_hostile_dali_state_bytes(dali_pristine, state):
    with copy_of(dali_pristine["root"]) as (root, _):
        _dali_state_with(root, DALI_STATES[state])
        open_checkpointer(dali_pristine, root, True, state)


def test_a_bfloat16_tensor_whose_view_was_dropped_is_refused_not_read_as_int16(tmp_path):
    """Issue 28.8: torch_view set to null made a saved bfloat16 tensor load as
    int16. A real tensor saved by Checkpointer.save; the edited manifest is
    refused by Checkpointer and by dvc_dali.load, naming manifest.json and
    the field."""
    torch = pytest.importorskip("torch")
    root = tmp_path / "ckpt"
    weights = torch.linspace(-2, 2, 6, dtype=torch.bfloat16)
    ck = dvc_dali.Checkpointer(root)
    ck.save(1, arrays={"w": weights})
    ck.close()
    assert torch.equal(dvc_dali.load(root).arrays["w"], weights)  # untouched: bfloat16
    manifest = load_manifest(root)
    (index,) = [i for i, f in enumerate(manifest["array_files"])
                if f.get("torch_dtype") == "bfloat16"]
    assert manifest["array_files"][index]["torch_view"] == "int16"
    manifest["array_files"][index]["torch_view"] = None
    publish_manifest(root, dumps(manifest))  # LATEST's md5 agrees: only the schema can tell
    says = (rf"manifest\.json: field 'array_files\[{index}\]\.torch_view' is null, but "
            r"torch_dtype bfloat16 has no NumPy dtype")
    refused(root, says)
    with pytest.raises(CheckpointCorruptError, match=says):
        dvc_dali.load(root)
    with pytest.raises(CheckpointCorruptError, match=says):
        dvc_dali.Checkpointer(root).arrays
