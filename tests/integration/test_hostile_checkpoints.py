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
``dvc_dali.Checkpointer`` with a real DALI pipeline. The forging, the oracle
and the bounds are tests/helpers/hostile.py; the tests are here.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dvc_dali
from dvc_dali.format import store
from dvc_dali.core.errors import CheckpointCorruptError

from tests.helpers import child_env, pipelines
from tests.helpers.hostile import (HUGE, SETTINGS, SWAPS, DaliCase, Deep, apply_edit,
                                   apply_swaps, as_host, copy_of, draw_edits, dumps, emptied,
                                   field_path, huge_header_npy, ld, load_manifest, npy_bytes,
                                   open_checkpointer, open_store, pickled_object_npy,
                                   publish_manifest, refused, same, snap_dir, swap_npy,
                                   swap_targets, user_arrays, write_dali_state,
                                   write_store_checkpoint)

EXAMPLES = int(os.environ.get("DVC_DALI_HOSTILE_EXAMPLES", "300"))
DALI_EXAMPLES = max(20, EXAMPLES // 2)


@pytest.fixture(scope="module", autouse=True)
def _collect_only_this_module():
    """bounded() collects garbage before each attack, so that an earlier
    test's finalizers do not run inside it: with what this process held
    before the module frozen (left out of collections), each collection
    scans only what the module made, not a heap that TensorFlow or torch
    imported by an earlier module in the same pytest worker (0.3 s a
    collection, 900 attacks)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "ckpt"
    write_store_checkpoint(root)
    return root


# -- property tests ----------------------------------------------------------------------
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
        if emptied(root):  # LATEST and the snapshot both gone: no checkpoint, not a damaged one
            assert store.read_snapshot(root) is None
            return
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


def test_a_manifest_without_the_pipelines_entry_starts_it_afresh(dali_pristine, capsys):
    """What the fuzz above drew once (CI, 2026-12-02): the manifest's entry
    of the pipeline deleted (digests recomputed). Such a checkpoint reads as
    one written before the pipeline was registered: the pipeline starts from
    its beginning, said, and the rest is restored (the oracle had expected
    the restored batch)."""
    src = dali_pristine["root"]
    edited = apply_edit(load_manifest(src), ("delete", ("pipelines", "train"), None))
    with copy_of(src) as (root, _outside):
        publish_manifest(root, dumps(edited))
        open_checkpointer(dali_pristine, root, False, "the pipeline's entry deleted")
    assert "pipeline 'train' is not in" in capsys.readouterr().err


# -- one test per input class ------------------------------------------------------------
@pytest.fixture
def ckpt(pristine):
    with copy_of(pristine) as (root, outside):
        yield root, outside


MEMBERS = ["pipelines/00000.dali", "arrays/00000.npy", "arrays/00000.pack",
           "dynamic/00000.json"]


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


def test_npy_header_declaring_10e7_by_10e7_is_not_allocated(ckpt):
    root, _ = ckpt
    swap_npy(root, "arrays/00000.npy", huge_header_npy(), dtype="<f8", shape=[10**7, 10**7])
    refused(root, "not a readable .npy \\(shape \\(10000000, 10000000\\) of <f8 needs "
            "800000000000000 data bytes, the file has 8\\)")


@pytest.mark.parametrize("array,says", [
    (np.arange(6, dtype=np.float32).reshape(2, 3), "holds dtype <f4 shape \\(2, 3\\)"),
    (np.arange(6, dtype=np.float64), "holds dtype <f8 shape \\(6,\\)"),
    (np.arange(6, dtype=np.float64).reshape(2, 3).astype(">f8"), "holds dtype >f8"),
], ids=["dtype", "shape", "byte order"])
def test_npy_other_than_the_manifest_says(ckpt, array, says):
    root, _ = ckpt
    infos = load_manifest(root)["array_files"]
    rel = next(i["file"] for i in infos if i["dtype"] == "<f8" and i["shape"] == [2, 3])
    assert rel.endswith(".npy")
    swap_npy(root, rel, npy_bytes(array))
    refused(root, f"{rel}: not a readable .npy \\({says}.*the manifest says <f8 shape \\(2, 3\\)")


def test_npy_of_python_objects_is_not_unpickled(ckpt):
    root, _ = ckpt
    swap_npy(root, "arrays/00000.npy", pickled_object_npy())
    refused(root, "arrays/00000.npy: not a readable .npy")


# -- packs (format 3: the arrays under 1 MiB share arrays/NNNNN.pack) ---------------------
def _pack_entry(manifest: dict) -> int:
    return next(i for i, info in enumerate(manifest["array_files"])
                if info["file"].endswith(".pack") and info["shape"] == [3, 4])


@pytest.mark.parametrize("offset", [10 ** 6, 2 ** 62])
def test_array_ending_past_its_pack(ckpt, offset):
    root, _ = ckpt
    manifest = load_manifest(root)
    i = _pack_entry(manifest)
    publish_manifest(root, dumps(apply_edit(manifest, ("set", ("array_files", i, "offset"),
                                                       offset))))
    refused(root, f"field 'array_files\\[{i}\\]': a <f4 array of shape \\[3, 4\\] at offset "
            f"{offset} ends past the \\d+ bytes of arrays/00000.pack")


def test_array_larger_than_its_pack(ckpt):
    """A shape edited to claim more than the pack holds: nothing is allocated for it."""
    root, _ = ckpt
    manifest = load_manifest(root)
    i = _pack_entry(manifest)
    publish_manifest(root, dumps(apply_edit(manifest, ("set", ("array_files", i, "shape"),
                                                       [10 ** 7, 10 ** 7]))))
    refused(root, f"field 'array_files\\[{i}\\]': a <f4 array of shape \\[10000000, 10000000\\] "
            "at offset \\d+ ends past")


def test_pack_the_manifest_says_is_5gb_is_not_read(ckpt):
    root, outside = ckpt
    apply_swaps(root, outside, [("arrays/00000.pack", "sparse_huge_sized")])
    refused(root, "field \"files\\['arrays/00000.pack'\\].size\" is 5368709120, more than a pack "
            "holds")


@pytest.mark.parametrize("edit,says", [
    (("array_files", 0, "offset"), "field 'array_files\\[0\\].offset' is 0, expected none"),
    (("array_files", "pack", "offset"), "field 'array_files\\[\\d\\].offset' is absent, "
     "expected the array's byte offset"),
    (("format_version",), "field \"files\\['arrays/00000.pack'\\]\" is a pack, which format 2 "
     "does not have"),
], ids=["offset on an npy", "pack without offset", "pack in format 2"])
def test_pack_fields_that_disagree(ckpt, edit, says):
    root, _ = ckpt
    manifest = load_manifest(root)
    if edit[0] == "format_version":
        manifest["format_version"] = 2
    elif edit[1] == "pack":
        del manifest["array_files"][_pack_entry(manifest)]["offset"]
    else:
        manifest["array_files"][0]["offset"] = 0
    publish_manifest(root, dumps(manifest))
    refused(root, says)


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
          "files.arrays/00000.npy.size", "files.arrays/00000.npy.crc32",
          "files.arrays/00000.pack", "files.arrays/00000.pack.size", "array_files.2.offset",
          "array_files.2.file", "pipelines",
          "pipelines.train", "pipelines.train.file", "pipelines.train.description",
          "pipelines.train.description.operators", "pipelines.train.iter", "array_files",
          "array_files.0", "array_files.0.file", "array_files.0.shape",
          "array_files.0.shape.0", "array_files.0.dtype", "array_files.0.kind", "arrays",
          "arrays.w", "arrays.w.array", "arrays.state.dict.0", "dynamic", "dynamic.dyn",
          "dynamic.dyn.file", "metadata", "run", "run.params", "run.total_steps", "rank",
          "versions", "created"]
VALUES = [None, 0, -1, "", [], {}, True, 1e308, float("inf"), "Infinity"]


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
                     "array_files.0.shape.0", "step") or value in ({}, None) or (
        field, value) == ("array_files.2.offset", 0), (field, value)


@pytest.mark.parametrize("value", [-5, True, False, 1.0, "3", None])
def test_step_must_be_a_non_negative_int(ckpt, value):
    root, _ = ckpt
    publish_manifest(root, dumps(apply_edit(load_manifest(root), ("set", ("step",), value))))
    refused(root, "manifest.json: field 'step' is ")


def test_dynamic_state_not_utf8(ckpt):
    root, _ = ckpt
    swap_npy(root, "dynamic/00000.json", b'{"reader": "\xff\xfe"}')
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
        assert same(as_host(got), as_host(value)), name


# -- the memory bound, for allocations tracemalloc does not see --------------------------
CHILD = """
import resource, sys
from pathlib import Path
from dvc_dali.format import store
from dvc_dali.core.errors import DvcDaliError
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
        swap_npy(root, "arrays/00000.npy", huge_header_npy(), dtype="<f8",
                  shape=[10**7, 10**7])
    elif case == "manifest_1gb":
        with open(snap_dir(root) / store.MANIFEST, "r+b") as fh:
            fh.truncate(1 << 30)
    else:
        with open(root / store.LATEST, "r+b") as fh:
            fh.truncate(HUGE)
    env = child_env()
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


DALI_STATES = {
    "operator name is a varint": b"\x0a\x02\x08\x05",
    "pipeline data is a varint": b"\x12\x02\x08\x05",
    "pipeline data nested 100000 levels": b"\x12" + ld(b"\x0a" + ld(b"[" * 100_000
                                                                     + b"]" * 100_000)),
    "iter is Infinity": b"\x12" + ld(b"\x0a" + ld(b'{"iter": Infinity, "epoch_idx": 0}')),
}


@pytest.mark.parametrize("state", list(DALI_STATES))
def test_hostile_dali_state_bytes(dali_pristine, state):
    with copy_of(dali_pristine["root"]) as (root, _):
        write_dali_state(root, DALI_STATES[state])
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
