"""Which DVC project of a git repository a row is of (rows.project_address,
rows.same_project), and its lineage line's ``root=``: two projects of one
repository (`dvc init --subdir`) share its experiment refs. And what a
finished stage's refusal says where the project has other checkpoint stages."""

from __future__ import annotations

import os

import pytest

from dvc_dali.reading.exp_refs import parse_lineage
from dvc_dali.recording.rows import Lineage, project_address, same_project
from dvc_dali.recording.stage import run_alone_hint


@pytest.mark.parametrize("root,top,address", [
    ("/r", "/r", "."),  # the project at the repository's top
    ("/r/pa", "/r", "pa"),
    ("/r/a/b c", "/r", "a/b%20c"),  # quoted: a lineage line's fields split at spaces
])
def test_project_address(root, top, address, tmp_path):
    for d in (root, top):
        os.makedirs(f"{tmp_path}{d}", exist_ok=True)
    assert project_address(f"{tmp_path}{root}", f"{tmp_path}{top}") == address


@pytest.mark.parametrize("row_root,root,same", [
    ("pa", "pa", True),
    ("pa", "pb", False),  # a sibling project's row: never resumed
    (".", "pb", False),  # the top project's row, from one below it
    ("pb", ".", False),
    (None, "pb", True),  # an older release's row says none: counted as before
    ("pa", None, True),
])
def test_same_project(row_root, root, same):
    assert same_project(row_root, root) is same


def test_the_root_reads_back_from_a_lineage_line():
    line = Lineage("a", 3, None, "dvc.yaml:train", "0" * 16, "1.000000", "pb").line()
    assert parse_lineage(line)["root"] == "pb"
    assert "root" not in parse_lineage(Lineage("a", 3, None, "s", "d").line())


@pytest.mark.parametrize("others,says", [
    ([], ""),  # the only checkpoint stage: its refusal as it was
    (["train-b"], "`dvc exp run -s train-b`"),
    (["train@1", "eval"], "(train@1, eval)"),
])
def test_a_finished_stage_names_how_to_run_another_alone(others, says):
    hint = run_alone_hint("train-a", others)
    assert says in hint
    assert ("reset --stage train-a" in hint) is bool(others)
