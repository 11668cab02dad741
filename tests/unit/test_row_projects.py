"""Which rows the readers (`show`, `rows`, `current_row`) take as their DVC project's
(row_queries.of_project, project_of): the recorder's rule
(rows.same_project, project_address), read from the reading layer, which
cannot import the recorder. Two projects of one git repository (`dvc init
--subdir`) share its experiment refs."""

from __future__ import annotations

import subprocess

import pytest

from dvc_dali.reading.row_queries import of_project, project_of
from dvc_dali.recording.rows import project_address, same_project


@pytest.mark.parametrize("row_root,here,mine", [
    ("pa", "pa", True),
    ("pb", "pa", False),  # a sibling project's row: not listed
    (".", "pa", False),
    ("pa", ".", False),
    (None, "pa", True),  # an older release's row says none: listed, as before
])
def test_of_project(row_root, here, mine):
    assert of_project(row_root, here) is mine
    assert same_project(row_root, here) is mine


@pytest.mark.parametrize("folder", [".", "pa", "a/b c"])
def test_project_of_is_the_address_the_recorder_writes(folder, tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    root = tmp_path / folder
    root.mkdir(parents=True, exist_ok=True)
    assert project_of(str(root)) == project_address(str(root), str(tmp_path))
