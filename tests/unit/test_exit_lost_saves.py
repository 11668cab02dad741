"""What a stopping run's line says of the asynchronous checkpoints in flight
(exit_hooks._lost_saves): each one that failed, taken off the exit's list
(which said it a second time and ended with status 1); the others left. An
orphan's refusal after its row is no lost checkpoint. What a preempted run
says when an error of ours ends it (exit_hooks._say_ours), and the command
that resumes a run (exit_hooks.next_command)."""

from __future__ import annotations

import os
import signal
from concurrent.futures import Future

import pytest

from dvc_dali.core import exit_hooks
from dvc_dali.core.errors import CheckpointWriteError, RecordError
from dvc_dali.core.process_state import STATE


def _future(outcome: str) -> Future:
    future: Future = Future()
    if outcome == "failed":
        future.set_exception(CheckpointWriteError("checkpoint: disk full. Free some."))
    elif outcome == "refused":  # an orphan's refusal, once its row was recorded
        refusal = RecordError("`dvc exp run` (pid 1) ended while this training went on")
        setattr(refusal, exit_hooks._ROW_RECORDED, True)
        future.set_exception(refusal)
    elif outcome == "done":
        future.set_result(None)
    return future  # "pending": still running


@pytest.mark.parametrize("outcomes,deleted,said,left", [
    ([], False, "", []),
    (["done", "pending"], False, "", [5, 10]),
    (["done", "failed", "pending"], False,
     "; the checkpoint of step 10, in flight then, failed (CheckpointWriteError: checkpoint: "
     "disk full. Free some): no row holds it", [5, 15]),
    # an orphan's refusal: the row is kept (the line names it), nothing lost; it
    # was said as "failed ...: no row holds it"
    (["refused", "failed"], False,
     "; the checkpoint of step 10, in flight then, failed (CheckpointWriteError: checkpoint: "
     "disk full. Free some): no row holds it", []),
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


@pytest.mark.parametrize("row,elsewhere,said", [
    ("a-step5", False, "`dvc exp run` again: it resumes from the last recorded row"),
    (None, False, "`dvc exp run` again: it resumes from the last recorded row"),
    # --temp or queued: the workspace does not hold the row; it said `dvc exp run` again
    ("a-step5", True, "`dvc exp apply a-step5` then `dvc exp run`: it resumes from that row"),
    ("it's", True, "`dvc exp apply 'it'\"'\"'s'` then `dvc exp run`: it resumes from that row"),
    (None, True, "run it again as it was started: no row of it was recorded"),
])
def test_the_next_command_of_a_run(row, elsewhere, said):
    assert exit_hooks.next_command(row, elsewhere) == said


@pytest.mark.parametrize("preempted,pid,status,said", [
    (None, "this", None, "dvc-dali: RecordError: cannot write dvc.lock.\n"),
    # preempted, then its checkpoint failed: it said the error alone, status 1
    (signal.SIGTERM, "this", 143, "dvc-dali: preempted (SIGTERM), but its checkpoint could not "
     "be made (RecordError: cannot write dvc.lock): no checkpoint was recorded by this run; "
     "`dvc exp run` resumes from the last one in the workspace, if any\n"),
    (signal.SIGUSR1, "this", 128 + signal.SIGUSR1, "dvc-dali: preempted (SIGUSR1), but its "),
    # a child forked since (not the run): the error as it is
    (signal.SIGTERM, "other", None, "dvc-dali: RecordError: cannot write dvc.lock.\n"),
])
def test_an_error_that_ends_a_preempted_run_says_the_preemption(capsys, preempted, pid, status,
                                                                said):
    fields = ("preemption_signal", "exit_lines_installed", "exit_lines_pid", "said_stopping")
    kept = {name: getattr(STATE, name) for name in fields}
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    STATE.preemption_signal, STATE.exit_lines_installed = preempted, True
    STATE.exit_lines_pid = os.getpid() if pid == "this" else -1
    try:
        if status is None:
            exit_hooks._say_ours(RecordError, RecordError("cannot write dvc.lock."))
        else:
            with pytest.raises(SystemExit) as exited:
                exit_hooks._say_ours(RecordError, RecordError("cannot write dvc.lock."))
            assert exited.value.code == status
    finally:
        for name, value in kept.items():
            setattr(STATE, name, value)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert capsys.readouterr().err.startswith(said)
