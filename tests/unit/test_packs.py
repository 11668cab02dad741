"""Format 3's packs: which arrays share a pack file, where each one starts,
and that every kind of small array comes back exactly (store.write_capture
and store.read_snapshot on real files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dvc_dali.format import store


def written(root: Path, arrays: dict) -> tuple[dict, store.Snapshot]:
    name, md5 = store.write_capture(root, store.Capture(1, {}, arrays, {}, {}))
    store.publish(root, [(name, md5)])
    return json.loads((root / name / store.MANIFEST).read_text()), store.read_snapshot(root)


@pytest.mark.parametrize("nbytes,file", [
    (0, "arrays/00000.pack"), (1, "arrays/00000.pack"),
    (store.PACK_BELOW - 1, "arrays/00000.pack"), (store.PACK_BELOW, "arrays/00000.npy"),
])
def test_an_array_under_pack_below_goes_into_a_pack(tmp_path, nbytes, file):
    manifest, snap = written(tmp_path, {"a": np.full(nbytes, 7, np.uint8)})
    assert [i["file"] for i in manifest["array_files"]] == [file]
    assert ("offset" in manifest["array_files"][0]) == file.endswith(".pack")
    assert np.array_equal(snap.arrays["a"], np.full(nbytes, 7, np.uint8))


def test_fortran_order_keeps_a_file_of_its_own(tmp_path):
    a = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    manifest, snap = written(tmp_path, {"a": a, "b": np.arange(3)})
    assert [i["file"] for i in manifest["array_files"]] == ["arrays/00000.npy",
                                                            "arrays/00000.pack"]
    assert np.array_equal(snap.arrays["a"], a) and snap.arrays["a"].flags.f_contiguous


def test_a_structured_dtype_keeps_a_file_of_its_own_and_its_fields(tmp_path):
    """A pack names an entry's dtype by dtype.str, which for a structured
    dtype is only its size ('|V12'): small ones came back as raw bytes."""
    dt = np.dtype([("a", "<i4"), ("b", "<f8")])
    small = np.array([(1, 2.5), (3, 4.5)], dtype=dt)
    manifest, snap = written(tmp_path, {"s": small, "v": small[1], "n": np.arange(3)})
    kinds = sorted(i["file"].rsplit(".", 1)[1] for i in manifest["array_files"])
    assert kinds == ["npy", "npy", "pack"], manifest["array_files"]  # only n in the pack
    assert snap.arrays["s"].dtype == dt and np.array_equal(snap.arrays["s"], small)
    assert snap.arrays["v"].dtype == dt and snap.arrays["v"]["b"] == 4.5


def test_packs_fill_up_to_pack_max_then_another_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "PACK_MAX", 256)
    arrays = {f"a{i}": np.full(100, i, np.uint8) for i in range(5)}
    manifest, snap = written(tmp_path, arrays)
    where = [(i["file"], i["offset"]) for i in manifest["array_files"]]
    # each array at a multiple of 64 bytes; a third one would end past 256 bytes
    assert where == [("arrays/00000.pack", 0), ("arrays/00000.pack", 128),
                     ("arrays/00001.pack", 0), ("arrays/00001.pack", 128),
                     ("arrays/00002.pack", 0)]
    assert manifest["files"]["arrays/00000.pack"]["size"] == 228
    for name, value in arrays.items():
        assert np.array_equal(snap.arrays[name], value)


def test_every_kind_of_small_array_comes_back_exactly(tmp_path):
    torch = pytest.importorskip("torch")
    arrays = {"f4": np.arange(12, dtype=np.float32).reshape(3, 4), "be": np.arange(3, dtype=">i4"),
              "scalar": np.float64(2.5), "empty": np.zeros((0, 3)), "bool": np.array([True, False]),
              "date": np.array(["2026-11-28"], dtype="datetime64[D]"),
              "bytes": np.array([b"ab", b"c"], dtype="S3"), "strided": np.arange(10)[::3],
              "bf16": torch.arange(5, dtype=torch.bfloat16), "i64": torch.arange(3)}
    manifest, snap = written(tmp_path, arrays)
    assert {i["file"] for i in manifest["array_files"]} == {"arrays/00000.pack"}
    for name, value in arrays.items():
        got = snap.arrays[name]
        if isinstance(value, torch.Tensor):
            assert got.dtype == value.dtype and torch.equal(got, value), name
        else:
            assert np.asarray(got).dtype == np.asarray(value).dtype, name
            assert np.array_equal(got, value), name
            assert not isinstance(got, np.ndarray) or got.flags.writeable, name


def test_needed_files_names_a_pack_once(tmp_path):
    manifest, _ = written(tmp_path, {"a": np.ones(3), "b": np.zeros(2), "big": np.zeros(1 << 17)})
    assert store.needed_files(manifest, ["a", "b"]) == ["arrays/00000.pack"]
    assert store.needed_files(manifest, None) == ["arrays/00000.pack", "arrays/00002.npy"]
    manifest["arrays"]["a"] = {"array": 99}  # a broken tree: every file, each once
    assert store.needed_files(manifest, ["a"]) == ["arrays/00000.pack", "arrays/00002.npy"]
