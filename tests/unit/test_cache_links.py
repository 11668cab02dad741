"""Which links a checkpoint's reader follows (format/cache_links.py): DVC's
into its cache, as `cache.type symlink` checks a checkpoint out, and no
other; and a save over such a checkpoint writes beside the links, never
through them (store.py, on real files, the cache laid out as DVC's)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from dvc_dali.core.errors import CheckpointCorruptError
from dvc_dali.format import cache_links, store

MD5 = "ab23456789abcdef0123456789abcdef"


@pytest.mark.parametrize("target, followed", [
    (f"/p/.dvc/cache/files/md5/{MD5[:2]}/{MD5[2:]}", True),  # DVC 3
    (f"/p/.dvc/cache/{MD5[:2]}/{MD5[2:]}", True),  # DVC 2's layout
    (f"../.dvc/cache/files/md5/{MD5[:2]}/{MD5[2:]}", True),  # relative
    (f"/p/.dvc/cache/files/md5/{MD5[:2]}/{MD5[2:]}.dir", False),  # a listing, not a file
    (f"/p/.dvc/cache/files/md5/{MD5[:3]}/{MD5[3:]}", False),
    (f"/p/.dvc/cache/files/md5/{MD5[:2].upper()}/{MD5[2:]}", False),
    (f"{MD5[:2]}/{MD5[2:]}", False),  # no directory above
    ("/elsewhere/step-000000004-0123abcd/manifest.json", False),
    ("/tmp/LATEST", False),
])
def test_only_a_dvc_cache_objects_path_is_followed(target, followed):
    assert cache_links.is_cache_object(target) is followed


def save(root: Path, step: int) -> None:
    name, md5 = store.write_capture(root, store.Capture(step, {}, {"w": np.full(3, step)}, {},
                                                        {}))
    store.publish(root, [(name, md5)])
    store.remove_leftovers(root, keep=name)


def link_into_cache(root: Path, cache: Path, relative: bool = False) -> list[Path]:
    """Every file of the checkpoint moved into ``cache`` under its md5 and
    replaced by a link to it, as DVC's checkout under `cache.type symlink`
    leaves it; the objects."""
    objects = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        md5 = hashlib.md5(path.read_bytes()).hexdigest()
        obj = cache / "files" / "md5" / md5[:2] / md5[2:]
        obj.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, obj)
        obj.chmod(0o444)
        path.symlink_to(os.path.relpath(obj, path.parent) if relative else obj)
        objects.append(obj)
    return objects


@pytest.mark.parametrize("relative", [False, True])
def test_a_checkpoint_linked_into_the_cache_reads_and_is_saved_over_beside_the_links(
        tmp_path, relative):
    root = tmp_path / "checkpoint"
    save(root, 4)
    objects = link_into_cache(root, tmp_path / "cache", relative)
    assert store.read_snapshot(root).arrays["w"].tolist() == [4, 4, 4]
    save(root, 5)  # the next snapshot of a run resumed from it
    assert store.read_snapshot(root).arrays["w"].tolist() == [5, 5, 5]
    assert not any(p.is_symlink() for p in root.rglob("*"))
    assert all(hashlib.md5(o.read_bytes()).hexdigest() == o.parent.name + o.name
               for o in objects)


@pytest.fixture()
def linked(tmp_path) -> tuple[Path, Path]:
    """A checkpoint linked into a cache; (its LATEST link, LATEST's object)."""
    root = tmp_path / "checkpoint"
    save(root, 4)
    link_into_cache(root, tmp_path / "cache")
    return root / store.LATEST, Path(os.readlink(root / store.LATEST))


def refused(pointer: Path, pattern: str) -> None:
    with pytest.raises(CheckpointCorruptError, match=pattern):
        store.read_snapshot(pointer.parent)


def test_a_link_to_a_missing_cache_object_is_named_with_dvc_pull(linked):
    pointer, obj = linked
    obj.unlink()
    refused(pointer, f"LATEST: a link to the DVC cache object {obj}, which is not there "
                     r"\(removed by `dvc gc`.*`dvc pull`")


@pytest.mark.parametrize("kind", ["fifo", "link", "other file"])
def test_a_cache_object_that_is_no_regular_file_of_its_own_is_refused(linked, tmp_path, kind):
    """What the link points to is checked as the store checks a file: not
    a FIFO, not a further link; and a link anywhere else is an edit."""
    pointer, obj = linked
    copy = tmp_path / "copy"
    copy.write_bytes(obj.read_bytes())
    if kind == "fifo":
        obj.unlink()
        os.mkfifo(obj)
    elif kind == "link":
        obj.unlink()
        obj.symlink_to(copy)
    else:
        pointer.unlink()
        pointer.symlink_to(copy)  # identical bytes: following it would "work"
    refused(pointer, "LATEST: is a (FIFO|symlink), not a regular file")


def test_a_cache_object_with_other_bytes_is_refused_by_its_digest(tmp_path):
    root = tmp_path / "checkpoint"
    save(root, 4)
    objects = link_into_cache(root, tmp_path / "cache")
    pack = Path(os.readlink(next(root.glob("*/arrays/*.pack"))))
    assert pack in objects
    data = bytearray(pack.read_bytes())
    data[-1] ^= 1
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorruptError, match=r"\.pack: contents do not match"):
        store.read_snapshot(root)
