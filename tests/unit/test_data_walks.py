"""The walks the data digests were made with (dali_state.WALKS) and how a
recorded digest ends (data_contents.verdict): a digest of another walk than
the one the manifest names, or of an older release's unnamed walk, is not
verified, never "changed" and never a match (found by sweep X: a run
recorded before f8b2f2a over a class folder that is a link was refused as
changed data on resume)."""

from __future__ import annotations

import hashlib
import os

import pytest

from dvc_dali.dali import dali_state
from dvc_dali.proof import data_contents as dc

M, C, N = dc.MATCHED, dc.CHANGED, dc.NOT_VERIFIED
OLDER = dc.OLDER_WALK


@pytest.mark.parametrize("recorded, walk, now, outcome, why", [
    # named with this release's walk: compared with it alone
    ("a", "walk3", {"walk3": "a"}, M, ""),
    ("a", "walk3", {"walk3": "b", "walk0": "a"}, C, ""),
    # named with an earlier walk this release knows: made again with it
    ("a", "walk0", {"walk3": "b", "walk0": "a"}, M, ""),
    ("a", "walk0", {"walk3": "a", "walk0": "b"}, C, ""),
    # named with a walk this release does not know (a later release's)
    ("a", "walk9", {"walk3": "a"}, N, "recorded by a dvc-dali that walks the data another way "
                                       "(walk9)"),
    # unnamed (an older release's): this walk's digest, another walk's, none
    ("a", None, {"walk0": "a", "walk1": "a", "walk2": "a", "walk3": "a"}, M, ""),
    ("a", None, {"walk0": "a", "walk1": "b", "walk2": "b", "walk3": "b"}, N, OLDER),
    ("a", None, {"walk0": "b", "walk1": "a", "walk2": "b", "walk3": "b"}, N, OLDER),
    ("a", None, {"walk0": "b", "walk1": "b", "walk2": "b", "walk3": "b"}, C, ""),
    # an older walk that cannot digest the data now (over the limits): unknown
    ("a", None, {"walk0": None, "walk1": "b", "walk2": "b", "walk3": "b"}, N, OLDER),
])
def test_a_recorded_digest_ends_as(recorded, walk, now, outcome, why):
    assert dc.verdict(recorded, walk, now.get) == (outcome, why)


def _tree(root):
    """data/0/a.png, a class folder 3 that is a link, a link below a class
    folder, a FIFO."""
    (root / "data" / "0").mkdir(parents=True)
    (root / "data" / "0" / "a.png").write_bytes(b"12")
    (root / "other" / "3").mkdir(parents=True)
    (root / "other" / "3" / "b.png").write_bytes(b"123")
    (root / "data" / "3").symlink_to(root / "other" / "3", target_is_directory=True)
    (root / "data" / "0" / "deep").symlink_to(root / "other" / "3", target_is_directory=True)
    os.mkfifo(root / "data" / "pipe")
    return root / "data"


@pytest.mark.parametrize("walk, listed", [
    ("walk0", [("pipe", 0), ("0/a.png", 2)]),
    ("walk1", [("pipe", 0), ("0/a.png", 2), ("0/deep/b.png", 3), ("3/b.png", 3)]),
    ("walk2", [("pipe", 0), ("0/a.png", 2), ("3/b.png", 3)]),
    ("walk3", [("pipe", -1), ("0/a.png", 2), ("3/b.png", 3)]),
])
def test_each_walk_lists_what_its_release_listed(tmp_path, walk, listed):
    data = _tree(tmp_path)
    assert [(n, s) for n, _, s in dali_state.data_files(str(data), walk=walk)] == listed
    assert dali_state.WALK == "walk3"  # a new recipe is a new name


def _description(path, digest):
    return {"operators": {"reader": {"type": "readers__File", "args": {"file_root": path}}},
            "data": {"reader.file_root": digest}}


def _before_f8b2f2a(top):
    """The description's digest as releases before f8b2f2a made it (their
    first recipe, os.walk: a folder that is a link not followed)."""
    h = hashlib.sha1()
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for f in sorted(files):
            full = os.path.join(root, f)
            h.update(f"{os.path.relpath(full, top)}\0{os.path.getsize(full)}\0".encode())
    return h.hexdigest()


def _linked_class_folder(tmp_path):
    """data/0/a.png (2 bytes) and data/3 -> other/3 holding b.png (3 bytes)."""
    data = tmp_path / "data"
    (data / "0").mkdir(parents=True)
    (data / "0" / "a.png").write_bytes(b"12")
    (tmp_path / "other" / "3").mkdir(parents=True)
    (tmp_path / "other" / "3" / "b.png").write_bytes(b"123")
    (data / "3").symlink_to(tmp_path / "other" / "3", target_is_directory=True)
    return data


def test_an_older_releases_digest_of_a_linked_class_folder_is_not_verified(tmp_path):
    data = _linked_class_folder(tmp_path)
    now = _description(str(data), dali_state.data_digest(
        _description(str(data), ""), "reader.file_root", dali_state.WALK))
    older = _description(str(data), _before_f8b2f2a(str(data)))
    assert dc.data_verdicts(older, now, None) == {"reader.file_root": (N, OLDER)}
    assert dali_state.differences(older, now, frozenset({"reader.file_root"})) == []
    # this release's own digest, named: nothing to say; a changed size: changed
    assert dc.data_verdicts(now, now, dali_state.WALK) == {}
    (data / "0" / "a.png").write_bytes(b"123")
    assert dc.data_verdicts(older, now, None) == {"reader.file_root": (C, "")}


def test_an_older_releases_content_record_is_compared_as_it_walked(tmp_path):
    """Its CRCs in its walk's order: the files it saw, unchanged, are not
    verified (the linked folder it never read); one of them rewritten with
    its size kept is named."""
    import zlib

    data = _linked_class_folder(tmp_path)
    older = {"reader.file_root": {"files": 1, "bytes": 2,
                                  "crc32": f"{zlib.crc32(b'12'):08x}"}}
    description = _description(str(data), "")

    contents = dc.start("p", description, 1 << 30)
    assert contents.changed(older, None) == []
    assert contents.unverified == {"reader.file_root": OLDER}
    assert contents.changed(older, dali_state.WALK) == [
        f"reader.file_root ({data}): 1 files -> 2"]  # named this walk's: changed

    (data / "0" / "a.png").write_bytes(b"21")
    contents = dc.start("p", description, 1 << 30)
    assert contents.changed(older, None) == [f"reader.file_root ({data}): changed 0/a.png"]
