"""cut_short.fate: what the next run does with a lock a killed row publish left."""

from __future__ import annotations

import pytest

from dvc_dali.recording.cut_short import COMPLETE, LEAVE, REMOVE, fate

SHA = "0123456789abcdef0123456789abcdef01234567"

# name, content, ref exists, the content names a dvc-dali row commit, older than the run
CASES = [
    ("a-step20", SHA + "\n", False, True, True, COMPLETE),  # recorded, not published
    ("a-step20-0123456", SHA + "\n", False, True, True, COMPLETE),  # _publish's suffixed name
    ("a-step20", SHA + "\n", True, True, True, REMOVE),  # published: the lock is stale
    ("a-step20", "", False, False, True, REMOVE),  # killed before git wrote the id
    ("a-step20", SHA[:17], False, False, True, REMOVE),  # cut short inside the id
    ("a-step20", SHA + "\n", False, True, False, LEAVE),  # younger: a live publish
    ("a-step20", "", False, False, False, LEAVE),
    ("r0010", SHA + "\n", False, False, True, LEAVE),  # DVC's own experiment: the user's call
    ("r0010", "", False, False, True, LEAVE),
    ("best", SHA + "\n", False, True, True, COMPLETE),  # a row named by make_checkpoint(name=)
    ("best", "", False, False, True, LEAVE),  # a name of no known shape: not ours to say
    ("a-step", "", False, False, True, LEAVE),
]


@pytest.mark.parametrize("name,content,exists,is_row,older,expected", CASES)
def test_fate(name, content, exists, is_row, older, expected):
    assert fate(name, content, exists, is_row, older) == expected
