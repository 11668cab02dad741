"""What the next run's start does with the note of a workspace row a kill
cut short (recording/pending.py), for a kill at each instant of the row's
writes: its commit, the note, dvc.lock, its ref, the note's removal."""

import pytest

from dvc_dali.recording.pending import COMPLETE, DROP, LEAVE, LOST, fate

# (instant of the kill, writer alive, a ref holds the row's commit,
#  dvc.lock names the row's outputs, its commit is there): fate
CASES = [
    ("note written, dvc.lock not", False, False, False, True, DROP),
    ("dvc.lock written, the ref not", False, False, True, True, COMPLETE),
    ("dvc.lock written, the commit since gone", False, False, True, False, LOST),
    ("the ref written, the note not removed", False, True, True, True, DROP),
    ("the ref written, dvc.lock changed since (`dvc exp apply`)", False, True, False, True, DROP),
    ("dvc.lock written, then another row applied over it", False, False, False, True, DROP),
    ("no kill: its writer is recording it now", True, False, True, True, LEAVE),
]


@pytest.mark.parametrize("instant, alive, ref_holds, lock_names, is_row, expected", CASES,
                         ids=[c[0] for c in CASES])
def test_fate_of_a_pending_row(instant, alive, ref_holds, lock_names, is_row, expected):
    assert fate(alive, ref_holds, lock_names, is_row) == expected, instant
