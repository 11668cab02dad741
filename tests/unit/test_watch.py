"""recording/watch.py: inotify on real directories (no mocks), and the
event parser as a table."""

from __future__ import annotations

import os
import struct

import pytest

from dvc_dali.recording import watch

pytestmark = pytest.mark.skipif(watch._lib() is None, reason="no inotify (Linux only)")


def event(wd: int, mask: int, name: str = "") -> bytes:
    raw = name.encode() + b"\0" * (16 - len(name) % 16) if name else b""
    return struct.pack("iIII", wd, mask, 0, len(raw)) + raw


@pytest.mark.parametrize("buf,names,broken", [
    (b"", [], False),
    (event(1, 0x2, "a.txt"), [(1, 0x2, "a.txt")], False),
    (event(1, 0x2, "a.txt") + event(2, 0x100, "b"), [(1, 0x2, "a.txt"), (2, 0x100, "b")], False),
    (event(-1, 0x4000), [(-1, 0x4000, "")], True),       # queue overflow
    (event(3, 0x8000), [(3, 0x8000, "")], True),         # watch removed
    (event(3, 0x400), [(3, 0x400, "")], True),           # directory deleted
    (event(1, 0x2, "a.txt")[:10], [], False),            # a cut header is not read
])
def test_parse_events(buf, names, broken):
    assert watch.parse_events(buf) == (names, broken)


def test_dirs_of():
    assert watch.dirs_of(["a.txt", "src/x.py", "src/y.py", "src/pkg/z.py"]) == {
        "", "src", "src/pkg"}


def test_the_watcher_names_what_changed_and_gives_up_when_a_dir_goes(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("1")
    (tmp_path / "top.txt").write_text("1")
    w = watch.Watcher(str(tmp_path), {"", "src"})
    assert w.usable and w.changed() == set()
    (tmp_path / "src" / "a.txt").write_text("2")
    os.replace(tmp_path / "top.txt", tmp_path / "moved.txt")
    assert w.changed() == {"src/a.txt", "top.txt", "moved.txt"}
    assert w.changed() == set()
    (tmp_path / "src" / "a.txt").unlink()
    (tmp_path / "src").rmdir()
    assert w.changed() is None and not w.usable
    w.close()


def test_too_many_directories_is_no_watcher(tmp_path, monkeypatch):
    monkeypatch.setattr(watch, "MAX_DIRS", 1)
    w = watch.Watcher(str(tmp_path), {"", "a"})
    assert not w.usable and w.changed() is None


def test_added_directories_are_watched_from_then_on(tmp_path, monkeypatch):
    (tmp_path / "data" / "new").mkdir(parents=True)
    w = watch.Watcher(str(tmp_path), {""})
    assert w.add("data") and w.add("data") and w.add("data/new")
    assert w.changed() == set()
    (tmp_path / "data" / "new" / "x.txt").write_text("x")
    assert w.changed() == {"data/new/x.txt"}
    assert not w.add("missing")  # gone (or never there): no events to count on
    assert w.usable
    monkeypatch.setattr(watch, "MAX_DIRS", 3)
    (tmp_path / "more").mkdir()
    assert not w.add("more") and w.usable  # over the limit: that directory only
    w.close()
    assert not w.add("data")
