"""Which rows of a run's name retention counts as the run's own
(retention.of_the_run): a table, commit times included to show they no
longer decide."""

from __future__ import annotations

import pytest

from dvc_dali.recording.retention import of_the_run, select_pruned
from dvc_dali.recording.rows import (CANNOT_TELL, CONTINUES, STARTS_OVER, Lineage,
                                     first_row_follows, started_token)
from dvc_dali.reading.exp_refs import parse_lineage

RUN = started_token(1_700_000_000.25)


@pytest.mark.parametrize("row_started,run_started,counted", [
    (RUN, RUN, True),  # the run's own row
    (started_token(1_700_000_000.75), RUN, False),  # another run, begun in the same second
    (started_token(1_699_999_000.0), RUN, False),  # the finished run it restarted
    (started_token(1_800_000_000.0), RUN, False),  # a later start (a clock set back)
    (None, RUN, False),  # a row that does not say its run's start: unknown, kept
    (RUN, None, True),  # a run resumed from an older checkpoint: every row, as before
    (None, None, True),
])
def test_of_the_run(row_started, run_started, counted):
    assert of_the_run(row_started, run_started) is counted


def test_a_finished_runs_row_of_the_same_second_is_not_pruned():
    """The old rule counted a row committed in the second the restart began
    (commit times are whole seconds) as the new run's: with keep_last=1 the
    finished run's last row went. Identity by start keeps it."""
    since = 1_700_000_000.9
    old = {"ref": "old", "step": 2, "time": 1_700_000_000, "started": started_token(1.0)}
    new = {"ref": "new", "step": 5, "time": 1_700_000_001, "started": started_token(since)}
    rows = [dict(r, name=f"a-step{r['step']}", exp="a", sha="0" * 40) for r in (old, new)]
    by_time = [r for r in rows if r["time"] >= int(since)]  # the rule it had
    assert [r["ref"] for r in select_pruned(by_time, 1, keep={"new"})] == ["old"]
    by_start = [r for r in rows if of_the_run(r["started"], started_token(since))]
    assert select_pruned(by_start, 1, keep={"new"}) == []


def test_the_start_reads_back_from_a_lineage_line():
    line = Lineage("a", 3, None, "dvc.yaml:train", "0" * 16, started_token(1712.5)).line()
    assert parse_lineage(line)["started"] == started_token(1712.5) == "1712.500000"
    assert "started" not in parse_lineage(Lineage("a", 3, None, "s", "d").line())


P = "p" * 40


@pytest.mark.parametrize("step,parent,parent_step,resumed,same,follows", [
    (1, P, 2, None, False, STARTS_OVER),  # a bare script that ignores its state: a new run
    (1, P, 2, None, True, STARTS_OVER),  # step 1 again, whatever its checkpoint holds
    (2, P, 2, None, True, CONTINUES),  # its step again, unchanged (top of a resumed loop)
    (2, P, 2, None, False, STARTS_OVER),  # its step, trained again: a one-row run restarted
    (3, P, 2, None, False, CONTINUES),  # the next step: it continues the row
    (3, P, 2, None, True, CONTINUES),
    (None, P, 2, None, False, CANNOT_TELL),  # no step: after the row, a start of its own
    (None, P, 2, None, True, CANNOT_TELL),
    (1, None, 0, None, False, CONTINUES),  # nothing resumed: a new run anyway
    (None, None, 0, None, False, CONTINUES),
    (1, P, 2, True, False, CONTINUES),  # a Checkpointer knows what it resumed
    (1, P, 2, False, False, CONTINUES),
    (2, P, 2, True, False, CONTINUES),
])
def test_how_a_bare_scripts_first_row_follows_the_row_it_resumed(
        step, parent, parent_step, resumed, same, follows):
    """`dvc exp run -n a -f` after run a finished, by a script that starts
    over (at step 1, at a one-row run's step, or naming no step): it
    continued a, and keep_last deleted a's rows."""
    assert first_row_follows(step, parent, parent_step, resumed, same) == follows
