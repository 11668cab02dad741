"""core/run.py: what belongs to one run lives in its Run, one a process; a
second run in the same process is refused, and reset() forgets the run as
a new process would."""

from __future__ import annotations

import pytest

from dvc_dali.core import exit_hooks, run
from dvc_dali.core.context import RunContext
from dvc_dali.core.errors import RecordError
from dvc_dali.core.process_state import ProcessState, reset


def _ctx(root: str = "/repo", name: str | None = "exp-a", stage: str | None = "train"):
    return RunContext(dvc_root=root, dvc_exp_name=name, stage=stage, baseline_rev="b" * 40)


@pytest.fixture(autouse=True)
def clean():
    reset()
    yield
    reset()


def test_one_run_a_process_the_same_on_every_call():
    first = run.of(_ctx())
    first.kept = (3, "exp-a-step3")
    assert run.of(_ctx()) is first and run.current() is first


@pytest.mark.parametrize("other", [
    _ctx(root="/elsewhere"), _ctx(name="exp-b"), _ctx(stage="eval"), _ctx(name=None)])
def test_a_second_run_in_the_same_process_is_refused(other):
    run.of(_ctx()).tips[("git", "exp-a", "dvc.yaml:train")] = ("a" * 40, 1, "exp-a")
    with pytest.raises(RecordError, match="one process trains one run"):
        run.of(other)


def test_a_run_that_began_nothing_claims_nothing():
    first = run.of(_ctx(stage="nope"))  # its recording refused: no such stage
    second = run.of(_ctx())
    assert second is not first and run.current() is second
    second.kept = (1, "exp-a-step1")
    with pytest.raises(RecordError, match="one process trains one run"):
        run.of(_ctx(stage="nope"))


def test_reset_forgets_the_run():
    run.of(_ctx()).kept = (1, "exp-a-step1")
    reset()
    assert run.current() is None and exit_hooks.last_kept() is None
    assert run.of(_ctx(name="exp-b")).kept is None  # a new process: any run may start


def test_the_interruption_line_names_the_runs_last_row():
    assert exit_hooks.last_kept() is None
    run.of(_ctx()).kept = (20, "exp-a-step20")
    assert exit_hooks.last_kept() == (20, "exp-a-step20")
    assert "step 20 is kept as row exp-a-step20" in exit_hooks.interruption_line(
        "terminated (SIGTERM)", exit_hooks.last_kept())


@pytest.mark.parametrize("recorded, elsewhere, said", [
    ((4, "a-step4"), False, "step 4 is kept as row a-step4; `dvc exp run` resumes from it"),
    # found by a sweep: a --temp or queued run's row is not in the workspace, which
    # a plain `dvc exp run` resumed from step 0
    ((4, "a-step4"), True, "step 4 is kept as row a-step4; `dvc exp apply a-step4` then "
                           "`dvc exp run` resumes from it"),
    (None, True, "no checkpoint was recorded by this run"),
    (None, False, "no checkpoint was recorded by this run; `dvc exp run` resumes from the "
                  "last one in the workspace, if any"),
    ((4, ""), True, "step 4 is kept (rank 0 recorded its row)"),
])
def test_the_interruption_line_says_how_to_resume_where_the_run_trained(recorded, elsewhere,
                                                                         said):
    assert exit_hooks.interruption_line("x", recorded, elsewhere=elsewhere) == f"x: {said}"


def test_the_process_state_holds_no_run_field():
    names = set(ProcessState.__dataclass_fields__)
    assert not names & {"run_start", "run_started", "kept", "tips"}
