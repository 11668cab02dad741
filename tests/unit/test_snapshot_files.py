"""How a snapshot's files are written and removed (store.py, on real
files): a pack of more parts than one writev takes comes back exactly; a
superseded snapshot this process wrote is removed by the names it wrote, and
whatever else is in it (a file added, one written by another process, a
link swapped in) is removed as rmtree would, never followed out."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dvc_dali.core.process_state import STATE
from dvc_dali.format import store


def save(root: Path, step: int, arrays: dict) -> str:
    name, md5 = store.write_capture(root, store.Capture(step, {}, arrays, {}, {}))
    store.publish(root, [(name, md5)])
    store.remove_leftovers(root, keep=name)
    return name


def entries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_a_pack_of_more_parts_than_one_writev_takes_comes_back_exactly(tmp_path):
    arrays = {f"a{i:04d}": np.full(i % 5 + 1, i, np.int32) for i in range(1500)}  # + padding
    assert 2 * len(arrays) > store._IOV_MAX
    save(tmp_path, 1, arrays)
    snap = store.read_snapshot(tmp_path)  # every file's size and CRC-32 checked
    assert {n: a.tolist() for n, a in snap.arrays.items()} == {
        n: a.tolist() for n, a in arrays.items()}


def test_a_superseded_snapshot_is_removed_by_name(tmp_path):
    first = save(tmp_path, 1, {"w": np.ones(3)})
    assert first in STATE.snapshot_members[str(tmp_path)]
    second = save(tmp_path, 2, {"w": np.zeros(3)})
    assert entries(tmp_path) == sorted([store.LATEST, second])
    assert list(STATE.snapshot_members[str(tmp_path)]) == [second]  # nothing kept for it


def test_what_this_process_notes_stays_small_when_another_removes(tmp_path):
    """Rank 0 removes every rank's superseded snapshots: the other ranks'
    processes never remove theirs, and note only the last two."""
    for step in range(1, 6):
        store.write_capture(tmp_path, store.Capture(step, {}, {"w": np.ones(3)}, {}, {}))
    assert len(STATE.snapshot_members[str(tmp_path)]) == 2


def test_what_else_a_superseded_snapshot_holds_is_removed_too(tmp_path):
    first = save(tmp_path, 1, {"w": np.ones(3)})
    (tmp_path / first / "arrays" / "extra.bin").write_bytes(b"x")
    (tmp_path / first / "more" / "deeper").mkdir(parents=True)
    second = save(tmp_path, 2, {"w": np.zeros(3)})
    assert entries(tmp_path) == sorted([store.LATEST, second])


def test_a_snapshot_another_process_wrote_is_removed_by_a_scan(tmp_path):
    first = save(tmp_path, 1, {"w": np.ones(3)})
    STATE.snapshot_members[str(tmp_path)].pop(first)  # as if written by another process
    second = save(tmp_path, 2, {"w": np.zeros(3)})
    assert entries(tmp_path) == sorted([store.LATEST, second])


def test_a_link_swapped_into_a_superseded_snapshot_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "00000.pack").write_bytes(b"keep")
    root = tmp_path / "c"
    first = save(root, 1, {"w": np.ones(3)})
    for rel in ("arrays/00000.pack", "manifest.json"):
        (root / first / rel).unlink()
    os.rmdir(root / first / "arrays")
    (root / first / "arrays").symlink_to(outside, target_is_directory=True)
    second = save(root, 2, {"w": np.zeros(3)})
    assert entries(root) == sorted([store.LATEST, second])
    assert (outside / "00000.pack").read_bytes() == b"keep"
