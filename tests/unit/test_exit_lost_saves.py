"""What a stopping run's line says of the asynchronous checkpoints in flight
(exit_hooks._lost_saves): each one that failed, taken off the exit's list
(which said it a second time and ended with status 1); the others left."""

from __future__ import annotations

import os
from concurrent.futures import Future

import pytest

from dvc_dali.core import exit_hooks
from dvc_dali.core.errors import CheckpointWriteError
from dvc_dali.core.process_state import STATE


def _future(outcome: str) -> Future:
    future: Future = Future()
    if outcome == "failed":
        future.set_exception(CheckpointWriteError("checkpoint: disk full. Free some."))
    elif outcome == "done":
        future.set_result(None)
    return future  # "pending": still running


@pytest.mark.parametrize("outcomes,deleted,said,left", [
    ([], False, "", []),
    (["done", "pending"], False, "", [5, 10]),
    (["done", "failed", "pending"], False,
     "; the checkpoint of step 10, in flight then, failed (CheckpointWriteError: checkpoint: "
     "disk full. Free some): no row holds it", [5, 15]),
    # the run's directory deleted: that is the error, not said again
    (["failed"], True,
     "; the checkpoint of step 5, in flight then, was lost with the directory: no row holds it",
     []),
])
def test_the_failed_checkpoints_in_flight_are_said_once(tmp_path, outcomes, deleted, said, left):
    entries = [(5 * (i + 1), "checkpoint", _future(o)) for i, o in enumerate(outcomes)]
    here, gone = os.getcwd(), tmp_path / "run"
    kept = STATE.unread_saves[:], STATE.exit_lines_pid
    STATE.unread_saves[:], STATE.exit_lines_pid = entries, os.getpid()
    try:
        if deleted:
            gone.mkdir()
            os.chdir(gone)
            gone.rmdir()
        assert exit_hooks._lost_saves() == said
        assert [step for step, _path, _f in STATE.unread_saves] == left
    finally:
        os.chdir(here)
        STATE.unread_saves[:], STATE.exit_lines_pid = kept
