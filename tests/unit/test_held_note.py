"""recording/held.py: which row the workspace's checkpoint is, and when a run
lost it (DVC deleted it, or does not carry it: dvc.lock names none)."""

from __future__ import annotations

import os

import pytest

from dvc_dali.recording import held

NOTE = held.Note(".dvc/tmp/dvc-dali/held/k.json", "a-step20", 20,
                 {"checkpoint": "ab.dir", "model": "cd.dir"})
BAD = held.Note(".dvc/tmp/dvc-dali/held/k.json", problem="not JSON")


@pytest.mark.parametrize("note,named,kept,lost", [
    (NOTE, None, False, True),            # dvc.lock deleted: DVC deleted the checkpoint
    (NOTE, "ab.dir", False, False),       # dvc.lock names it: DVC checks it out (or refuses)
    (NOTE, None, True, False),            # still there (an uncached output DVC left alone)
    (None, None, False, False),           # nothing recorded here: a fresh run, or reset
    (held.Note("n", "x", None, {"model": "cd.dir"}), None, False, False),  # not this output
    (held.Note("n", "x"), None, False, False),  # a note without outputs protects nothing
    (BAD, None, False, True),             # unreadable: it may have named this output
    (BAD, "ab.dir", False, False),        # ... but dvc.lock names one: nothing lost
    (BAD, None, True, False),
])
def test_lost(note, named, kept, lost):
    assert held.lost(note, "checkpoint", named, kept) is lost


def test_note_round_trip_and_forget(tmp_path):
    root = str(tmp_path)
    entry = {"outs": [{"path": "checkpoint", "md5": "ab.dir"}, {"path": "x", "md5": None},
                      "junk"]}
    held.write(root, "dvc.lock", "train", "a-step20", 20, entry)
    where = held.read(root, "dvc.lock", "train").where
    assert held.read(root, "dvc.lock", "train") == held.Note(
        where, "a-step20", 20, {"checkpoint": "ab.dir"})
    assert where.startswith(".dvc/tmp/dvc-dali/held/") and where.endswith(".json")
    assert held.read(root, "sub/dvc.lock", "train") is None  # another dvc.lock's stage
    assert held.forget(root, "dvc.lock", "train").row == "a-step20"
    assert held.forget(root, "dvc.lock", "train") is None
    assert held.read(root, "dvc.lock", "train") is None


@pytest.mark.parametrize("text,problem", [
    ("", "not JSON"),
    ("not json", "not JSON"),
    ("\xff\xfe", "not JSON"),
    ("[" * 100_000 + "]" * 100_000, "not JSON"),  # deeper than the parser goes
    ("[1]", "not a JSON object"),
    ('{"step": 3}', "no valid row name"),
    ('{"row": "a-step4\\nERROR: forged", "step": 4}', "no valid row name"),
    ('{"row": "a step4"}', "no valid row name"),
    ('{"row": "a-step4\\u001b[31m"}', "no valid row name"),
    ('{"row": ""}', "no valid row name"),
    ('{"row": "a-step4", "step": "4"}', "its step is not a whole number"),
    ('{"row": "a-step4", "step": -1}', "its step is not a whole number"),
    ('{"row": "a-step4", "step": true}', "its step is not a whole number"),
    ('{"row": "a-step4", "outs": ["checkpoint"]}', "its outputs are not a map"),
    ('{"row": "a-step4", "outs": "checkpoint"}', "its outputs are not a map"),
    ('{"row": "a-step4", "outs": {"checkpoint": null}}', "its outputs are not a map"),
    ('{"row": "a-step4", "pad": "' + "x" * (1 << 20) + '"}', "larger than 1 MB"),
])
def test_a_note_that_does_not_parse_is_said_to_be_unreadable(tmp_path, text, problem):
    path = held.note_path(str(tmp_path), "dvc.lock", "train")
    (tmp_path / ".dvc/tmp/dvc-dali/held").mkdir(parents=True)
    with open(path, "wb") as fobj:
        fobj.write(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    note = held.read(str(tmp_path), "dvc.lock", "train")
    assert note.problem.startswith(problem) and not note.row, note
    assert held.forget(str(tmp_path), "dvc.lock", "train").problem == note.problem
    assert not os.path.lexists(path)


@pytest.mark.parametrize("kind", ["fifo", "link to a file", "link to a fifo", "directory"])
def test_a_note_that_is_no_regular_file_is_not_read_nor_waited_on(tmp_path, kind):
    """A FIFO would block the run's start (and `dvc-dali reset`) for ever; a
    link is not followed. Each is a note that cannot be read, and reset
    removes it (not what it points to)."""
    root = str(tmp_path)
    path = held.note_path(root, "dvc.lock", "train")
    os.makedirs(os.path.dirname(path))
    target = tmp_path / "target"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        os.mkdir(path)
        (tmp_path / path / "x").write_text("x")
    else:
        os.mkfifo(target) if kind.endswith("fifo") else target.write_text('{"row": "a-step2"}')
        os.symlink(target, path)
    note = held.read(root, "dvc.lock", "train")
    assert note.problem in ("not a regular file", "a symbolic link"), note
    assert held.forget(root, "dvc.lock", "train") is not None
    assert not os.path.lexists(path) and (kind.startswith("link") == os.path.lexists(target))


def test_refusal_names_the_file_the_row_and_what_to_do():
    text = held.refusal("dvc.lock", "train", "checkpoint", NOTE, True, False)
    assert text.startswith("dvc.lock names no checkpoint for stage 'train'")
    assert "DVC deleted the workspace's" in text and "step 0" in text
    assert "`dvc exp apply a-step20`" in text and "resume from step 20" in text
    assert "`dvc-dali reset`" in text
    temp = held.refusal("dvc.lock", "train", "checkpoint", NOTE, True, True)
    assert "into this --temp/queued run" in temp and "deleted" not in temp
    gone = held.refusal("dvc.lock", "train", "checkpoint", NOTE, False, False)
    assert "has been removed since" in gone and "dvc exp apply a-step20" not in gone
    assert "`dvc exp show` lists the rows" in gone


def test_refusal_of_an_unreadable_note_names_it_and_the_ways_out():
    text = held.refusal("dvc.lock", "train", "checkpoint", BAD, False, False)
    assert "names no checkpoint for stage 'train'" in text
    assert ".dvc/tmp/dvc-dali/held/k.json, cannot be read (not JSON)" in text
    assert "`dvc exp show` lists the rows" in text and "`dvc-dali reset`" in text
    assert "\n" not in text


def test_a_row_name_with_shell_characters_is_quoted_in_the_command():
    note = held.Note("n", "a-step4;$(id)", 4, {"checkpoint": "ab.dir"})
    assert held.valid_row(note.row)  # git takes it; the shell must not run it
    text = held.refusal("dvc.lock", "train", "checkpoint", note, True, False)
    assert "`dvc exp apply 'a-step4;$(id)'`" in text
