"""The pure rules behind preemption, pushing and run names, as tables."""

import pytest

from dvc_dali.training.preemption import due
from dvc_dali.recording.auto_push import BACKOFF_S, backoff
from dvc_dali.recording.rows import run_name


@pytest.mark.parametrize("step,every,preempted,expected", [
    (10, 10, False, True), (11, 10, False, False), (11, 10, True, True),
    (0, 10, False, True), (5, 0, False, False), (5, 0, True, True), (7, 1, False, True)])
def test_should_save_rule(step, every, preempted, expected):
    assert due(step, every, preempted) is expected


@pytest.mark.parametrize("failures,seconds", [
    (0, 0.0), (1, 1.0), (2, 2.0), (3, 5.0), (5, 30.0), (50, 30.0)])
def test_backoff_grows_and_caps(failures, seconds):
    assert backoff(failures) == seconds
    assert max(BACKOFF_S) == 30.0


@pytest.mark.parametrize("exp,parent_run,branched,expected", [
    ("lurid-dace", "a", False, "a"),       # resumed: the run keeps its name
    ("b", "a", True, "b"),                 # changed params: a branch of its own
    ("b", None, False, "b"),               # fresh start
    ("b", None, True, "b"),
    ("a", "a", False, "a")])
def test_run_name(exp, parent_run, branched, expected):
    assert run_name(exp, parent_run, branched) == expected


def test_the_exit_line_handler_defers_to_preemption_only_once_the_flag_has_the_signal():
    """dvc-dali's SIGTERM exit-line handler, where a framework wrapped it into
    its own (Lightning): reached after the preemption flag took the signal,
    it returns (one more checkpoint comes, then the exit); called directly
    (the framework put it back after fit), it exits as before."""
    from dvc_dali.core import exit_hooks
    from dvc_dali.core.process_state import STATE

    import os

    STATE.preemption_signal, STATE.exit_lines_pid = None, os.getpid()  # installed here
    try:
        with pytest.raises(SystemExit) as exited:
            exit_hooks.on_sigterm(15, None)
        assert exited.value.code == 143
        STATE.preemption_signal = 15
        assert exit_hooks.on_sigterm(15, None) is None
    finally:
        STATE.preemption_signal, STATE.exit_lines_pid = None, 0


def test_an_exit_hook_does_nothing_in_a_child_forked_later(tmp_path):
    """A forked child inherits the exit hooks, not the run: a rank's "exited",
    the params put back, the pushes finished are its parent's to do."""
    import os

    from dvc_dali.core.exit_hooks import this_process_only

    def mark(name: str) -> None:
        (tmp_path / name).write_text(str(os.getpid()))

    hook = this_process_only(mark, "ran")
    child = os.fork()
    if child == 0:  # the child runs the hook as its interpreter's exit would
        try:
            hook()
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    assert not (tmp_path / "ran").exists()
    hook()
    assert (tmp_path / "ran").read_text() == str(os.getpid())
