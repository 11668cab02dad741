"""What the next run's start does with the note of a workspace row a kill
cut short (recording/pending.py), for a kill at each instant of the row's
writes: its commit, the note, dvc.lock, its ref, the note's removal."""

import pytest

from dvc_dali.recording.pending import COMPLETE, DROP, LEAVE, LOST, fate, writer_alive

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


# (the writer's pid: alive, its start as noted, the start of the process it
#  names now; dvc.lock written, the ref not): fate
WRITERS = [
    ("its writer, recording it now", True, "ticks:100", "ticks:100", LEAVE),
    ("its pid gone: the writer was killed", False, "ticks:100", None, COMPLETE),
    ("its pid given to another process since", True, "ticks:100", "ticks:900", COMPLETE),
    ("an older release's note, no start", True, None, "ticks:900", LEAVE),
    ("the live process's start unreadable", True, "ticks:100", None, LEAVE),
]


@pytest.mark.parametrize("who, alive, noted, now, expected", WRITERS,
                         ids=[c[0] for c in WRITERS])
def test_a_pid_reused_by_another_process_is_no_writer(who, alive, noted, now, expected):
    """The note of a killed writer whose pid another process now has was
    left alone: dvc.lock kept naming an unpublished checkpoint, and the next
    run resumed from it as a run of its own, the history cut (a sweep)."""
    assert fate(writer_alive(alive, noted, now), False, True, True) == expected, who
