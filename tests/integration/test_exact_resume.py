"""Bit-exact resume, in the shape of torchdata's test_state_dict.py: run to an
interruption point, save, continue; restore in a NEW process; every later
output (pixels, labels, random draws) must equal the uninterrupted run's."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.launch import copy_checkpoint, requires_gpu, run_runner

TOTAL = 20  # 24 samples, batch 4: an epoch is 6 steps
POINTS = {"early": 1, "mid-epoch": 3, "epoch-boundary": 6, "epochs-in": 15, "3-epochs": 18}


def assert_same_from(reference: dict, resumed: dict, start: int) -> None:
    keys = sorted(k for k in reference if k[:4].isdigit() and int(k[:4]) >= start)
    got = sorted(k for k in resumed if k[:4].isdigit())
    assert got == keys, "the resumed run produced other steps/samples than the reference"
    for k in keys:
        assert reference[k].dtype == resumed[k].dtype and reference[k].shape == resumed[k].shape, k
        assert np.array_equal(reference[k], resumed[k]), f"output {k} differs after the restore"
    np.testing.assert_array_equal(reference["final_weights"], resumed["final_weights"])


@pytest.fixture(scope="module")
def references(data_dir, tmp_path_factory):
    """One uninterrupted run per case, saving at every interruption point."""
    cache = {}

    def get(kind, shuffle, device="cpu"):
        key = (kind, shuffle, device)
        if key not in cache:
            d = tmp_path_factory.mktemp(f"ref-{kind}-{int(shuffle)}-{device}")
            out = run_runner(kind, data_dir, d / "ckpt", d / "ref.npz", TOTAL,
                             save_at=sorted(POINTS.values()), fresh=True, shuffle=shuffle,
                             device=device)
            cache[key] = (d, out)
        return cache[key]

    return get


CASES = [("rotate", True), ("rotate", False), ("numpy", True), ("numpy", False),
         ("webdataset", True), ("two", True)]


@pytest.mark.parametrize("point", list(POINTS), ids=list(POINTS))
@pytest.mark.parametrize("kind,shuffle", CASES, ids=[f"{k}-shuffle{int(s)}" for k, s in CASES])
def test_resume_in_new_process_is_bit_exact(references, data_dir, tmp_path, kind, shuffle, point):
    ref_dir, reference = references(kind, shuffle)
    at = POINTS[point]
    ckpt = copy_checkpoint(ref_dir / f"ckpt-{at}", tmp_path / "ckpt")
    resumed = run_runner(kind, data_dir, ckpt, tmp_path / "resumed.npz", TOTAL, shuffle=shuffle)
    assert int(resumed["restored_step"]) == at
    assert_same_from(reference, resumed, at)


@pytest.mark.parametrize("kind", ["rotate", "two"])
def test_chained_restores_equal_one_run(references, data_dir, tmp_path, kind):
    """Restore, run, save, three times over: still the uninterrupted stream."""
    _, reference = references(kind, True)
    ckpt = tmp_path / "ckpt"
    run_runner(kind, data_dir, ckpt, tmp_path / "a.npz", 4, save_at=[4], fresh=True)
    pieces = {}
    for i, (until, save) in enumerate([(9, 9), (16, 16), (TOTAL, None)]):
        out = run_runner(kind, data_dir, ckpt, tmp_path / f"r{i}.npz", until,
                         save_at=[save] if save else [])
        pieces.update({k: v for k, v in out.items() if k[:4].isdigit()})
    pieces["final_weights"] = out["final_weights"]
    assert_same_from(reference, pieces, 4)


def test_without_checkpoint_dali_would_restart(references, data_dir, tmp_path):
    """The comparison can fail: a fresh run from step 6 is not the resumed stream."""
    _, reference = references("rotate", True)
    fresh = run_runner("rotate", data_dir, tmp_path / "none", tmp_path / "f.npz", 6, fresh=True)
    ref_later = [reference[k] for k in sorted(reference) if k.startswith("0006_")]
    fresh_first = [fresh[k] for k in sorted(fresh) if k.startswith("0000_")]
    assert not all(np.array_equal(a, b) for a, b in zip(ref_later, fresh_first))


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("point", ["mid-epoch", "epochs-in"])
def test_gpu_mixed_decoding_and_cupy_arrays(references, data_dir, tmp_path, point):
    ref_dir, reference = references("rotate", True, "gpu")
    at = POINTS[point]
    ckpt = copy_checkpoint(ref_dir / f"ckpt-{at}", tmp_path / "ckpt")
    resumed = run_runner("rotate", data_dir, ckpt, tmp_path / "r.npz", TOTAL, device="gpu")
    assert_same_from(reference, resumed, at)
