"""The walk of a reader's file_root (dali_state.data_files), as DALI's file
reader walks it: its order, links to folders followed once, entries that
cannot be stat'ed named, and the description's digest of a plain tree
unchanged from the releases before links were followed (their checkpoints
resume)."""

from __future__ import annotations

import hashlib
import os

from dvc_dali.dali import dali_state


def tree(root, files):
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def names(root):
    return [(name, size) for name, _, size in dali_state.data_files(str(root))]


def test_a_folders_files_by_name_then_its_subfolders(tmp_path):
    tree(tmp_path, {"b.jpg": b"12", "a.jpg": b"1", "z/c.jpg": b"123", "y/d.jpg": b""})
    assert names(tmp_path) == [("a.jpg", 1), ("b.jpg", 2), ("y/d.jpg", 0), ("z/c.jpg", 3)]


def test_a_linked_class_folder_is_followed_and_no_deeper_link(tmp_path):
    """DALI reads <file_root>/<class>/<file>, following a class folder that
    is a link; a link deeper down (to /usr, to the data itself) is not
    walked."""
    tree(tmp_path / "outside", {"c.jpg": b"123"})
    tree(tmp_path / "data", {"a/a.jpg": b"1"})
    (tmp_path / "data" / "b").symlink_to(tmp_path / "outside", target_is_directory=True)
    (tmp_path / "data" / "a" / "up").symlink_to(tmp_path / "data", target_is_directory=True)
    (tmp_path / "outside" / "usr").symlink_to("/usr", target_is_directory=True)
    assert names(tmp_path / "data") == [("a/a.jpg", 1), ("b/c.jpg", 3)]


def test_a_dangling_link_and_a_name_not_utf8_are_listed(tmp_path):
    (tmp_path / "gone.txt").symlink_to(tmp_path / "nonexistent")
    (tmp_path / os.fsdecode(b"\xff.jpg")).write_bytes(b"12")
    assert names(tmp_path) == [("gone.txt", -1), (os.fsdecode(b"\xff.jpg"), 2)]
    dali_state._digest_dir(hashlib.sha1(), str(tmp_path))  # noqa: SLF001 (no traceback)


def test_a_fifo_and_a_link_to_a_device_are_never_read(tmp_path):
    """Their size is -1, so the content digest does not open them: a FIFO's
    open blocked the run at its first save for ever, /dev/zero was read
    for ever (found by a sweep)."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "zero").symlink_to("/dev/zero")
    assert names(tmp_path) == [("pipe", -1), ("zero", -1)]


def test_a_plain_trees_digest_is_the_earlier_releases(tmp_path):
    tree(tmp_path, {"b.jpg": b"12", "a.jpg": b"1", "z/c.jpg": b"123", "é/d.jpg": b""})
    earlier = hashlib.sha1()
    for name, size in (("a.jpg", 1), ("b.jpg", 2), ("z/c.jpg", 3), ("é/d.jpg", 0)):
        earlier.update(f"{name}\0{size}\0".encode())
    now = hashlib.sha1()
    dali_state._digest_dir(now, str(tmp_path))  # noqa: SLF001
    assert now.hexdigest() == earlier.hexdigest()
