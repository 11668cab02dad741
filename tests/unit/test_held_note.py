"""recording/held.py: which row the workspace's checkpoint is, and when a run
lost it (DVC deleted it, or does not carry it: dvc.lock names none)."""

from __future__ import annotations

import pytest

from dvc_dali.recording import held

NOTE = {"row": "a-step20", "step": 20, "outs": {"checkpoint": "ab.dir", "model": "cd.dir"}}


@pytest.mark.parametrize("note,named,kept,lost", [
    (NOTE, None, False, True),            # dvc.lock deleted: DVC deleted the checkpoint
    (NOTE, "ab.dir", False, False),       # dvc.lock names it: DVC checks it out (or refuses)
    (NOTE, None, True, False),            # still there (an uncached output DVC left alone)
    (None, None, False, False),           # nothing recorded here: a fresh run, or reset
    ({"row": "x", "outs": {"model": "cd.dir"}}, None, False, False),  # not this output
    ({"row": "x"}, None, False, False),   # a note without outputs protects nothing
])
def test_lost(note, named, kept, lost):
    assert held.lost(note, "checkpoint", named, kept) is lost


def test_note_round_trip_and_forget(tmp_path):
    root = str(tmp_path)
    entry = {"outs": [{"path": "checkpoint", "md5": "ab.dir"}, {"path": "x", "md5": None},
                      "junk"]}
    held.write(root, "dvc.lock", "train", "a-step20", 20, entry)
    assert held.read(root, "dvc.lock", "train") == {
        "row": "a-step20", "step": 20, "outs": {"checkpoint": "ab.dir"}}
    assert held.read(root, "sub/dvc.lock", "train") is None  # another dvc.lock's stage
    assert held.forget(root, "dvc.lock", "train") == "a-step20"
    assert held.forget(root, "dvc.lock", "train") is None
    assert held.read(root, "dvc.lock", "train") is None


@pytest.mark.parametrize("text", ["", "[1]", "{\"step\": 3}", "not json"])
def test_a_note_that_does_not_parse_protects_nothing(tmp_path, text):
    path = held.note_path(str(tmp_path), "dvc.lock", "train")
    (tmp_path / ".dvc/tmp/dvc-dali/held").mkdir(parents=True)
    open(path, "w").write(text)
    assert held.read(str(tmp_path), "dvc.lock", "train") is None


def test_refusal_names_the_file_the_row_and_what_to_do():
    text = held.refusal("dvc.lock", "train", "checkpoint", NOTE, True, False)
    assert text.startswith("dvc.lock names no checkpoint for stage 'train'")
    assert "DVC deleted the workspace's" in text and "step 0" in text
    assert "`dvc exp apply a-step20`" in text and "resume from step 20" in text
    assert "`dvc-dali reset`" in text
    temp = held.refusal("dvc.lock", "train", "checkpoint", NOTE, True, True)
    assert "into this --temp/queued run" in temp and "deleted" not in temp
    gone = held.refusal("dvc.lock", "train", "checkpoint", NOTE, False, False)
    assert "has been removed since" in gone and "dvc exp apply" not in gone
