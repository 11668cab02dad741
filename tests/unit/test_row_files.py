"""core/row_files: which of the files a row holds changed between an
asynchronous checkpoint's call and its recording (a table of the pure
comparison, and stamps of real files)."""

from __future__ import annotations

import os

import pytest

from dvc_dali.core.row_files import Stamps, changed, restamp, stamp

A, B = {"a": (3, 10)}, {"a": (3, 10), "b": (1, 5)}


@pytest.mark.parametrize("before, after, expected", [
    (Stamps(A, True), Stamps(A, True), []),                          # untouched
    (Stamps(A, True), Stamps({"a": (3, 11)}, True), ["a"]),          # rewritten, same size
    (Stamps(A, True), Stamps({"a": (4, 10)}, True), ["a"]),          # another size
    (Stamps(A, True), Stamps(B, True), ["b"]),                       # a new file
    (Stamps(B, True), Stamps(A, True), ["b"]),                       # a file removed
    (Stamps(A, False), Stamps(B, False), []),                        # cut short: new not seen
    (Stamps(B, False), Stamps(A, False), ["b"]),                     # its own files still are
    (Stamps({}, True), Stamps({}, True), []),
])
def test_what_changed(before, after, expected):
    assert changed(before, after) == expected


def test_stamps_of_real_files_and_directories(tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "e" / "x.tsv").write_text("step\n")
    (tmp_path / "m.json").write_text("{}")
    os.symlink(tmp_path / "m.json", tmp_path / "link.json")
    roots = [str(tmp_path / n) for n in ("d", "m.json", "link.json", "absent")]
    before = stamp(roots)
    assert before.complete and sorted(before.files) == sorted(
        str(tmp_path / n) for n in ("d/e/x.tsv", "m.json", "link.json"))
    assert changed(before, restamp(before, roots)) == []
    (tmp_path / "absent").write_text("new")
    st = os.stat(tmp_path / "m.json")
    (tmp_path / "m.json").write_text("{}")  # same size; a later time
    os.utime(tmp_path / "m.json", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert changed(before, restamp(before, roots)) == sorted(
        str(tmp_path / n) for n in ("absent", "link.json", "m.json"))


def test_a_walk_stops_at_the_limit_and_then_compares_only_its_files(tmp_path):
    for i in range(5):
        (tmp_path / f"{i}.png").write_bytes(b"x")
    cut = stamp([str(tmp_path)], limit=3)
    assert not cut.complete and len(cut.files) == 3
    (tmp_path / "9.png").write_bytes(b"x")  # not one it stamped: not seen
    assert changed(cut, restamp(cut, [str(tmp_path)])) == []
    first = sorted(cut.files)[0]
    os.remove(first)
    assert changed(cut, restamp(cut, [str(tmp_path)])) == [first]
