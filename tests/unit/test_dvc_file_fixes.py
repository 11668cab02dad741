"""What a message says to do about a file DVC could not read."""

from __future__ import annotations

import pytest

from dvc_dali.recording.dvc_door import _fix_file


@pytest.mark.parametrize("path, says", [
    # a kill cuts dvc.lock short: the rows hold what it named, doctor names one
    ("./dvc.lock", "cut short by a kill? `dvc-dali doctor` names the row to put back with "
                   "`dvc exp apply`; `git checkout -- ./dvc.lock` restores the committed one"),
    ("params.yaml", "Fix params.yaml (`git checkout -- params.yaml` restores the committed one)"),
    (None, "Fix dvc.yaml; `dvc stage list` shows the problem."),
    ("sub/dvc.yaml", "Fix sub/dvc.yaml; `dvc stage list`"),
])
def test_the_file_dvc_could_not_read_is_named_with_its_fix(path, says):
    assert says in _fix_file(path)
